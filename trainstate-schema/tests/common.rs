//! Helpers shared by the test modules.

use std::path::PathBuf;

use serde_json::{Value, json};
use trainstate_schema::{TrainRunInfo, TrainRunInfoDraft};

/// The workspace's copy of Ray's documents.
pub(crate) fn fixture(name: &str) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// How reading a document failed: the field path and the message.
#[derive(Debug)]
pub(crate) struct Rejection {
    pub(crate) field: String,
    pub(crate) message: String,
}

/// Reads a run the way the head does: structure first (with the path of a
/// structural error), then the rules (with the field of the broken rule).
pub(crate) fn read_run(text: &str) -> Result<TrainRunInfo, Rejection> {
    let de = &mut serde_json::Deserializer::from_str(text);
    let draft: TrainRunInfoDraft = serde_path_to_error::deserialize(de)
        .map_err(|e| Rejection { field: e.path().to_string(), message: e.inner().to_string() })?;
    let validated = draft
        .validate()
        .map_err(|e| Rejection { field: e.field().to_string(), message: e.rule().to_string() });
    // The plain `Deserialize` of the validated type must agree.
    let direct = serde_json::from_str::<TrainRunInfo>(text);
    assert_eq!(
        validated.is_ok(),
        direct.is_ok(),
        "draft+validate and Deserialize disagree on {text}"
    );
    validated
}

/// A valid 4-worker run over two nodes, as JSON.
pub(crate) fn valid_run() -> Value {
    let worker = |rank: u32, node: u32| {
        json!({
            "actor_id": format!("actor{rank}"),
            "world_rank": rank,
            "local_rank": rank % 2,
            "node_rank": node,
            "node_id": format!("node{node}"),
            "node_ip": format!("10.0.0.{}", node + 1),
            "pid": 1000 + rank,
            "gpu_ids": [rank % 2],
            "status": "ALIVE",
            "resources": {"CPU": 1.0, "GPU": 1.0}
        })
    };
    json!({
        "name": "pretrain",
        "id": "0192f0c5a4e27c3db1c1a2b3c4d5e6f7",
        "job_id": "01000000",
        "controller_actor_id": "c0ffee",
        "workers": [worker(0, 0), worker(1, 0), worker(2, 1), worker(3, 1)],
        "datasets": [{"name": "train", "dataset_uuid": "ds1", "dataset_name": "train_ds"}],
        "run_status": "RUNNING",
        "status_detail": "",
        "start_time_ms": 1_760_000_000_000u64,
        "end_time_ms": null,
        "resources": [
            {"CPU": 1.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 1.0},
            {"CPU": 1.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}
        ]
    })
}
