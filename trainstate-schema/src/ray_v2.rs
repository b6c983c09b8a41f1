//! Ray Train V2's documents, as Ray 2.60 writes and serves them: the
//! `TrainRun` and `TrainRunAttempt` its state actor keeps (and that a
//! controller upserts whole), and the `DecoratedTrainRun`s of its
//! dashboard route `GET /api/train/v2/runs/v1`.
//!
//! One model underneath: a V2 document is a view of a [`TrainRunInfo`]
//! ([`DecoratedTrainRun::of`]), and a V2 write becomes a change of one
//! ([`TrainRun::to_draft`], [`TrainRunAttempt::worker_drafts`]). Times are
//! nanoseconds in V2 and milliseconds in the model: a V2 time is kept to
//! the millisecond.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::draft::{TrainRunInfoDraft, TrainWorkerInfoDraft};
use crate::json::JsonValue;
use crate::resources::Resources;
use crate::status::{ActorStatus, AttemptStatus, RunStatus};
use crate::{TrainRunInfo, TrainWorkerInfo};

/// Nanoseconds in a millisecond.
const NS_PER_MS: u64 = 1_000_000;

/// A V2 time (ns) as the model keeps it (ms).
pub fn ns_to_ms(ns: u64) -> u64 {
    ns / NS_PER_MS
}

/// A model time (ms) as V2 writes it (ns).
pub fn ms_to_ns(ms: u64) -> u64 {
    ms.saturating_mul(NS_PER_MS)
}

/// Ray's `TrainResources`: resources wrapped in an object.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schemars", schemars(rename = "RayTrainResources"))]
pub struct TrainResources {
    /// Name to amount.
    pub resources: Resources,
}

/// Ray's `TrainWorker`: one worker of an attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schemars", schemars(rename = "RayTrainWorker"))]
#[non_exhaustive]
pub struct TrainWorker {
    /// Rank among all workers of the attempt.
    pub world_rank: u32,
    /// Rank among the workers on the same node.
    pub local_rank: u32,
    /// Rank of the worker's node.
    pub node_rank: u32,
    /// The worker's actor id.
    pub actor_id: String,
    /// Id of the node the worker runs on.
    pub node_id: String,
    /// IP address of the node the worker runs on.
    pub node_ip: String,
    /// Process id of the worker.
    pub pid: u32,
    /// Ids of the GPUs the worker sees.
    pub gpu_ids: Vec<u32>,
    /// Whether the worker's process is alive.
    #[serde(default)]
    pub status: Option<ActorStatus>,
    /// Resources allocated to the worker.
    #[serde(deserialize_with = "crate::object::one")]
    pub resources: TrainResources,
    /// Path of the worker's log file, when known.
    #[serde(default)]
    pub log_file_path: Option<String>,
}

impl TrainWorker {
    /// The V2 form of a worker.
    pub fn of(worker: &TrainWorkerInfo) -> Self {
        Self {
            world_rank: worker.world_rank(),
            local_rank: worker.local_rank(),
            node_rank: worker.node_rank(),
            actor_id: worker.actor_id().to_owned(),
            node_id: worker.node_id().to_owned(),
            node_ip: worker.node_ip().to_owned(),
            pid: worker.pid(),
            gpu_ids: worker.gpu_ids().to_vec(),
            status: Some(worker.status()),
            resources: TrainResources { resources: worker.resources().clone() },
            log_file_path: worker.worker_log_file_path().map(str::to_owned),
        }
    }

    /// The model's draft of this worker.
    pub fn to_draft(&self) -> TrainWorkerInfoDraft {
        TrainWorkerInfoDraft {
            actor_id: self.actor_id.clone(),
            world_rank: self.world_rank,
            local_rank: self.local_rank,
            node_rank: self.node_rank,
            node_id: self.node_id.clone(),
            node_ip: self.node_ip.clone(),
            pid: self.pid,
            gpu_ids: self.gpu_ids.clone(),
            status: self.status.unwrap_or(ActorStatus::Alive),
            resources: self.resources.resources.clone(),
            worker_log_file_path: self.log_file_path.clone(),
            node_name: None,
        }
    }
}

