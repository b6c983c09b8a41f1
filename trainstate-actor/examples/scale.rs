//! The head at scale: fills a SQLite store with 100,000 runs of 8 workers
//! (once), then times loading it as a restart does and one page of 100 for
//! each filter, matching and matching nothing.
//!
//! `cargo run --release -p trainstate-actor --example scale -- /tmp/scale.db [runs]`

#![allow(missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use trainstate_actor::StateConfig;
use trainstate_actor::bench_support::StoreBench;
use trainstate_client::RunQuery;
use trainstate_schema::{
    ActorStatus, Resources, RunId, RunStatus, TrainRunInfo, TrainRunInfoDraft, TrainWorkerInfoDraft,
};

const START_MS: u64 = 1_760_000_000_000;

fn run(i: u64) -> TrainRunInfo {
    let res = || Resources::from_iter([("CPU", 1.0), ("GPU", 0.0)]);
    // 8 workers on 2 of 1,000 nodes; 1,000 jobs.
    TrainRunInfoDraft {
        workers: (0..8u32)
            .map(|w| {
                let node = (i * 2 + u64::from(w / 4)) % 1000;
                TrainWorkerInfoDraft {
                    actor_id: format!("{:032x}", i * 100 + u64::from(w) + 1),
                    world_rank: w,
                    local_rank: w % 4,
                    node_rank: w / 4,
                    node_id: format!("{node:056x}"),
                    node_ip: format!("10.0.{}.{}", node / 250, node % 250),
                    pid: 10_000 + w,
                    gpu_ids: vec![],
                    status: ActorStatus::Alive,
                    resources: res(),
                    worker_log_file_path: None,
                    node_name: None,
                }
            })
            .collect(),
        datasets: vec![],
        ..TrainRunInfoDraft::new(
            RunId::new_v7().to_string(),
            format!("bench-run-{i}"),
            format!("{:08x}", i % 1000 + 1),
            format!("{:032x}", i + 1),
            START_MS + i,
        )
    }
    .validate()
    .expect("valid")
}

/// Resident memory of this process, KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args.next().unwrap_or_else(|| "/tmp/trainstate-scale.db".into());
    let n: u64 = args.next().map_or(100_000, |s| s.parse().expect("a number of runs"));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let config = StateConfig::sqlite(&path);

    if !std::path::Path::new(&path).exists() {
        let store = StoreBench::open(&config).expect("the store opens");
        let stored = 0;
        let t = Instant::now();
        let done = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = std::sync::mpsc::channel();
        for i in stored..n {
            let done = done.clone();
            let tx = tx.clone();
            let want = (n - stored) as usize;
            store.put(&run(i), move |r| {
                r.expect("committed");
                if done.fetch_add(1, Ordering::SeqCst) + 1 == want {
                    let _ = tx.send(());
                }
            });
        }
        rx.recv().expect("all committed");
        println!("filled {} runs in {:?}; run again to measure", n - stored, t.elapsed());
        store.close();
        return;
    }

    // A restart: open and load every stored run.
    let before = rss_kib();
    let t = Instant::now();
    let store = StoreBench::open(&config).expect("the store opens");
    let loaded = rt.block_on(store.load()).expect("loads");
    let took = t.elapsed();
    let after = rss_kib();
    println!(
        "load {loaded} runs: {took:?}; RSS {:.1} MiB before, {:.1} MiB after: {:.2} KiB a run",
        before as f64 / 1024.0,
        after as f64 / 1024.0,
        (after - before) as f64 / loaded as f64
    );

    let q = |f: &dyn Fn(&mut RunQuery)| {
        let mut q = RunQuery::default();
        f(&mut q);
        q
    };
    let node = |k: u64| format!("{k:056x}");
    let queries: Vec<(&str, RunQuery)> = vec![
        ("no filter", q(&|_| {})),
        ("status=RUNNING (matching)", q(&|q| q.statuses = vec![RunStatus::Running])),
        ("status=FINISHED (none)", q(&|q| q.statuses = vec![RunStatus::Finished])),
        ("job_id (matching)", q(&|q| q.job_id = Some("00000007".into()))),
        ("job_id (none)", q(&|q| q.job_id = Some("ffffffff".into()))),
        ("node_id (matching)", q(&|q| q.node_id = Some(node(7)))),
        ("node_id (none)", q(&|q| q.node_id = Some(node(5000)))),
        ("node_ip (matching)", q(&|q| q.node_ip = Some("10.0.0.7".into()))),
        ("node_ip (none)", q(&|q| q.node_ip = Some("10.9.9.9".into()))),
        ("name (matching)", q(&|q| q.name_contains = Some("run-77".into()))),
        ("name (none)", q(&|q| q.name_contains = Some("nothing-like-it".into()))),
        ("name (every run)", q(&|q| q.name_contains = Some("run-".into()))),
        ("cluster (none)", q(&|q| q.cluster = Some("other".into()))),
        (
            "job_id+status=FINISHED (none)",
            q(&|q| {
                q.job_id = Some("00000007".into());
                q.statuses = vec![RunStatus::Finished];
            }),
        ),
    ];
    for (label, query) in &queries {
        let mut times = Vec::new();
        let mut page = None;
        for _ in 0..21 {
            let t = Instant::now();
            page = Some(store.list(query));
            times.push(t.elapsed());
        }
        let page = page.expect("a page");
        println!(
            "{label:32} {:>10.3} ms  ({} runs, total {})",
            median(times).as_secs_f64() * 1e3,
            page.runs.len(),
            page.total
        );
    }
    store.close();
}
