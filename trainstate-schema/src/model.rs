//! The validated wire types: immutable values that always obey the rules.

mod registration;

use std::collections::{BTreeMap, HashSet};

use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::draft::{
    RunAttemptDraft, StatusChange, TrainDatasetInfoDraft, TrainRunInfoDraft, TrainWorkerInfoDraft,
};
use crate::error::{Rule, ValidationError};
use crate::goodput::RunGoodput;
use crate::health::{HealthChange, HealthState, RunHealth};
use crate::id::RunId;
use crate::json::JsonValue;
use crate::limits::{
    MAX_ATTEMPTS, MAX_DATASETS, MAX_FRAMEWORK_VERSIONS, MAX_RUN_SETTINGS_BYTES,
    MAX_RUN_SETTINGS_DEPTH, MAX_STATUS_CHANGE_DETAIL_LEN, MAX_STATUS_HISTORY,
};
use crate::resources::Resources;
use crate::status::{ActorStatus, AttemptStatus, RunCause, RunStatus};
use crate::validate;
use crate::workers::WorkerList;

pub use registration::NewRun;

/// One worker of a run, as Ray's `TrainWorkerInfo`.
///
/// Built from a [`TrainWorkerInfoDraft`] (or deserialized), which checks the
/// rules of a single worker; the rules across the workers of a group are
/// those of a [`WorkerList`](crate::WorkerList), which a run holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrainWorkerInfo {
    actor_id: String,
    world_rank: u32,
    local_rank: u32,
    node_rank: u32,
    node_id: String,
    node_ip: String,
    pid: u32,
    gpu_ids: Vec<u32>,
    pub(crate) status: ActorStatus,
    resources: Resources,
    #[serde(skip_serializing_if = "Option::is_none")]
    worker_log_file_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node_name: Option<String>,
}

impl TrainWorkerInfo {
    /// The worker's actor id.
    pub fn actor_id(&self) -> &str {
        &self.actor_id
    }
    /// Rank among all workers of the run.
    pub fn world_rank(&self) -> u32 {
        self.world_rank
    }
    /// Rank among the workers on the same node.
    pub fn local_rank(&self) -> u32 {
        self.local_rank
    }
    /// Rank of the worker's node.
    pub fn node_rank(&self) -> u32 {
        self.node_rank
    }
    /// Id of the worker's node.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }
    /// IP address of the worker's node, as reported.
    pub fn node_ip(&self) -> &str {
        &self.node_ip
    }
    /// Process id of the worker.
    pub fn pid(&self) -> u32 {
        self.pid
    }
    /// GPU ids the worker sees.
    pub fn gpu_ids(&self) -> &[u32] {
        &self.gpu_ids
    }
    /// Whether the worker's process is alive.
    pub fn status(&self) -> ActorStatus {
        self.status
    }
    /// Resources allocated to the worker.
    pub fn resources(&self) -> &Resources {
        &self.resources
    }
    /// Path of the worker's log file, when known.
    pub fn worker_log_file_path(&self) -> Option<&str> {
        self.worker_log_file_path.as_deref()
    }
    /// Host name of the worker's node, when its reporter gave it.
    pub fn node_name(&self) -> Option<&str> {
        self.node_name.as_deref()
    }

    /// True when both describe the same worker, whatever their `status`.
    pub fn same_identity(&self, other: &TrainWorkerInfo) -> bool {
        let Self { status: _, .. } = self;
        self.actor_id == other.actor_id
            && self.world_rank == other.world_rank
            && self.local_rank == other.local_rank
            && self.node_rank == other.node_rank
            && self.node_id == other.node_id
            && self.node_ip == other.node_ip
            && self.pid == other.pid
            && self.gpu_ids == other.gpu_ids
            && self.resources == other.resources
            && self.worker_log_file_path == other.worker_log_file_path
            && self.node_name == other.node_name
    }

    /// The unvalidated form, to change and validate again.
    pub fn into_draft(self) -> TrainWorkerInfoDraft {
        TrainWorkerInfoDraft {
            actor_id: self.actor_id,
            world_rank: self.world_rank,
            local_rank: self.local_rank,
            node_rank: self.node_rank,
            node_id: self.node_id,
            node_ip: self.node_ip,
            pid: self.pid,
            gpu_ids: self.gpu_ids,
            status: self.status,
            resources: self.resources,
            worker_log_file_path: self.worker_log_file_path,
            node_name: self.node_name,
        }
    }

