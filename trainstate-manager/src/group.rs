//! [`WorkerGroup`]: the controller's view of its workers, and how the
//! manager gathers their metadata.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use trainstate_schema::TrainWorkerInfo;

use crate::error::{ManagerError, WorkerError};

/// What [`WorkerGroup::worker_info`] returns: a future that owns what it
/// needs, so the manager can run every worker's request at once.
pub type WorkerInfoFuture =
    Pin<Box<dyn Future<Output = Result<TrainWorkerInfo, WorkerError>> + Send + 'static>>;

/// The controller's view of its workers, from which the manager collects
/// one [`TrainWorkerInfo`] per worker.
///
/// Workers are addressed by world rank, `0..world_size()`. The manager asks
/// every worker at once and gives up on the group at its gather deadline.
///
/// [`RactorWorkerGroup`](crate::RactorWorkerGroup) is the implementation
/// for workers that are ractor actors; any other transport implements this
/// trait:
///
/// ```
/// use std::net::Ipv4Addr;
/// use trainstate_manager::{WorkerError, WorkerGroup, WorkerInfoFuture};
/// use trainstate_schema::{ActorStatus, Resources, TrainWorkerInfoDraft};
///
/// /// One worker: this process.
/// struct Solo;
///
/// impl WorkerGroup for Solo {
///     fn world_size(&self) -> u32 {
///         1
///     }
///
///     fn worker_info(&self, world_rank: u32) -> WorkerInfoFuture {
///         Box::pin(async move {
///             let info = TrainWorkerInfoDraft {
///                 actor_id: "solo".into(),
///                 world_rank,
///                 local_rank: 0,
///                 node_rank: 0,
///                 node_id: "node-0".into(),
///                 node_ip: Ipv4Addr::LOCALHOST.to_string(),
///                 pid: std::process::id(),
///                 gpu_ids: vec![],
///                 status: ActorStatus::Alive,
///                 resources: Resources::from_iter([("CPU", 1.0)]),
///                 worker_log_file_path: None,
///                 node_name: None,
///             };
///             Ok(info.validate()?)
///         })
///     }
/// }
/// # let _: Result<(), WorkerError> = Ok(());
/// ```
pub trait WorkerGroup: Send + Sync {
    /// How many workers the group has; their world ranks are
    /// `0..world_size()`.
    fn world_size(&self) -> u32;

    /// Asks the worker of `world_rank` about itself. The answer's
    /// `world_rank` must be `world_rank`.
    fn worker_info(&self, world_rank: u32) -> WorkerInfoFuture;
}

impl<G: WorkerGroup + ?Sized> WorkerGroup for &G {
    fn world_size(&self) -> u32 {
        (**self).world_size()
    }

    fn worker_info(&self, world_rank: u32) -> WorkerInfoFuture {
        (**self).worker_info(world_rank)
    }
}

impl<G: WorkerGroup + ?Sized> WorkerGroup for std::sync::Arc<G> {
    fn world_size(&self) -> u32 {
        (**self).world_size()
    }

    fn worker_info(&self, world_rank: u32) -> WorkerInfoFuture {
        (**self).worker_info(world_rank)
    }
}

/// Asks every worker of `group` at once and returns their answers sorted by
/// world rank. The first worker to fail fails the gather, naming its rank;
/// at `timeout` the lowest rank still silent is named.
pub(crate) async fn gather<G: WorkerGroup + ?Sized>(
    group: &G,
    timeout: Duration,
) -> Result<Vec<TrainWorkerInfo>, ManagerError> {
    let deadline = Instant::now() + timeout;
    let size = group.world_size();
    let mut tasks = JoinSet::new();
    let mut rank_of = HashMap::with_capacity(size as usize);
    for rank in 0..size {
        let task = tasks.spawn(group.worker_info(rank));
        rank_of.insert(task.id(), rank);
    }
    let mut answers: Vec<Option<TrainWorkerInfo>> = vec![None; size as usize];
    loop {
        let joined = match tokio::time::timeout_at(deadline, tasks.join_next_with_id()).await {
            Ok(Some(joined)) => joined,
            Ok(None) => break,
            Err(_) => {
                let rank = answers.iter().position(Option::is_none).unwrap_or_default() as u32;
                return Err(ManagerError::WorkerTimeout { rank, after: timeout });
            }
        };
        let (rank, answer) = match joined {
            Ok((id, answer)) => (rank_of.get(&id).copied().unwrap_or_default(), answer),
            Err(err) => {
                let rank = rank_of.get(&err.id()).copied().unwrap_or_default();
                let reason = if err.is_panic() { "its request panicked" } else { "cancelled" };
                return Err(ManagerError::Worker { rank, source: WorkerError::failed(reason) });
            }
        };
        let info = answer.map_err(|source| ManagerError::Worker { rank, source })?;
        if info.world_rank() != rank {
            return Err(ManagerError::Worker {
                rank,
                source: WorkerError::failed(format!(
                    "asked for rank {rank}, it answered as rank {}",
                    info.world_rank()
                )),
            });
        }
        answers[rank as usize] = Some(info);
    }
    Ok(answers.into_iter().flatten().collect())
}
