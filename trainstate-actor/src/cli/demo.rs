//! `trainstate serve --demo`: simulated runs, so a newcomer sees live,
//! changing data at once.
//!
//! The runs go through [`StateHandle`], the typed API every client uses:
//! registration, a new attempt after an elastic resize, heartbeats while a
//! run is live, and ends with their causes.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::task::AbortHandle;
use trainstate_client::{NewAttempt, StateHandle, StatusUpdate};
use trainstate_schema::{
    ActorStatus, CauseKind, Resources, RunId, RunStatus, TrainDatasetInfoDraft, TrainRunInfoDraft,
    TrainWorkerInfo, TrainWorkerInfoDraft,
};

/// The pause between the demo's steps.
const PACE: Duration = Duration::from_secs(3);

/// The shortest interval between two heartbeats of a run, whatever its lease.
const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(100);

type DemoError = Box<dyn std::error::Error + Send + Sync>;

/// Starts the demo in the background.
pub(crate) fn start(state: StateHandle) {
    tokio::spawn(async move {
        if let Err(err) = drive(state, PACE).await {
            tracing::warn!(error = %err, "the demo stopped");
        }
    });
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Simulated workers: `nodes` nodes of `per_node` workers, one GPU each.
fn workers(nodes: u32, per_node: u32, first_node: u32, pid_base: u32) -> Vec<TrainWorkerInfo> {
    (0..nodes * per_node)
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
                node_name: None,
            }
            .validate()
            .expect("simulated workers are valid")
        })
        .collect()
}

/// A dataset given to the trainer under `key`, named as a manager names it
/// (`<key>_<the dataset's own name>`).
fn dataset(key: &str, uuid: String, own_name: &str) -> TrainDatasetInfoDraft {
    TrainDatasetInfoDraft {
        name: key.to_owned(),
        dataset_uuid: uuid,
        dataset_name: Some(format!("{key}_{own_name}")),
    }
}

/// A registered run whose lease a background task renews until the run ends
/// (or this value is dropped), as a controller does.
struct LiveRun {
    id: RunId,
    heartbeat: AbortHandle,
}

impl Drop for LiveRun {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}

impl LiveRun {
    async fn register(
        state: &StateHandle,
        name: &str,
        job_id: &str,
        controller_actor_id: &str,
        workers: Vec<TrainWorkerInfo>,
        datasets: Vec<TrainDatasetInfoDraft>,
    ) -> Result<Self, DemoError> {
        let id = RunId::new_v7();
        let run = TrainRunInfoDraft {
            workers: workers.into_iter().map(TrainWorkerInfo::into_draft).collect(),
            datasets,
            ..TrainRunInfoDraft::new(id.to_string(), name, job_id, controller_actor_id, now_ms())
        }
        .validate()?;
        let registration = state.register(run).await?;
        let heartbeat = tokio::spawn(heartbeat(state.clone(), id.clone(), registration.lease));
        Ok(Self { id, heartbeat: heartbeat.abort_handle() })
    }

    /// A new worker group, as Ray Train V2 reports it: the run is RESIZING,
    /// the new attempt replaces the old one (whose workers the actor marks
    /// `DEAD`), and the run is RUNNING again.
    async fn resize(
        &self,
        state: &StateHandle,
        attempt_id: &str,
        workers: Vec<TrainWorkerInfo>,
    ) -> Result<(), DemoError> {
        let resizing = StatusUpdate::live(RunStatus::Resizing, "a node left: resizing");
        state.set_status(self.id.clone(), resizing).await?;
        state
            .start_attempt(self.id.clone(), NewAttempt::new(attempt_id, now_ms(), workers))
            .await?;
        state.set_status(self.id.clone(), StatusUpdate::live(RunStatus::Running, "")).await?;
        Ok(())
    }

    /// Ends the run and stops its heartbeat.
    async fn end(self, state: &StateHandle, update: StatusUpdate) -> Result<(), DemoError> {
        self.heartbeat.abort();
        state.set_status(self.id.clone(), update).await?;
        Ok(())
    }
}

/// Renews the lease of a live run every third of the lease, until the actor
/// says the run has ended.
async fn heartbeat(state: StateHandle, id: RunId, lease: Duration) {
    let mut interval = (lease / 3).max(MIN_HEARTBEAT_INTERVAL);
    loop {
        tokio::time::sleep(interval).await;
        match state.heartbeat(id.clone()).await {
            Ok(lease) => interval = (lease / 3).max(MIN_HEARTBEAT_INTERVAL),
            Err(err) if err.is_retryable() => {
                tracing::warn!(run = %id, error = %err, "demo heartbeat failed; retrying");
            }
            Err(_) => return,
        }
    }
}

const TRACE: &str = "Traceback (most recent call last):\n  File \"train.py\", line 42, in train_loop\n    loss.backward()\n  File \"torch/_tensor.py\", line 521, in backward\n    torch.autograd.backward(\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB";

