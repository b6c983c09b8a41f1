//! Micro-benchmark of one store commit: one 8-worker run written and
//! acknowledged, durable (SQLite WAL, synchronous=FULL, one fsync) and in
//! memory (`cargo bench -p trainstate-actor`).

#![allow(missing_docs)]

use std::sync::mpsc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use criterion::{Criterion, criterion_group, criterion_main};
use trainstate_actor::StateConfig;
use trainstate_actor::bench_support::StoreBench;
use trainstate_schema::{
    ActorStatus, Resources, RunId, TrainRunInfo, TrainRunInfoDraft, TrainWorkerInfoDraft,
};

fn run(i: u64) -> TrainRunInfo {
    let res = || Resources::from_iter([("CPU", 1.0), ("GPU", 0.0)]);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    TrainRunInfoDraft {
        workers: (0..8)
            .map(|w| TrainWorkerInfoDraft {
                actor_id: format!("{:032x}", i * 100_000 + u64::from(w) + 1),
                world_rank: w,
                local_rank: w,
                node_rank: 0,
                node_id: format!("{:056x}", 1),
                node_ip: "127.0.0.1".into(),
                pid: 10_000 + w,
                gpu_ids: vec![],
                status: ActorStatus::Alive,
                resources: res(),
                worker_log_file_path: None,
                node_name: None,
            })
            .collect(),
        datasets: vec![],
        ..TrainRunInfoDraft::new(
            RunId::new_v7().to_string(),
            format!("bench-run-{i}"),
            "00000001",
            format!("{:032x}", i + 1),
            now,
        )
    }
    .validate()
    .expect("valid")
}

/// Writes one run and waits until it is committed.
fn commit(store: &StoreBench, run: &TrainRunInfo) {
    let (tx, rx) = mpsc::channel();
    store.put(run, move |result| {
        let _ = tx.send(result);
    });
    rx.recv().expect("the writer answers").expect("the commit succeeds");
}

fn store(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let configs = [
        ("commit one run (SQLite, synchronous=FULL)", StateConfig::sqlite(dir.path().join("a.db"))),
        ("commit one run (in memory)", StateConfig::in_memory()),
    ];
    for (name, config) in configs {
        let store = StoreBench::open(&config).expect("the store opens");
        let mut i = 0;
        c.bench_function(name, |b| {
            b.iter_batched(
                || {
                    i += 1;
                    run(i)
                },
                |run| commit(&store, &run),
                criterion::BatchSize::SmallInput,
            )
        });
        store.close();
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = store
}
criterion_main!(benches);
