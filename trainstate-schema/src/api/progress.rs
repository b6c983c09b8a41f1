//! A rank's progress, as its heartbeat carries it and as a run serves it.
//!
//! A rank of a rendezvous run says where its training loop is (its step,
//! its phase, its latest scalar metrics) with each heartbeat
//! ([`RankProgress`], in [`RankHeartbeatRequest`](super::RankHeartbeatRequest)).
//! The head keeps the latest report of each rank in memory and serves it
//! as the run's `rank_progress` ([`RankProgressServed`]); from when the
//! steps last grew it decides the run's `health`, and from each rank's own
//! time per step (`step_time_ms`) which ranks are stragglers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::limits::{
    MAX_METRIC_NAME_LEN, MAX_METRIC_NAMES_PER_REPORT, MAX_PHASE_LEN, MAX_STALL_WINDOW_MS,
    MAX_STEP_TIME_MS,
};
use crate::{Rule, ValidationError};

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
        Self { step, total_steps, phase, last_advance_ms, metrics }
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
