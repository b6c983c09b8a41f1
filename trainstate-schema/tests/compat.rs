//! Wire compatibility with Ray's own documents.

use serde_json::Value;
use trainstate_schema::{ActorStatus, RunStatus, TrainRunInfo};

use crate::common::{fixture, read_run, valid_run};

/// The keys of Ray's V1 schema, per object.
const RAY_RUN_KEYS: &[&str] = &[
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
];
const RAY_WORKER_KEYS: &[&str] = &[
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
];
const RAY_DATASET_KEYS: &[&str] = &["name", "dataset_uuid", "dataset_name"];

fn ray_documents() -> Vec<Value> {
    let mut docs = vec![fixture("ray-v1-run.json")];
    docs.extend(fixture("ray-v1-runs.json").as_array().unwrap().iter().cloned());
    docs.extend(
        fixture("ray-v1-dashboard-response.json")["train_runs"].as_array().unwrap().iter().cloned(),
    );
    docs
}

/// Every key of Ray's schema is present in ours, with an equal value.
fn assert_ray_keys_equal(ray: &Value, ours: &Value, keys: &[&str], at: &str) {
    for key in keys {
        let theirs = &ray[*key];
        let mine = ours.get(*key).unwrap_or_else(|| panic!("{at}: our output lacks `{key}`"));
        match *key {
            "workers" => {
                for (i, (t, m)) in
                    theirs.as_array().unwrap().iter().zip(mine.as_array().unwrap()).enumerate()
                {
                    assert_ray_keys_equal(t, m, RAY_WORKER_KEYS, &format!("{at}.workers[{i}]"));
                }
                assert_eq!(theirs.as_array().unwrap().len(), mine.as_array().unwrap().len());
            }
            "datasets" => {
                for (i, (t, m)) in
                    theirs.as_array().unwrap().iter().zip(mine.as_array().unwrap()).enumerate()
                {
                    assert_ray_keys_equal(t, m, RAY_DATASET_KEYS, &format!("{at}.datasets[{i}]"));
                }
            }
            _ => assert_eq!(theirs, mine, "{at}.{key}"),
        }
    }
}

#[test]
fn every_ray_document_deserializes_and_reserializes_with_rays_keys() {
    let docs = ray_documents();
    assert_eq!(docs.len(), 5);
    for (i, doc) in docs.iter().enumerate() {
        let run: TrainRunInfo = read_run(&doc.to_string())
            .unwrap_or_else(|e| panic!("Ray document {i} rejected: {e:?}"));
        let ours = serde_json::to_value(&run).unwrap();
        assert_ray_keys_equal(doc, &ours, RAY_RUN_KEYS, &format!("doc{i}"));
        // Ray's dashboard decorations are dropped, not echoed.
        assert!(ours.get("job_details").is_none());
        assert!(ours["workers"][0].get("processStats").is_none());
    }
}

#[test]
fn finished_dashboard_run_keeps_alive_workers() {
    let doc = &fixture("ray-v1-dashboard-response.json")["train_runs"][0];
    let run: TrainRunInfo = serde_json::from_value(doc.clone()).unwrap();
    assert_eq!(run.run_status(), RunStatus::Finished);
    assert_eq!(run.workers()[0].status(), ActorStatus::Alive);
}

#[test]
fn round_trip_value_json_value() {
    let run: TrainRunInfo = serde_json::from_value(valid_run()).unwrap();
    let text = serde_json::to_string(&run).unwrap();
    let again: TrainRunInfo = serde_json::from_str(&text).unwrap();
    assert_eq!(run, again);
    assert_eq!(serde_json::to_value(&again).unwrap(), valid_run());
}

#[test]
fn started_is_read_as_running_and_never_written() {
    let mut doc = valid_run();
    doc["run_status"] = "STARTED".into();
    let run: TrainRunInfo = serde_json::from_value(doc).unwrap();
    assert_eq!(run.run_status(), RunStatus::Running);
    assert_eq!(serde_json::to_value(&run).unwrap()["run_status"], "RUNNING");
}

