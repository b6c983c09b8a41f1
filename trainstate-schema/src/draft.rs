//! Unvalidated documents: the shapes that are read from JSON and checked.
//!
//! A draft has public fields and no invariants. It is what a document
//! deserializes into before validation, and what a caller fills in to build
//! a value: `TrainRunInfo::try_from(draft)` (or [`TrainRunInfoDraft::validate`])
//! checks every rule and returns a [`ValidationError`](crate::ValidationError)
//! that names the field path and the rule.
//!
//! The JSON Schemas of this crate are the schemas of these drafts, with the
//! rules that a schema can express (lengths, patterns, minimums); the rules
//! that span fields (ranks, nodes, times) are in the descriptions.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::json::JsonValue;
use crate::resources::Resources;
use crate::status::{ActorStatus, AttemptStatus, RunCause, RunStatus};

/// One change of a run's status, as the run's `status_history` keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "schemars",
    schemars(
        description = "Extension: one change of a run's status (its registration included), as the run's `status_history` keeps it."
    )
)]
pub struct StatusChange {
    /// The status the run moved to (Ray Train V2's, as the run's `status`).
    pub status: RunStatus,
    /// When it happened (Unix ms): the time the writer gave for the change (Ray's own
    /// time for an ingested Ray event), else the head's time when it took the write. Between
    /// 946684800000 (2000-01-01) and 7258118400000 (2200-01-01) when a client writes it.
    pub at_ms: u64,
    /// The run's current attempt when it happened, if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 1024)))]
    pub attempt_id: Option<String>,
    /// The start of the run's status detail then (at most 256 characters, any text but
    /// NUL); absent when there was nothing to say.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[cfg_attr(feature = "schemars", schemars(length(max = 256)))]
    pub detail: String,
}

impl StatusChange {
    /// A change to `status` at `at_ms`, with no attempt id or detail.
    pub fn new(status: RunStatus, at_ms: u64) -> Self {
        Self { status, at_ms, attempt_id: None, detail: String::new() }
    }
}

/// One worker of a run, unvalidated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "schemars",
    schemars(
        rename = "TrainWorkerInfo",
        description = "One worker of a training run, as Ray's V1 `TrainWorkerInfo`. Across a run's workers: world ranks are exactly 0..n-1; on each node, local ranks are unique and one node rank is used; distinct nodes have distinct node ranks."
    )
)]
pub struct TrainWorkerInfoDraft {
    /// The worker's actor id. Non-empty, at most 1,024 characters, no control characters.
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 1024)))]
    pub actor_id: String,
    /// Rank among all workers of the run: the workers' world ranks are exactly 0..n-1.
    pub world_rank: u32,
    /// Rank among the workers on the same node; unique per node.
    pub local_rank: u32,
    /// Rank of the worker's node; one per node, distinct nodes have distinct node ranks.
    pub node_rank: u32,
    /// Id of the node the worker runs on. Non-empty, at most 1,024 characters, no control characters.
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 1024)))]
    pub node_id: String,
    /// IP address (IPv4 or IPv6) of the node the worker runs on.
    pub node_ip: String,
    /// Process id of the worker, greater than 0.
    #[cfg_attr(feature = "schemars", schemars(range(min = 1)))]
    pub pid: u32,
    /// Ids of the GPUs the worker sees, unique within the worker.
    #[cfg_attr(feature = "schemars", schemars(extend("uniqueItems" = true)))]
    pub gpu_ids: Vec<u32>,
    /// Whether the worker's process is alive. Unconstrained by the run's status.
    pub status: ActorStatus,
    /// Resources allocated to the worker: name to amount (finite, ≥ 0).
    pub resources: Resources,
    /// Path of the worker's log file on its node, when known (Ray's later V1 name;
    /// Ray Train V2's `log_file_path` is read as the same field).
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "log_file_path")]
    pub worker_log_file_path: Option<String>,
    /// Extension: host name of the node the worker runs on, as its reporter saw it
    /// (`socket.gethostname()`), shown beside `node_id`; absent when unknown. Non-empty, at
    /// most 1,024 characters, no control characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 1024)))]
    pub node_name: Option<String>,
}

