//! `trainstate serve --demo`: simulated runs driven through the real
//! manager, so a newcomer sees live data at once.

use std::time::Duration;

use trainstate_client::StateHandle;
use trainstate_manager::{
    DatasetSpec, ManagerConfig, TrainRunStateManager, WorkerError, WorkerGroup, WorkerInfoFuture,
};
use trainstate_schema::{ActorStatus, CauseKind, Resources, TrainWorkerInfo, TrainWorkerInfoDraft};

/// Starts the demo in the background.
pub(crate) fn start(state: StateHandle) {
    tokio::spawn(async move {
        if let Err(err) = drive(state).await {
            tracing::warn!(error = %err, "the demo stopped");
        }
    });
}

/// Simulated workers: `nodes` nodes of `per_node` workers, one GPU each.
struct SimulatedGroup {
    workers: Vec<TrainWorkerInfo>,
}

impl SimulatedGroup {
    fn new(nodes: u32, per_node: u32, first_node: u32, pid_base: u32) -> Self {
        let workers = (0..nodes * per_node)
            .map(|rank| {
                let node = first_node + rank / per_node;
                TrainWorkerInfoDraft {
                    actor_id: format!("{:032x}", (u128::from(pid_base + rank) << 16) | 0xac7),
                    world_rank: rank,
                    local_rank: rank % per_node,
                    node_rank: rank / per_node,
                    node_id: format!("{:056x}", 0x0de0_0000u64 + u64::from(node)),
                    node_ip: format!("10.0.0.{}", node + 11),
                    pid: pid_base + rank,
                    gpu_ids: vec![rank % per_node],
                    status: ActorStatus::Alive,
                    resources: Resources::from_iter([("CPU", 8.0), ("GPU", 1.0)]),
                    worker_log_file_path: None,
                }
                .validate()
                .expect("simulated workers are valid")
            })
            .collect();
        Self { workers }
    }
}

impl WorkerGroup for SimulatedGroup {
    fn world_size(&self) -> u32 {
        self.workers.len() as u32
    }

    fn worker_info(&self, world_rank: u32) -> WorkerInfoFuture {
        let info = self.workers.get(world_rank as usize).cloned();
        Box::pin(async move { info.ok_or_else(|| WorkerError::unreachable("no such worker")) })
    }
}

const TRACE: &str = "Traceback (most recent call last):\n  File \"train.py\", line 42, in train_loop\n    loss.backward()\n  File \"torch/_tensor.py\", line 521, in backward\n    torch.autograd.backward(\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB";

/// Three rounds of four runs each: one finishes, one errors, one is
/// resized (elastic) then finishes, one long run is interrupted.
async fn drive(state: StateHandle) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    for round in 1..=3u32 {
        let manager = TrainRunStateManager::new(Some(state.clone()), ManagerConfig::default());
        let pid = 4000 + round * 100;
        let train = || [DatasetSpec::new("train", format!("{:032x}", pid * 7)).named("c4_en")];
        let register = |name: String, group: SimulatedGroup| {
            let manager = &manager;
            let datasets = train();
            async move {
                let controller = format!("{:032x}", u128::from(pid) << 40);
                let run = manager
                    .register_train_run(&name, "02000000", &controller, &group, datasets, None)
                    .await?;
                Ok::<_, trainstate_manager::ManagerError>(run.into_id())
            }
        };
        let pretrain =
            register(format!("llama-pretrain-{round}"), SimulatedGroup::new(2, 4, 0, pid)).await?;
        let finetune =
            register(format!("bert-finetune-{round}"), SimulatedGroup::new(1, 4, 2, pid + 20))
                .await?;
        let elastic =
            register(format!("resnet-elastic-{round}"), SimulatedGroup::new(2, 4, 3, pid + 40))
                .await?;
        let long =
            register(format!("gpt-long-{round}"), SimulatedGroup::new(4, 8, 5, pid + 60)).await?;

        tokio::time::sleep(Duration::from_secs(3)).await;
        manager.update_worker_group(&elastic, &SimulatedGroup::new(1, 6, 3, pid + 50)).await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        manager
            .errored(&finetune, Some(2), "torch.OutOfMemoryError: CUDA out of memory", TRACE)
            .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        manager.finished(&pretrain).await?;
        manager.finished(&elastic).await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        manager.aborted(&long, CauseKind::UserInterrupt).await?;
        manager.shutdown(Duration::from_secs(5)).await;
    }
    // One run stays live, heartbeating, for as long as the head runs.
    let manager = TrainRunStateManager::new(Some(state), ManagerConfig::default());
    let group = SimulatedGroup::new(2, 8, 9, 9000);
    manager
        .register_train_run(
            "llama-70b-pretrain",
            "03000000",
            "c0ffee",
            &group,
            [DatasetSpec::new("train", "5eed").named("fineweb")],
            None,
        )
        .await?;
    std::future::pending::<()>().await;
    drop(manager);
    Ok(())
}
