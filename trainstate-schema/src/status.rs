//! Statuses of runs and workers, and the cause of a run's end.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The lifecycle status of a run, spelled as Ray spells it: Ray Train V2's
/// statuses, of which V1 knows `RUNNING`, `FINISHED`, `ERRORED` and
/// `ABORTED`.
///
/// `INITIALIZING`, `SCHEDULING`, `RUNNING`, `RESTARTING` and `RESIZING`
/// are live; any live status may move to any other and to a terminal one.
/// `FINISHED`, `ERRORED` and `ABORTED` are terminal and final. A V1
/// document shows every live status as `RUNNING` ([`RunStatus::v1`]).
/// `STARTED` is accepted on input as Ray's deprecated spelling of
/// `RUNNING` and is never written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum RunStatus {
    /// The run is being set up.
    Initializing,
    /// The run waits for its workers to be scheduled.
    Scheduling,
    /// The run is live: its workers train.
    #[serde(alias = "STARTED")]
    Running,
    /// The run recovers from a failure: a new attempt is on its way.
    Restarting,
    /// The run changes its number of workers.
    Resizing,
    /// The run ended successfully.
    Finished,
    /// The run ended with an error raised by a worker or the controller.
    Errored,
    /// The run was stopped before it finished (user interrupt, lost controller, ...).
    Aborted,
}

impl RunStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [RunStatus; 8] = [
        RunStatus::Initializing,
        RunStatus::Scheduling,
        RunStatus::Running,
        RunStatus::Restarting,
        RunStatus::Resizing,
        RunStatus::Finished,
        RunStatus::Errored,
        RunStatus::Aborted,
    ];

    /// True for `FINISHED`, `ERRORED` and `ABORTED`: the run has ended and
    /// its status is final.
    pub fn is_terminal(self) -> bool {
        matches!(self, RunStatus::Finished | RunStatus::Errored | RunStatus::Aborted)
    }

    /// True for every status that is not terminal.
    pub fn is_live(self) -> bool {
        !self.is_terminal()
    }

    /// The status as a V1 reader sees it: every live status is `RUNNING`.
    pub fn v1(self) -> RunStatus {
        if self.is_live() { RunStatus::Running } else { self }
    }

    /// True when a filter on this status keeps a run with `status`: as V1
    /// readers see runs, `RUNNING` keeps every live run; every other status
    /// keeps exactly itself.
    pub fn matches(self, status: RunStatus) -> bool {
        if self == RunStatus::Running { status.is_live() } else { self == status }
    }

    /// The wire spelling, for example `"RUNNING"`.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Initializing => "INITIALIZING",
            RunStatus::Scheduling => "SCHEDULING",
            RunStatus::Running => "RUNNING",
            RunStatus::Restarting => "RESTARTING",
            RunStatus::Resizing => "RESIZING",
            RunStatus::Finished => "FINISHED",
            RunStatus::Errored => "ERRORED",
            RunStatus::Aborted => "ABORTED",
        }
    }

    /// Parses the wire spelling (also the deprecated `STARTED`).
    pub fn parse(text: &str) -> Option<Self> {
        if text == "STARTED" {
            return Some(RunStatus::Running);
        }
        RunStatus::ALL.into_iter().find(|s| s.as_str() == text)
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
            "description": "The lifecycle status of a run, spelled as Ray spells it (Ray Train V2's statuses). INITIALIZING, SCHEDULING, RUNNING, RESTARTING and RESIZING are live; FINISHED, ERRORED and ABORTED are terminal and final. A V1 document's run_status shows every live status as RUNNING.",
            "oneOf": [
                { "const": "INITIALIZING", "type": "string", "description": "The run is being set up." },
                { "const": "SCHEDULING", "type": "string", "description": "The run waits for its workers to be scheduled." },
                { "const": "RUNNING", "type": "string", "description": "The run is live: its workers train." },
                { "const": "RESTARTING", "type": "string", "description": "The run recovers from a failure: a new attempt is on its way." },
                { "const": "RESIZING", "type": "string", "description": "The run changes its number of workers." },
                { "const": "FINISHED", "type": "string", "description": "The run ended successfully." },
                { "const": "ERRORED", "type": "string", "description": "The run ended with an error raised by a worker or the controller." },
                { "const": "ABORTED", "type": "string", "description": "The run was stopped before it finished (user interrupt, lost controller, ...)." },
                { "const": "STARTED", "type": "string", "deprecated": true, "description": "Ray's deprecated spelling of RUNNING: accepted on input, never written." }
            ]
        })
    }
}

