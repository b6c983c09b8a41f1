//! The messages the state actor answers, and what they carry.

use std::time::Duration;

use trainstate_schema::api::{
    AttemptRequest, GoodputQuery, GoodputResponse, ProgressReport, ProgressResponse, StatusRequest,
};
use trainstate_schema::ray_v2;
use trainstate_schema::{
    CauseKind, NewRun, RunCause, RunId, RunStatus, TrainRunInfo, TrainWorkerInfo, WorkerList,
};

use crate::document::RunDocument;
use crate::error::{Reply, StateError};
use crate::events::Subscription;
use crate::query::{RunPage, RunQuery};

/// The registry name of the state actor when its configuration does not
/// name another.
pub const DEFAULT_STATE_ACTOR_NAME: &str = "trainstate.state_actor";

/// A change prepared for the state actor outside its turn, by the process
/// that runs it: opaque to everyone else (see
/// [`StateMessage::UpsertRayPrepared`]).
pub struct PreparedChange(Box<dyn std::any::Any + Send>);

impl PreparedChange {
    /// Wraps a prepared change.
    pub fn new<T: std::any::Any + Send>(change: T) -> Self {
        Self(Box::new(change))
    }

    /// The prepared change, if it is a `T`.
    pub fn into_inner<T: std::any::Any>(self) -> Option<T> {
        self.0.downcast().ok().map(|change| *change)
    }
}

impl std::fmt::Debug for PreparedChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PreparedChange")
    }
}