#[test]
fn workers_are_sorted_by_rank_on_construction() {
    let mut doc = valid_run();
    doc["workers"].as_array_mut().unwrap().reverse();
    doc["resources"].as_array_mut().unwrap().reverse();
    let run: TrainRunInfo = serde_json::from_value(doc).unwrap();
    let ranks: Vec<u32> = run.workers().iter().map(|w| w.world_rank()).collect();
    assert_eq!(ranks, [0, 1, 2, 3]);
}

#[test]
fn resources_may_be_left_out_and_are_derived() {
    let mut doc = valid_run();
    doc.as_object_mut().unwrap().remove("resources");
    let run: TrainRunInfo = serde_json::from_value(doc).unwrap();
    assert_eq!(serde_json::to_value(&run).unwrap()["resources"], valid_run()["resources"]);
}

#[test]
fn terminal_run_without_end_time_deserializes() {
    let mut doc = valid_run();
    doc["run_status"] = "ABORTED".into();
    let run: TrainRunInfo = serde_json::from_value(doc).unwrap();
    assert_eq!(run.end_time_ms(), None);
}

#[test]
fn largest_real_run_is_valid() {
    // 32,768 workers over 4,096 nodes, 8 GPUs each.
    let workers: Vec<Value> = (0..32_768u32)
        .map(|rank| {
            let node = rank / 8;
            serde_json::json!({
                "actor_id": format!("{rank:032x}"), "world_rank": rank, "local_rank": rank % 8,
                "node_rank": node, "node_id": format!("{node:056x}"),
                "node_ip": format!("10.{}.{}.{}", node >> 16, (node >> 8) & 255, node & 255),
                "pid": 1000 + rank, "gpu_ids": [rank % 8], "status": "ALIVE",
                "resources": {"CPU": 8.0, "GPU": 1.0}
            })
        })
        .collect();
    let mut doc = valid_run();
    doc["workers"] = Value::Array(workers);
    doc.as_object_mut().unwrap().remove("resources");
    let run: TrainRunInfo = serde_json::from_value(doc).unwrap();
    assert_eq!(run.workers().len(), 32_768);
    let nodes: std::collections::HashSet<&str> =
        run.workers().iter().map(|w| w.node_id()).collect();
    assert_eq!(nodes.len(), 4_096);
}

#[test]
fn a_cause_kept_before_classes_reads_with_its_kind_s_class_and_a_kept_class_stays() {
    use trainstate_schema::{CauseClass, CauseKind, RunCause};
    let cases = [
        (r#"{"kind":"USER_ERROR","failed_world_rank":1}"#, CauseClass::Application),
        (r#"{"kind":"SYSTEM_ERROR"}"#, CauseClass::Infrastructure),
        (r#"{"kind":"LOST_CONTROLLER"}"#, CauseClass::Infrastructure),
        (r#"{"kind":"USER_INTERRUPT"}"#, CauseClass::Interrupted),
        (r#"{"kind":"USER_INTERRUPT","class":"NO_PROGRESS"}"#, CauseClass::NoProgress),
    ];
    for (json, class) in cases {
        let cause: RunCause = serde_json::from_str(json).unwrap();
        assert_eq!(cause.class, class, "{json}");
        let again: RunCause =
            serde_json::from_value(serde_json::to_value(&cause).unwrap()).unwrap();
        assert_eq!(again, cause, "{json}");
    }
    for kind in CauseKind::ALL {
        assert_eq!(CauseKind::parse(&kind.as_str().to_lowercase()), Some(kind));
        let json = serde_json::to_string(&kind).unwrap();
        assert_eq!(json, format!("\"{}\"", kind.as_str()));
    }
    let err = serde_json::from_str::<RunCause>(r#"{"kind":"OOPS"}"#).unwrap_err().to_string();
    assert!(err.contains("OOM") && err.contains("NODE_LOST"), "the kinds are listed: {err}");
}