/// Ray's `TrainRunAttempt`: one attempt of a run, written whole by Ray's
/// controller each time it changes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schemars", schemars(rename = "RayTrainRunAttempt"))]
#[non_exhaustive]
pub struct TrainRunAttempt {
    /// The run the attempt belongs to.
    pub run_id: String,
    /// The attempt's id, unique within the run.
    pub attempt_id: String,
    /// The attempt's status.
    pub status: AttemptStatus,
    /// Detail of the status (the error of an ERRORED attempt).
    #[serde(default)]
    pub status_detail: Option<String>,
    /// When the attempt started (Unix ns). Once in ms, between 946684800000 (2000-01-01) and 7258118400000 (2200-01-01): a time in ms or s is refused (422).
    pub start_time_ns: u64,
    /// When the attempt ended (Unix ns); null while it is live. Once in ms, between 946684800000 (2000-01-01) and 7258118400000 (2200-01-01): a time in ms or s is refused (422).
    #[serde(default)]
    pub end_time_ns: Option<u64>,
    /// Each worker's resources, in worker order.
    #[serde(default, deserialize_with = "crate::object::vec")]
    pub resources: Vec<TrainResources>,
    /// The attempt's workers, sorted by world rank.
    #[serde(default, deserialize_with = "crate::object::vec")]
    pub workers: Vec<TrainWorker>,
}

impl TrainRunAttempt {
    /// The model's drafts of the attempt's workers.
    pub fn worker_drafts(&self) -> Vec<TrainWorkerInfoDraft> {
        self.workers.iter().map(TrainWorker::to_draft).collect()
    }
}

/// Ray's `TrainRun`: a run's own metadata and status, written whole by
/// Ray's controller each time it changes. Its workers are its attempts'.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schemars", schemars(rename = "RayTrainRun"))]
#[non_exhaustive]
pub struct TrainRun {
    /// The run's id.
    pub id: String,
    /// The run's name.
    pub name: String,
    /// The Ray job that started it (hex).
    pub job_id: String,
    /// The actor id of the run's controller (hex).
    pub controller_actor_id: String,
    /// The run's status.
    pub status: RunStatus,
    /// Detail of the status.
    #[serde(default)]
    pub status_detail: Option<String>,
    /// When the run started (Unix ns). Once in ms, between 946684800000 (2000-01-01) and 7258118400000 (2200-01-01): a time in ms or s is refused (422).
    pub start_time_ns: u64,
    /// When the run ended (Unix ns); null while it is live. Once in ms, between 946684800000 (2000-01-01) and 7258118400000 (2200-01-01): a time in ms or s is refused (422).
    #[serde(default)]
    pub end_time_ns: Option<u64>,
    /// Path of the controller's log file.
    #[serde(default)]
    pub controller_log_file_path: Option<String>,
    /// Framework name to version.
    #[serde(default)]
    pub framework_versions: BTreeMap<String, String>,
    /// The run's settings (Ray's `RunSettings`).
    #[serde(default)]
    pub run_settings: JsonValue,
}

impl TrainRun {
    /// The model's draft of a new run from this document: no workers or
    /// attempts yet (they come with its attempts).
    pub fn to_draft(&self) -> TrainRunInfoDraft {
        let mut draft = TrainRunInfoDraft::new(
            self.id.clone(),
            self.name.clone(),
            self.job_id.clone(),
            self.controller_actor_id.clone(),
            ns_to_ms(self.start_time_ns),
        );
        // Ray's controller reports every change, but does not heartbeat.
        draft.heartbeats = Some(false);
        self.apply_to(&mut draft);
        draft
    }

