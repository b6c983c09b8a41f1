//! The runs a benchmark registers: the same shape as the Ray anchor's
//! (`ray_state_bench.py`), with a fresh id for every run.

use std::time::{SystemTime, UNIX_EPOCH};

use trainstate_schema::{
    ActorStatus, CauseKind, FailureMode, Resources, RunCause, RunId, RunStatus,
    TrainDatasetInfoDraft, TrainRunInfo, TrainRunInfoDraft, TrainWorkerInfoDraft,
};

/// `n` as `nbytes` bytes of lowercase hex.
fn hexid(n: u64, nbytes: usize) -> String {
    format!("{n:0width$x}", width = nbytes * 2)
}

fn resources() -> Resources {
    Resources::from_iter([("CPU", 1.0), ("GPU", 0.0)])
}

/// Run `i` of a benchmark: `workers` workers (8 per node), one dataset.
pub(crate) fn run(i: u64, workers: u32, start_ms: u64) -> TrainRunInfo {
    draft(i, workers, start_ms).validate().expect("a benchmark run is valid")
}

/// Worker `w` of run `i`: 8 workers a node on 127.0.0.1, one CPU each.
pub(crate) fn worker(i: u64, w: u32) -> TrainWorkerInfoDraft {
    TrainWorkerInfoDraft {
        actor_id: hexid(i * 100_000 + u64::from(w) + 1, 16),
        world_rank: w,
        local_rank: w % 8,
        node_rank: w / 8,
        node_id: hexid(u64::from(w / 8) + 1, 28),
        node_ip: "127.0.0.1".into(),
        pid: 10_000 + w,
        gpu_ids: vec![],
        status: ActorStatus::Alive,
        resources: resources(),
        worker_log_file_path: None,
        node_name: None,
    }
}

fn draft(i: u64, workers: u32, start_ms: u64) -> TrainRunInfoDraft {
    TrainRunInfoDraft {
        workers: (0..workers).map(|w| worker(i, w)).collect(),
        datasets: vec![TrainDatasetInfoDraft {
            name: "train".into(),
            dataset_uuid: hexid(i + 7, 16),
            dataset_name: Some(format!("ds_{i}")),
        }],
        resources: Some(vec![resources(); workers as usize]),
        ..TrainRunInfoDraft::new(
            RunId::new_v7().to_string(),
            format!("bench-run-{i}"),
            hexid(1, 4),
            hexid(i + 1, 16),
            start_ms + i,
        )
    }
}

/// The nodes the retained history of the scale measurement runs on.
pub(crate) const SCALE_NODES: u64 = 10_000;

/// Run `i` of the scale measurement, shaped like a head's retained
/// history rather than one job's burst: 1,000 jobs; each run on its own
/// nodes out of [`SCALE_NODES`] (8 workers a node, one IP a node); one run
/// in 100 still live (`RUNNING`), the others ended, one in 10 of them
/// `ERRORED` and the rest `FINISHED`. An errored run's rank 0 failed
/// first: of `OOM` (the machine's fault) for one in three, else of
/// `USER_ERROR`, so the node ledger has failures of both classes to count.
pub(crate) fn retained_run(i: u64, workers: u32, start_ms: u64) -> TrainRunInfo {
    let node = |w: u32| (i * 7 + u64::from(w / 8)) % SCALE_NODES;
    let mut draft = draft(i, workers, start_ms);
    for (w, worker) in draft.workers.iter_mut().enumerate() {
        let node = node(w as u32);
        worker.node_id = hexid(node + 1, 28);
        worker.node_ip = format!("10.{}.{}.{}", node / 65_536, node / 256 % 256, node % 256);
    }
    draft.job_id = hexid(i % 1_000 + 1, 4);
    let status = match i % 100 {
        0 => RunStatus::Running,
        n if n % 10 == 1 => RunStatus::Errored,
        _ => RunStatus::Finished,
    };
    if status.is_terminal() {
        draft.run_status = status;
        draft.status = Some(status);
        draft.end_time_ms = Some(start_ms + i + 60_000);
    }
    if status == RunStatus::Errored {
        let kind = if i.is_multiple_of(3) { CauseKind::Oom } else { CauseKind::UserError };
        let failed_at = start_ms + i + 59_000;
        draft.cause = Some(
            RunCause::new(kind, Some(0)).with_failure(Some(FailureMode::Killed), Some(failed_at)),
        );
    }
    draft.validate().expect("a benchmark run is valid")
}

