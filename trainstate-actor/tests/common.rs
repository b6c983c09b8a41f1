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

/// A head service in this process, on a free loopback port: the same
/// [`trainstate_actor::Head`] the binary composes.
pub(crate) struct Server {
    pub(crate) url: String,
    pub(crate) service: std::sync::Arc<trainstate_actor::StateService>,
    head: trainstate_actor::Head,
}

impl Server {
    pub(crate) async fn start(
        config: trainstate_actor::StateConfig,
        http: trainstate_actor::http::HttpConfig,
    ) -> Self {
        let head = trainstate_actor::Head::start(trainstate_actor::HeadConfig::new(config, http))
            .await
            .unwrap();
        Self { url: head.url(), service: head.service().clone(), head }
    }

    /// Stops accepting, ends event streams, then shuts the actor down.
    pub(crate) async fn stop(self) {
        drop(self.service);
        // A head whose actor was given up on (an injected fault) says so as
        // it stops; any other error is the test's.
        if let Err(err) = self.head.shutdown().await {
            assert!(err.to_string().contains("given up on"), "{err}");
        }
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