/// Three rounds of four runs each, `pace` between steps: one finishes, one
/// errors, one is resized (elastic) then finishes, one long run is
/// interrupted. Then one run stays live, heartbeating, until the task is
/// dropped.
async fn drive(state: StateHandle, pace: Duration) -> Result<(), DemoError> {
    for round in 1..=3u32 {
        let pid = 4000 + round * 100;
        let controller = format!("{:032x}", u128::from(pid) << 40);
        let register = |name: String, workers: Vec<TrainWorkerInfo>| {
            let (state, controller) = (&state, &controller);
            let datasets = vec![dataset("train", format!("{:032x}", pid * 7), "c4_en")];
            async move {
                LiveRun::register(state, &name, "02000000", controller, workers, datasets).await
            }
        };
        let pretrain = register(format!("llama-pretrain-{round}"), workers(2, 4, 0, pid)).await?;
        let finetune =
            register(format!("bert-finetune-{round}"), workers(1, 4, 2, pid + 20)).await?;
        let elastic =
            register(format!("resnet-elastic-{round}"), workers(2, 4, 3, pid + 40)).await?;
        let long = register(format!("gpt-long-{round}"), workers(4, 8, 5, pid + 60)).await?;

        tokio::time::sleep(pace).await;
        elastic.resize(&state, "1", workers(1, 6, 3, pid + 50)).await?;
        tokio::time::sleep(pace).await;
        finetune.end(&state, StatusUpdate::errored(Some(2), CauseKind::UserError, TRACE)).await?;
        tokio::time::sleep(pace).await;
        pretrain.end(&state, StatusUpdate::finished()).await?;
        elastic.end(&state, StatusUpdate::finished()).await?;
        tokio::time::sleep(pace).await;
        long.end(
            &state,
            StatusUpdate::aborted(CauseKind::UserInterrupt, "The run was interrupted."),
        )
        .await?;
    }
    let _live = LiveRun::register(
        &state,
        "llama-70b-pretrain",
        "03000000",
        "c0ffee",
        workers(2, 8, 9, 9000),
        vec![dataset("train", "5eed".into(), "fineweb")],
    )
    .await?;
    std::future::pending::<()>().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tokio::time::Instant;
    use trainstate_actor::{StateConfig, launch_state_actor};
    use trainstate_client::{EventKind, RunQuery};
    use trainstate_schema::{RunStatus, TrainRunInfo};

    use super::*;

    const DEADLINE: Duration = Duration::from_secs(30);

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_demo_drives_live_runs_through_the_handle_to_their_ends() {
        let name = format!("trainstate.demo-test.{}", std::process::id());
        // A short lease: the live run stays live only if its heartbeat renews it.
        let lease = Duration::from_secs(1);
        let service = launch_state_actor(
            StateConfig::in_memory()
                .with_name(name)
                .with_lease(lease)
                .with_sweep_interval(Duration::from_millis(100)),
        )
        .await
        .unwrap();
        let state = service.handle();
        let mut events = state.subscribe(None).await.unwrap().receiver;
        let demo = tokio::spawn(drive(state.clone(), Duration::ZERO));

        // Events come in commit order: the last registration comes after every other write.
        let last = tokio::time::timeout(DEADLINE, async {
            loop {
                let event = events.recv().await.expect("the event stream stays open");
                let run = event.run.as_ref().map(|doc| doc.parse().unwrap());
                if event.kind == EventKind::Registered
                    && run.as_ref().is_some_and(|r| r.name() == "llama-70b-pretrain")
                {
                    return event.run_id;
                }
            }
        })
        .await
        .expect("the demo registers its last run");

        let page = state.list(RunQuery::all()).await.unwrap();
        let runs: BTreeMap<String, TrainRunInfo> = page
            .runs
            .iter()
            .map(|doc| doc.parse().unwrap())
            .map(|run| (run.name().to_owned(), run))
            .collect();
        assert_eq!(runs.len(), 13, "{:?}", runs.keys());
        for round in 1..=3 {
            let run = |prefix: &str| &runs[&format!("{prefix}-{round}")];
            assert_eq!(run("llama-pretrain").run_status(), RunStatus::Finished);
            assert_eq!(run("llama-pretrain").workers().len(), 8);
            assert_eq!(run("llama-pretrain").datasets()[0].dataset_name(), Some("train_c4_en"));

            let finetune = run("bert-finetune");
            assert_eq!(finetune.run_status(), RunStatus::Errored);
            let cause = finetune.cause().unwrap();
            assert_eq!((cause.kind, cause.failed_world_rank), (CauseKind::UserError, Some(2)));
            assert!(finetune.status_detail().contains("torch.OutOfMemoryError"));

            let elastic = run("resnet-elastic");
            assert_eq!(elastic.run_status(), RunStatus::Finished);
            let attempts: Vec<&str> = elastic.attempts().iter().map(|a| a.attempt_id()).collect();
            assert_eq!(attempts.len(), 2, "{attempts:?}");
            assert_eq!(attempts[1], "1");
            assert_eq!(elastic.workers().len(), 6, "the resized group is the current one");

            let long = run("gpt-long");
            assert_eq!(long.run_status(), RunStatus::Aborted);
            assert_eq!(long.cause().unwrap().kind, CauseKind::UserInterrupt);
            assert!(long.end_time_ms().is_some());
        }

        // The last run stays live: its heartbeats outlast its lease and many sweeps.
        let registered = state.get(last.clone()).await.unwrap().last_heartbeat_ms().unwrap();
        let deadline = Instant::now() + DEADLINE;
        loop {
            let doc = state.get(last.clone()).await.unwrap();
            let run = doc.parse().unwrap();
            assert_eq!(run.run_status(), RunStatus::Running, "the live run was swept");
            if doc.last_heartbeat_ms().unwrap() >= registered + 2 * lease.as_millis() as u64 {
                break;
            }
            assert!(Instant::now() < deadline, "the live run's heartbeat never renewed its lease");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        demo.abort();
        let _ = demo.await;
        service.shutdown().await;
    }
}