/// Milliseconds since the epoch.
/// The clusters [`goodput_run`] spreads its runs over.
pub(crate) const GOODPUT_CLUSTERS: [&str; 4] = ["north", "south", "east", "west"];

/// The training jobs [`fleet_run`] names its runs after, launch after
/// launch: 100,000 runs are 100 launches of each.
pub(crate) const FLEET_JOBS: u64 = 1_000;

/// [`retained_run`] an hour earlier (every run ended before the head
/// reads, so the default window holds all of it), in one of
/// [`GOODPUT_CLUSTERS`], named after one of [`FLEET_JOBS`] training jobs,
/// without goodput.
pub(crate) fn fleet_run(i: u64, workers: u32, start_ms: u64) -> TrainRunInfo {
    let mut draft = retained_run(i, workers, start_ms.saturating_sub(3_600_000)).into_draft();
    draft.cluster = Some(GOODPUT_CLUSTERS[i as usize % GOODPUT_CLUSTERS.len()].to_owned());
    draft.name = format!("train-job-{}", i % FLEET_JOBS);
    draft.validate().expect("a benchmark run is valid")
}

/// [`fleet_run`] with the goodput a head counted for it: an ended run's
/// 60 s are 45 productive and 5 each waiting, restarting and stalled; a
/// live run is counted to 30 s after its start, 25 productive and 5
/// waiting.
pub(crate) fn goodput_run(i: u64, workers: u32, start_ms: u64) -> TrainRunInfo {
    use trainstate_schema::{GoodputBucket, RunGoodput};
    let draft = fleet_run(i, workers, start_ms).into_draft();
    let start = draft.start_time_ms;
    let mut goodput = RunGoodput::starting_at(start);
    let buckets: &[(GoodputBucket, u64)] = match draft.end_time_ms {
        Some(_) => &[
            (GoodputBucket::Productive, 45_000),
            (GoodputBucket::WaitingToStart, 5_000),
            (GoodputBucket::Restarting, 5_000),
            (GoodputBucket::Stalled, 5_000),
        ],
        None => &[(GoodputBucket::Productive, 25_000), (GoodputBucket::WaitingToStart, 5_000)],
    };
    for (bucket, ms) in buckets {
        goodput.add(*bucket, *ms);
    }
    goodput.as_of_ms = draft.end_time_ms.unwrap_or(start + 30_000);
    let run = draft.validate().expect("a benchmark run is valid");
    run.with_goodput(goodput).expect("a benchmark run's goodput is valid")
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// `n` runs of `workers` workers, each with a fresh id.
pub(crate) fn runs(n: usize, workers: u32) -> Vec<TrainRunInfo> {
    let now = now_ms();
    (0..n as u64).map(|i| run(i, workers, now)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retained_runs_are_valid_mostly_ended_and_spread_over_jobs_and_nodes() {
        let runs: Vec<_> = (0..10_000).map(|i| retained_run(i, 8, 1_760_000_000_000)).collect();
        let live = runs.iter().filter(|r| r.status() == RunStatus::Running).count();
        let errored = runs.iter().filter(|r| r.status() == RunStatus::Errored).count();
        assert_eq!((live, errored), (100, 1_000));
        assert!(runs.iter().all(|r| r.status() == RunStatus::Running || r.end_time_ms().is_some()));
        let oom = runs.iter().filter(|r| r.cause().is_some_and(|c| c.kind == CauseKind::Oom));
        assert_eq!(oom.count(), 333, "one errored run in three failed of OOM");
        let jobs: std::collections::BTreeSet<_> = runs.iter().map(|r| r.job_id()).collect();
        assert_eq!(jobs.len(), 1_000);
        let nodes: std::collections::BTreeSet<_> =
            runs.iter().flat_map(|r| r.workers().iter().map(|w| w.node_id())).collect();
        assert_eq!(nodes.len(), SCALE_NODES as usize);
    }
}
