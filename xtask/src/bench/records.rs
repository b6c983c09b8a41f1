//! The runs a benchmark registers: the same shape as the Ray anchor's
//! (`ray_state_bench.py`), with a fresh id for every run.

use std::time::{SystemTime, UNIX_EPOCH};

use trainstate_schema::{
    ActorStatus, Resources, RunId, TrainDatasetInfoDraft, TrainRunInfo, TrainRunInfoDraft,
    TrainWorkerInfoDraft,
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
    TrainRunInfoDraft {
        workers: (0..workers)
            .map(|w| TrainWorkerInfoDraft {
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
            })
            .collect(),
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
    .validate()
    .expect("a benchmark run is valid")
}

/// Milliseconds since the epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// `n` runs of `workers` workers, each with a fresh id.
pub(crate) fn runs(n: usize, workers: u32) -> Vec<TrainRunInfo> {
    let now = now_ms();
    (0..n as u64).map(|i| run(i, workers, now)).collect()
}