/// A request to the state actor. Writes are answered only once committed.
///
/// Exhaustive on purpose: the actor matches every variant, so a new
/// request is a compile error there, never a reply silently dropped.
#[derive(Debug)]
pub enum StateMessage {
    /// Registers a run. Repeating it with identical static metadata is a
    /// no-op that succeeds; with different metadata it is a conflict.
    Register {
        /// The run to register, already normalised: the actor stores
        /// [`NewRun::into_run`] at its own clock's time.
        run: Box<NewRun>,
        /// The bytes of the run's JSON as the caller received it, when it
        /// knows (an HTTP body's length): what sizes the call's deadline,
        /// so the run is not serialized again to count them.
        bytes: Option<u64>,
        /// The stored run and its lease.
        reply: Reply<Registration>,
    },
    /// Sets a run's status along a legal transition.
    SetStatus {
        /// The run.
        id: RunId,
        /// The new status.
        update: StatusUpdate,
        /// The stored run after the change.
        reply: Reply<RunDocument>,
    },
    /// Replaces the run's worker group with a new attempt.
    StartAttempt {
        /// The run.
        id: RunId,
        /// The new attempt.
        attempt: NewAttempt,
        /// The stored run after the change.
        reply: Reply<RunDocument>,
    },
    /// Creates or updates a run from Ray Train V2's whole run document, as
    /// Ray's controller writes it. Idempotent; a terminal run never moves
    /// back to live.
    UpsertRayRun {
        /// The whole V2 run.
        run: Box<ray_v2::TrainRun>,
        /// When the change happened (Unix ms), if the writer knows better
        /// than the actor's clock (Ray's time of an export event).
        at_ms: Option<u64>,
        /// The stored run after the change.
        reply: Reply<RunDocument>,
    },
    /// Creates or updates an attempt of a run from Ray Train V2's whole
    /// attempt document. Idempotent; a terminal attempt never moves back to
    /// live, and a new attempt ends the one before it.
    UpsertRayAttempt {
        /// The whole V2 attempt.
        attempt: Box<ray_v2::TrainRunAttempt>,
        /// When the change happened (Unix ms), if the writer knows better
        /// than the actor's clock (Ray's time of an export event).
        at_ms: Option<u64>,
        /// The stored run after the change.
        reply: Reply<RunDocument>,
    },
    /// A Ray Train V2 write prepared off the actor's turn, by the process
    /// that runs the actor (its HTTP handlers: the document parsed,
    /// converted and validated against the committed version of its run).
    /// The actor takes it only if the run has not changed since; otherwise
    /// it answers `None`, and the write is prepared again.
    UpsertRayPrepared {
        /// The prepared write: opaque outside the actor's crate.
        prepared: PreparedChange,
        /// The size of the document it came from, in bytes (its deadline
        /// grows with it, as for every document).
        bytes: u64,
        /// The stored run after the change; `None` when it was prepared on
        /// a version of the run that is no longer the current one.
        reply: Reply<Option<RunDocument>>,
    },
    /// Renews a live run's lease.
    Heartbeat {
        /// The run.
        id: RunId,
        /// The lease, from now.
        reply: Reply<Duration>,
    },
    /// Records where the training loop of some ranks of a run is, as its
    /// controller reports it (the ranks of a rendezvous run report their
    /// own, with their heartbeats); renews the run's lease like a
    /// heartbeat.
    ReportProgress {
        /// The run.
        id: RunId,
        /// The report, checked ([`ProgressReport::check`]).
        report: Box<ProgressReport>,
        /// The attempt it was taken for, and the lease.
        reply: Reply<ProgressResponse>,
    },
    /// Reads one run.
    Get {
        /// The run.
        id: RunId,
        /// The stored run.
        reply: Reply<RunDocument>,
    },
    /// Lists runs, newest first, filtered and paged.
    List {
        /// Filters and paging.
        query: RunQuery,
        /// One page.
        reply: Reply<RunPage>,
    },
    /// The fleet's goodput: every retained run's time summed by cluster,
    /// node or run name over a window.
    Goodput {
        /// The window, what to sum by, and the cluster.
        query: GoodputQuery,
        /// The sums.
        reply: Reply<GoodputResponse>,
    },
    /// Subscribes to committed changes.
    Subscribe {
        /// Resume after this sequence number, if the events are still kept.
        after_seq: Option<u64>,
        /// The stream.
        reply: Reply<Subscription>,
    },
    /// Deletes an ended run.
    Delete {
        /// The run.
        id: RunId,
        /// Done.
        reply: Reply<()>,
    },
    /// Stores a run forwarded by the head of another cluster, as it is (a
    /// hub's write): repeating it is a no-op, and it never takes a run back
    /// to an earlier state.
    Forward {
        /// The run as its own head stores it; it names its cluster.
        run: Box<TrainRunInfo>,
        /// The run as stored here.
        reply: Reply<RunDocument>,
    },
    /// Runs the liveness sweep now: aborts every live run whose lease has
    /// expired. The actor also runs it periodically.
    SweepLeases {
        /// The ids of the runs it aborted.
        reply: Reply<Vec<RunId>>,
    },
    /// Decides now the health of the live runs whose health may change (a
    /// stall a rank's advance ended, a stall window just passed). The
    /// actor also decides it about once a second.
    DecideHealth {
        /// How many runs it decided.
        reply: Reply<usize>,
    },
    /// A request of the rendezvous, where the ranks of a launch without a
    /// controller report one run together.
    Rendezvous(crate::rendezvous::RendezvousMessage),
    /// Reads a run's stack captures, newest first (`GET .../stacks`). The
    /// actor only checks that the run is committed; the captures are read
    /// from the store on a blocking thread, off its turn.
    GetStacks {
        /// The run.
        id: RunId,
        /// Its captures.
        reply: Reply<trainstate_schema::api::StacksResponse>,
    },
    /// Posts to a run's stack captures (`POST .../stacks`): asks its ranks
    /// for their stacks (no ranks), keeps the ranks' answer to a capture
    /// (`capture_id`), or keeps a controller's own capture.
    PostStacks {
        /// The run.
        id: RunId,
        /// What is posted.
        request: Box<trainstate_schema::api::StacksRequest>,
        /// The capture as it now stands, and whether it was just opened.
        reply: Reply<(trainstate_schema::api::StackCapture, bool)>,
    },
}

/// The answer to a registration.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Registration {
    /// The run as stored.
    pub run: RunDocument,
    /// How long the run stays live without a heartbeat.
    pub lease: Duration,
    /// False when the run was already registered with the same metadata.
    pub created: bool,
}

impl Registration {
    /// A registration answer.
    pub fn new(run: RunDocument, lease: Duration, created: bool) -> Self {
        Self { run, lease, created }
    }
}

/// A status change of a run.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StatusUpdate {
    /// The new status.
    pub status: RunStatus,
    /// Human-readable detail. For `ERRORED`, the error's trace: the actor
    /// keeps its last 50,000 characters after Ray's
    /// `Rank {r} worker raised an error.` prefix.
    pub detail: String,
    /// The machine-readable cause of an `ERRORED` or `ABORTED` run.
    pub cause: Option<RunCause>,
    /// When the run ended (Unix ms); the actor stamps it if `None`.
    pub end_time_ms: Option<u64>,
    /// When the change happened (Unix ms), if the writer knows better than
    /// the actor's clock (a replay of Ray's events): what the run's status
    /// history records, and the end stamped when `end_time_ms` is `None`.
    pub at_ms: Option<u64>,
}

