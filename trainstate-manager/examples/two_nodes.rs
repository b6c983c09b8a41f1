//! A simulated training run over two nodes of four workers each.
//!
//! Every worker is a ractor actor that probes "its" process from the inputs
//! of its node (machine id, address, the GPU it was given). The controller's
//! manager registers the run, resizes it to six workers (an elastic resize:
//! a second attempt), finishes it, and the stored run is printed as JSON.
//! The simulated workers all live in this process, so they report its pid.
//!
//! ```sh
//! cargo run -p trainstate-manager --example two_nodes
//! ```

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::time::Duration;

use ractor::{Actor, ActorRef};
use trainstate_actor::{StateConfig, launch_state_actor};
use trainstate_manager::{
    DatasetSpec, ManagerConfig, MetadataRequest, MetadataWorker, ProbeInputs, RactorWorkerGroup,
    TrainRunStateManager,
};
use trainstate_schema::Resources;

/// What tells one simulated node from the other.
struct Node {
    machine_id: &'static str,
    ip: Ipv4Addr,
    gpus: [u32; 4],
}

const NODES: [Node; 2] = [
    Node {
        machine_id: "6f1c2a9be0d34c8e9a7b5d3f1e2c4a6b",
        ip: Ipv4Addr::new(10, 0, 0, 11),
        gpus: [0, 1, 2, 3],
    },
    Node {
        machine_id: "b83e4d5c6a7f4e1d8c9b0a1f2e3d4c5b",
        ip: Ipv4Addr::new(10, 0, 0, 12),
        gpus: [0, 1, 2, 3],
    },
];

/// Spawns `per_node` workers on each node; worker `l` of a node is given
/// the node's GPU `l`, as a launcher setting `CUDA_VISIBLE_DEVICES` would.
async fn spawn_workers(
    dir: &Path,
    attempt: u32,
    per_node: usize,
) -> Result<RactorWorkerGroup<MetadataRequest>, Box<dyn std::error::Error>> {
    let mut layout = Vec::new();
    for (n, node) in NODES.iter().enumerate() {
        let machine_id = dir.join(format!("node{n}-machine-id"));
        std::fs::write(&machine_id, format!("{}\n", node.machine_id))?;
        let mut actors: Vec<ActorRef<MetadataRequest>> = Vec::new();
        for (local, gpu) in node.gpus.iter().take(per_node).enumerate() {
            let inputs = ProbeInputs::empty()
                .with_machine_id_path(&machine_id)
                .with_node_ip(IpAddr::V4(node.ip))
                .with_env("CUDA_VISIBLE_DEVICES", gpu.to_string())
                .with_resources(Resources::from_iter([("CPU", 8.0), ("GPU", 1.0)]));
            let name = format!("attempt{attempt}-node{n}-worker{local}");
            let (actor, _) = Actor::spawn(Some(name), MetadataWorker, inputs).await?;
            actors.push(actor);
        }
        layout.push(actors);
    }
    Ok(RactorWorkerGroup::from_nodes(layout))
}

fn stop(group: &RactorWorkerGroup<MetadataRequest>) {
    for worker in group.workers() {
        worker.actor.stop(None);
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The head's state actor, in this process for the example.
    let service = launch_state_actor(StateConfig::in_memory()).await?;
    let scratch = tempfile::tempdir()?;
    let dir = scratch.path();

    let manager = TrainRunStateManager::new(Some(service.handle()), ManagerConfig::default());
    let eight = spawn_workers(dir, 0, 4).await?;
    let datasets = [
        DatasetSpec::new("train", "9a1b2c3d4e5f").named("c4_en"),
        DatasetSpec::new("validation", "0f1e2d3c4b5a").named("c4_en_val"),
    ];
    let run = manager
        .register_train_run("llama-pretrain", "02000000", "controller-7f3a", &eight, datasets, None)
        .await?;
    let id = run.into_id();
    eprintln!("registered run {id} with 8 workers");

    // Elastic resize: two workers lost, the run goes on with six.
    stop(&eight);
    let six = spawn_workers(dir, 1, 3).await?;
    manager.update_worker_group(&id, &six).await?;
    eprintln!("resized run {id} to 6 workers");

    manager.finished(&id).await?;
    let stored = service.handle().get(id).await?;
    let json: serde_json::Value = serde_json::from_str(&stored.to_json())?;
    println!("{}", serde_json::to_string_pretty(&json)?);

    manager.shutdown(Duration::from_secs(5)).await;
    stop(&six);
    service.shutdown().await;
    Ok(())
}
