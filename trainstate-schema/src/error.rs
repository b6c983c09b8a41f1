//! The one error of this crate: a value broke a rule of the wire format.

use std::fmt;

/// A document or value broke one rule of the wire format.
///
/// It names the field by its path in the JSON document (for example
/// `workers[3].world_rank`) and the rule that was broken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationError {
    field: String,
    rule: Rule,
}

impl ValidationError {
    /// Builds an error for `field` (a JSON path such as `workers[3].pid`).
    pub fn new(field: impl Into<String>, rule: Rule) -> Self {
        Self { field: field.into(), rule }
    }

    /// The path of the offending field, for example `workers[3].world_rank`.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The rule that was broken.
    pub fn rule(&self) -> &Rule {
        &self.rule
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.rule)
    }
}

impl std::error::Error for ValidationError {}

/// The rules of the wire format, one variant each.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rule {
    /// A run id must match `^[A-Za-z0-9_-]{1,128}$`.
    RunIdFormat,
    /// The text must not be empty.
    Empty,
    /// The text is longer than the limit, counted in characters.
    TooLong {
        /// The limit, in characters.
        max: usize,
    },
    /// The text contains a control character.
    ControlCharacter,
    /// The text contains a NUL character.
    NulCharacter,
    /// The list is longer than the limit.
    TooMany {
        /// The limit, in items.
        max: usize,
    },
    /// Two workers have the same `world_rank`.
    DuplicateWorldRank {
        /// The rank that appears twice.
        rank: u32,
    },
    /// A `world_rank` is outside `0..n` for `n` workers.
    WorldRankOutOfRange {
        /// The rank.
        rank: u32,
        /// The number of workers.
        workers: usize,
    },
    /// Two workers on the same node have the same `local_rank`.
    DuplicateLocalRank {
        /// The rank that appears twice on the node.
        rank: u32,
    },
    /// Workers on one node disagree about the node's `node_rank`.
    InconsistentNodeRank {
        /// The node rank given by the first worker on the node.
        expected: u32,
    },
    /// Two distinct nodes have the same `node_rank`.
    NodeRankShared {
        /// The node rank used by both nodes.
        rank: u32,
    },
    /// The text is not an IPv4 or IPv6 address.
    IpAddress,
    /// A pid must be greater than zero.
    PidZero,
    /// A GPU id appears twice on one worker.
    DuplicateGpuId {
        /// The GPU id that appears twice.
        gpu_id: u32,
    },
    /// A resource amount must be finite.
    NotFinite,
    /// A resource amount must be zero or more.
    Negative,
    /// Two datasets of a run have the same `name`.
    DuplicateDatasetName,
    /// Two attempts of a run have the same `attempt_id`.
    DuplicateAttemptId,
    /// A live run has no end time.
    EndTimeWhileRunning,
    /// An end time is before its start time.
    EndBeforeStart,
    /// A time is before the start of the run or of the attempt before it.
    StartBeforePrevious,
    /// The run's `resources` must list each worker's `resources`, in worker order.
    ResourcesMismatch,
    /// An ended attempt must list its workers and its end time.
    EndedAttemptIncomplete,
    /// The current (last) attempt's workers are the run's `workers`; it must not list its own.
    CurrentAttemptHasWorkers,
    /// No longer checked: a live run's current attempt may have ended (Ray
    /// Train V2 reports an attempt's end before the run's next status).
    #[deprecated(note = "a live run's current attempt may have ended")]
    CurrentAttemptEnded,
    /// `run_status` must be `status` as V1 shows it (every live status is RUNNING).
    StatusMismatch,
    /// An attempt has an end time exactly when its status is terminal.
    AttemptStatusMismatch,
    /// A time (Unix ms) outside the plausible range
    /// [`MIN_TIME_MS`](crate::limits::MIN_TIME_MS)..=[`MAX_TIME_MS`](crate::limits::MAX_TIME_MS)
    /// (years 2000 to 2200): a time in seconds or nanoseconds, say.
    ImplausibleTime,
    /// Only an `ERRORED` or `ABORTED` run or attempt has a cause.
    CauseWithoutFailure,
    /// `LOST_CONTROLLER` is decided by the head's lease sweep, never written
    /// by a client.
    CauseReservedForHead,
    /// A `failed_world_rank` outside `0..n` for a run of `n` workers.
    FailedRankOutOfRange {
        /// The rank.
        rank: u32,
        /// The number of workers.
        workers: usize,
    },
    /// An end time before the start of the run's current attempt.
    EndBeforeAttemptStart,
    /// The JSON nests deeper than the limit.
    TooDeep {
        /// The limit, in levels.
        max: usize,
    },
    /// The JSON is larger than the limit.
    TooLarge {
        /// The limit, in bytes.
        max: usize,
    },
    /// The run's stored JSON would be larger than
    /// [`MAX_RUN_BYTES`](crate::limits::MAX_RUN_BYTES); the error names the
    /// run's largest member.
    RunTooLarge {
        /// The limit, in bytes.
        max: usize,
        /// The size the run's JSON would have, in bytes.
        size: usize,
    },
    /// `dropped_workers` is only on an ended attempt that is not the
    /// current one, with `workers` empty.
    DroppedWorkersListed,
    /// A metric name must be 1 to 128 of `A-Z a-z 0-9 _ . : / -`.
    MetricNameFormat,
    /// The text must be printable ASCII (no control characters).
    PrintableAscii,
    /// A number outside its allowed range.
    OutOfRange {
        /// The least value allowed.
        min: u64,
        /// The greatest value allowed.
        max: u64,
    },
    /// A report would bring a run past the limit of distinct metric names.
    TooManyMetricNames {
        /// The limit, in names per run.
        max: usize,
    },
    /// A number must be finite, greater than 0 and at most the limit.
    PositiveUpTo {
        /// The greatest value allowed.
        max: u64,
    },
    /// A progress report carries the same rank twice.
    DuplicateRank {
        /// The rank that appears twice.
        rank: u32,
    },
    /// A checkpoint mark must not be ahead of the rank's own step.
    CheckpointAheadOfStep {
        /// The rank's step.
        step: u64,
    },
    /// A checkpoint mark must not go back from the rank's previous mark in
    /// the same attempt.
    CheckpointGoesBack {
        /// The rank's previous mark.
        previous: u64,
    },
    /// A run's goodput buckets must add up to its `wall_ms`.
    GoodputSum {
        /// What they add up to.
        sum: u64,
    },
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::RunIdFormat => write!(f, "must match {}", crate::RUN_ID_PATTERN),
            Rule::Empty => f.write_str("must not be empty"),
            Rule::TooLong { max } => write!(f, "must be at most {max} characters"),
            Rule::ControlCharacter => f.write_str("must not contain control characters"),
            Rule::NulCharacter => f.write_str("must not contain NUL characters"),
            Rule::TooMany { max } => write!(f, "must have at most {max} items"),
            Rule::DuplicateWorldRank { rank } => {
                write!(f, "world_rank {rank} is used by more than one worker")
            }
            Rule::WorldRankOutOfRange { rank, workers } => write!(
                f,
                "world_rank {rank} is out of range: world ranks of {workers} workers are 0..{workers}"
            ),
            Rule::DuplicateLocalRank { rank } => {
                write!(f, "local_rank {rank} is used twice on this node")
            }
            Rule::InconsistentNodeRank { expected } => write!(
                f,
                "all workers on one node_id must share one node_rank (first seen: {expected})"
            ),
            Rule::NodeRankShared { rank } => {
                write!(f, "node_rank {rank} is used by more than one node_id")
            }
            Rule::IpAddress => f.write_str("must be an IPv4 or IPv6 address"),
            Rule::PidZero => f.write_str("must be greater than 0"),
            Rule::DuplicateGpuId { gpu_id } => {
                write!(f, "gpu id {gpu_id} appears twice on this worker")
            }
            Rule::NotFinite => f.write_str("must be a finite number"),
            Rule::Negative => f.write_str("must be zero or more"),
            Rule::DuplicateDatasetName => f.write_str("dataset names must be unique within a run"),
            Rule::DuplicateAttemptId => f.write_str("attempt ids must be unique within a run"),
            Rule::EndTimeWhileRunning => {
                f.write_str("must be null while the run is live (RUNNING or another live status)")
            }
            Rule::EndBeforeStart => f.write_str("must not be before the start time"),
            Rule::StartBeforePrevious => {
                f.write_str("must not be before the run's start or the previous attempt's start")
            }
            Rule::ResourcesMismatch => {
                f.write_str("must list each worker's resources, in the order of workers")
            }
            Rule::EndedAttemptIncomplete => {
                f.write_str("an ended attempt must list its workers and its end_time_ms")
            }
            Rule::CurrentAttemptHasWorkers => f.write_str(
                "the current (last) attempt must not list workers: its workers are the run's workers",
            ),
            #[allow(deprecated)]
            Rule::CurrentAttemptEnded => {
                f.write_str("the current attempt of a RUNNING run must have end_time_ms null")
            }
            Rule::StatusMismatch => f.write_str(
                "run_status must be status as V1 shows it: RUNNING for every live status",
            ),
            Rule::AttemptStatusMismatch => f.write_str(
                "an attempt has end_time_ms exactly when its status is FINISHED, ERRORED or ABORTED",
            ),
            Rule::ImplausibleTime => write!(
                f,
                "must be a Unix time in milliseconds between {} (2000-01-01) and {} (2200-01-01)",
                crate::limits::MIN_TIME_MS,
                crate::limits::MAX_TIME_MS
            ),
            Rule::CauseWithoutFailure => {
                f.write_str("only an ERRORED or ABORTED run or attempt has a cause")
            }
            Rule::CauseReservedForHead => f.write_str(
                "LOST_CONTROLLER is decided by the head when a run's lease expires, never by a client",
            ),
            Rule::FailedRankOutOfRange { rank, workers } => write!(
                f,
                "failed_world_rank {rank} is out of range: world ranks of {workers} workers are 0..{workers}"
            ),
            Rule::EndBeforeAttemptStart => {
                f.write_str("must not be before the start of the run's current attempt")
            }
            Rule::TooDeep { max } => write!(f, "must nest at most {max} levels deep"),
            Rule::TooLarge { max } => write!(f, "must be at most about {max} bytes of JSON"),
            Rule::RunTooLarge { max, size } => write!(
                f,
                "is the largest member of a run whose JSON would take {size} bytes; a run takes at most {max} bytes"
            ),
            Rule::DroppedWorkersListed => f.write_str(
                "only an ended attempt before the current one has dropped_workers, and then workers is []",
            ),
            Rule::MetricNameFormat => {
                f.write_str("must be 1 to 128 characters of A-Z a-z 0-9 _ . : / -")
            }
            Rule::PrintableAscii => {
                f.write_str("must be printable ASCII, without control characters")
            }
            Rule::OutOfRange { min, max } => write!(f, "must be {min} to {max}"),
            Rule::TooManyMetricNames { max } => write!(
                f,
                "would bring the run past {max} distinct metric names: a run keeps at most {max}"
            ),
            Rule::PositiveUpTo { max } => {
                write!(f, "must be a finite number greater than 0 and at most {max}")
            }
            Rule::DuplicateRank { rank } => {
                write!(f, "rank {rank} is reported more than once: one entry per rank")
            }
            Rule::CheckpointAheadOfStep { step } => write!(
                f,
                "must not be ahead of the rank's own step ({step}): a checkpoint saves steps already taken"
            ),
            Rule::CheckpointGoesBack { previous } => write!(
                f,
                "must not go back from the rank's previous checkpoint mark ({previous}) in the same attempt"
            ),
            Rule::GoodputSum { sum } => write!(
                f,
                "must equal productive_ms plus every badput bucket ({sum})"
            ),
        }
    }
}
