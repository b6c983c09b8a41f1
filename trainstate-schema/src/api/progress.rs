//! A rank's progress, as its heartbeat or its controller carries it and as
//! a run serves it.
//!
//! A rank of a rendezvous run says where its training loop is (its step,
//! its phase, its latest scalar metrics) with each heartbeat
//! ([`RankProgress`], in [`RankHeartbeatRequest`](super::RankHeartbeatRequest));
//! the controller of a run it registered says it for its ranks, several at
//! a time ([`ProgressReport`]). The head keeps the latest report of each
//! rank in memory and serves it as the run's `rank_progress`
//! ([`RankProgressServed`]); from when the steps last grew it decides the
//! run's `health`, and from each rank's own time per step (`step_time_ms`)
//! which ranks are stragglers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::limits::{
    MAX_METRIC_NAME_LEN, MAX_METRIC_NAMES_PER_REPORT, MAX_PHASE_LEN, MAX_PROGRESS_RANKS,
    MAX_STALL_WINDOW_MS, MAX_STEP_TIME_MS,
};
use crate::{Rule, ValidationError, validate_name};

/// One rank's progress: where its training loop is. Every field is
/// optional: a report replaces what it carries of the rank's previous one
/// and keeps what it leaves out (its step, phase, metrics).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct RankProgress {
    /// The rank's latest step (the global step, as the training loop counts
    /// it). Never lower than the rank's previous step of the same attempt
    /// (409 `conflict`); the same step again is no advance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u64>,
    /// How many steps the run takes, if known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_steps: Option<u64>,
    /// What the rank is doing (`train`, `eval`, `checkpoint`, ...): 1 to 64
    /// characters of printable ASCII.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 64)))]
    pub phase: Option<String>,
    /// The rank's next advance may take this long (a checkpoint, an
    /// evaluation), in ms: the run is not STALLED before this long after
    /// this report, whatever its stall window. At most 604800000 (7 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(range(max = 604_800_000_u64)))]
    pub expect_next_within_ms: Option<u64>,
    /// The rank's time per step since its previous report, in ms: its own
    /// work when the client can tell (the training loop measured it, say
    /// its compute without the time spent waiting for its peers in
    /// collectives), else the wall time between its advances. Counted only
    /// with a report whose `step` is new (the rank's first, or higher than
    /// its previous one). Finite, greater than 0 and at most 604800000
    /// (7 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schemars",
        schemars(range(max = 604_800_000_u64), extend("exclusiveMinimum" = 0))
    )]
    pub step_time_ms: Option<f64>,
    /// Progress up to this step is saved (a checkpoint was written): the
    /// work a failure loses is counted from the run's latest mark (its
    /// goodput's progress lost). Never ahead of the rank's own step (this
    /// report's, else its latest) and never lower than the rank's previous
    /// mark of the same attempt (422, naming `progress.checkpoint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<u64>,
    /// The rank's latest scalar metrics, by name: at most 32 per report,
    /// each name 1 to 128 of `A-Z a-z 0-9 _ . : / -`, each value finite. A
    /// run's ranks report at most 64 distinct names in all.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, f64>,
}

impl RankProgress {
    /// A report of `step`.
    pub fn at_step(step: u64) -> Self {
        Self { step: Some(step), ..Self::default() }
    }