    pub(crate) fn from_checked(d: TrainWorkerInfoDraft) -> Self {
        Self {
            actor_id: d.actor_id,
            world_rank: d.world_rank,
            local_rank: d.local_rank,
            node_rank: d.node_rank,
            node_id: d.node_id,
            node_ip: d.node_ip,
            pid: d.pid,
            gpu_ids: d.gpu_ids,
            status: d.status,
            resources: d.resources,
            worker_log_file_path: d.worker_log_file_path,
            node_name: d.node_name,
        }
    }
}

impl TryFrom<TrainWorkerInfoDraft> for TrainWorkerInfo {
    type Error = ValidationError;

    fn try_from(draft: TrainWorkerInfoDraft) -> Result<Self, ValidationError> {
        validate::worker("", &draft)?;
        Ok(Self::from_checked(draft))
    }
}

/// One dataset of a run, as Ray's `TrainDatasetInfo`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TrainDatasetInfo {
    name: String,
    dataset_uuid: String,
    dataset_name: Option<String>,
}

impl TrainDatasetInfo {
    /// The key the trainer was given the dataset under.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The dataset's unique id.
    pub fn dataset_uuid(&self) -> &str {
        &self.dataset_uuid
    }
    /// `<name>_<the dataset's own name>`, when known.
    pub fn dataset_name(&self) -> Option<&str> {
        self.dataset_name.as_deref()
    }

    /// The unvalidated form, to change and validate again.
    pub fn into_draft(self) -> TrainDatasetInfoDraft {
        TrainDatasetInfoDraft {
            name: self.name,
            dataset_uuid: self.dataset_uuid,
            dataset_name: self.dataset_name,
        }
    }

    fn check(prefix: &str, d: &TrainDatasetInfoDraft) -> Result<(), ValidationError> {
        validate::name(|| format!("{prefix}name"), &d.name)?;
        validate::name(|| format!("{prefix}dataset_uuid"), &d.dataset_uuid)?;
        if let Some(dataset_name) = &d.dataset_name {
            validate::name(|| format!("{prefix}dataset_name"), dataset_name)?;
        }
        Ok(())
    }
}

impl TryFrom<TrainDatasetInfoDraft> for TrainDatasetInfo {
    type Error = ValidationError;

    fn try_from(draft: TrainDatasetInfoDraft) -> Result<Self, ValidationError> {
        Self::check("", &draft)?;
        Ok(Self {
            name: draft.name,
            dataset_uuid: draft.dataset_uuid,
            dataset_name: draft.dataset_name,
        })
    }
}

/// One worker group of a run: the first, or one started by an elastic resize
/// or a restart after a failure.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunAttempt {
    pub(crate) attempt_id: String,
    pub(crate) status: AttemptStatus,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub(crate) status_detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cause: Option<RunCause>,
    pub(crate) start_time_ms: u64,
    pub(crate) end_time_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) workers: Option<WorkerList>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) dropped_workers: Option<u32>,
}

impl RunAttempt {
    /// Id chosen by the caller, unique within the run.
    pub fn attempt_id(&self) -> &str {
        &self.attempt_id
    }
    /// When the attempt started (Unix ms).
    pub fn start_time_ms(&self) -> u64 {
        self.start_time_ms
    }
    /// When the attempt ended (Unix ms), if it has.
    pub fn end_time_ms(&self) -> Option<u64> {
        self.end_time_ms
    }
    /// The attempt's status.
    pub fn status(&self) -> AttemptStatus {
        self.status
    }
    /// Human-readable detail of the attempt's status; empty when there is nothing to say.
    pub fn status_detail(&self) -> &str {
        &self.status_detail
    }
    /// The machine-readable cause of an ERRORED or ABORTED attempt.
    pub fn cause(&self) -> Option<RunCause> {
        self.cause.clone()
    }
    /// The workers of an ended attempt; `None` for the current attempt,
    /// whose workers are the run's [`TrainRunInfo::workers`].
    pub fn workers(&self) -> Option<&[TrainWorkerInfo]> {
        self.workers.as_deref()
    }
    /// How many workers this ended attempt had, when the head dropped
    /// their list to bound the run's size
    /// ([`MAX_ATTEMPT_HISTORY_BYTES`](crate::limits::MAX_ATTEMPT_HISTORY_BYTES));
    /// its [`workers`](Self::workers) are then empty.
    pub fn dropped_workers(&self) -> Option<u32> {
        self.dropped_workers
    }

    /// The unvalidated form, to change and validate again.
    pub fn into_draft(self) -> RunAttemptDraft {
        RunAttemptDraft {
            attempt_id: self.attempt_id,
            start_time_ms: self.start_time_ms,
            end_time_ms: self.end_time_ms,
            status: Some(self.status),
            status_detail: self.status_detail,
            cause: self.cause,
            workers: self
                .workers
                .map(|ws| ws.into_vec().into_iter().map(TrainWorkerInfo::into_draft).collect()),
            dropped_workers: self.dropped_workers,
        }
    }
}

