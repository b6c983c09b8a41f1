//! [`TrainRunStateManager`]: reports a controller's runs to the state actor.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use trainstate_client::{StateHandle, StatusUpdate};
use trainstate_schema::api::{RankProgress, RankStackReport, StackCapture, StacksRequest};
use trainstate_schema::{
    CauseKind, Rule, RunCause, RunId, TrainDatasetInfoDraft, TrainRunInfo, TrainRunInfoDraft,
    TrainWorkerInfo, ValidationError, WorkerList,
};

use crate::config::ManagerConfig;
use crate::delivery::{Ack, Outbox, deliver};
use crate::error::ManagerError;
use crate::group::{WorkerGroup, gather};
use crate::progress::{ProgressOutbox, send_progress};

/// A dataset given to the trainer, as the manager reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DatasetSpec {
    /// The key the trainer was given the dataset under.
    pub key: String,
    /// The dataset's unique id.
    pub uuid: String,
    /// The dataset's own name, when it has one.
    pub name: Option<String>,
}

impl DatasetSpec {
    /// A dataset given under `key`, with its unique id.
    pub fn new(key: impl Into<String>, uuid: impl Into<String>) -> Self {
        Self { key: key.into(), uuid: uuid.into(), name: None }
    }

    /// The same dataset with its own name.
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The wire entry: `name` is the key, `dataset_name` is
    /// `<key>_<own name>` (null when the dataset has no name).
    pub fn to_draft(&self) -> TrainDatasetInfoDraft {
        TrainDatasetInfoDraft {
            name: self.key.clone(),
            dataset_uuid: self.uuid.clone(),
            dataset_name: self.name.as_ref().map(|name| format!("{}_{name}", self.key)),
        }
    }
}

/// What became of a registration.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RunRegistration {
    /// The state actor acknowledged the run: it is durable.
    Registered(RunId),
    /// The deadline passed first; delivery goes on in the background.
    Pending(RunId),
    /// Tracking is off (no state actor); nothing was sent.
    Untracked(RunId),
}

impl RunRegistration {
    /// The run's id, whatever became of the registration.
    pub fn id(&self) -> &RunId {
        match self {
            RunRegistration::Registered(id)
            | RunRegistration::Pending(id)
            | RunRegistration::Untracked(id) => id,
        }
    }

    /// The run's id.
    pub fn into_id(self) -> RunId {
        match self {
            RunRegistration::Registered(id)
            | RunRegistration::Pending(id)
            | RunRegistration::Untracked(id) => id,
        }
    }
}

/// What became of a write after the registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Delivery {
    /// The state actor acknowledged the write: it is durable.
    Acknowledged,
    /// The deadline passed first; delivery goes on in the background.
    Pending,
    /// Tracking is off (no state actor); nothing was sent.
    Untracked,
}

/// Reports a controller's training runs to the state actor: gathers the
/// workers' metadata, registers each run once, records new worker groups,
/// and reports how each run ends.
///
/// Observability never breaks training. Every call returns within its
/// deadline ([`ManagerConfig::call_timeout`], plus
/// [`ManagerConfig::gather_timeout`] where workers are asked), never panics,
/// and returns an error only for what the training code should know (a
/// worker that did not answer, a run the actor refused). If the actor is
/// unreachable, the manager keeps what it would have sent and delivers it,
/// in order, when the actor is back; [`shutdown`](Self::shutdown) flushes
/// what is still pending before the controller exits.
///
/// Built with no state actor, every call is a no-op that logs a warning, as
/// Ray does when tracking is off.
///
/// While a run is live, a heartbeat renews its lease every third of the
/// lease; the terminal call, [`shutdown`](Self::shutdown) and dropping the
/// manager stop it. Dropping the manager also drops what is undelivered.
///
/// The manager runs its delivery on the Tokio runtime it is created in;
/// created outside one, it tracks nothing.
pub struct TrainRunStateManager {
    config: ManagerConfig,
    tracking: Option<Tracking>,
    created_ms: u64,
    first_run_taken: AtomicBool,
}

struct Tracking {
    shared: Arc<Outbox>,
    task: JoinHandle<()>,
    progress: Arc<ProgressOutbox>,
    progress_task: JoinHandle<()>,
}

