//! `TrainRunStateManager`, used on a training run's controller.
//!
//! The manager gathers every worker's metadata through a [`WorkerGroup`],
//! registers the run once with the trainstate state actor, records new
//! worker groups (elastic resizes, restarts after failures), and reports how
//! the run ends, without ever blocking training past a deadline or breaking
//! it. If the state actor is absent, slow or down, the manager logs a
//! warning and training goes on; it catches up when the actor is back.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use trainstate_manager::{
//!     DatasetSpec, ManagerConfig, MetadataWorker, ProbeInputs, RactorWorkerGroup,
//!     TrainRunStateManager,
//! };
//!
//! // One worker actor per training process; each probes its own process.
//! let mut node = Vec::new();
//! for _ in 0..4 {
//!     node.push(MetadataWorker::spawn_with(ProbeInputs::from_process(None)).await?);
//! }
//! let workers = RactorWorkerGroup::from_nodes(vec![node]);
//!
//! // `None` when no state actor runs: every call is then a no-op.
//! let manager = TrainRunStateManager::new(trainstate_client::get_state_actor(), ManagerConfig::default());
//! let datasets = [DatasetSpec::new("train", "ds-5f2c").named("imagenet")];
//! let run = manager
//!     .register_train_run("resnet", "job-01", "controller-0", &workers, datasets, None)
//!     .await?;
//! // ... train ...
//! manager.finished(run.id()).await?;
//! manager.shutdown(Duration::from_secs(5)).await;
//! # Ok(()) }
//! ```
//!
//! # Workers
//!
//! [`WorkerGroup`] is the controller's view of its workers.
//! [`RactorWorkerGroup`] implements it for workers that are ractor actors
//! answering a [`MetadataRequest`]; [`MetadataWorker`] is such an actor. A
//! worker's [`WorkerMetadata`] is probed from its process (pid, node id,
//! node IP, GPU ids, resources) through explicit [`ProbeInputs`]; only
//! [`ProbeInputs::from_process`] reads the environment.
//!
//! # Delivery
//!
//! Every call to the state actor has a deadline
//! ([`ManagerConfig::call_timeout`], 2 s by default). Writes are kept per run
//! in order (registration, attempts, terminal status) and delivered by one
//! background task per manager, retried with capped backoff; every write is
//! idempotent on the actor, so a write whose answer was lost is sent again.
//! A head that restarted and lost a run (an in-memory store) gets the run's
//! registration again first.
//!
//! # Progress
//!
//! [`TrainRunStateManager::report_progress`] says where a rank's training
//! loop is (its step, phase and metrics), from which the head decides the
//! run's health. It returns at once: reports are merged per rank and sent
//! in the background at most once per [`ManagerConfig::progress_interval`]
//! (a second by default); what cannot be sent is dropped and counted
//! ([`TrainRunStateManager::dropped_progress`]), never queued. A report
//! that breaks a rule (a checkpoint mark ahead of the rank's step or below
//! its previous mark, say) is refused at the call.
//!
//! # Time
//!
//! Deadlines, retries and heartbeats are Tokio timers: a test runs them on
//! paused Tokio time. The times the manager writes (a run's start, an
//! attempt's start, a run's end) are read from [`ManagerConfig::clock`], the
//! system's wall clock unless a [`Clock`] is injected.

mod config;
mod delivery;
mod error;
mod group;
mod manager;
mod probe;
mod progress;
mod ractor_group;

pub use config::{
    DEFAULT_CALL_TIMEOUT, DEFAULT_GATHER_TIMEOUT, DEFAULT_MAX_BACKOFF, DEFAULT_MIN_BACKOFF,
    DEFAULT_PROGRESS_INTERVAL, ManagerConfig,
};
pub use error::{ManagerError, WorkerError};
pub use group::{WorkerGroup, WorkerInfoFuture};
pub use manager::{DatasetSpec, Delivery, RunRegistration, TrainRunStateManager};
pub use probe::{
    CUDA_VISIBLE_DEVICES, HOSTNAME, NVIDIA_VISIBLE_DEVICES, ProbeInputs, ProbeWarning,
    WorkerMetadata, fnv1a64, parse_visible_devices,
};
pub use ractor_group::{MetadataRequest, MetadataWorker, RactorWorker, RactorWorkerGroup};
pub use trainstate_client::{Clock, ManualClock, SystemClock};
pub use trainstate_schema::api::{RankProgress, RankStackReport, StackCapture};
