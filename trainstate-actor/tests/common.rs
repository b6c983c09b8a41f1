//! Helpers shared by the test modules.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use trainstate_schema::{
    ActorStatus, Resources, RunId, TrainRunInfo, TrainRunInfoDraft, TrainWorkerInfo,
    TrainWorkerInfoDraft,
};

/// A registry name of its own for each test: tests share one process (and
/// its actor registry) under `cargo test`.
pub(crate) fn unique_name(what: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("test.{what}.{}.{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst))
}

/// `n` workers over nodes of `per_node` workers.
pub(crate) fn workers(n: u32, per_node: u32, node_prefix: &str) -> Vec<TrainWorkerInfo> {
    (0..n)
        .map(|rank| {
            let node = rank / per_node;
            TrainWorkerInfoDraft {
                actor_id: format!("{node_prefix}actor{rank}"),
                world_rank: rank,
                local_rank: rank % per_node,
                node_rank: node,
                node_id: format!("{node_prefix}node{node}"),
                node_ip: format!("10.0.{}.{}", node / 250, node % 250 + 1),
                pid: 1000 + rank,
                gpu_ids: vec![rank % per_node],
                status: ActorStatus::Alive,
                resources: Resources::from_iter([("CPU", 1.0), ("GPU", 1.0)]),
                worker_log_file_path: None,
            }
            .validate()
            .unwrap()
        })
        .collect()
}

/// A live run of `n` workers started at `start_ms`.
pub(crate) fn run_with(id: &RunId, name: &str, job: &str, start_ms: u64, n: u32) -> TrainRunInfo {
    TrainRunInfoDraft {
        workers: workers(n, 4, "").into_iter().map(TrainWorkerInfo::into_draft).collect(),
        ..TrainRunInfoDraft::new(id.to_string(), name, job, "controller", start_ms)
    }
    .validate()
    .unwrap()
}

/// A live 8-worker run with a fresh id.
pub(crate) fn run(name: &str, start_ms: u64) -> TrainRunInfo {
    run_with(&RunId::new_v7(), name, "job1", start_ms, 8)
}

/// Waits for `condition`, polling, until `deadline` passes.
pub(crate) async fn wait_until(
    what: &str,
    deadline: Duration,
    mut condition: impl FnMut() -> bool,
) {
    let until = Instant::now() + deadline;
    while !condition() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// The JSON of a run without the fields that change over its life.
pub(crate) fn json(run: &TrainRunInfo) -> serde_json::Value {
    serde_json::to_value(run).unwrap()
}

/// A head service in this process, on a free loopback port.
pub(crate) struct Server {
    pub(crate) url: String,
    pub(crate) service: std::sync::Arc<trainstate_actor::StateService>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Server {
    pub(crate) async fn start(
        config: trainstate_actor::StateConfig,
        http: trainstate_actor::http::HttpConfig,
    ) -> Self {
        let service =
            std::sync::Arc::new(trainstate_actor::launch_state_actor(config).await.unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(trainstate_actor::http::serve(
            listener,
            service.clone(),
            http,
            async move {
                let _ = stopped.await;
            },
        ));
        Self { url, service, stop: Some(stop), task: Some(task) }
    }

    /// Stops accepting, ends event streams, then shuts the actor down.
    pub(crate) async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await.unwrap().unwrap();
        }
        self.service.shutdown().await;
    }
}

/// A guard on a wait for a child process that must end by itself; not a
/// margin any test needs.
pub(crate) const PROCESS_HANG: std::time::Duration = std::time::Duration::from_secs(60);

/// `trainstate serve` started as a child process: the child, the URL of
/// its `listening on` line, and everything it logs on stderr (read as it
/// comes, so that a chatty head never blocks on a full pipe).
pub(crate) struct Spawned {
    pub(crate) child: std::process::Child,
    pub(crate) url: String,
    pub(crate) log: std::sync::Arc<std::sync::Mutex<String>>,
}

/// Starts `trainstate serve --listen LISTEN --data-dir DIR EXTRA…` (with
/// `RUST_LOG=warn` unless `env` says otherwise) and waits for its
/// `listening on` line; or returns its exit status and what it logged if
/// it exits first.
pub(crate) fn spawn_serve(
    data_dir: &std::path::Path,
    listen: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Result<Spawned, (std::process::ExitStatus, String)> {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::sync::{Arc, Mutex};

    let mut child = Command::new(env!("CARGO_BIN_EXE_trainstate"))
        .args(["serve", "--listen", listen, "--data-dir"])
        .arg(data_dir)
        .args(extra)
        .env("RUST_LOG", "warn")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let log = Arc::new(Mutex::new(String::new()));
    let stderr = child.stderr.take().unwrap();
    let lines = log.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let mut log = lines.lock().unwrap();
            log.push_str(&line);
            log.push('\n');
        }
    });
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let _ = tx.send(lines.next().and_then(Result::ok));
        for _ in lines {}
    });
    match rx.recv_timeout(PROCESS_HANG) {
        Ok(Some(line)) => {
            let url = line
                .strip_prefix("listening on ")
                .unwrap_or_else(|| panic!("the first line was {line:?}"))
                .to_owned();
            Ok(Spawned { child, url, log })
        }
        _ => {
            let _ = child.kill();
            let status = child.wait().unwrap();
            reader.join().unwrap();
            let log = log.lock().unwrap().clone();
            Err((status, log))
        }
    }
}