/// The status of one attempt (worker group) of a run, spelled as Ray
/// Train V2 spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum AttemptStatus {
    /// The attempt's workers are being scheduled.
    Pending,
    /// The attempt's workers train.
    Running,
    /// The attempt ended successfully.
    Finished,
    /// The attempt ended with an error raised by a worker.
    Errored,
    /// The attempt was stopped: replaced by another, or its run was aborted.
    Aborted,
}

impl AttemptStatus {
    /// True for `FINISHED`, `ERRORED` and `ABORTED`.
    pub fn is_terminal(self) -> bool {
        matches!(self, AttemptStatus::Finished | AttemptStatus::Errored | AttemptStatus::Aborted)
    }

    /// The wire spelling, for example `"PENDING"`.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptStatus::Pending => "PENDING",
            AttemptStatus::Running => "RUNNING",
            AttemptStatus::Finished => "FINISHED",
            AttemptStatus::Errored => "ERRORED",
            AttemptStatus::Aborted => "ABORTED",
        }
    }

    /// The attempt status that ends an attempt when its run ends with
    /// `status`; `None` for a live status.
    pub fn ending(status: RunStatus) -> Option<AttemptStatus> {
        match status {
            RunStatus::Finished => Some(AttemptStatus::Finished),
            RunStatus::Errored => Some(AttemptStatus::Errored),
            RunStatus::Aborted => Some(AttemptStatus::Aborted),
            _ => None,
        }
    }
}

impl fmt::Display for AttemptStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
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
/// human-readable `status_detail`. Each kind has a [`CauseClass`], which
/// says whose fault it was; `docs/causes.md` says how each is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum CauseKind {
    /// The training code raised an error, or its process exited with a
    /// non-zero status.
    UserError,
    /// The system failed under the training code, and how is not known
    /// more closely (a rank killed by a signal no one is known to have
    /// sent, a rank that vanished).
    SystemError,
    /// The run's controller stopped heartbeating; the head aborted the run.
    /// For a run of the rendezvous (no controller): no rank was heard from
    /// within the lease.
    LostController,
    /// A person or a scheduler interrupted the run.
    UserInterrupt,
    /// The kernel's out-of-memory killer ended a rank: its cgroup's memory
    /// limit, or the machine's memory, was reached.
    #[serde(rename = "OOM")]
    Oom,
    /// The scheduler took the allocation back before its time: a preempted
    /// job, a node drained for a job of higher priority or a spot instance
    /// reclaimed.
    Preempted,
    /// The allocation's time ran out (Slurm's time limit, a job's deadline).
    Timeout,
    /// A node died under the run.
    NodeLost,
    /// A device failed: a GPU's uncorrectable memory error, an Xid of its
    /// driver, a GPU fallen off the bus.
    Hardware,
    /// The run made no progress and was ended for it: its watcher ended a
    /// stalled rank because the run asked for it (`on_stall: ABORT`), so
    /// that the launcher restarts it from its checkpoint. The cause's
    /// detail links the stacks captured at the stall.
    NoProgress,
}

impl CauseKind {
    /// Every kind, in documentation order.
    pub const ALL: [CauseKind; 10] = [
        CauseKind::UserError,
        CauseKind::SystemError,
        CauseKind::LostController,
        CauseKind::UserInterrupt,
        CauseKind::Oom,
        CauseKind::Preempted,
        CauseKind::Timeout,
        CauseKind::NodeLost,
        CauseKind::Hardware,
        CauseKind::NoProgress,
    ];