    /// Writes what a V2 run document may change into a draft of the run:
    /// its status, detail, end, log path, versions and settings.
    pub fn apply_to(&self, draft: &mut TrainRunInfoDraft) {
        draft.run_status = self.status.v1();
        draft.status = Some(self.status);
        draft.status_detail = self.status_detail.clone().unwrap_or_default();
        draft.end_time_ms = self.end_time_ns.map(ns_to_ms);
        if self.controller_log_file_path.is_some() {
            draft.controller_log_file_path.clone_from(&self.controller_log_file_path);
        }
        if !self.framework_versions.is_empty() {
            draft.framework_versions.clone_from(&self.framework_versions);
        }
        if self.run_settings != JsonValue::Null {
            draft.run_settings = Some(self.run_settings.clone());
        }
    }
}

/// A worker as Ray's dashboard serves it: with process and GPU statistics,
/// which trainstate does not collect (null and empty).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schemars", schemars(rename = "RayDecoratedTrainWorker"))]
#[non_exhaustive]
pub struct DecoratedTrainWorker {
    /// The worker.
    #[serde(flatten)]
    pub worker: TrainWorker,
    /// CPU and memory statistics of the worker's process; null.
    #[serde(rename = "processStats", default)]
    pub process_stats: Option<JsonValue>,
    /// Statistics of the GPUs the worker uses; empty.
    #[serde(default)]
    pub gpus: Vec<JsonValue>,
}

/// An attempt as Ray's dashboard serves it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schemars", schemars(rename = "RayDecoratedTrainRunAttempt"))]
#[non_exhaustive]
pub struct DecoratedTrainRunAttempt {
    /// The run the attempt belongs to.
    pub run_id: String,
    /// The attempt's id.
    pub attempt_id: String,
    /// The attempt's status.
    pub status: AttemptStatus,
    /// Detail of the status.
    pub status_detail: Option<String>,
    /// When the attempt started (Unix ns).
    pub start_time_ns: u64,
    /// When the attempt ended (Unix ns).
    pub end_time_ns: Option<u64>,
    /// Each worker's resources.
    pub resources: Vec<TrainResources>,
    /// The attempt's workers.
    pub workers: Vec<DecoratedTrainWorker>,
}

/// A run as Ray's dashboard serves it on `GET /api/train/v2/runs/v1`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schemars", schemars(rename = "RayDecoratedTrainRun"))]
#[non_exhaustive]
pub struct DecoratedTrainRun {
    /// The run's own document.
    #[serde(flatten)]
    pub run: TrainRun,
    /// Its attempts, oldest first.
    pub attempts: Vec<DecoratedTrainRunAttempt>,
    /// The Ray job's details; null (trainstate does not know them).
    #[serde(default)]
    pub job_details: Option<JsonValue>,
}

/// The answer of `GET /api/train/v2/runs/v1`, Ray's `TrainRunsResponse`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schemars", schemars(rename = "RayTrainRunsResponse"))]
#[non_exhaustive]
pub struct TrainRunsResponse {
    /// Every run, newest first.
    pub train_runs: Vec<DecoratedTrainRun>,
}

impl TrainRunsResponse {
    /// An answer.
    pub fn new(train_runs: Vec<DecoratedTrainRun>) -> Self {
        Self { train_runs }
    }
}

