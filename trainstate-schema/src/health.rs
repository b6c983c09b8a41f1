//! A run's health as the head decides it: whether its ranks still advance.
//!
//! The head marks a live run whose ranks report progress `STALLED` when
//! none of them advanced for the run's stall window, and `PROGRESSING`
//! again when one does (dated by that advance), and names the ranks whose
//! own steps are persistently slower than their peers' ([`Straggler`]). A
//! run that ends while stalled keeps its `STALLED` health marked ended
//! (`ended_ms`). The run keeps its current health ([`RunHealth`]) and a
//! bounded history of changes ([`HealthChange`]); both are the head's
//! own: a registration's are ignored.

use serde::{Deserialize, Serialize};

use crate::limits::{MAX_HEALTH_DETAIL_LEN, MAX_HEALTH_HISTORY, MAX_HEALTH_RANKS};
use crate::{Rule, ValidationError};

/// Whether a run's ranks still advance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum HealthState {
    /// A rank advanced within the run's stall window.
    Progressing,
    /// No rank advanced for the run's stall window.
    Stalled,
}

impl HealthState {
    /// Every state, in a fixed order.
    pub const ALL: [HealthState; 2] = [HealthState::Progressing, HealthState::Stalled];

    /// The wire name, for example `STALLED`.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthState::Progressing => "PROGRESSING",
            HealthState::Stalled => "STALLED",
        }
    }

    /// The state named `text` (`STALLED`, `PROGRESSING`).
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

impl std::fmt::Display for HealthState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Extension: a run's current health, as the head last decided it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct RunHealth {
    /// `STALLED` or `PROGRESSING`.
    pub state: HealthState,
    /// Since when (Unix ms, the head's clock).
    pub since_ms: u64,
    /// The culprits, by world rank: for `STALLED`, the ranks whose last
    /// advance is the oldest and the ranks that lag behind the highest step;
    /// for `PROGRESSING`, the ranks that lag. At most 1,024.
    #[serde(default)]
    #[cfg_attr(feature = "schemars", schemars(length(max = 1024)))]
    pub ranks: Vec<u32>,
    /// What the head saw, in words for a person (times as RFC 3339, never
    /// raw ms). At most 4,096 characters, no NUL.
    #[serde(default)]
    #[cfg_attr(feature = "schemars", schemars(length(max = 4096)))]
    pub detail: String,
    /// The ranks whose own time per step is persistently slower than their
    /// peers', by world rank, with their times as they were when the set
    /// last changed. At most 1,024.
    #[serde(default)]
    #[cfg_attr(feature = "schemars", schemars(length(max = 1024)))]
    pub stragglers: Vec<Straggler>,
    /// For `STALLED`: when a rank last advanced before the stall (Unix ms,
    /// the head's clock), from which the stall's length is counted. Absent
    /// from a health written before it was kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_advance_ms: Option<u64>,
    /// When the run ended while `STALLED` (Unix ms, the head's clock): the
    /// stall ended with the run, and nobody needs to look at it any more.
    /// Absent for a live run and for a run that did not end stalled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
    /// For `STALLED`: the capture of the ranks' stacks the stall opened,
    /// in short (the whole capture is at `GET /api/train/runs/{id}/stacks`).
    /// Absent when none was opened (a run whose ranks have no watcher).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<StallCapture>,
}

/// The capture a stall opened, in short: which, whether it is complete,
/// and where to look first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct StallCapture {
    /// The capture's number within the run.
    pub capture_id: u64,
    /// Pending until every rank answered or its deadline passed.
    pub state: crate::api::CaptureState,
    /// Its suspects, once complete (at most 1,024).
    #[serde(default)]
    #[cfg_attr(feature = "schemars", schemars(length(max = 1024)))]
    pub suspects: Vec<crate::api::StackSuspect>,
}

impl StallCapture {
    /// Capture `capture_id` in `state`, naming `suspects`.
    pub fn new(
        capture_id: u64,
        state: crate::api::CaptureState,
        suspects: Vec<crate::api::StackSuspect>,
    ) -> Self {
        Self { capture_id, state, suspects }
    }
}

impl RunHealth {
    /// Health `state` since `since_ms`, naming `ranks`, described by
    /// `detail`, with no stragglers.
    pub fn new(state: HealthState, since_ms: u64, ranks: Vec<u32>, detail: String) -> Self {
        Self {
            state,
            since_ms,
            ranks,
            detail,
            stragglers: Vec::new(),
            last_advance_ms: None,
            ended_ms: None,
            capture: None,
        }
    }

    /// The same health, saying when a rank last advanced before it.
    pub fn with_last_advance(mut self, last_advance_ms: u64) -> Self {
        self.last_advance_ms = Some(last_advance_ms);
        self
    }

    /// True for a `STALLED` health that is still live: its run has not
    /// ended.
    pub fn is_live_stall(&self) -> bool {
        self.state == HealthState::Stalled && self.ended_ms.is_none()
    }