/// One dataset of a run, unvalidated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "schemars",
    schemars(
        rename = "TrainDatasetInfo",
        description = "One dataset of a training run, as Ray's V1 `TrainDatasetInfo`."
    )
)]
pub struct TrainDatasetInfoDraft {
    /// The key the trainer was given the dataset under; unique within a run.
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 1024)))]
    pub name: String,
    /// The dataset's unique id.
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 1024)))]
    pub dataset_uuid: String,
    /// `<name>_<the dataset's own name>`, to find it on a data dashboard; null when unknown.
    #[serde(default)]
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 1024)))]
    pub dataset_name: Option<String>,
}

/// One worker group of a run (the first, or one after an elastic resize or
/// a restart after a failure), unvalidated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "schemars",
    schemars(
        rename = "RunAttempt",
        description = "Extension: one worker group of a run (the first, or one started by an elastic resize or a restart after a failure)."
    )
)]
pub struct RunAttemptDraft {
    /// Id chosen by the caller; unique within the run.
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 1024)))]
    pub attempt_id: String,
    /// When the attempt's workers started (Unix ms). Between 946684800000 (2000-01-01) and 7258118400000 (2200-01-01) when a client writes it: a time in seconds or nanoseconds is refused (422).
    pub start_time_ms: u64,
    /// When the attempt ended (Unix ms); null while it is PENDING or RUNNING. Between 946684800000 (2000-01-01) and 7258118400000 (2200-01-01) when a client writes it: a time in seconds or nanoseconds is refused (422).
    #[serde(default)]
    pub end_time_ms: Option<u64>,
    /// The attempt's status (Ray Train V2's). Derived when absent: RUNNING (PENDING while
    /// the run is INITIALIZING or SCHEDULING) until the attempt ends; then the status
    /// that ended its run, or ABORTED for an attempt another one replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<AttemptStatus>,
    /// Human-readable detail of the attempt's status; `""` when there is nothing to say.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[cfg_attr(feature = "schemars", schemars(length(max = 50100)))]
    pub status_detail: String,
    /// The machine-readable cause of an ERRORED or ABORTED attempt (which rank failed first).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::object::option"
    )]
    pub cause: Option<RunCause>,
    /// The attempt's workers, sorted by world rank. Present on ended attempts (`[]` when
    /// the head dropped them: see `dropped_workers`); absent on the current (last)
    /// attempt, whose workers are the run's `workers`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::object::option_vec"
    )]
    pub workers: Option<Vec<TrainWorkerInfoDraft>>,
    /// How many workers this ended attempt had, when the head dropped their
    /// list (its `workers` is then `[]`) to bound the run's size: it keeps
    /// the worker lists of ended attempts, the first attempt's aside, up to
    /// about 16 MiB of JSON, the newest first. Absent when the list is kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped_workers: Option<u32>,
}

impl RunAttemptDraft {
    /// A new attempt starting at `start_time_ms`, not ended, its status to
    /// be derived, with no workers of its own (the current attempt's
    /// workers are the run's).
    pub fn new(attempt_id: impl Into<String>, start_time_ms: u64) -> Self {
        Self {
            attempt_id: attempt_id.into(),
            start_time_ms,
            end_time_ms: None,
            status: None,
            status_detail: String::new(),
            cause: None,
            workers: None,
            dropped_workers: None,
        }
    }
}

