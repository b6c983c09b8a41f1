//! Micro-benchmarks of the wire types: validating, encoding and decoding a
//! 64-worker run (`cargo bench -p trainstate-schema`).

#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use trainstate_schema::{
    ActorStatus, Resources, TrainDatasetInfoDraft, TrainRunInfo, TrainRunInfoDraft,
    TrainWorkerInfoDraft,
};

/// A live run of `workers` workers, 8 per node, one dataset.
fn draft(workers: u32) -> TrainRunInfoDraft {
    let res = || Resources::from_iter([("CPU", 1.0), ("GPU", 0.0)]);
    TrainRunInfoDraft {
        workers: (0..workers)
            .map(|w| TrainWorkerInfoDraft {
                actor_id: format!("{:032x}", w + 1),
                world_rank: w,
                local_rank: w % 8,
                node_rank: w / 8,
                node_id: format!("{:056x}", w / 8 + 1),
                node_ip: "127.0.0.1".into(),
                pid: 10_000 + w,
                gpu_ids: vec![],
                status: ActorStatus::Alive,
                resources: res(),
                worker_log_file_path: None,
                node_name: None,
            })
            .collect(),
        datasets: vec![TrainDatasetInfoDraft {
            name: "train".into(),
            dataset_uuid: format!("{:032x}", 7),
            dataset_name: Some("ds_0".into()),
        }],
        resources: Some(vec![res(); workers as usize]),
        ..TrainRunInfoDraft::new(
            "0192f0c1d2e37a4b8c9d0e1f2a3b4c5d",
            "bench-run-0",
            "00000001",
            format!("{:032x}", 1),
            1_700_000_000_000,
        )
    }
}

fn wire(c: &mut Criterion) {
    let draft = draft(64);
    let run = draft.clone().validate().expect("valid");
    let json = serde_json::to_string(&run).expect("serializes");

    c.bench_function("validate 64-worker run", |b| {
        b.iter_batched(
            || draft.clone(),
            |d| black_box(d.validate().expect("valid")),
            criterion::BatchSize::SmallInput,
        )
    });
    c.bench_function("encode 64-worker run (JSON)", |b| {
        b.iter(|| black_box(serde_json::to_string(black_box(&run)).expect("serializes")))
    });
    c.bench_function("decode and validate 64-worker run (JSON)", |b| {
        b.iter(|| {
            black_box(serde_json::from_str::<TrainRunInfo>(black_box(&json)).expect("parses"))
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30);
    targets = wire
}
criterion_main!(benches);