    /// The wire spelling, for example `"LOST_CONTROLLER"`.
    pub fn as_str(self) -> &'static str {
        match self {
            CauseKind::UserError => "USER_ERROR",
            CauseKind::SystemError => "SYSTEM_ERROR",
            CauseKind::LostController => "LOST_CONTROLLER",
            CauseKind::UserInterrupt => "USER_INTERRUPT",
            CauseKind::Oom => "OOM",
            CauseKind::Preempted => "PREEMPTED",
            CauseKind::Timeout => "TIMEOUT",
            CauseKind::NodeLost => "NODE_LOST",
            CauseKind::Hardware => "HARDWARE",
            CauseKind::NoProgress => "NO_PROGRESS",
        }
    }

    /// The kind spelled `text` on the wire, without regard to case.
    pub fn parse(text: &str) -> Option<CauseKind> {
        CauseKind::ALL.into_iter().find(|kind| kind.as_str().eq_ignore_ascii_case(text))
    }

    /// Whose fault a failure of this kind is, unless what the run did
    /// before says otherwise (see [`CauseClass`]).
    pub fn class(self) -> CauseClass {
        match self {
            CauseKind::UserError => CauseClass::Application,
            CauseKind::SystemError
            | CauseKind::LostController
            | CauseKind::Oom
            | CauseKind::NodeLost
            | CauseKind::Hardware => CauseClass::Infrastructure,
            CauseKind::UserInterrupt | CauseKind::Preempted | CauseKind::Timeout => {
                CauseClass::Interrupted
            }
            CauseKind::NoProgress => CauseClass::NoProgress,
        }
    }
}

impl fmt::Display for CauseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whose fault the end of a run was, coarsely: what a person paged for it
/// would first want to know. Each [`CauseKind`] has one
/// ([`CauseKind::class`]), except that a run that had stopped making
/// progress (STALLED) and was then interrupted, timed out or lost is
/// `NO_PROGRESS`: the hang, not the signal that ended it, is the news.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum CauseClass {
    /// The machine failed under the code: out of memory, a node lost, a
    /// device fault, a rank killed by no one known, the controller lost.
    Infrastructure,
    /// The training code failed: it raised, or exited non-zero.
    Application,
    /// Someone stopped the run on purpose: a person, the scheduler's
    /// preemption or its time limit.
    Interrupted,
    /// The run had stopped making progress before it ended (it was
    /// STALLED); what ended it followed the hang.
    NoProgress,
}

impl CauseClass {
    /// Every class, in documentation order.
    pub const ALL: [CauseClass; 4] = [
        CauseClass::Infrastructure,
        CauseClass::Application,
        CauseClass::Interrupted,
        CauseClass::NoProgress,
    ];

    /// The wire spelling, for example `"NO_PROGRESS"`.
    pub fn as_str(self) -> &'static str {
        match self {
            CauseClass::Infrastructure => "INFRASTRUCTURE",
            CauseClass::Application => "APPLICATION",
            CauseClass::Interrupted => "INTERRUPTED",
            CauseClass::NoProgress => "NO_PROGRESS",
        }
    }

    /// The class spelled `text` on the wire, without regard to case.
    pub fn parse(text: &str) -> Option<CauseClass> {
        CauseClass::ALL.into_iter().find(|class| class.as_str().eq_ignore_ascii_case(text))
    }
}

impl fmt::Display for CauseClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a failed rank is known to have failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum FailureMode {
    /// The rank reported an error it raised (an uncaught exception).
    Raised,
    /// The rank's process exited with a non-zero status without reporting
    /// an error (`sys.exit(1)`, `os._exit`, a C library's `exit`).
    Exited,
    /// The rank's process was killed by a signal (SIGKILL, which is also
    /// what the kernel's out-of-memory killer sends, SIGSEGV, SIGTERM, ...),
    /// as its watcher saw.
    Killed,
    /// The rank's process died without reporting, and how is not known.
    Vanished,
}