/// One training run, unvalidated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(
    feature = "schemars",
    schemars(
        rename = "TrainRunInfo",
        description = "One training run, as Ray's V1 `TrainRunInfo`, with trainstate's extensions. Workers are sorted by world rank; a RUNNING run has a null end_time_ms; end_time_ms, when set, is not before start_time_ms."
    )
)]
pub struct TrainRunInfoDraft {
    /// The run's name. Non-empty, at most 1,024 characters, no control characters.
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 1024)))]
    pub name: String,
    /// The run's id: `^[A-Za-z0-9_-]{1,128}$`.
    #[cfg_attr(feature = "schemars", schemars(with = "crate::RunId"))]
    pub id: String,
    /// The id of the job that started the run.
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 1024)))]
    pub job_id: String,
    /// The actor id of the run's controller.
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 1024)))]
    pub controller_actor_id: String,
    /// The workers of the current attempt, sorted by world rank (0..n-1).
    #[serde(deserialize_with = "crate::object::vec")]
    pub workers: Vec<TrainWorkerInfoDraft>,
    /// The datasets given to the trainer.
    #[serde(deserialize_with = "crate::object::vec")]
    pub datasets: Vec<TrainDatasetInfoDraft>,
    /// The run's status as Ray's V1 readers know it: every live status is written as
    /// RUNNING. `STARTED` is read as `RUNNING`.
    pub run_status: RunStatus,
    /// Extension: the run's lifecycle status, with Ray Train V2's live sub-statuses
    /// (INITIALIZING, SCHEDULING, RUNNING, RESTARTING, RESIZING). Written only when it
    /// differs from `run_status`; when both are given, `run_status` must be this status
    /// as V1 shows it. Absent: `run_status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<RunStatus>,
    /// Human-readable detail of the status; `""` when there is nothing to say.
    /// Any text but NUL, at most 50,100 characters.
    #[serde(default)]
    #[cfg_attr(feature = "schemars", schemars(length(max = 50100)))]
    pub status_detail: String,
    /// When the run started (Unix ms). Between 946684800000 (2000-01-01) and 7258118400000 (2200-01-01) when a client writes it: a time in seconds or nanoseconds is refused (422).
    pub start_time_ms: u64,
    /// When the run ended (Unix ms); null while the run is live. Not before `start_time_ms`, nor, when a client writes it, before the current attempt's start. Between 946684800000 (2000-01-01) and 7258118400000 (2200-01-01) when a client writes it: a time in seconds or nanoseconds is refused (422).
    #[serde(default)]
    pub end_time_ms: Option<u64>,
    /// Each worker's resources, in the order of `workers`. Derived from `workers` when absent.
    #[serde(default)]
    pub resources: Option<Vec<Resources>>,
    /// Extension: every attempt (worker group) of the run, oldest first. The last is the
    /// current one. Empty for runs reported without attempt history (as Ray reports them).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "crate::object::vec"
    )]
    pub attempts: Vec<RunAttemptDraft>,
    /// Extension: when the run's controller was last heard from (Unix ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat_ms: Option<u64>,
    /// Extension: the machine-readable cause of an `ERRORED` or `ABORTED` run.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::object::option"
    )]
    pub cause: Option<RunCause>,
    /// Extension: the id of the run this run was restored from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(with = "Option<crate::RunId>"))]
    pub restored_from: Option<String>,
    /// Path of the controller's log file on the head, when known (Ray's later V1 name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub controller_log_file_path: Option<String>,
    /// Extension (Ray Train V2): the versions of the frameworks the run uses, by name
    /// (for example `ray`, `torch`). At most 64 entries.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub framework_versions: BTreeMap<String, String>,
    /// Extension (Ray Train V2): the run's settings as the trainer gave them (Ray's
    /// `RunSettings`: scaling, failure, data and checkpoint configs), kept as JSON:
    /// nested at most 16 deep, at most about 64 KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_settings: Option<JsonValue>,
    /// Extension: false for a run whose controller does not heartbeat (Ray Train V2's,
    /// through its writes or its export events), set by the head. Such a run is leased
    /// all the same: each V2 write renews it, and so does the ingester of Ray's export
    /// events while it follows them; one nothing tells about for longer than the lease
    /// is aborted for a lost controller. A registration's value is ignored: no client
    /// may opt out of its lease. Absent: true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeats: Option<bool>,
    /// Extension: the name of the cluster the run ran on, set by the head it
    /// was registered with (`trainstate serve --cluster NAME`), so a hub that
    /// keeps the runs of many clusters can tell them apart. Absent when the
    /// head has no cluster name. Non-empty, at most 1,024 characters, no
    /// control characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 1024)))]
    pub cluster: Option<String>,
    /// Extension: the run's status changes, oldest first, its registration included: each
    /// with the status it moved to, when, the current attempt then and the start of the
    /// detail. The head appends one whenever the run's status changes. Bounded: at most 64
    /// entries, the first and the latest 63 (the ones between are dropped). Absent: none
    /// recorded (a run stored before the head kept them).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "crate::object::vec"
    )]
    #[cfg_attr(feature = "schemars", schemars(length(max = 64)))]
    pub status_history: Vec<StatusChange>,
    /// Extension: the run's health as the head last decided it from its ranks' progress
    /// (`STALLED` when no rank advanced for the run's stall window, `PROGRESSING` again when
    /// one did). Set by the head: a registration's value is ignored. Absent for a run that
    /// never reported progress.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::object::option"
    )]
    pub health: Option<crate::RunHealth>,
    /// Extension: the run's health changes, oldest first; at most 32 (the oldest are dropped).
    /// Set by the head: a registration's value is ignored.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "crate::object::vec"
    )]
    #[cfg_attr(feature = "schemars", schemars(length(max = 32)))]
    pub health_history: Vec<crate::HealthChange>,
    /// Extension: where the run's wall-clock time went: productive time and badput by
    /// bucket, its goodput ratio, its latest checkpoint mark and whether it restarts in a
    /// loop (docs/goodput.md). Set by the head: a registration's value is ignored. Absent
    /// for a run registered already ended.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::object::option"
    )]
    pub goodput: Option<crate::RunGoodput>,
}