/// One training run, as Ray's V1 `TrainRunInfo`, with trainstate's extensions.
///
/// A value always obeys every rule of the wire format: it is built from a
/// [`TrainRunInfoDraft`] through [`TryFrom`] (or [`TrainRunInfoDraft::validate`]),
/// and deserializing runs the same checks. Workers are sorted by world rank.
/// To change a run, take its draft ([`TrainRunInfo::into_draft`]), change it,
/// and validate it again.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainRunInfo {
    name: String,
    id: RunId,
    job_id: String,
    controller_actor_id: String,
    workers: WorkerList,
    datasets: Vec<TrainDatasetInfo>,
    status: RunStatus,
    status_detail: String,
    start_time_ms: u64,
    end_time_ms: Option<u64>,
    attempts: Vec<RunAttempt>,
    last_heartbeat_ms: Option<u64>,
    cause: Option<RunCause>,
    restored_from: Option<RunId>,
    controller_log_file_path: Option<String>,
    framework_versions: BTreeMap<String, String>,
    run_settings: Option<JsonValue>,
    heartbeats: bool,
    cluster: Option<String>,
    status_history: Vec<StatusChange>,
    health: Option<RunHealth>,
    health_history: Vec<HealthChange>,
    goodput: Option<RunGoodput>,
}

impl TrainRunInfo {
    /// The run with health `health`, its change at `at_ms` appended to its
    /// `health_history` (bounded: the oldest entries are dropped past
    /// [`MAX_HEALTH_HISTORY`](crate::limits::MAX_HEALTH_HISTORY)). A
    /// change of stragglers alone keeps the health's `since_ms` (the state
    /// did not change): `at_ms` says when it happened. Fails when `health`
    /// breaks a rule (too many ranks, too long a detail).
    pub fn with_health(mut self, health: RunHealth, at_ms: u64) -> Result<Self, ValidationError> {
        crate::health::check(Some(&health), &[])?;
        let max = crate::limits::MAX_HEALTH_HISTORY;
        if self.health_history.len() >= max {
            let excess = self.health_history.len() + 1 - max;
            self.health_history.drain(..excess);
        }
        let stragglers = health.stragglers.iter().map(|s| s.rank).collect();
        let mut change = HealthChange::new(health.state, at_ms, health.ranks.clone())
            .with_stragglers(stragglers);
        change.last_advance_ms = health.last_advance_ms;
        self.health_history.push(change);
        self.health = Some(health);
        Ok(self)
    }

    /// The run with its `STALLED` health marked as ended at `at_ms`, in its
    /// health and its history's last change: the stall ended with the run.
    /// Any other health is kept as it is.
    pub fn with_stall_ended(mut self, at_ms: u64) -> Self {
        let Some(health) = self.health.as_mut().filter(|h| h.is_live_stall()) else {
            return self;
        };
        health.ended_ms = Some(at_ms);
        if let Some(last) =
            self.health_history.last_mut().filter(|c| c.state == HealthState::Stalled)
        {
            last.ended_ms = Some(at_ms);
        }
        self
    }

    /// The run with its live `STALLED` health carrying `capture` (the
    /// stack capture the stall opened, as it now stands). The health's
    /// history is left as it is: the stall is the same stall. Any other
    /// health is kept as it is.
    pub fn with_stall_capture(mut self, capture: crate::StallCapture) -> Self {
        if let Some(health) = self.health.as_mut().filter(|h| h.is_live_stall()) {
            health.capture = Some(capture);
        }
        self
    }

    /// The run's health as the head last decided it; `None` for a run
    /// that never reported progress.
    pub fn health(&self) -> Option<&RunHealth> {
        self.health.as_ref()
    }

    /// The run with goodput `goodput`, as the head counted it. Fails when
    /// it breaks the rules of a run's goodput (its buckets must add up to
    /// its wall-clock time).
    pub fn with_goodput(mut self, goodput: RunGoodput) -> Result<Self, ValidationError> {
        crate::goodput::check(Some(&goodput))?;
        self.goodput = Some(goodput);
        Ok(self)
    }

    /// Where the run's wall-clock time went, as the head last counted it;
    /// `None` for a run registered already ended.
    pub fn goodput(&self) -> Option<&RunGoodput> {
        self.goodput.as_ref()
    }

    /// The run's health changes, oldest first (the latest
    /// [`MAX_HEALTH_HISTORY`](crate::limits::MAX_HEALTH_HISTORY)).
    pub fn health_history(&self) -> &[HealthChange] {
        &self.health_history
    }

