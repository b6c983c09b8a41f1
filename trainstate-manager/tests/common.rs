//! Helpers shared by the test modules.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use ractor::ActorRef;
use trainstate_actor::{StateConfig, StateService, launch_state_actor};
use trainstate_client::StateHandle;
use trainstate_manager::{
    ManagerConfig, MetadataRequest, MetadataWorker, ProbeInputs, RactorWorkerGroup, WorkerError,
    WorkerGroup, WorkerInfoFuture,
};
use trainstate_schema::{Resources, RunId, RunStatus, TrainRunInfo, TrainWorkerInfo};
pub(crate) use trainstate_testkit::eventually;
use trainstate_testkit::runs::workers;

/// A registry name of its own for each test: tests share one process (and
/// its actor registry) under `cargo test`.
pub(crate) fn unique_name(what: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("test.manager.{what}.{}.{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst))
}

/// An in-memory state actor under a unique name.
pub(crate) async fn in_memory(what: &str) -> StateService {
    launch_state_actor(StateConfig::in_memory().with_name(unique_name(what))).await.unwrap()
}

/// A manager configuration with short deadlines, so tests of an absent
/// head run quickly. A call to a live head may still come back `Pending`
/// on a busy machine: a test with this configuration and a live head
/// waits for the outcome ([`eventually`], [`wait_for_status`]) instead of
/// asserting `Acknowledged`.
pub(crate) fn quick() -> ManagerConfig {
    ManagerConfig::default()
        .with_call_timeout(Duration::from_millis(300))
        .with_gather_timeout(Duration::from_secs(5))
        .with_backoff(Duration::from_millis(10), Duration::from_millis(100))
}

/// A manager configuration whose deadlines only end a hung test: a live
/// head acknowledges every call within them however loaded the machine,
/// so a test may assert `Registered` and `Acknowledged`.
pub(crate) fn patient() -> ManagerConfig {
    ManagerConfig::default()
        .with_call_timeout(Duration::from_secs(60))
        .with_gather_timeout(Duration::from_secs(60))
        .with_backoff(Duration::from_millis(10), Duration::from_millis(100))
}

/// The time the test clocks start at (Unix ms, in 2025).
pub(crate) use trainstate_testkit::runs::T0;

/// One wall clock for the head and the manager, moved only by the test:
/// leases, start and end times are decided by it, never by how fast the
/// machine runs. The one place that knows both crates' clock traits.
#[derive(Debug)]
pub(crate) struct TestClock(AtomicU64);

impl TestClock {
    /// A clock reading [`T0`].
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self(AtomicU64::new(T0)))
    }

    pub(crate) fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }

    pub(crate) fn advance(&self, by: Duration) {
        self.0.fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }

    /// The same clock, for the head's configuration.
    pub(crate) fn for_head(self: &Arc<Self>) -> Arc<dyn trainstate_actor::Clock> {
        self.clone()
    }

    /// The same clock, for the manager's configuration.
    pub(crate) fn for_manager(self: &Arc<Self>) -> Arc<dyn trainstate_manager::Clock> {
        self.clone()
    }
}

/// One clock trait serves both (trainstate-client's).
impl trainstate_actor::Clock for TestClock {
    fn now_ms(&self) -> u64 {
        TestClock::now_ms(self)
    }

    /// Time here only passes (`advance`), never steps: the monotonic
    /// reading is the same counter.
    fn monotonic_ms(&self) -> u64 {
        TestClock::now_ms(self)
    }
}

/// An in-memory head on `clock` that sweeps only when the test asks
/// (`sweep_leases`), with `lease`.
pub(crate) fn head_on(clock: &Arc<TestClock>, what: &str, lease: Duration) -> StateConfig {
    StateConfig::in_memory()
        .with_name(unique_name(what))
        .with_clock(clock.for_head())
        .with_lease(lease)
        .with_sweep_interval(Duration::from_secs(24 * 3600))
}

/// Waits until the run is stored with `status`, and returns it.
pub(crate) async fn wait_for_status(
    state: &StateHandle,
    id: &RunId,
    status: RunStatus,
) -> TrainRunInfo {
    let what = format!("run {id} to be {status}");
    eventually(&what, Duration::from_secs(20), || async {
        state.get_run(id.clone()).await.ok().filter(|run| run.run_status() == status)
    })
    .await
}

/// Probe inputs of one simulated worker: its node's machine id, address
/// and the GPU it sees.
pub(crate) fn worker_inputs(dir: &Path, node: u32, gpu: &str) -> ProbeInputs {
    let machine_id = dir.join(format!("machine-id-{node}"));
    std::fs::write(&machine_id, format!("{:032x}\n", 0xabc0 + node)).unwrap();
    ProbeInputs::empty()
        .with_machine_id_path(machine_id)
        .with_node_ip(IpAddr::V4(Ipv4Addr::new(10, 0, 0, node as u8 + 1)))
        .with_env("CUDA_VISIBLE_DEVICES", gpu)
        .with_resources(Resources::from_iter([("CPU", 1.0), ("GPU", 1.0)]))
}

/// `nodes` × `per_node` ractor workers; the worker of local rank `l` sees
/// GPU `l`.
pub(crate) async fn ractor_group(
    dir: &Path,
    nodes: u32,
    per_node: u32,
) -> RactorWorkerGroup<MetadataRequest> {
    let mut layout = Vec::new();
    for node in 0..nodes {
        let mut actors: Vec<ActorRef<MetadataRequest>> = Vec::new();
        for local in 0..per_node {
            let inputs = worker_inputs(dir, node, &local.to_string());
            actors.push(MetadataWorker::spawn_with(inputs).await.unwrap());
        }
        layout.push(actors);
    }
    RactorWorkerGroup::from_nodes(layout)
}

/// Stops every actor of a group.
pub(crate) fn stop(group: &RactorWorkerGroup<MetadataRequest>) {
    for worker in group.workers() {
        worker.actor.stop(None);
    }
}

/// A worker group whose workers' answers are known up front; one rank may
/// fail, one may never answer.
pub(crate) struct FakeGroup {
    pub(crate) workers: Vec<TrainWorkerInfo>,
    pub(crate) failing: Option<u32>,
    pub(crate) silent: Option<u32>,
}

impl FakeGroup {
    /// `n` healthy workers over nodes of `per_node`.
    pub(crate) fn new(n: u32, per_node: u32) -> Self {
        Self { workers: workers(n, per_node, ""), failing: None, silent: None }
    }
}

impl WorkerGroup for FakeGroup {
    fn world_size(&self) -> u32 {
        self.workers.len() as u32
    }

    fn worker_info(&self, world_rank: u32) -> WorkerInfoFuture {
        let info = self.workers.get(world_rank as usize).cloned();
        let failing = self.failing == Some(world_rank);
        let silent = self.silent == Some(world_rank);
        Box::pin(async move {
            if silent {
                std::future::pending::<()>().await;
            }
            if failing {
                return Err(WorkerError::failed("CUDA error: out of memory"));
            }
            info.ok_or(WorkerError::NoSuchRank)
        })
    }
}