impl Drop for Tracking {
    fn drop(&mut self) {
        self.task.abort();
        self.progress_task.abort();
        self.shared.stop_heartbeats();
    }
}

impl std::fmt::Debug for TrainRunStateManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrainRunStateManager")
            .field("config", &self.config)
            .field("tracking", &self.tracking.is_some())
            .finish()
    }
}

impl TrainRunStateManager {
    /// A manager reporting to `state`, or tracking nothing when `state` is
    /// `None` (as when no state actor runs).
    ///
    /// With a state actor, this spawns the delivery task on the current
    /// Tokio runtime; without a runtime, it logs a warning and tracks
    /// nothing.
    pub fn new(state: Option<StateHandle>, config: ManagerConfig) -> Self {
        let tracking = state.and_then(|handle| match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let shared = Outbox::new(handle, config.clone());
                let task = runtime.spawn(deliver(shared.clone()));
                let progress = Arc::new(ProgressOutbox::default());
                let sending = send_progress(shared.clone(), progress.clone(), config.progress_interval);
                let progress_task = runtime.spawn(sending);
                Some(Tracking { shared, task, progress, progress_task })
            }
            Err(_) => {
                tracing::warn!(
                    "the run-state manager was created outside a Tokio runtime; run-state tracking is off"
                );
                None
            }
        });
        let created_ms = config.clock.now_ms();
        Self { config, tracking, created_ms, first_run_taken: AtomicBool::new(false) }
    }

    /// The configuration.
    pub fn config(&self) -> &ManagerConfig {
        &self.config
    }

    /// True when runs are reported to a state actor.
    pub fn is_tracking(&self) -> bool {
        self.tracking.is_some()
    }

    /// Writes not yet acknowledged by the state actor, over every run.
    pub fn pending_writes(&self) -> usize {
        self.tracking.as_ref().map_or(0, |t| t.shared.pending())
    }

    /// Says where rank `rank`'s training loop is in run `run_id`: its
    /// step, phase and latest metrics, from which the head decides the
    /// run's health (PROGRESSING, or STALLED once no rank advanced for the
    /// head's stall window) and which it serves as the run's
    /// `rank_progress` and metric histories.
    ///
    /// A report's `checkpoint` says progress up to that step is saved:
    /// the head counts the work a failure loses from the run's latest mark.
    ///
    /// Never waits: the report is merged with what waits for the same rank
    /// (the latest step, phase and total win, but the highest step and the
    /// highest checkpoint mark are kept, so a mark is never lost; metrics
    /// are merged) and sent in the background at most once per
    /// [`ManagerConfig::progress_interval`], once the head has acknowledged
    /// the run and its latest worker group.
    ///
    /// A report that breaks a rule of [`RankProgress`], or whose
    /// checkpoint mark is ahead of the rank's step (the report's, else the
    /// latest taken) or below the rank's previous mark of the attempt, is
    /// refused: [`ManagerError::InvalidProgress`], naming the field
    /// (`progress.checkpoint`). What cannot be sent (a rank the latest
    /// worker group does not have, a run this manager does not track live,
    /// a request the head refused or did not answer) is dropped; refused
    /// and dropped reports are counted in
    /// [`dropped_progress`](Self::dropped_progress), never queued. Without
    /// a state actor it does nothing.
    pub fn report_progress(
        &self,
        run_id: &RunId,
        rank: u32,
        progress: RankProgress,
    ) -> Result<(), ManagerError> {
        if let Some(tracking) = &self.tracking {
            tracking
                .progress
                .report(&tracking.shared, run_id, rank, progress)
                .map_err(ManagerError::InvalidProgress)?;
        }
        Ok(())
    }

    /// How many rank progress reports were dropped since the manager was
    /// created: never sent (see [`report_progress`](Self::report_progress)),
    /// or refused by the head.
    pub fn dropped_progress(&self) -> u64 {
        self.tracking.as_ref().map_or(0, |t| t.progress.dropped())
    }

    /// Registers a new run: a fresh run id for every call (a restore of an
    /// earlier run is a new run, naming it in `restored_from`).
    ///
    /// Gathers every worker's metadata at once, within the gather deadline;
    /// a worker that fails or is late fails the registration with an error
    /// naming its rank. The run is `RUNNING`, its workers sorted by world
    /// rank, its datasets as [`DatasetSpec::to_draft`] makes them. Its
    /// `start_time_ms` is when the manager was created for it: the
    /// manager's creation for the first run it registers, the start of this
    /// call for any later one.
    ///
    /// Returns [`RunRegistration::Registered`] once the actor has
    /// acknowledged the run (so it survives the controller dying right
    /// after), or [`RunRegistration::Pending`] when the deadline passes
    /// first, while delivery goes on in the background.
    pub async fn register_train_run<G: WorkerGroup + ?Sized>(
        &self,
        name: &str,
        job_id: &str,
        controller_actor_id: &str,
        worker_group: &G,
        datasets: impl IntoIterator<Item = DatasetSpec>,
        restored_from: Option<RunId>,
    ) -> Result<RunRegistration, ManagerError> {
        let id = RunId::new_v7();
        let start_time_ms = if self.first_run_taken.swap(true, Ordering::SeqCst) {
            self.config.clock.now_ms()
        } else {
            self.created_ms
        };
        let Some(tracking) = self.tracking("register_train_run") else {
            return Ok(RunRegistration::Untracked(id));
        };
        Self::in_runtime("register_train_run")?;
        if tracking.shared.is_closed() {
            return Err(ManagerError::ShutDown);
        }
        let workers = gather(worker_group, self.config.gather_timeout).await?;
        let run = build_run(RunParts {
            id: &id,
            name,
            job_id,
            controller_actor_id,
            workers,
            datasets: datasets.into_iter().map(|d| d.to_draft()).collect(),
            start_time_ms,
            restored_from,
        })?;
        let ack = tracking.shared.register(run)?;
        Ok(match self.wait(&id, ack).await? {
            true => RunRegistration::Registered(id),
            false => RunRegistration::Pending(id),
        })
    }

    /// Records a new worker group of a live run (an elastic resize, or a
    /// restart after a failure): a new attempt, whose previous workers the
    /// actor marks `DEAD`. Gathers the workers' metadata like
    /// [`register_train_run`](Self::register_train_run).
    pub async fn update_worker_group<G: WorkerGroup + ?Sized>(
        &self,
        run_id: &RunId,
        worker_group: &G,
    ) -> Result<Delivery, ManagerError> {
        let Some(tracking) = self.tracking("update_worker_group") else {
            return Ok(Delivery::Untracked);
        };
        Self::in_runtime("update_worker_group")?;
        tracking.shared.check_live(run_id)?;
        let workers = gather(worker_group, self.config.gather_timeout).await?;
        // A bad group is refused to the caller rather than by the actor later.
        let workers = WorkerList::try_from(workers)?;
        let ack = tracking.shared.start_attempt(run_id, workers.into_vec())?;
        self.delivery(run_id, ack).await
    }

    /// The run finished successfully. Waits for the acknowledgement, at
    /// most the call deadline.
    pub async fn finished(&self, run_id: &RunId) -> Result<Delivery, ManagerError> {
        self.end(run_id, "finished", StatusUpdate::finished()).await
    }

    /// The run failed with `error`: raised by the worker of world rank
    /// `rank` (a user error), or by the controller when `rank` is `None`
    /// (a system error). `trace` is the error's traceback; the stored
    /// detail is Ray's `Rank {rank} worker raised an error.` followed by the
    /// trace, which is made to contain `error`. Waits for the
    /// acknowledgement, at most the call deadline.
    pub async fn errored(
        &self,
        run_id: &RunId,
        rank: Option<u32>,
        error: &str,
        trace: &str,
    ) -> Result<Delivery, ManagerError> {
        let kind = if rank.is_some() { CauseKind::UserError } else { CauseKind::SystemError };
        self.errored_with_cause(run_id, rank, kind, error, trace).await
    }

    /// As [`errored`](Self::errored), with the kind of failure given.
    pub async fn errored_with_cause(
        &self,
        run_id: &RunId,
        rank: Option<u32>,
        kind: CauseKind,
        error: &str,
        trace: &str,
    ) -> Result<Delivery, ManagerError> {
        let detail = if trace.contains(error) {
            trace.to_owned()
        } else if trace.is_empty() {
            error.to_owned()
        } else {
            format!("{trace}\n{error}")
        };
        self.end(run_id, "errored", StatusUpdate::errored(rank, kind, detail)).await
    }

    /// The run was stopped before it finished, for `cause` (a user
    /// interrupt, say). Waits for the acknowledgement, at most the call
    /// deadline.
    pub async fn aborted(
        &self,
        run_id: &RunId,
        cause: CauseKind,
    ) -> Result<Delivery, ManagerError> {
        self.aborted_with_cause(run_id, None, cause, "").await
    }

    /// As [`aborted`](Self::aborted), naming the world rank that failed
    /// first (the rank on a node that was preempted or lost, say), if one
    /// did, and saying why in `detail` (the kind's own words when empty).
    /// The head gives the cause its class (`PREEMPTED` and `TIMEOUT` are
    /// interruptions, `NODE_LOST`, `OOM` and `HARDWARE` the machine's).
    pub async fn aborted_with_cause(
        &self,
        run_id: &RunId,
        rank: Option<u32>,
        kind: CauseKind,
        detail: &str,
    ) -> Result<Delivery, ManagerError> {
        let detail = if detail.is_empty() { abort_words(kind) } else { detail };
        let mut update = StatusUpdate::aborted(kind, detail);
        update.cause = Some(RunCause::new(kind, rank));
        self.end(run_id, "aborted", update).await
    }

    /// Attaches the stacks this controller holds of live run `run_id`'s
    /// ranks (each rank's stacks as text, in `ranks`): a capture of its own
    /// (trigger `CONTROLLER`), for `reason`, which the head keeps with the
    /// run at once, complete, and groups like any other: the ranks stuck in
    /// the same place together, the others named as suspects. A rank of
    /// the run's latest worker group not in `ranks` is listed as not
    /// answering. Answers the capture as the head keeps it.
    ///
    /// Sent at once, not queued: what the head does not take within the
    /// call deadline is an error ([`ManagerError::Unreachable`]), never
    /// sent later. A run this manager does not track live is
    /// [`ManagerError::UnknownRun`]; no ranks is
    /// [`ManagerError::InvalidStacks`]; what the head refuses (a rank
    /// outside the group, a bad `source`, a `reason` over 256 characters,
    /// a worker group the head does not know yet) is
    /// [`ManagerError::Rejected`], naming the field.
    pub async fn attach_stacks(
        &self,
        run_id: &RunId,
        reason: Option<String>,
        ranks: Vec<RankStackReport>,
    ) -> Result<StackCapture, ManagerError> {
        let Some(tracking) = self.tracking("attach_stacks") else {
            return Err(ManagerError::Untracked);
        };
        Self::in_runtime("attach_stacks")?;
        if ranks.is_empty() {
            return Err(ManagerError::InvalidStacks(ValidationError::new("ranks", Rule::Empty)));
        }
        let attempt = tracking
            .shared
            .attempt(run_id)
            .ok_or_else(|| ManagerError::UnknownRun { id: run_id.clone() })?;
        // The latest worker group's: the head refuses stacks of a group it
        // does not hold as the run's current attempt.
        let request = StacksRequest::attach(Some(attempt.attempt_id), reason, ranks);
        let handle = tracking.shared.handle();
        match handle.post_stacks(run_id, request).await {
            Ok(capture) => Ok(capture),
            Err(source) if source.is_retryable() => {
                Err(ManagerError::Unreachable { id: run_id.clone(), source })
            }
            Err(source) => Err(ManagerError::Rejected { id: run_id.clone(), source }),
        }
    }

    /// Flushes what is still undelivered, waiting at most `grace`, then
    /// stops every heartbeat and the delivery. Returns the number of writes
    /// left undelivered. Calls after it fail with [`ManagerError::ShutDown`].
    pub async fn shutdown(&self, grace: Duration) -> usize {
        let Some(tracking) = self.tracking("shutdown") else {
            return 0;
        };
        tracking.shared.close();
        tracking.progress_task.abort();
        tracking.progress.close();
        if Self::in_runtime("shutdown").is_err() {
            tracking.shared.stop_heartbeats();
            tracking.task.abort();
            return tracking.shared.pending();
        }
        let left = tracking.shared.drain(Instant::now() + grace).await;
        tracking.shared.stop_heartbeats();
        tracking.task.abort();
        if left > 0 {
            tracing::warn!(
                writes = left,
                "shut down with writes the state actor never acknowledged"
            );
        }
        left
    }

    fn tracking(&self, call: &str) -> Option<&Tracking> {
        if self.tracking.is_none() {
            tracing::warn!(call, "no state actor: run-state tracking is off; training goes on");
        }
        self.tracking.as_ref()
    }

    /// Fails when called outside a Tokio runtime, where the manager's
    /// timers and tasks cannot run.
    fn in_runtime(call: &str) -> Result<(), ManagerError> {
        if tokio::runtime::Handle::try_current().is_err() {
            tracing::warn!(call, "called outside a Tokio runtime; nothing was sent");
            return Err(ManagerError::NoRuntime);
        }
        Ok(())
    }

    async fn end(
        &self,
        run_id: &RunId,
        call: &str,
        update: StatusUpdate,
    ) -> Result<Delivery, ManagerError> {
        let Some(tracking) = self.tracking(call) else {
            return Ok(Delivery::Untracked);
        };
        Self::in_runtime(call)?;
        let ack = tracking.shared.end(run_id, update)?;
        self.delivery(run_id, ack).await
    }

    async fn delivery(&self, run_id: &RunId, ack: Ack) -> Result<Delivery, ManagerError> {
        Ok(match self.wait(run_id, ack).await? {
            true => Delivery::Acknowledged,
            false => Delivery::Pending,
        })
    }

    /// Waits for a write's acknowledgement up to the call deadline: true
    /// when acknowledged, false when still pending.
    async fn wait(&self, id: &RunId, ack: Ack) -> Result<bool, ManagerError> {
        match tokio::time::timeout(self.config.call_timeout, ack).await {
            Ok(Ok(Ok(()))) => Ok(true),
            Ok(Ok(Err(source))) => Err(ManagerError::Rejected { id: id.clone(), source }),
            Ok(Err(_)) | Err(_) => Ok(false),
        }
    }
}