    /// The run with its current status appended to its `status_history`,
    /// as changed at `at_ms` (Unix ms): with its current attempt's id and
    /// the first [`MAX_STATUS_CHANGE_DETAIL_LEN`] characters of its status
    /// detail. The history stays bounded: once it has
    /// [`MAX_STATUS_HISTORY`] entries, the oldest but the first is dropped.
    /// Keeps every rule, so the run is not validated again.
    pub fn with_status_recorded(mut self, at_ms: u64) -> Self {
        if self.status_history.len() >= MAX_STATUS_HISTORY {
            let excess = self.status_history.len() + 1 - MAX_STATUS_HISTORY;
            self.status_history.drain(1..1 + excess);
        }
        let detail = crate::text::first_chars(&self.status_detail, MAX_STATUS_CHANGE_DETAIL_LEN);
        self.status_history.push(StatusChange {
            status: self.status,
            at_ms,
            attempt_id: self.attempts.last().map(|a| a.attempt_id.clone()),
            detail: detail.to_owned(),
        });
        self
    }

    /// The run's status changes, oldest first (bounded: the first and the
    /// latest ones, at most [`MAX_STATUS_HISTORY`]).
    pub fn status_history(&self) -> &[StatusChange] {
        &self.status_history
    }

    /// Ends the current attempt at `end` (not before its start) if it has
    /// not ended, with the status that ends the run, its detail and cause,
    /// and marks the run's workers `DEAD`. For a run that has ended.
    pub(crate) fn end_current_attempt(&mut self, end: u64) {
        let ending = AttemptStatus::ending(self.status).unwrap_or(AttemptStatus::Aborted);
        if let Some(current) = self.attempts.last_mut().filter(|a| a.end_time_ms.is_none()) {
            current.end_time_ms = Some(end.max(current.start_time_ms));
            current.status = ending;
            current.status_detail.clone_from(&self.status_detail);
            current.cause.clone_from(&self.cause);
        }
        self.workers.mark_dead();
    }

    /// The run's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The run's id.
    pub fn id(&self) -> &RunId {
        &self.id
    }
    /// The id of the job that started the run.
    pub fn job_id(&self) -> &str {
        &self.job_id
    }
    /// The actor id of the run's controller.
    pub fn controller_actor_id(&self) -> &str {
        &self.controller_actor_id
    }
    /// The workers of the current attempt, sorted by world rank.
    pub fn workers(&self) -> &[TrainWorkerInfo] {
        &self.workers
    }
    /// The datasets given to the trainer.
    pub fn datasets(&self) -> &[TrainDatasetInfo] {
        &self.datasets
    }
    /// The run's status as a V1 reader sees it: every live status is
    /// `RUNNING`. See [`status`](Self::status) for the full lifecycle status.
    pub fn run_status(&self) -> RunStatus {
        self.status.v1()
    }
    /// The run's lifecycle status, with Ray Train V2's live sub-statuses.
    pub fn status(&self) -> RunStatus {
        self.status
    }
    /// The versions of the frameworks the run uses, by name (Ray Train V2).
    pub fn framework_versions(&self) -> &BTreeMap<String, String> {
        &self.framework_versions
    }
    /// The run's settings as the trainer gave them (Ray Train V2's `RunSettings`).
    pub fn run_settings(&self) -> Option<&JsonValue> {
        self.run_settings.as_ref()
    }
    /// False when the run's controller does not heartbeat (Ray Train V2's):
    /// its source renews its lease instead (see the draft's `heartbeats`).
    pub fn heartbeats(&self) -> bool {
        self.heartbeats
    }
    /// Human-readable detail of the status; empty when there is nothing to say.
    pub fn status_detail(&self) -> &str {
        &self.status_detail
    }
    /// When the run started (Unix ms).
    pub fn start_time_ms(&self) -> u64 {
        self.start_time_ms
    }
    /// When the run ended (Unix ms); `None` while it is live.
    pub fn end_time_ms(&self) -> Option<u64> {
        self.end_time_ms
    }
    /// Every attempt (worker group), oldest first; the last is the current one.
    pub fn attempts(&self) -> &[RunAttempt] {
        &self.attempts
    }
    /// When the controller was last heard from (Unix ms).
    pub fn last_heartbeat_ms(&self) -> Option<u64> {
        self.last_heartbeat_ms
    }
    /// The machine-readable cause of an `ERRORED` or `ABORTED` run.
    pub fn cause(&self) -> Option<RunCause> {
        self.cause.clone()
    }
    /// The run this one was restored from.
    pub fn restored_from(&self) -> Option<&RunId> {
        self.restored_from.as_ref()
    }
    /// Path of the controller's log file, when known.
    pub fn controller_log_file_path(&self) -> Option<&str> {
        self.controller_log_file_path.as_deref()
    }
    /// The cluster the run ran on, when its head has a cluster name.
    pub fn cluster(&self) -> Option<&str> {
        self.cluster.as_deref()
    }

