//! Valid runs and workers, built one way for every test.

use trainstate_schema::{
    ActorStatus, Resources, RunAttemptDraft, RunId, RunStatus, TrainRunInfo, TrainRunInfoDraft,
    TrainWorkerInfo, TrainWorkerInfoDraft,
};

/// The time tests start their runs at (Unix ms, in 2025).
pub const T0: u64 = 1_760_000_000_000;

/// `n` live workers over nodes of `per_node` workers, in world-rank order:
/// worker `r` is `{prefix}actor{r}` on `{prefix}node{r / per_node}`, with
/// one CPU and GPU `r % per_node`.
pub fn workers(n: u32, per_node: u32, prefix: &str) -> Vec<TrainWorkerInfo> {
    (0..n)
        .map(|rank| {
            let node = rank / per_node;
            TrainWorkerInfoDraft {
                actor_id: format!("{prefix}actor{rank}"),
                world_rank: rank,
                local_rank: rank % per_node,
                node_rank: node,
                node_id: format!("{prefix}node{node}"),
                node_ip: format!("10.0.{}.{}", node / 250, node % 250 + 1),
                pid: 1000 + rank,
                gpu_ids: vec![rank % per_node],
                status: ActorStatus::Alive,
                resources: Resources::from_iter([("CPU", 1.0), ("GPU", 1.0)]),
                worker_log_file_path: None,
                node_name: None,
            }
            .validate()
            .unwrap()
        })
        .collect()
}

/// A live run `id` of `n` workers (four a node) started at `start_ms`.
pub fn run_with(id: &RunId, name: &str, job: &str, start_ms: u64, n: u32) -> TrainRunInfo {
    TrainRunInfoDraft {
        workers: workers(n, 4, "").into_iter().map(TrainWorkerInfo::into_draft).collect(),
        ..TrainRunInfoDraft::new(id.to_string(), name, job, "controller", start_ms)
    }
    .validate()
    .unwrap()
}

/// `run` ended with `status` 500 ms after its start, with one attempt that
/// ended then too: what a controller reports last.
pub fn ended(run: &TrainRunInfo, status: RunStatus) -> TrainRunInfo {
    let mut draft = run.clone().into_draft();
    let end_ms = draft.start_time_ms + 500;
    draft.run_status = status;
    draft.status = None;
    draft.end_time_ms = Some(end_ms);
    draft.attempts = vec![RunAttemptDraft {
        end_time_ms: Some(end_ms),
        ..RunAttemptDraft::new("0", draft.start_time_ms)
    }];
    draft.validate().unwrap()
}

/// A live 8-worker run of job `job1` with a fresh id.
pub fn run(name: &str, start_ms: u64) -> TrainRunInfo {
    run_with(&RunId::new_v7(), name, "job1", start_ms, 8)
}

/// `count` live runs with fresh ids, `{prefix}{i}` of `n` workers started
/// at `start_ms + i`: what a store is filled with.
pub fn numbered(
    count: u64,
    prefix: &str,
    job: &str,
    start_ms: u64,
    n: u32,
) -> impl Iterator<Item = TrainRunInfo> {
    let (prefix, job) = (prefix.to_owned(), job.to_owned());
    (0..count)
        .map(move |i| run_with(&RunId::new_v7(), &format!("{prefix}{i}"), &job, start_ms + i, n))
}