impl StatusUpdate {
    /// The run finished successfully.
    pub fn finished() -> Self {
        Self {
            status: RunStatus::Finished,
            detail: String::new(),
            cause: None,
            end_time_ms: None,
            at_ms: None,
        }
    }

    /// The run moves to another live status (Ray Train V2's sub-statuses:
    /// `INITIALIZING`, `SCHEDULING`, `RUNNING`, `RESTARTING`, `RESIZING`).
    pub fn live(status: RunStatus, detail: impl Into<String>) -> Self {
        Self { status, detail: detail.into(), cause: None, end_time_ms: None, at_ms: None }
    }

    /// The run failed. `rank` is the world rank of the worker that failed
    /// first, if a worker did; `trace` the error and its traceback.
    pub fn errored(rank: Option<u32>, kind: CauseKind, trace: impl Into<String>) -> Self {
        Self {
            status: RunStatus::Errored,
            detail: trace.into(),
            cause: Some(RunCause::new(kind, rank)),
            end_time_ms: None,
            at_ms: None,
        }
    }

    /// The run was stopped before it finished.
    pub fn aborted(kind: CauseKind, detail: impl Into<String>) -> Self {
        Self {
            status: RunStatus::Aborted,
            detail: detail.into(),
            cause: Some(RunCause::new(kind, None)),
            end_time_ms: None,
            at_ms: None,
        }
    }

    /// The same update, as changed at `at_ms` (Unix ms) if known.
    pub fn at(mut self, at_ms: Option<u64>) -> Self {
        self.at_ms = at_ms;
        self
    }

    /// The same update with an explicit end time.
    pub fn ended_at(mut self, end_time_ms: u64) -> Self {
        self.end_time_ms = Some(end_time_ms);
        self
    }
}

/// A new attempt (worker group) of a run: after an elastic resize or a
/// restart after a failure.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct NewAttempt {
    /// Id chosen by the caller, unique within the run. Repeating an attempt
    /// is a no-op.
    pub attempt_id: String,
    /// When the attempt's workers started (Unix ms).
    pub start_time_ms: u64,
    /// The attempt's workers; the same rules as a run's workers.
    pub workers: Vec<TrainWorkerInfo>,
}

impl NewAttempt {
    /// A new attempt.
    pub fn new(
        attempt_id: impl Into<String>,
        start_time_ms: u64,
        workers: Vec<TrainWorkerInfo>,
    ) -> Self {
        Self { attempt_id: attempt_id.into(), start_time_ms, workers }
    }
}

// How the protocol converts to and from the HTTP API's documents.

impl From<StatusUpdate> for StatusRequest {
    fn from(update: StatusUpdate) -> Self {
        let mut request = StatusRequest::new(update.status);
        request.detail = update.detail;
        request.cause = update.cause;
        request.end_time_ms = update.end_time_ms;
        request.at_ms = update.at_ms;
        request
    }
}

impl From<StatusRequest> for StatusUpdate {
    fn from(request: StatusRequest) -> Self {
        let mut update = StatusUpdate::finished();
        update.status = request.status;
        update.detail = request.detail;
        update.cause = request.cause;
        update.end_time_ms = request.end_time_ms;
        update.at_ms = request.at_ms;
        update
    }
}

impl From<NewAttempt> for AttemptRequest {
    fn from(attempt: NewAttempt) -> Self {
        let workers = attempt.workers.into_iter().map(TrainWorkerInfo::into_draft).collect();
        AttemptRequest::new(attempt.attempt_id, attempt.start_time_ms, workers)
    }
}

impl TryFrom<AttemptRequest> for NewAttempt {
    type Error = StateError;

    /// Checks the worker group (each worker, and the rules across them); a
    /// broken rule names its path (`workers[3].pid`).
    fn try_from(request: AttemptRequest) -> Result<Self, Self::Error> {
        let workers = WorkerList::try_from(request.workers)?;
        Ok(NewAttempt::new(request.attempt_id, request.start_time_ms, workers.into_vec()))
    }
}