impl FailureMode {
    /// The wire spelling, for example `"KILLED"`.
    pub fn as_str(self) -> &'static str {
        match self {
            FailureMode::Raised => "RAISED",
            FailureMode::Exited => "EXITED",
            FailureMode::Killed => "KILLED",
            FailureMode::Vanished => "VANISHED",
        }
    }

    /// True when the rank died without reporting its own end: its watcher
    /// reported it (`EXITED`, `KILLED`, `VANISHED`).
    pub fn died_unreported(self) -> bool {
        !matches!(self, FailureMode::Raised)
    }
}

impl fmt::Display for FailureMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The machine-readable cause of an `ERRORED` or `ABORTED` run.
///
/// Its `class` is the head's: read from a record that has none (written
/// before classes were kept), and from a client, it is the kind's own
/// ([`CauseKind::class`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(from = "RunCauseFields")]
#[non_exhaustive]
pub struct RunCause {
    /// What kind of failure ended the run.
    pub kind: CauseKind,
    /// Whose fault it was, coarsely.
    pub class: CauseClass,
    /// The world rank of the worker that failed first in time, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_world_rank: Option<u32>,
    /// How that rank is known to have failed, when a rank did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub how: Option<FailureMode>,
    /// When that rank failed (Unix ms, by the clock of the rank's machine),
    /// when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_at_ms: Option<u64>,
    /// What the rank that failed first reported, in one line (its first
    /// line and, when it has more, its last, where a Python traceback says
    /// what was raised), when the head judged the cause from the ranks'
    /// reports: what a notification shows, without reading
    /// `status_detail`, which also tells what followed the failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<String>,
}

/// A [`RunCause`] as read: its `class` may be missing (an older record or
/// client), and is then the kind's own.
#[derive(Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
struct RunCauseFields {
    /// What kind of failure ended the run.
    kind: CauseKind,
    /// Whose fault it was, coarsely: the head's, kept with the record.
    /// Without it, the kind's own.
    #[serde(default)]
    class: Option<CauseClass>,
    /// The world rank of the worker that failed first in time, when one did.
    #[serde(default)]
    failed_world_rank: Option<u32>,
    /// How that rank is known to have failed, when a rank did.
    #[serde(default)]
    how: Option<FailureMode>,
    /// When that rank failed (Unix ms, by the clock of the rank's machine),
    /// when known.
    #[serde(default)]
    failed_at_ms: Option<u64>,
    /// What the rank that failed first reported, in one line (its first
    /// line and, when it has more, its last, where a Python traceback says
    /// what was raised), when the head judged the cause from the ranks'
    /// reports: what a notification shows, without reading
    /// `status_detail`, which also tells what followed the failure.
    #[serde(default)]
    report: Option<String>,
}

impl From<RunCauseFields> for RunCause {
    fn from(fields: RunCauseFields) -> Self {
        RunCause {
            kind: fields.kind,
            class: fields.class.unwrap_or(fields.kind.class()),
            failed_world_rank: fields.failed_world_rank,
            how: fields.how,
            failed_at_ms: fields.failed_at_ms,
            report: fields.report,
        }
    }
}

impl RunCause {
    /// A cause of `kind`, of the kind's own class, with the world rank that
    /// failed first if known.
    pub fn new(kind: CauseKind, failed_world_rank: Option<u32>) -> Self {
        Self {
            kind,
            class: kind.class(),
            failed_world_rank,
            how: None,
            failed_at_ms: None,
            report: None,
        }
    }

    /// This cause, saying how its rank failed and when.
    pub fn with_failure(self, how: Option<FailureMode>, failed_at_ms: Option<u64>) -> Self {
        Self { how, failed_at_ms, ..self }
    }

    /// This cause, of class `class`.
    pub fn with_class(self, class: CauseClass) -> Self {
        Self { class, ..self }
    }
}