    /// The workers of the run's first attempt: part of its static metadata.
    pub fn first_attempt_workers(&self) -> &[TrainWorkerInfo] {
        self.attempts.first().and_then(RunAttempt::workers).unwrap_or(&self.workers)
    }

    /// The first field of static metadata in which the two runs differ, or
    /// `None` when they have the same static metadata: `name`, `id`,
    /// `job_id`, `controller_actor_id`, `datasets`, `start_time_ms` and the
    /// first attempt's workers (whatever their `status`; named `workers`),
    /// compared in that order. This is what a repeated registration of a
    /// run must match.
    ///
    /// ```
    /// use trainstate_schema::TrainRunInfoDraft;
    ///
    /// let draft = TrainRunInfoDraft::new("0192f0c5a4e27c3db1c1a2b3c4d5e6f7", "pretrain", "01000000", "c0ffee", 1_760_000_000_000);
    /// let run = draft.clone().validate().unwrap();
    /// let renamed = TrainRunInfoDraft { name: "finetune".into(), ..draft }.validate().unwrap();
    /// assert_eq!(run.static_difference(&run), None);
    /// assert_eq!(run.static_difference(&renamed), Some("name"));
    /// ```
    pub fn static_difference(&self, other: &TrainRunInfo) -> Option<&'static str> {
        let (mine, theirs) = (self.first_attempt_workers(), other.first_attempt_workers());
        let same_workers = || {
            mine.len() == theirs.len() && mine.iter().zip(theirs).all(|(a, b)| a.same_identity(b))
        };
        if self.name != other.name {
            Some("name")
        } else if self.id != other.id {
            Some("id")
        } else if self.job_id != other.job_id {
            Some("job_id")
        } else if self.controller_actor_id != other.controller_actor_id {
            Some("controller_actor_id")
        } else if self.datasets != other.datasets {
            Some("datasets")
        } else if self.start_time_ms != other.start_time_ms {
            Some("start_time_ms")
        } else if !same_workers() {
            Some("workers")
        } else {
            None
        }
    }

    /// True when both have the same static metadata; see
    /// [`static_difference`](Self::static_difference).
    pub fn same_static_metadata(&self, other: &TrainRunInfo) -> bool {
        self.static_difference(other).is_none()
    }

    /// The unvalidated form, to change and validate again.
    pub fn into_draft(self) -> TrainRunInfoDraft {
        TrainRunInfoDraft {
            name: self.name,
            id: self.id.as_str().to_owned(),
            job_id: self.job_id,
            controller_actor_id: self.controller_actor_id,
            workers: self.workers.into_vec().into_iter().map(TrainWorkerInfo::into_draft).collect(),
            datasets: self.datasets.into_iter().map(TrainDatasetInfo::into_draft).collect(),
            run_status: self.status.v1(),
            // As written: only a live sub-status says more than `run_status`.
            status: (self.status != self.status.v1()).then_some(self.status),
            status_detail: self.status_detail,
            start_time_ms: self.start_time_ms,
            end_time_ms: self.end_time_ms,
            resources: None,
            attempts: self.attempts.into_iter().map(RunAttempt::into_draft).collect(),
            last_heartbeat_ms: self.last_heartbeat_ms,
            cause: self.cause,
            restored_from: self.restored_from.map(|id| id.as_str().to_owned()),
            controller_log_file_path: self.controller_log_file_path,
            framework_versions: self.framework_versions,
            run_settings: self.run_settings,
            heartbeats: (!self.heartbeats).then_some(false),
            cluster: self.cluster,
            status_history: self.status_history,
            health: self.health,
            health_history: self.health_history,
            goodput: self.goodput,
        }
    }
}

impl TryFrom<TrainRunInfoDraft> for TrainRunInfo {
    type Error = ValidationError;

