//! The messages the state actor answers, and what they carry.

use std::sync::Arc;
use std::time::Duration;

use ractor::RpcReplyPort;
use trainstate_schema::{
    CauseKind, NewRun, RunCause, RunId, RunStatus, TrainRunInfo, TrainWorkerInfo,
};

use crate::error::StateError;
use crate::events::Subscription;
use crate::query::{RunPage, RunQuery};

/// The registry name of the state actor when its configuration does not
/// name another.
pub const DEFAULT_STATE_ACTOR_NAME: &str = "trainstate.state_actor";

/// The reply port of every request: the answer or a typed error.
pub type Reply<T> = RpcReplyPort<Result<T, StateError>>;

/// A request to the state actor. Writes are answered only once committed.
#[derive(Debug)]
#[non_exhaustive]
pub enum StateMessage {
    /// Registers a run. Repeating it with identical static metadata is a
    /// no-op that succeeds; with different metadata it is a conflict.
    Register {
        /// The run to register, already normalised: the actor stores
        /// [`NewRun::into_run`] at its own clock's time.
        run: Box<NewRun>,
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
    /// Renews a live run's lease.
    Heartbeat {
        /// The run.
        id: RunId,
        /// The lease, from now.
        reply: Reply<Duration>,
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
    /// Runs the liveness sweep now: aborts every live run whose lease has
    /// expired. The actor also runs it periodically.
    SweepLeases {
        /// The ids of the runs it aborted.
        reply: Reply<Vec<RunId>>,
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

/// A stored run as canonical JSON, cheap to clone and to send.
///
/// The state actor keeps runs as JSON bytes; this is what it hands out.
/// [`RunDocument::parse`] gives the typed run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunDocument {
    body: Arc<str>,
    last_heartbeat_ms: Option<u64>,
}

impl RunDocument {
    /// Wraps the canonical JSON of a run (a JSON object) and the time its
    /// controller was last heard from, which is kept apart because it
    /// changes with every heartbeat.
    pub fn new(body: Arc<str>, last_heartbeat_ms: Option<u64>) -> Self {
        debug_assert!(body.ends_with('}'));
        Self { body, last_heartbeat_ms }
    }

    /// The stored JSON without the heartbeat time.
    pub fn body(&self) -> &Arc<str> {
        &self.body
    }

    /// When the controller was last heard from (Unix ms), for live runs.
    pub fn last_heartbeat_ms(&self) -> Option<u64> {
        self.last_heartbeat_ms
    }

    /// Appends the full JSON of the run to `out`.
    pub fn write_json(&self, out: &mut String) {
        match self.last_heartbeat_ms {
            Some(at) => {
                out.push_str(&self.body[..self.body.len() - 1]);
                out.push_str(",\"last_heartbeat_ms\":");
                out.push_str(&at.to_string());
                out.push('}');
            }
            None => out.push_str(&self.body),
        }
    }

    /// Appends `runs` to `out` as a JSON array of full runs.
    pub fn write_json_list(out: &mut String, runs: &[RunDocument]) {
        out.push('[');
        for (i, run) in runs.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            run.write_json(out);
        }
        out.push(']');
    }

    /// The full JSON of the run.
    pub fn to_json(&self) -> String {
        let mut out = String::with_capacity(self.body.len() + 32);
        self.write_json(&mut out);
        out
    }

    /// The typed run.
    pub fn parse(&self) -> Result<TrainRunInfo, StateError> {
        serde_json::from_str(&self.to_json())
            .map_err(|e| StateError::unavailable(format!("stored run does not parse: {e}")))
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
}

impl StatusUpdate {
    /// The run finished successfully.
    pub fn finished() -> Self {
        Self { status: RunStatus::Finished, detail: String::new(), cause: None, end_time_ms: None }
    }

    /// The run failed. `rank` is the world rank of the worker that failed
    /// first, if a worker did; `trace` the error and its traceback.
    pub fn errored(rank: Option<u32>, kind: CauseKind, trace: impl Into<String>) -> Self {
        Self {
            status: RunStatus::Errored,
            detail: trace.into(),
            cause: Some(RunCause::new(kind, rank)),
            end_time_ms: None,
        }
    }

    /// The run was stopped before it finished.
    pub fn aborted(kind: CauseKind, detail: impl Into<String>) -> Self {
        Self {
            status: RunStatus::Aborted,
            detail: detail.into(),
            cause: Some(RunCause::new(kind, None)),
            end_time_ms: None,
        }
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