impl DecoratedTrainRun {
    /// The V2 view of a run. What a run registered the V1 way lacks is
    /// filled in as V2 requires it: its versions (empty), and settings
    /// complete with Ray's defaults and what the run says (its workers,
    /// GPUs, datasets and name).
    pub fn of(run: &TrainRunInfo) -> Self {
        let last = run.attempts().len().saturating_sub(1);
        let attempts = run
            .attempts()
            .iter()
            .enumerate()
            .map(|(i, attempt)| {
                let workers = match attempt.workers() {
                    Some(workers) => workers,
                    None if i == last => run.workers(),
                    None => &[],
                };
                DecoratedTrainRunAttempt {
                    run_id: run.id().to_string(),
                    attempt_id: attempt.attempt_id().to_owned(),
                    status: attempt.status(),
                    status_detail: non_empty(attempt.status_detail()),
                    start_time_ns: ms_to_ns(attempt.start_time_ms()),
                    end_time_ns: attempt.end_time_ms().map(ms_to_ns),
                    resources: workers
                        .iter()
                        .map(|w| TrainResources { resources: w.resources().clone() })
                        .collect(),
                    workers: workers
                        .iter()
                        .map(|w| DecoratedTrainWorker {
                            worker: TrainWorker::of(w),
                            process_stats: None,
                            gpus: Vec::new(),
                        })
                        .collect(),
                }
            })
            .collect();
        Self {
            run: TrainRun {
                id: run.id().to_string(),
                name: run.name().to_owned(),
                job_id: run.job_id().to_owned(),
                controller_actor_id: run.controller_actor_id().to_owned(),
                status: run.status(),
                status_detail: non_empty(run.status_detail()),
                start_time_ns: ms_to_ns(run.start_time_ms()),
                end_time_ns: run.end_time_ms().map(ms_to_ns),
                controller_log_file_path: run.controller_log_file_path().map(str::to_owned),
                framework_versions: run.framework_versions().clone(),
                run_settings: run.run_settings().cloned().unwrap_or_else(|| default_settings(run)),
            },
            attempts,
            job_details: None,
        }
    }
}

fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_owned())
}

/// Ray's `RunSettings` for a run that gave none: Ray's defaults, and what
/// the run itself says.
pub fn default_settings(run: &TrainRunInfo) -> JsonValue {
    let workers = run.first_attempt_workers();
    let use_gpu = workers.iter().any(|w| !w.gpu_ids().is_empty());
    let datasets: Vec<JsonValue> =
        run.datasets().iter().map(|d| JsonValue::from(d.name())).collect();
    let execution_options = JsonValue::object()
        .with("resource_limits", JsonValue::object())
        .with("exclude_resources", JsonValue::object())
        .with("preserve_order", false)
        .with("actor_locality_enabled", true)
        .with("verbose_progress", true);
    JsonValue::object()
        .with("train_loop_config", JsonValue::Null)
        .with(
            "backend_config",
            JsonValue::object()
                .with("framework", JsonValue::Null)
                .with("config", JsonValue::object()),
        )
        .with(
            "scaling_config",
            JsonValue::object()
                .with("num_workers", JsonValue::UInt(workers.len() as u64))
                .with("use_gpu", use_gpu)
                .with("resources_per_worker", JsonValue::Null)
                .with("placement_strategy", "PACK")
                .with("accelerator_type", JsonValue::Null)
                .with("use_tpu", false)
                .with("topology", JsonValue::Null)
                .with("bundle_label_selector", JsonValue::Null),
        )
        .with("datasets", datasets)
        .with(
            "data_config",
            JsonValue::object()
                .with("datasets_to_split", "all")
                .with("execution_options", JsonValue::Null)
                .with(
                    "data_execution_options",
                    JsonValue::object()
                        .with("default", execution_options)
                        .with("per_dataset_execution_options", JsonValue::object()),
                )
                .with("enable_shard_locality", true),
        )
        .with(
            "run_config",
            JsonValue::object()
                .with("name", run.name())
                .with(
                    "failure_config",
                    JsonValue::object()
                        .with("max_failures", JsonValue::UInt(0))
                        .with("controller_failure_limit", JsonValue::Int(-1)),
                )
                .with("worker_runtime_env", JsonValue::object())
                .with(
                    "checkpoint_config",
                    JsonValue::object()
                        .with("num_to_keep", JsonValue::Null)
                        .with("checkpoint_score_attribute", JsonValue::Null)
                        .with("checkpoint_score_order", "max"),
                )
                .with("storage_path", "")
                .with("storage_filesystem", JsonValue::Null),
        )
}

/// How many attempts the run's settings allow (`max_failures + 1`), when
/// they say; `None` when unlimited (`-1`) or unknown.
pub fn attempt_budget(run: &TrainRunInfo) -> Option<u64> {
    let max_failures = run
        .run_settings()?
        .get("run_config")?
        .get("failure_config")?
        .get("max_failures")?
        .as_i64()?;
    u64::try_from(max_failures).ok().map(|m| m + 1)
}