    fn try_from(d: TrainRunInfoDraft) -> Result<Self, ValidationError> {
        validate::name(|| "name".into(), &d.name)?;
        RunId::check(&d.id).map_err(|rule| ValidationError::new("id", rule))?;
        validate::name(|| "job_id".into(), &d.job_id)?;
        validate::name(|| "controller_actor_id".into(), &d.controller_actor_id)?;

        if let Some(resources) = &d.resources {
            let matches = resources.len() == d.workers.len()
                && resources.iter().zip(&d.workers).all(|(r, w)| *r == w.resources);
            if !matches {
                return Err(ValidationError::new("resources", Rule::ResourcesMismatch));
            }
        }
        let workers = WorkerList::from_drafts_at("workers", d.workers)?;

        if d.datasets.len() > MAX_DATASETS {
            return Err(ValidationError::new("datasets", Rule::TooMany { max: MAX_DATASETS }));
        }
        let mut dataset_names = HashSet::with_capacity(d.datasets.len());
        for (i, dataset) in d.datasets.iter().enumerate() {
            TrainDatasetInfo::check(&format!("datasets[{i}]."), dataset)?;
            if !dataset_names.insert(dataset.name.as_str()) {
                return Err(ValidationError::new(
                    format!("datasets[{i}].name"),
                    Rule::DuplicateDatasetName,
                ));
            }
        }
        let datasets = d
            .datasets
            .into_iter()
            .map(|ds| TrainDatasetInfo {
                name: ds.name,
                dataset_uuid: ds.dataset_uuid,
                dataset_name: ds.dataset_name,
            })
            .collect();

        let status = d.status.unwrap_or(d.run_status);
        if d.status.is_some() && d.run_status.v1() != status.v1() {
            return Err(ValidationError::new("status", Rule::StatusMismatch));
        }
        validate::status_detail(&d.status_detail)?;
        if let Some(end) = d.end_time_ms {
            if status.is_live() {
                return Err(ValidationError::new("end_time_ms", Rule::EndTimeWhileRunning));
            }
            if end < d.start_time_ms {
                return Err(ValidationError::new("end_time_ms", Rule::EndBeforeStart));
            }
        }

        let attempts = checked_attempts(d.attempts, d.start_time_ms, status)?;
        if d.framework_versions.len() > MAX_FRAMEWORK_VERSIONS {
            return Err(ValidationError::new(
                "framework_versions",
                Rule::TooMany { max: MAX_FRAMEWORK_VERSIONS },
            ));
        }
        for (name, version) in &d.framework_versions {
            validate::name(|| "framework_versions".into(), name)?;
            validate::name(|| format!("framework_versions.{name}"), version)?;
        }
        if let Some(settings) = &d.run_settings {
            if settings.depth() > MAX_RUN_SETTINGS_DEPTH {
                let rule = Rule::TooDeep { max: MAX_RUN_SETTINGS_DEPTH };
                return Err(ValidationError::new("run_settings", rule));
            }
            if settings.approximate_size() > MAX_RUN_SETTINGS_BYTES {
                let rule = Rule::TooLarge { max: MAX_RUN_SETTINGS_BYTES };
                return Err(ValidationError::new("run_settings", rule));
            }
        }

        let restored_from = match d.restored_from {
            Some(text) => {
                RunId::check(&text).map_err(|rule| ValidationError::new("restored_from", rule))?;
                Some(RunId::from_checked(text))
            }
            None => None,
        };
        if let Some(path) = &d.controller_log_file_path {
            validate::file_path(|| "controller_log_file_path".into(), path)?;
        }
        if let Some(cluster) = &d.cluster {
            validate::name(|| "cluster".into(), cluster)?;
        }
        check_status_history(&d.status_history)?;
        crate::health::check(d.health.as_ref(), &d.health_history)?;
        crate::goodput::check(d.goodput.as_ref())?;

        Ok(Self {
            name: d.name,
            id: RunId::from_checked(d.id),
            job_id: d.job_id,
            controller_actor_id: d.controller_actor_id,
            workers,
            datasets,
            status,
            status_detail: d.status_detail,
            start_time_ms: d.start_time_ms,
            end_time_ms: d.end_time_ms,
            attempts,
            last_heartbeat_ms: d.last_heartbeat_ms,
            cause: d.cause,
            restored_from,
            controller_log_file_path: d.controller_log_file_path,
            framework_versions: d.framework_versions,
            run_settings: d.run_settings,
            heartbeats: d.heartbeats.unwrap_or(true),
            cluster: d.cluster,
            status_history: d.status_history,
            health: d.health,
            health_history: d.health_history,
            goodput: d.goodput,
        })
    }
}

