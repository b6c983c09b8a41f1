//! Builds a small two-node run through the validating draft, prints it as
//! Ray-compatible JSON, shows a rejected document, and prints the run's
//! JSON Schema.
//!
//! ```text
//! cargo run -p trainstate-schema --example print_run
//! ```

use trainstate_schema::{
    ActorStatus, Resources, RunId, TrainDatasetInfoDraft, TrainRunInfo, TrainRunInfoDraft,
    TrainWorkerInfoDraft,
};

fn main() {
    let workers = (0..4u32)
        .map(|rank| TrainWorkerInfoDraft {
            actor_id: format!("{:032x}", 0xabc0 + rank),
            world_rank: rank,
            local_rank: rank % 2,
            node_rank: rank / 2,
            node_id: format!("node-{}", rank / 2),
            node_ip: format!("10.0.0.{}", rank / 2 + 1),
            pid: 4000 + rank,
            gpu_ids: vec![rank % 2],
            status: ActorStatus::Alive,
            resources: Resources::from_iter([("CPU", 1.0), ("GPU", 1.0)]),
            worker_log_file_path: None,
            node_name: None,
        })
        .collect();
    let draft = TrainRunInfoDraft {
        workers,
        datasets: vec![TrainDatasetInfoDraft {
            name: "train".into(),
            dataset_uuid: "ds-1".into(),
            dataset_name: Some("train_c4".into()),
        }],
        ..TrainRunInfoDraft::new(
            RunId::new_v7().to_string(),
            "llama-pretrain",
            "01000000",
            "c0ffee",
            1_760_000_000_000,
        )
    };

    let run: TrainRunInfo = draft.clone().validate().expect("the example run is valid");
    println!("A valid run, as Ray's TrainRunInfo:\n");
    println!("{}", serde_json::to_string_pretty(&run).unwrap());

    let mut broken = draft;
    broken.workers[3].world_rank = 1;
    let err = broken.validate().unwrap_err();
    println!("\nThe same run with two workers of world rank 1 is rejected:\n\n  {err}\n");

    let schema = schemars::schema_for!(TrainRunInfo);
    println!("Its JSON Schema (also committed as schemas/TrainRunInfo.schema.json):\n");
    println!("{}", serde_json::to_string_pretty(&schema).unwrap());
}
