//! Helpers shared by the test modules.

use std::sync::atomic::{AtomicUsize, Ordering};

use trainstate_schema::TrainRunInfo;
pub(crate) use trainstate_testkit::runs::{numbered, run, run_with, workers};
pub(crate) use trainstate_testkit::{Head, Serve, eventually, fill};

/// A registry name of its own for each test: tests share one process (and
/// its actor registry) under `cargo test`.
pub(crate) fn unique_name(what: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("test.{what}.{}.{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst))
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

/// `trainstate serve` of this crate's binary on `data_dir` (see
/// [`Serve`] for its listen address, arguments and environment).
pub(crate) fn serve(data_dir: &std::path::Path) -> Serve {
    Serve::new(env!("CARGO_BIN_EXE_trainstate"), data_dir)
}

/// Starts `trainstate serve` on `data_dir` with `extra` arguments on a free
/// port; what it logged and how it exited if it exits before listening.
pub(crate) fn start_head(data_dir: &std::path::Path, extra: &[&str]) -> Result<Head, String> {
    serve(data_dir).args(extra).start().map_err(|refused| refused.to_string())
}