/// The rules of a run's `status_history`: at most [`MAX_STATUS_HISTORY`]
/// entries, each attempt id a name, each detail short and without NUL.
fn check_status_history(history: &[StatusChange]) -> Result<(), ValidationError> {
    if history.len() > MAX_STATUS_HISTORY {
        let rule = Rule::TooMany { max: MAX_STATUS_HISTORY };
        return Err(ValidationError::new("status_history", rule));
    }
    for (i, change) in history.iter().enumerate() {
        if let Some(attempt_id) = &change.attempt_id {
            validate::name(|| format!("status_history[{i}].attempt_id"), attempt_id)?;
        }
        let detail = || format!("status_history[{i}].detail");
        if change.detail.contains('\0') {
            return Err(ValidationError::new(detail(), Rule::NulCharacter));
        }
        if change.detail.len() > MAX_STATUS_CHANGE_DETAIL_LEN
            && change.detail.chars().count() > MAX_STATUS_CHANGE_DETAIL_LEN
        {
            let rule = Rule::TooLong { max: MAX_STATUS_CHANGE_DETAIL_LEN };
            return Err(ValidationError::new(detail(), rule));
        }
    }
    Ok(())
}

/// The status of an attempt that does not state one: running until it
/// ends; then what ended its run, or ABORTED for one another replaced.
fn derived_attempt_status(ended: bool, is_last: bool, run: RunStatus) -> AttemptStatus {
    match (ended, is_last) {
        (false, _) if matches!(run, RunStatus::Initializing | RunStatus::Scheduling) => {
            AttemptStatus::Pending
        }
        (false, _) => AttemptStatus::Running,
        (true, true) => AttemptStatus::ending(run).unwrap_or(AttemptStatus::Aborted),
        (true, false) => AttemptStatus::Aborted,
    }
}

fn checked_attempts(
    drafts: Vec<RunAttemptDraft>,
    run_start_ms: u64,
    status: RunStatus,
) -> Result<Vec<RunAttempt>, ValidationError> {
    if drafts.len() > MAX_ATTEMPTS {
        return Err(ValidationError::new("attempts", Rule::TooMany { max: MAX_ATTEMPTS }));
    }
    let last = drafts.len().saturating_sub(1);
    let mut ids = HashSet::with_capacity(drafts.len());
    let mut previous_start = run_start_ms;
    let mut attempts = Vec::with_capacity(drafts.len());
    for (i, a) in drafts.into_iter().enumerate() {
        let path = |field: &str| format!("attempts[{i}].{field}");
        validate::name(|| path("attempt_id"), &a.attempt_id)?;
        if !ids.insert(a.attempt_id.clone()) {
            return Err(ValidationError::new(path("attempt_id"), Rule::DuplicateAttemptId));
        }
        if a.start_time_ms < previous_start {
            return Err(ValidationError::new(path("start_time_ms"), Rule::StartBeforePrevious));
        }
        previous_start = a.start_time_ms;
        if a.end_time_ms.is_some_and(|end| end < a.start_time_ms) {
            return Err(ValidationError::new(path("end_time_ms"), Rule::EndBeforeStart));
        }
        let is_last = i == last;
        let workers = if is_last {
            if a.workers.is_some() {
                return Err(ValidationError::new(path("workers"), Rule::CurrentAttemptHasWorkers));
            }
            // A live run's current attempt may have ended: Ray Train V2
            // reports the attempt's end before the run's next status.
            None
        } else {
            match (a.workers, a.end_time_ms) {
                (Some(workers), Some(_)) => {
                    Some(WorkerList::from_drafts_at(&path("workers"), workers)?)
                }
                (None, _) => {
                    return Err(ValidationError::new(
                        path("workers"),
                        Rule::EndedAttemptIncomplete,
                    ));
                }
                (Some(_), None) => {
                    return Err(ValidationError::new(
                        path("end_time_ms"),
                        Rule::EndedAttemptIncomplete,
                    ));
                }
            }
        };
        if a.dropped_workers.is_some()
            && (is_last || workers.as_ref().is_none_or(|w| !w.is_empty()))
        {
            return Err(ValidationError::new(path("dropped_workers"), Rule::DroppedWorkersListed));
        }
        let attempt_status = match a.status {
            Some(given) => {
                if given.is_terminal() != a.end_time_ms.is_some() {
                    return Err(ValidationError::new(path("status"), Rule::AttemptStatusMismatch));
                }
                given
            }
            None => derived_attempt_status(a.end_time_ms.is_some(), is_last, status),
        };
        validate::status_detail(&a.status_detail)
            .map_err(|e| ValidationError::new(path("status_detail"), e.rule().clone()))?;
        attempts.push(RunAttempt {
            attempt_id: a.attempt_id,
            status: attempt_status,
            status_detail: a.status_detail,
            cause: a.cause,
            start_time_ms: a.start_time_ms,
            end_time_ms: a.end_time_ms,
            workers,
            dropped_workers: a.dropped_workers,
        });
    }
    Ok(attempts)
}