struct RunParts<'a> {
    id: &'a RunId,
    name: &'a str,
    job_id: &'a str,
    controller_actor_id: &'a str,
    workers: Vec<TrainWorkerInfo>,
    datasets: Vec<TrainDatasetInfoDraft>,
    start_time_ms: u64,
    restored_from: Option<RunId>,
}

fn build_run(parts: RunParts<'_>) -> Result<TrainRunInfo, ManagerError> {
    let draft = TrainRunInfoDraft {
        workers: parts.workers.into_iter().map(TrainWorkerInfo::into_draft).collect(),
        datasets: parts.datasets,
        restored_from: parts.restored_from.map(|id| id.to_string()),
        ..TrainRunInfoDraft::new(
            parts.id.to_string(),
            parts.name,
            parts.job_id,
            parts.controller_actor_id,
            parts.start_time_ms,
        )
    };
    Ok(draft.validate()?)
}

/// What a run aborted for `kind` says, when its controller says nothing
/// more.
fn abort_words(kind: CauseKind) -> &'static str {
    match kind {
        CauseKind::UserInterrupt => "The run was interrupted.",
        CauseKind::LostController => "The run's controller was lost.",
        CauseKind::SystemError => "The run was stopped by a system failure.",
        CauseKind::UserError => "The run was stopped by an error in the training code.",
        CauseKind::Oom => "The run was stopped: a rank ran out of memory.",
        CauseKind::Preempted => "The run was stopped: the scheduler preempted its allocation.",
        CauseKind::Timeout => "The run was stopped: its allocation's time ran out.",
        CauseKind::NodeLost => "The run was stopped: a node was lost under it.",
        CauseKind::Hardware => "The run was stopped: a device failed.",
        _ => "The run was stopped before it finished.",
    }
}
