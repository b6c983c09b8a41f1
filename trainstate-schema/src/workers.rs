//! [`WorkerList`]: the workers of one worker group, valid together.

use std::ops::Deref;

use serde::Serialize;

use crate::draft::TrainWorkerInfoDraft;
use crate::error::ValidationError;
use crate::model::TrainWorkerInfo;
use crate::validate::{self, Placement};

/// The workers of one worker group (a run's current attempt, or an ended
/// one), sorted by world rank and valid together.
///
/// A [`TrainWorkerInfo`] obeys the rules of a single worker; a `WorkerList`
/// also obeys the rules across the workers of a group, the same ones a run
/// checks for its `workers` and for each attempt's:
///
/// - at most [`MAX_WORKERS`](crate::limits::MAX_WORKERS) workers;
/// - world ranks are exactly `0..n` for `n` workers;
/// - on each node (`node_id`), local ranks are unique and one node rank is
///   used;
/// - distinct nodes have distinct node ranks.
///
/// Built with [`TryFrom`] from validated workers or from drafts, in any
/// order; a broken rule names the field as a run's would
/// (`workers[3].world_rank`, indexed by input position). An empty list is
/// valid.
///
/// ```
/// use trainstate_schema::{ActorStatus, Resources, TrainWorkerInfoDraft, WorkerList};
///
/// let worker = |rank: u32, node: u32| TrainWorkerInfoDraft {
///     actor_id: format!("actor{rank}"),
///     world_rank: rank,
///     local_rank: rank % 2,
///     node_rank: node,
///     node_id: format!("node{node}"),
///     node_ip: format!("10.0.0.{}", node + 1),
///     pid: 1000 + rank,
///     gpu_ids: vec![rank % 2],
///     status: ActorStatus::Alive,
///     resources: Resources::from_iter([("GPU", 1.0)]),
///     worker_log_file_path: None,
///     node_name: None,
/// };
///
/// let group = WorkerList::try_from(vec![worker(1, 0), worker(0, 0)]).unwrap();
/// assert_eq!(group.iter().map(|w| w.world_rank()).collect::<Vec<_>>(), [0, 1]);
///
/// // Two workers: ranks 0 and 1, not 0 and 2.
/// let err = WorkerList::try_from(vec![worker(0, 0), worker(2, 0)]).unwrap_err();
/// assert_eq!(err.field(), "workers[1].world_rank");
/// // Ranks 0 and 2 both have local rank 0 on node0.
/// let err = WorkerList::try_from(vec![worker(0, 0), worker(1, 1), worker(2, 0)]).unwrap_err();
/// assert_eq!(err.field(), "workers[2].local_rank");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(transparent)]
pub struct WorkerList(Vec<TrainWorkerInfo>);

impl WorkerList {
    /// The field path of a worker group's errors when built on its own.
    const FIELD: &'static str = "workers";

    /// Checks drafts, each on its own and all together, naming errors under
    /// `prefix` (`workers`, `attempts[2].workers`).
    pub(crate) fn from_drafts_at(
        prefix: &str,
        drafts: Vec<TrainWorkerInfoDraft>,
    ) -> Result<Self, ValidationError> {
        let order = validate::workers(prefix, &drafts, |i, w| {
            validate::worker(&format!("{prefix}[{i}]."), w)
        })?;
        Ok(Self(in_order(drafts, order).map(TrainWorkerInfo::from_checked).collect()))
    }

    /// The workers, sorted by world rank.
    pub fn as_slice(&self) -> &[TrainWorkerInfo] {
        &self.0
    }

    /// Marks every worker `DEAD`: their attempt or run has ended. The
    /// rules across workers do not look at status, so they still hold.
    pub fn mark_dead(&mut self) {
        for worker in &mut self.0 {
            worker.status = crate::ActorStatus::Dead;
        }
    }

    /// The workers, sorted by world rank.
    pub fn into_vec(self) -> Vec<TrainWorkerInfo> {
        self.0
    }
}

/// `items` in the order of their indexes in `order`, a permutation.
fn in_order<T>(items: Vec<T>, order: Vec<usize>) -> impl Iterator<Item = T> {
    let mut slots: Vec<Option<T>> = items.into_iter().map(Some).collect();
    order.into_iter().filter_map(move |i| slots[i].take())
}

impl Placement for TrainWorkerInfo {
    fn world_rank(&self) -> u32 {
        self.world_rank()
    }
    fn local_rank(&self) -> u32 {
        self.local_rank()
    }
    fn node_rank(&self) -> u32 {
        self.node_rank()
    }
    fn node_id(&self) -> &str {
        self.node_id()
    }
}

impl TryFrom<Vec<TrainWorkerInfo>> for WorkerList {
    type Error = ValidationError;

    /// Checks the rules across the workers (each is valid on its own).
    fn try_from(workers: Vec<TrainWorkerInfo>) -> Result<Self, ValidationError> {
        let order = validate::workers(Self::FIELD, &workers, |_, _| Ok(()))?;
        Ok(Self(in_order(workers, order).collect()))
    }
}

impl TryFrom<Vec<TrainWorkerInfoDraft>> for WorkerList {
    type Error = ValidationError;

    /// Checks every rule of each worker and the rules across them.
    fn try_from(drafts: Vec<TrainWorkerInfoDraft>) -> Result<Self, ValidationError> {
        Self::from_drafts_at(Self::FIELD, drafts)
    }
}

impl Deref for WorkerList {
    type Target = [TrainWorkerInfo];

    fn deref(&self) -> &[TrainWorkerInfo] {
        &self.0
    }
}

impl AsRef<[TrainWorkerInfo]> for WorkerList {
    fn as_ref(&self) -> &[TrainWorkerInfo] {
        &self.0
    }
}

impl From<WorkerList> for Vec<TrainWorkerInfo> {
    fn from(list: WorkerList) -> Self {
        list.0
    }
}