impl TrainRunInfoDraft {
    /// A live (`RUNNING`) run with no workers, datasets or extensions yet:
    /// fill in the rest with struct update syntax, then [`validate`](Self::validate).
    ///
    /// ```
    /// use trainstate_schema::TrainRunInfoDraft;
    ///
    /// let run = TrainRunInfoDraft {
    ///     status_detail: "warming up".into(),
    ///     ..TrainRunInfoDraft::new("0192f0c5a4e27c3db1c1a2b3c4d5e6f7", "pretrain", "01000000", "c0ffee", 1_760_000_000_000)
    /// }
    /// .validate()
    /// .unwrap();
    /// assert!(run.workers().is_empty());
    /// ```
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        job_id: impl Into<String>,
        controller_actor_id: impl Into<String>,
        start_time_ms: u64,
    ) -> Self {
        Self {
            name: name.into(),
            id: id.into(),
            job_id: job_id.into(),
            controller_actor_id: controller_actor_id.into(),
            workers: Vec::new(),
            datasets: Vec::new(),
            run_status: RunStatus::Running,
            status_detail: String::new(),
            start_time_ms,
            end_time_ms: None,
            resources: None,
            attempts: Vec::new(),
            last_heartbeat_ms: None,
            cause: None,
            restored_from: None,
            controller_log_file_path: None,
            status: None,
            framework_versions: BTreeMap::new(),
            run_settings: None,
            heartbeats: None,
            cluster: None,
            status_history: Vec::new(),
            health: None,
            health_history: Vec::new(),
            goodput: None,
        }
    }

    /// Checks every rule and returns the validated run.
    pub fn validate(self) -> Result<crate::TrainRunInfo, crate::ValidationError> {
        crate::TrainRunInfo::try_from(self)
    }
}

impl TrainWorkerInfoDraft {
    /// Checks every rule of a single worker (the rules across workers need the
    /// whole run) and returns the validated worker.
    pub fn validate(self) -> Result<crate::TrainWorkerInfo, crate::ValidationError> {
        crate::TrainWorkerInfo::try_from(self)
    }
}

impl TrainDatasetInfoDraft {
    /// Checks every rule and returns the validated dataset.
    pub fn validate(self) -> Result<crate::TrainDatasetInfo, crate::ValidationError> {
        crate::TrainDatasetInfo::try_from(self)
    }
}
