//! The messages the state actor answers, and what they carry.

use std::sync::Arc;
use std::time::Duration;

use ractor::RpcReplyPort;
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
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
/// The state actor keeps runs as JSON; this is what it hands out.
/// [`RunDocument::parse`] gives the typed run. It serializes as the run's
/// JSON object: the stored text is copied as it is, and a live run's
/// heartbeat time, which is kept apart because it changes with every
/// heartbeat, is written as the `last_heartbeat_ms` member.
#[derive(Debug, Clone)]
pub struct RunDocument {
    body: Arc<RawValue>,
    last_heartbeat_ms: Option<u64>,
}

impl PartialEq for RunDocument {
    fn eq(&self, other: &Self) -> bool {
        self.body.get() == other.body.get() && self.last_heartbeat_ms == other.last_heartbeat_ms
    }
}

impl Eq for RunDocument {}

impl RunDocument {
    /// Wraps the canonical JSON of a run (a JSON object) and the time its
    /// controller was last heard from.
    pub fn new(body: Arc<RawValue>, last_heartbeat_ms: Option<u64>) -> Self {
        debug_assert!(body.get().starts_with('{'));
        Self { body, last_heartbeat_ms }
    }

    /// The canonical JSON of `run`, as a document with no heartbeat time.
    pub fn of(run: &TrainRunInfo) -> Self {
        let body = serde_json::value::to_raw_value(run).expect("a validated run serializes");
        Self::new(Arc::from(body), None)
    }

    /// The stored JSON without the heartbeat time.
    pub fn body(&self) -> &str {
        self.body.get()
    }

    /// The stored JSON as a shared raw value.
    pub fn raw(&self) -> &Arc<RawValue> {
        &self.body
    }

    /// When the controller was last heard from (Unix ms), for live runs.
    pub fn last_heartbeat_ms(&self) -> Option<u64> {
        self.last_heartbeat_ms
    }

    /// The full JSON of the run.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a run document serializes")
    }

    /// The typed run.
    pub fn parse(&self) -> Result<TrainRunInfo, StateError> {
        serde_json::from_str(&self.to_json())
            .map_err(|e| StateError::Corrupt { reason: e.to_string() })
    }
}

impl Serialize for RunDocument {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let Some(heartbeat) = self.last_heartbeat_ms else {
            return self.body.serialize(serializer);
        };
        // A live run: its members as stored, then the heartbeat time.
        let members: Members<'_> =
            serde_json::from_str(self.body.get()).map_err(serde::ser::Error::custom)?;
        let mut map = serializer.serialize_map(Some(members.0.len() + 1))?;
        for (key, value) in members.0.iter().filter(|(k, _)| *k != LAST_HEARTBEAT) {
            map.serialize_entry(key, value)?;
        }
        map.serialize_entry(LAST_HEARTBEAT, &heartbeat)?;
        map.end()
    }
}

impl<'de> Deserialize<'de> for RunDocument {
    /// Keeps the JSON object as it came, heartbeat time included.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let body = Box::<RawValue>::deserialize(deserializer)?;
        if !body.get().starts_with('{') {
            return Err(serde::de::Error::custom("a run must be a JSON object"));
        }
        Ok(Self::new(Arc::from(body), None))
    }
}

impl schemars::JsonSchema for RunDocument {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        TrainRunInfo::schema_name()
    }

    fn schema_id() -> std::borrow::Cow<'static, str> {
        TrainRunInfo::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        TrainRunInfo::json_schema(generator)
    }
}

/// The member a live run's heartbeat time is written as.
const LAST_HEARTBEAT: &str = "last_heartbeat_ms";

/// The top-level members of a stored run, in stored order, values unparsed.
struct Members<'a>(Vec<(&'a str, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = Members<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut members = Vec::with_capacity(map.size_hint().unwrap_or(16));
                while let Some(entry) = map.next_entry::<&'de str, &'de RawValue>()? {
                    members.push(entry);
                }
                Ok(Members(members))
            }
        }
        deserializer.deserialize_map(Visit)
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
