//! `trainstate serve --demo`: a few simulated runs, so a newcomer sees live data.

use std::time::Duration;

use trainstate_client::{NewAttempt, StateHandle, StatusUpdate};
use trainstate_schema::{
    ActorStatus, CauseKind, Resources, RunId, RunStatus, TrainDatasetInfoDraft, TrainRunInfoDraft,
    TrainWorkerInfo, TrainWorkerInfoDraft,
};

/// Starts the demo in the background.
pub(crate) fn start(state: StateHandle, lease: Duration) {
    tokio::spawn(async move {
        if let Err(err) = drive(state, lease).await {
            tracing::warn!(error = %err, "the demo stopped");
        }
    });
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn workers(nodes: u32, per_node: u32, pid_base: u32) -> Vec<TrainWorkerInfo> {
    (0..nodes * per_node)
        .map(|rank| {
            let node = rank / per_node;
            TrainWorkerInfoDraft {
                actor_id: format!("{:032x}", u128::from(pid_base + rank) << 8),
                world_rank: rank,
                local_rank: rank % per_node,
                node_rank: node,
                node_id: format!("{:056x}", 0xd3e0_0000u64 + u64::from(node)),
                node_ip: format!("10.0.0.{}", node + 11),
                pid: pid_base + rank,
                gpu_ids: vec![rank % per_node],
                status: ActorStatus::Alive,
                resources: Resources::from_iter([("CPU", 8.0), ("GPU", 1.0)]),
                worker_log_file_path: None,
            }
            .validate()
            .expect("demo workers are valid")
        })
        .collect()
}

async fn register(
    state: &StateHandle,
    name: &str,
    nodes: u32,
    per_node: u32,
    pid_base: u32,
) -> Result<RunId, trainstate_client::StateError> {
    let id = RunId::new_v7();
    let run = TrainRunInfoDraft {
        name: name.into(),
        id: id.to_string(),
        job_id: "01000000".into(),
        controller_actor_id: format!("{:032x}", u128::from(pid_base)),
        workers: workers(nodes, per_node, pid_base)
            .into_iter()
            .map(TrainWorkerInfo::into_draft)
            .collect(),
        datasets: vec![TrainDatasetInfoDraft {
            name: "train".into(),
            dataset_uuid: format!("{:032x}", u128::from(pid_base) * 7),
            dataset_name: Some("train_c4-en".into()),
        }],
        run_status: RunStatus::Running,
        status_detail: String::new(),
        start_time_ms: now_ms(),
        end_time_ms: None,
        resources: None,
        attempts: vec![],
        last_heartbeat_ms: None,
        cause: None,
        restored_from: None,
        controller_log_file_path: None,
    }
    .validate()
    .expect("demo runs are valid");
    state.register(run).await?;
    Ok(id)
}

/// Drives runs through their lifecycle, again and again.
async fn drive(state: StateHandle, lease: Duration) -> Result<(), trainstate_client::StateError> {
    let beat = (lease / 3).max(Duration::from_millis(100));
    let mut round = 0u32;
    loop {
        round += 1;
        let pid = 4000 + round * 100;
        let finishing = register(&state, &format!("llama-pretrain-{round}"), 2, 4, pid).await?;
        let failing = register(&state, &format!("bert-finetune-{round}"), 1, 4, pid + 20).await?;
        let elastic = register(&state, &format!("resnet-elastic-{round}"), 2, 4, pid + 40).await?;
        let long = register(&state, &format!("gpt-long-{round}"), 4, 8, pid + 60).await?;
        for step in 0..12u32 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            for id in [&finishing, &failing, &elastic, &long] {
                let _ = state.heartbeat(id.clone()).await;
            }
            match step {
                3 => {
                    let resized = NewAttempt::new("1", now_ms(), workers(1, 6, pid + 50));
                    state.start_attempt(elastic.clone(), resized).await?;
                }
                6 => {
                    let trace = "Traceback (most recent call last):\n  File \"train.py\", line 42, in train_loop\n    loss.backward()\nRuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB";
                    state
                        .set_status(
                            failing.clone(),
                            StatusUpdate::errored(Some(2), CauseKind::UserError, trace),
                        )
                        .await?;
                }
                9 => {
                    state.set_status(finishing.clone(), StatusUpdate::finished()).await?;
                    state.set_status(elastic.clone(), StatusUpdate::finished()).await?;
                }
                _ => {}
            }
            let _ = beat;
        }
        state
            .set_status(
                long,
                StatusUpdate::aborted(CauseKind::UserInterrupt, "Stopped by the user (Ctrl-C)."),
            )
            .await?;
        tokio::time::sleep(Duration::from_secs(5)).await;
        if round >= 3 {
            // Keep a handful of runs, then stop writing: there is enough to look at.
            return Ok(());
        }
    }
}