    /// Checks every rule of one report; an error names its field under
    /// `progress` (`progress.metrics["loss"]`, `progress.phase`).
    pub fn check(&self) -> Result<(), ValidationError> {
        if let (Some(checkpoint), Some(step)) = (self.checkpoint, self.step)
            && checkpoint > step
        {
            let rule = Rule::CheckpointAheadOfStep { step };
            return Err(ValidationError::new("progress.checkpoint", rule));
        }
        if let Some(phase) = &self.phase {
            let field = || "progress.phase".to_owned();
            if phase.is_empty() {
                return Err(ValidationError::new(field(), Rule::Empty));
            }
            if phase.len() > MAX_PHASE_LEN {
                return Err(ValidationError::new(field(), Rule::TooLong { max: MAX_PHASE_LEN }));
            }
            if !phase.bytes().all(|b| (0x20..0x7f).contains(&b)) {
                return Err(ValidationError::new(field(), Rule::PrintableAscii));
            }
        }
        if let Some(ms) = self.expect_next_within_ms
            && ms > MAX_STALL_WINDOW_MS
        {
            let rule = Rule::OutOfRange { min: 0, max: MAX_STALL_WINDOW_MS };
            return Err(ValidationError::new("progress.expect_next_within_ms", rule));
        }
        if let Some(ms) = self.step_time_ms
            && !(ms.is_finite() && ms > 0.0 && ms <= MAX_STEP_TIME_MS as f64)
        {
            let rule = Rule::PositiveUpTo { max: MAX_STEP_TIME_MS };
            return Err(ValidationError::new("progress.step_time_ms", rule));
        }
        if self.metrics.len() > MAX_METRIC_NAMES_PER_REPORT {
            let rule = Rule::TooMany { max: MAX_METRIC_NAMES_PER_REPORT };
            return Err(ValidationError::new("progress.metrics", rule));
        }
        for (name, value) in &self.metrics {
            let field = || format!("progress.metrics[{name:?}]");
            if !is_metric_name(name) {
                return Err(ValidationError::new(field(), Rule::MetricNameFormat));
            }
            if !value.is_finite() {
                return Err(ValidationError::new(field(), Rule::NotFinite));
            }
        }
        Ok(())
    }
}

/// Body of `POST /api/train/runs/{id}/progress`: where the training loop
/// of some ranks of a run is, as the run's controller reports it (a run a
/// controller registered; the ranks of a rendezvous run report their own,
/// with their heartbeats).
///
/// Each rank's report is a [`RankProgress`] with its rules; a report that
/// breaks one is refused whole (422, naming the field:
/// `ranks[2].progress.metrics["loss"]`) and nothing of it is recorded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct ProgressReport {
    /// The attempt the ranks belong to; the run's current attempt when
    /// absent. A report of an attempt that is not the current one is
    /// refused (409).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 1024)))]
    pub attempt_id: Option<String>,
    /// Each rank's progress: 1 to 65536 entries, one per rank, each rank
    /// one of the attempt's workers (below its world size; 409 otherwise).
    #[serde(deserialize_with = "crate::object::vec")]
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 65536)))]
    pub ranks: Vec<RankReport>,
}

impl ProgressReport {
    /// A report of `ranks`, of the run's current attempt.
    pub fn new(ranks: Vec<RankReport>) -> Self {
        Self { attempt_id: None, ranks }
    }

    /// The same report, of attempt `attempt_id`.
    pub fn of_attempt(mut self, attempt_id: impl Into<String>) -> Self {
        self.attempt_id = Some(attempt_id.into());
        self
    }

    /// Checks every rule of the report: an attempt id is a name, 1 to
    /// [`MAX_PROGRESS_RANKS`] ranks, each once, each rank's progress by
    /// [`RankProgress::check`]. An error names its field
    /// (`ranks[2].progress.metrics["loss"]`, `ranks[3].rank`).
    pub fn check(&self) -> Result<(), ValidationError> {
        if let Some(attempt_id) = &self.attempt_id {
            validate_name("attempt_id", attempt_id)?;
        }
        if self.ranks.is_empty() {
            return Err(ValidationError::new("ranks", Rule::Empty));
        }
        if self.ranks.len() > MAX_PROGRESS_RANKS {
            return Err(ValidationError::new("ranks", Rule::TooMany { max: MAX_PROGRESS_RANKS }));
        }
        let mut seen = std::collections::HashSet::with_capacity(self.ranks.len());
        for (i, entry) in self.ranks.iter().enumerate() {
            if !seen.insert(entry.rank) {
                let rule = Rule::DuplicateRank { rank: entry.rank };
                return Err(ValidationError::new(format!("ranks[{i}].rank"), rule));
            }
            entry.progress.check().map_err(|err| {
                ValidationError::new(format!("ranks[{i}].{}", err.field()), err.rule().clone())
            })?;
        }
        Ok(())
    }
}

/// One rank's entry of a [`ProgressReport`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct RankReport {
    /// The rank's world rank.
    pub rank: u32,
    /// Where its training loop is.
    #[serde(deserialize_with = "crate::object::one")]
    pub progress: RankProgress,
}

impl RankReport {
    /// Rank `rank`'s `progress`.
    pub fn new(rank: u32, progress: RankProgress) -> Self {
        Self { rank, progress }
    }
}