impl Serialize for TrainRunInfo {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        struct EachWorkersResources<'a>(&'a [TrainWorkerInfo]);
        impl Serialize for EachWorkersResources<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq(self.0.iter().map(TrainWorkerInfo::resources))
            }
        }

        let extensions = usize::from(!self.attempts.is_empty())
            + usize::from(self.last_heartbeat_ms.is_some())
            + usize::from(self.cause.is_some())
            + usize::from(self.restored_from.is_some())
            + usize::from(self.controller_log_file_path.is_some())
            + usize::from(!self.framework_versions.is_empty())
            + usize::from(self.run_settings.is_some())
            + usize::from(!self.heartbeats)
            + usize::from(self.cluster.is_some())
            + usize::from(!self.status_history.is_empty())
            + usize::from(self.health.is_some())
            + usize::from(!self.health_history.is_empty())
            + usize::from(self.goodput.is_some());
        // `status` is written only when it says more than `run_status`: a
        // live sub-status. A V1 document stays exactly a V1 document.
        let detailed = self.status != self.status.v1();
        let mut s =
            serializer.serialize_struct("TrainRunInfo", 11 + extensions + usize::from(detailed))?;
        s.serialize_field("name", &self.name)?;
        s.serialize_field("id", &self.id)?;
        s.serialize_field("job_id", &self.job_id)?;
        s.serialize_field("controller_actor_id", &self.controller_actor_id)?;
        s.serialize_field("workers", &self.workers)?;
        s.serialize_field("datasets", &self.datasets)?;
        s.serialize_field("run_status", &self.status.v1())?;
        if detailed {
            s.serialize_field("status", &self.status)?;
        } else {
            s.skip_field("status")?;
        }
        s.serialize_field("status_detail", &self.status_detail)?;
        s.serialize_field("start_time_ms", &self.start_time_ms)?;
        s.serialize_field("end_time_ms", &self.end_time_ms)?;
        s.serialize_field("resources", &EachWorkersResources(&self.workers))?;
        if !self.attempts.is_empty() {
            s.serialize_field("attempts", &self.attempts)?;
        }
        if let Some(at) = self.last_heartbeat_ms {
            s.serialize_field("last_heartbeat_ms", &at)?;
        }
        if let Some(cause) = &self.cause {
            s.serialize_field("cause", cause)?;
        }
        if let Some(id) = &self.restored_from {
            s.serialize_field("restored_from", id)?;
        }
        if let Some(path) = &self.controller_log_file_path {
            s.serialize_field("controller_log_file_path", path)?;
        }
        if !self.framework_versions.is_empty() {
            s.serialize_field("framework_versions", &self.framework_versions)?;
        }
        if let Some(settings) = &self.run_settings {
            s.serialize_field("run_settings", settings)?;
        }
        if !self.heartbeats {
            s.serialize_field("heartbeats", &false)?;
        }
        if let Some(cluster) = &self.cluster {
            s.serialize_field("cluster", cluster)?;
        }
        if !self.status_history.is_empty() {
            s.serialize_field("status_history", &self.status_history)?;
        }
        if let Some(health) = &self.health {
            s.serialize_field("health", health)?;
        }
        if !self.health_history.is_empty() {
            s.serialize_field("health_history", &self.health_history)?;
        }
        if let Some(goodput) = &self.goodput {
            s.serialize_field("goodput", goodput)?;
        }
        s.end()
    }
}

/// Deserializes through the draft and validates it: an invalid document
/// never becomes a value. The error message names the field path and rule.
macro_rules! deserialize_through_draft {
    ($($validated:ident <- $draft:ident),* $(,)?) => {$(
        impl<'de> Deserialize<'de> for $validated {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let draft = $draft::deserialize(deserializer)?;
                $validated::try_from(draft).map_err(serde::de::Error::custom)
            }
        }

        #[cfg(feature = "schemars")]
        impl schemars::JsonSchema for $validated {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                <$draft as schemars::JsonSchema>::schema_name()
            }

            fn schema_id() -> std::borrow::Cow<'static, str> {
                <$draft as schemars::JsonSchema>::schema_id()
            }

            fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
                <$draft as schemars::JsonSchema>::json_schema(generator)
            }
        }
    )*};
}

deserialize_through_draft! {
    TrainRunInfo <- TrainRunInfoDraft,
    TrainWorkerInfo <- TrainWorkerInfoDraft,
    TrainDatasetInfo <- TrainDatasetInfoDraft,
}

#[cfg(feature = "schemars")]
impl schemars::JsonSchema for RunAttempt {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        <RunAttemptDraft as schemars::JsonSchema>::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <RunAttemptDraft as schemars::JsonSchema>::json_schema(generator)
    }
}