    /// The same health, naming `stragglers`.
    pub fn with_stragglers(mut self, stragglers: Vec<Straggler>) -> Self {
        self.stragglers = stragglers;
        self
    }
}

/// Extension: a rank whose own time per step is persistently slower than
/// its peers'.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct Straggler {
    /// The rank's world rank.
    pub rank: u32,
    /// The rank's smoothed time per step, in ms.
    pub step_time_ms: f64,
    /// The median of its peers' smoothed times per step, in ms.
    pub peers_step_time_ms: f64,
    /// `step_time_ms / peers_step_time_ms`, to 2 decimals.
    pub ratio: f64,
}

impl Straggler {
    /// Rank `rank`, at `step_time_ms` a step where its peers take
    /// `peers_step_time_ms`; the ratio is computed and rounded to 2 decimals.
    pub fn new(rank: u32, step_time_ms: f64, peers_step_time_ms: f64) -> Self {
        let ratio = (step_time_ms / peers_step_time_ms * 100.0).round() / 100.0;
        Self { rank, step_time_ms, peers_step_time_ms, ratio }
    }
}

/// Extension: one change of a run's health, as its `health_history` keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct HealthChange {
    /// The state the run moved to.
    pub state: HealthState,
    /// When (Unix ms, the head's clock).
    pub at_ms: u64,
    /// The ranks its health named then. At most 1,024.
    #[serde(default)]
    #[cfg_attr(feature = "schemars", schemars(length(max = 1024)))]
    pub ranks: Vec<u32>,
    /// The ranks its health named stragglers then. At most 1,024.
    #[serde(default)]
    #[cfg_attr(feature = "schemars", schemars(length(max = 1024)))]
    pub stragglers: Vec<u32>,
    /// For `STALLED`: when a rank last advanced before the stall (Unix ms),
    /// from which the stall's length is counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_advance_ms: Option<u64>,
    /// On the last `STALLED` change of a run that ended while stalled: when
    /// it ended (Unix ms), which resolved the stall.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_ms: Option<u64>,
}

impl HealthChange {
    /// A change to `state` at `at_ms`, naming `ranks` and no stragglers.
    pub fn new(state: HealthState, at_ms: u64, ranks: Vec<u32>) -> Self {
        Self { state, at_ms, ranks, stragglers: Vec::new(), last_advance_ms: None, ended_ms: None }
    }

    /// The same change, naming `stragglers`.
    pub fn with_stragglers(mut self, stragglers: Vec<u32>) -> Self {
        self.stragglers = stragglers;
        self
    }
}

/// The rules of a run's `health` and `health_history`.
pub(crate) fn check(
    health: Option<&RunHealth>,
    history: &[HealthChange],
) -> Result<(), ValidationError> {
    if let Some(health) = health {
        if health.ranks.len() > MAX_HEALTH_RANKS {
            let rule = Rule::TooMany { max: MAX_HEALTH_RANKS };
            return Err(ValidationError::new("health.ranks", rule));
        }
        if health.detail.contains('\0') {
            return Err(ValidationError::new("health.detail", Rule::NulCharacter));
        }
        if health.detail.chars().count() > MAX_HEALTH_DETAIL_LEN {
            let rule = Rule::TooLong { max: MAX_HEALTH_DETAIL_LEN };
            return Err(ValidationError::new("health.detail", rule));
        }
        if health.stragglers.len() > MAX_HEALTH_RANKS {
            let rule = Rule::TooMany { max: MAX_HEALTH_RANKS };
            return Err(ValidationError::new("health.stragglers", rule));
        }
        for (i, straggler) in health.stragglers.iter().enumerate() {
            let numbers = [
                ("step_time_ms", straggler.step_time_ms),
                ("peers_step_time_ms", straggler.peers_step_time_ms),
                ("ratio", straggler.ratio),
            ];
            for (name, value) in numbers {
                if !value.is_finite() {
                    let field = format!("health.stragglers[{i}].{name}");
                    return Err(ValidationError::new(field, Rule::NotFinite));
                }
            }
        }
    }
    if history.len() > MAX_HEALTH_HISTORY {
        let rule = Rule::TooMany { max: MAX_HEALTH_HISTORY };
        return Err(ValidationError::new("health_history", rule));
    }
    for (i, change) in history.iter().enumerate() {
        if change.ranks.len() > MAX_HEALTH_RANKS {
            let rule = Rule::TooMany { max: MAX_HEALTH_RANKS };
            return Err(ValidationError::new(format!("health_history[{i}].ranks"), rule));
        }
        if change.stragglers.len() > MAX_HEALTH_RANKS {
            let rule = Rule::TooMany { max: MAX_HEALTH_RANKS };
            return Err(ValidationError::new(format!("health_history[{i}].stragglers"), rule));
        }
    }
    Ok(())
}