/// Answer of `POST /api/train/runs/{id}/progress`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct ProgressResponse {
    /// The run's current attempt, which the report was taken for.
    pub attempt_id: String,
    /// How many ranks the attempt has.
    pub world_size: u32,
    /// True when the progress was recorded: the run is RUNNING. At another
    /// live status (RESTARTING, say) the report renews the run's lease and
    /// nothing else.
    pub recorded: bool,
    /// The run's lease, renewed by the report, in ms: a report is a sign
    /// of life of the run, like its heartbeat.
    pub lease_ms: u64,
}

impl ProgressResponse {
    /// An answer.
    pub fn new(
        attempt_id: impl Into<String>,
        world_size: u32,
        recorded: bool,
        lease_ms: u64,
    ) -> Self {
        Self { attempt_id: attempt_id.into(), world_size, recorded, lease_ms }
    }
}

/// True when `name` is a metric name: 1 to 128 of `A-Z a-z 0-9 _ . : / -`.
///
/// ```
/// use trainstate_schema::api::is_metric_name;
///
/// assert!(is_metric_name("train/loss"));
/// assert!(!is_metric_name("loss rate"));
/// assert!(!is_metric_name(""));
/// ```
pub fn is_metric_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_METRIC_NAME_LEN
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'/' | b'-'))
}

/// One rank's progress as a run serves it (`rank_progress`, by world
/// rank): its latest report, and when its step last grew.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct RankProgressServed {
    /// The rank's latest step.
    pub step: Option<u64>,
    /// How many steps the run takes, if the rank said.
    pub total_steps: Option<u64>,
    /// What the rank was doing at its latest report.
    pub phase: Option<String>,
    /// When the rank's step last grew (Unix ms, the head's clock), or,
    /// before it grew on this head, when the head first heard its progress
    /// (after a head restart, the restart).
    pub last_advance_ms: Option<u64>,
    /// The rank's latest scalar metrics, by name.
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
    /// The rank's latest checkpoint mark in this attempt, if it made one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<u64>,
}

impl RankProgressServed {
    /// A rank's latest report as served.
    pub fn new(
        step: Option<u64>,
        total_steps: Option<u64>,
        phase: Option<String>,
        last_advance_ms: Option<u64>,
        metrics: BTreeMap<String, f64>,
    ) -> Self {
        Self { step, total_steps, phase, last_advance_ms, metrics, checkpoint: None }
    }

    /// The same report, with the rank's latest checkpoint mark.
    pub fn with_checkpoint(mut self, checkpoint: Option<u64>) -> Self {
        self.checkpoint = checkpoint;
        self
    }
}

/// Query of `GET /api/train/runs/{id}/metrics`: which series, and which
/// part of each. Every filter is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct MetricsQuery {
    /// Only the series of this metric name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Only the points reported by this world rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    /// Only points at this step or later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_step: Option<u64>,
    /// Only points at this step or earlier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_step: Option<u64>,
}

/// One reported value of a metric.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct MetricPoint {
    /// The world rank that reported it.
    pub rank: u32,
    /// The rank's step when it reported it.
    pub step: u64,
    /// The value (always finite).
    pub value: f64,
}

impl MetricPoint {
    /// A point.
    pub fn new(rank: u32, step: u64, value: f64) -> Self {
        Self { rank, step, value }
    }
}

/// The history of one metric of a run: at most
/// [`MAX_METRIC_POINTS`](crate::limits::MAX_METRIC_POINTS) points, in the
/// order they were reported; as it grows it is decimated (every other
/// point dropped, and from then on every other report kept), so it spans
/// the whole run at a coarser grain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct MetricSeries {
    /// The metric's name.
    pub name: String,
    /// The points kept.
    pub points: Vec<MetricPoint>,
}

impl MetricSeries {
    /// A series.
    pub fn new(name: impl Into<String>, points: Vec<MetricPoint>) -> Self {
        Self { name: name.into(), points }
    }
}

/// Answer of `GET /api/train/runs/{id}/metrics`: the run's metric series
/// of its current attempt, by name.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct MetricsResponse {
    /// The run.
    pub run_id: crate::RunId,
    /// The series, by name.
    pub series: Vec<MetricSeries>,
}

impl MetricsResponse {
    /// An answer.
    pub fn new(run_id: crate::RunId, series: Vec<MetricSeries>) -> Self {
        Self { run_id, series }
    }
}
