//! Property tests: valid runs round-trip; mutated documents never become
//! values that break a rule.

use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use serde_json::{Value, json};
use trainstate_schema::{RunStatus, TrainRunInfo};

use crate::common::valid_run;

/// A valid run document: `nodes` nodes with `per_node` workers each, in a
/// shuffled order, some datasets, any status.
fn run_document() -> impl Strategy<Value = Value> {
    (1usize..5, 1usize..5, 0usize..3, 0usize..4, any::<u64>(), 0u64..1_000_000, "[a-z][a-z0-9_-]{0,20}")
        .prop_flat_map(|(nodes, per_node, datasets, status, seed, duration, name)| {
            let n = nodes * per_node;
            (Just((nodes, per_node, datasets, status, duration, name)), Just(seed), Just(n))
                .prop_flat_map(|(params, seed, n)| {
                    (Just(params), Just(seed), Just((0..n).collect::<Vec<_>>()).prop_shuffle())
                })
        })
        .prop_map(|((nodes, per_node, datasets, status, duration, name), seed, order)| {
            let _ = nodes;
            let workers: Vec<Value> = order
                .iter()
                .map(|&rank| {
                    let node = rank / per_node;
                    json!({
                        "actor_id": format!("a{rank}-{seed:x}"), "world_rank": rank,
                        "local_rank": rank % per_node, "node_rank": node,
                        "node_id": format!("n{node}"), "node_ip": format!("fd00::{node:x}"),
                        "pid": rank + 1, "gpu_ids": [rank % per_node],
                        "status": if rank % 3 == 0 { "DEAD" } else { "ALIVE" },
                        "resources": {"CPU": rank as f64 / 2.0}
                    })
                })
                .collect();
            let status = RunStatus::ALL[status];
            let start = 1_700_000_000_000u64 + seed % 1_000_000;
            json!({
                "name": name, "id": format!("{seed:032x}"), "job_id": "j", "controller_actor_id": "c",
                "workers": workers,
                "datasets": (0..datasets).map(|i| json!({"name": format!("d{i}"), "dataset_uuid": "u", "dataset_name": null})).collect::<Vec<_>>(),
                "run_status": status.as_str(), "status_detail": "",
                "start_time_ms": start,
                "end_time_ms": if status.is_terminal() { json!(start + duration) } else { Value::Null },
            })
        })
}

/// Rules checked independently of the crate's validator.
fn assert_obeys_rules(run: &TrainRunInfo) {
    let ranks: Vec<u32> = run.workers().iter().map(|w| w.world_rank()).collect();
    assert_eq!(ranks, (0..run.workers().len() as u32).collect::<Vec<_>>());
    let mut node_rank_of: HashMap<&str, u32> = HashMap::new();
    let mut local: HashSet<(&str, u32)> = HashSet::new();
    for w in run.workers() {
        assert_eq!(*node_rank_of.entry(w.node_id()).or_insert(w.node_rank()), w.node_rank());
        assert!(local.insert((w.node_id(), w.local_rank())));
        assert!(w.pid() > 0);
        assert!(w.node_ip().parse::<std::net::IpAddr>().is_ok());
        assert!(w.resources().iter().all(|(_, v)| v.is_finite() && v >= 0.0));
    }
    let distinct: HashSet<u32> = node_rank_of.values().copied().collect();
    assert_eq!(distinct.len(), node_rank_of.len());
    if run.run_status() == RunStatus::Running {
        assert_eq!(run.end_time_ms(), None);
    }
    if let Some(end) = run.end_time_ms() {
        assert!(end >= run.start_time_ms());
    }
    assert!(!run.status_detail().contains('\0'));
}

/// One mutation of a document: a path (into the run, or into its first
/// worker) set to a value from a small pool of troublesome values.
fn mutation() -> impl Strategy<Value = (bool, usize, usize)> {
    (any::<bool>(), 0usize..16, 0usize..12)
}

const RUN_KEYS: &[&str] = &[
    "name",
    "id",
    "job_id",
    "controller_actor_id",
    "workers",
    "datasets",
    "run_status",
    "status_detail",
    "start_time_ms",
    "end_time_ms",
    "resources",
    "attempts",
    "cause",
    "restored_from",
    "last_heartbeat_ms",
    "extra",
];
const WORKER_KEYS: &[&str] = &[
    "actor_id",
    "world_rank",
    "local_rank",
    "node_rank",
    "node_id",
    "node_ip",
    "pid",
    "gpu_ids",
    "status",
    "resources",
    "worker_log_file_path",
    "extra",
    "world_rank",
    "node_rank",
    "pid",
    "local_rank",
];

fn troublesome(i: usize) -> Value {
    [
        json!(0),
        json!(1),
        json!(-1),
        json!(7),
        json!(1.5),
        json!(""),
        json!("\u{0}"),
        json!("FINISHED"),
        json!(null),
        json!([1, 1]),
        json!({"CPU": -1.0}),
        json!("::1"),
    ][i]
        .clone()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn valid_runs_round_trip(doc in run_document()) {
        let run: TrainRunInfo = serde_json::from_value(doc).unwrap();
        assert_obeys_rules(&run);
        let text = serde_json::to_string(&run).unwrap();
        let again: TrainRunInfo = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(&run, &again);
        prop_assert_eq!(run.clone().into_draft().validate().unwrap(), run);
    }

    #[test]
    fn mutated_documents_never_break_a_rule(
        doc in run_document(),
        mutations in proptest::collection::vec(mutation(), 1..4),
    ) {
        let mut doc = doc;
        for (in_worker, key, value) in mutations {
            if in_worker {
                if let Some(workers) = doc["workers"].as_array_mut() {
                    let n = workers.len().max(1);
                    if let Some(worker) = workers.get_mut(key % n).and_then(Value::as_object_mut) {
                        worker.insert(WORKER_KEYS[key].into(), troublesome(value));
                    }
                }
            } else {
                doc[RUN_KEYS[key]] = troublesome(value);
            }
        }
        if let Ok(run) = serde_json::from_value::<TrainRunInfo>(doc) {
            assert_obeys_rules(&run);
        }
    }
}

#[test]
fn the_fixed_valid_run_obeys_the_rules() {
    assert_obeys_rules(&serde_json::from_value(valid_run()).unwrap());
}
