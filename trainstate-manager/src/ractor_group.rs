//! The ractor implementation of [`WorkerGroup`]: each worker is an actor
//! that answers a [`MetadataRequest`] about its own process.

use std::collections::BTreeMap;

use ractor::rpc::CallResult;
use ractor::{Actor, ActorProcessingErr, ActorRef, Message, RpcReplyPort, SpawnErr};
use trainstate_schema::{
    ActorStatus, Rule, TrainWorkerInfo, TrainWorkerInfoDraft, ValidationError,
};

use crate::error::WorkerError;
use crate::group::{WorkerGroup, WorkerInfoFuture};
use crate::probe::{ProbeInputs, WorkerMetadata};

/// A request to a worker actor for its [`WorkerMetadata`].
///
/// A worker actor of any message type `M` answers it when
/// `M: From<MetadataRequest>`: its handler replies on the port with what
/// [`WorkerMetadata::probe`] found when the worker started.
#[derive(Debug)]
pub struct MetadataRequest {
    /// Where the worker sends its metadata.
    pub reply: RpcReplyPort<WorkerMetadata>,
}

impl From<RpcReplyPort<WorkerMetadata>> for MetadataRequest {
    fn from(reply: RpcReplyPort<WorkerMetadata>) -> Self {
        Self { reply }
    }
}

/// A worker actor that only answers metadata requests: it probes its
/// process once, when it starts, from the [`ProbeInputs`] it is spawned
/// with.
///
/// Training workers that are actors of their own add a variant holding a
/// [`MetadataRequest`] to their message type instead.
#[derive(Debug, Clone, Copy, Default)]
pub struct MetadataWorker;

impl MetadataWorker {
    /// Spawns a worker probing `inputs`, unnamed and unsupervised.
    pub async fn spawn_with(inputs: ProbeInputs) -> Result<ActorRef<MetadataRequest>, SpawnErr> {
        let (actor, _) = Actor::spawn(None, MetadataWorker, inputs).await?;
        Ok(actor)
    }
}

impl Actor for MetadataWorker {
    type Msg = MetadataRequest;
    type State = WorkerMetadata;
    type Arguments = ProbeInputs;

    async fn pre_start(
        &self,
        _myself: ActorRef<MetadataRequest>,
        inputs: ProbeInputs,
    ) -> Result<WorkerMetadata, ActorProcessingErr> {
        Ok(WorkerMetadata::probe(&inputs))
    }

    async fn handle(
        &self,
        _myself: ActorRef<MetadataRequest>,
        request: MetadataRequest,
        metadata: &mut WorkerMetadata,
    ) -> Result<(), ActorProcessingErr> {
        let _ = request.reply.send(metadata.clone());
        Ok(())
    }
}

/// One worker of a [`RactorWorkerGroup`]: its actor and its ranks.
#[derive(Debug)]
#[non_exhaustive]
pub struct RactorWorker<M: Message = MetadataRequest> {
    /// The worker's actor.
    pub actor: ActorRef<M>,
    /// Rank among all workers of the group.
    pub world_rank: u32,
    /// Rank among the workers on the same node.
    pub local_rank: u32,
    /// Rank of the worker's node.
    pub node_rank: u32,
}

impl<M: Message> Clone for RactorWorker<M> {
    fn clone(&self) -> Self {
        Self {
            actor: self.actor.clone(),
            world_rank: self.world_rank,
            local_rank: self.local_rank,
            node_rank: self.node_rank,
        }
    }
}

impl<M: Message> RactorWorker<M> {
    /// A worker with its ranks.
    pub fn new(actor: ActorRef<M>, world_rank: u32, local_rank: u32, node_rank: u32) -> Self {
        Self { actor, world_rank, local_rank, node_rank }
    }
}

/// A [`WorkerGroup`] whose workers are ractor actors: it holds their
/// references and ranks, and asks each for its metadata.
///
/// A worker's `actor_id` is its actor's registered name when it has one,
/// else `<node_id>:<pid>:<actor id>`, unique across nodes and processes.
#[derive(Debug)]
pub struct RactorWorkerGroup<M: Message = MetadataRequest> {
    /// Indexed by world rank.
    workers: Vec<RactorWorker<M>>,
}

impl<M: Message> Clone for RactorWorkerGroup<M> {
    fn clone(&self) -> Self {
        Self { workers: self.workers.clone() }
    }
}

impl<M: Message + From<MetadataRequest>> RactorWorkerGroup<M> {
    /// A group of `workers`, whose world ranks must be exactly `0..n`.
    pub fn new(workers: Vec<RactorWorker<M>>) -> Result<Self, ValidationError> {
        let n = workers.len();
        let mut slots: BTreeMap<u32, RactorWorker<M>> = BTreeMap::new();
        for (i, worker) in workers.into_iter().enumerate() {
            let rank = worker.world_rank;
            let path = || format!("workers[{i}].world_rank");
            if rank as usize >= n {
                return Err(ValidationError::new(
                    path(),
                    Rule::WorldRankOutOfRange { rank, workers: n },
                ));
            }
            if slots.insert(rank, worker).is_some() {
                return Err(ValidationError::new(path(), Rule::DuplicateWorldRank { rank }));
            }
        }
        Ok(Self { workers: slots.into_values().collect() })
    }

    /// A group laid out node by node: `nodes[i]` are the actors on node
    /// rank `i`, in local-rank order; world ranks run through the nodes in
    /// order.
    pub fn from_nodes(nodes: Vec<Vec<ActorRef<M>>>) -> Self {
        let mut workers = Vec::new();
        for (node_rank, actors) in nodes.into_iter().enumerate() {
            for (local_rank, actor) in actors.into_iter().enumerate() {
                let world_rank = workers.len() as u32;
                workers.push(RactorWorker::new(
                    actor,
                    world_rank,
                    local_rank as u32,
                    node_rank as u32,
                ));
            }
        }
        Self { workers }
    }

    /// The workers, by world rank.
    pub fn workers(&self) -> &[RactorWorker<M>] {
        &self.workers
    }
}

impl<M: Message + From<MetadataRequest>> WorkerGroup for RactorWorkerGroup<M> {
    fn world_size(&self) -> u32 {
        self.workers.len() as u32
    }

    fn worker_info(&self, world_rank: u32) -> WorkerInfoFuture {
        let worker = self.workers.get(world_rank as usize).cloned();
        Box::pin(async move {
            let worker = worker.ok_or(WorkerError::NoSuchRank)?;
            let answer = worker
                .actor
                .call(|reply| M::from(MetadataRequest { reply }), None)
                .await
                .map_err(|err| WorkerError::unreachable(err.to_string()))?;
            let metadata = match answer {
                CallResult::Success(metadata) => metadata,
                CallResult::Timeout => return Err(WorkerError::failed("timed out")),
                CallResult::SenderError => {
                    return Err(WorkerError::failed("the worker dropped the request"));
                }
            };
            let actor_id = worker.actor.get_name().unwrap_or_else(|| {
                format!("{}:{}:{}", metadata.node_id, metadata.pid, worker.actor.get_id())
            });
            let draft = TrainWorkerInfoDraft {
                actor_id,
                world_rank: worker.world_rank,
                local_rank: worker.local_rank,
                node_rank: worker.node_rank,
                node_id: metadata.node_id,
                node_ip: metadata.node_ip.to_string(),
                pid: metadata.pid,
                gpu_ids: metadata.gpu_ids,
                status: ActorStatus::Alive,
                resources: metadata.resources,
                worker_log_file_path: None,
                node_name: metadata.node_name,
            };
            Ok(TrainWorkerInfo::try_from(draft)?)
        })
    }
}
