//! Statuses of runs and workers, and the cause of a run's end.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The lifecycle status of a run, spelled as Ray spells it.
///
/// `STARTED` is accepted on input as Ray's deprecated spelling of `RUNNING`
/// and is never written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum RunStatus {
    /// The run is live: its controller reports it.
    #[serde(alias = "STARTED")]
    Running,
    /// The run ended successfully.
    Finished,
    /// The run ended with an error raised by a worker or the controller.
    Errored,
    /// The run was stopped before it finished (user interrupt, lost controller, ...).
    Aborted,
}

impl RunStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [RunStatus; 4] =
        [RunStatus::Running, RunStatus::Finished, RunStatus::Errored, RunStatus::Aborted];

    /// True for `FINISHED`, `ERRORED` and `ABORTED`: the run has ended and
    /// its status is final.
    pub fn is_terminal(self) -> bool {
        !matches!(self, RunStatus::Running)
    }

    /// The wire spelling, for example `"RUNNING"`.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "RUNNING",
            RunStatus::Finished => "FINISHED",
            RunStatus::Errored => "ERRORED",
            RunStatus::Aborted => "ABORTED",
        }
    }

    /// Parses the wire spelling (also the deprecated `STARTED`).
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "RUNNING" | "STARTED" => Some(RunStatus::Running),
            "FINISHED" => Some(RunStatus::Finished),
            "ERRORED" => Some(RunStatus::Errored),
            "ABORTED" => Some(RunStatus::Aborted),
            _ => None,
        }
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(feature = "schemars")]
impl schemars::JsonSchema for RunStatus {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "RunStatus".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "The lifecycle status of a run, spelled as Ray spells it. RUNNING is live; FINISHED, ERRORED and ABORTED are terminal and final.",
            "oneOf": [
                { "const": "RUNNING", "type": "string", "description": "The run is live: its controller reports it." },
                { "const": "FINISHED", "type": "string", "description": "The run ended successfully." },
                { "const": "ERRORED", "type": "string", "description": "The run ended with an error raised by a worker or the controller." },
                { "const": "ABORTED", "type": "string", "description": "The run was stopped before it finished (user interrupt, lost controller, ...)." },
                { "const": "STARTED", "type": "string", "deprecated": true, "description": "Ray's deprecated spelling of RUNNING: accepted on input, never written." }
            ]
        })
    }
}

/// Whether a worker's process is alive, spelled as Ray spells it.
///
/// Unconstrained with respect to the run's status: Ray's finished runs often
/// still say `ALIVE`. Workers of an ended attempt are `DEAD`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum ActorStatus {
    /// The worker's process is alive.
    Alive,
    /// The worker's process has exited.
    Dead,
}

impl ActorStatus {
    /// The wire spelling, for example `"ALIVE"`.
    pub fn as_str(self) -> &'static str {
        match self {
            ActorStatus::Alive => "ALIVE",
            ActorStatus::Dead => "DEAD",
        }
    }
}

impl fmt::Display for ActorStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What ended a run that did not finish: machine-readable, beside the
/// human-readable `status_detail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum CauseKind {
    /// The training code raised an error.
    UserError,
    /// The system failed under the training code (node lost, out of memory, ...).
    SystemError,
    /// The run's controller stopped heartbeating; the head aborted the run.
    LostController,
    /// A person or a scheduler interrupted the run.
    UserInterrupt,
}

impl CauseKind {
    /// The wire spelling, for example `"LOST_CONTROLLER"`.
    pub fn as_str(self) -> &'static str {
        match self {
            CauseKind::UserError => "USER_ERROR",
            CauseKind::SystemError => "SYSTEM_ERROR",
            CauseKind::LostController => "LOST_CONTROLLER",
            CauseKind::UserInterrupt => "USER_INTERRUPT",
        }
    }
}

impl fmt::Display for CauseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The machine-readable cause of an `ERRORED` or `ABORTED` run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct RunCause {
    /// What kind of failure ended the run.
    pub kind: CauseKind,
    /// The world rank of the worker that failed first, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_world_rank: Option<u32>,
}

impl RunCause {
    /// A cause of `kind`, with the world rank that failed first if known.
    pub fn new(kind: CauseKind, failed_world_rank: Option<u32>) -> Self {
        Self { kind, failed_world_rank }
    }
}
