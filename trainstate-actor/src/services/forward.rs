//! Forwarding: a head sends the runs it commits to a hub, another head
//! (usually on PostgreSQL) that keeps the runs of many clusters.
//!
//! The head keeps its own store and keeps working while the hub is away.
//! Its store numbers every commit; forwarding reads the runs changed after
//! a durable position (kept in the head's own store, per hub), sends each
//! one's latest version to the hub (`PUT /api/train/forwarded/{id}`, an
//! idempotent upsert by run id), and moves the position on only after the
//! hub has answered. So after either side restarts it resumes where it
//! was: nothing is lost, and what is sent twice changes nothing the second
//! time. A run that changed many times while the hub was away is sent
//! once, as it is now. Deletions and evictions are not forwarded: a run
//! stays on the hub after its cluster (and its head's store) is gone.
//!
//! Runs are stamped with the head's cluster name on the way, if they were
//! registered before the head had one. With a shared (PostgreSQL) store,
//! only the head that sweeps forwards.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use trainstate_client::{StateError, StateHandle, TrustedCas};
use trainstate_schema::TrainRunInfo;

use crate::StateService;
pub use crate::engine::stats::ForwardStats;
use crate::engine::writer::Writer;
use crate::store::Position;

/// Runs read from the store at a time.
const BATCH: usize = 256;

/// How often forwarding looks for changes when it was told of none.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// How long one send of a run may take by default (tries to an
/// unreachable hub included).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest wait between two tries to reach the hub.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Where and how a head forwards its runs.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ForwardConfig {
    /// The hub's base URL, `http://host:port` or `https://host:port`.
    pub hub: String,
    /// The bearer token the hub's writes need.
    pub token: Option<String>,
    /// The CAs trusted for an `https://` hub, instead of the system's roots.
    pub cas: Option<TrustedCas>,
    /// This head's cluster name, stamped on runs that lack one.
    pub cluster: String,
    /// How long one send of a run may take, tries to an unreachable hub
    /// included, before it counts as a failure and is tried again.
    pub call_timeout: Duration,
}

impl ForwardConfig {
    /// Forwarding of cluster `cluster`'s runs to the hub at `hub`.
    pub fn new(hub: impl Into<String>, cluster: impl Into<String>) -> Self {
        Self {
            hub: hub.into(),
            token: None,
            cas: None,
            cluster: cluster.into(),
            call_timeout: CALL_TIMEOUT,
        }
    }

    /// Trusts `cas` (instead of the system's roots) for an `https://` hub.
    pub fn with_cas(mut self, cas: Option<TrustedCas>) -> Self {
        self.cas = cas;
        self
    }

    /// The same, with another deadline for one send of a run.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Sends `token` to the hub.
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }
}

/// Forwarding in progress; stop it with [`Forwarder::stop`].
#[derive(Debug)]
pub struct Forwarder {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    stats: Arc<ForwardStats>,
}

impl Forwarder {
    /// The counters.
    pub fn stats(&self) -> Arc<ForwardStats> {
        self.stats.clone()
    }

    /// Stops forwarding; what was forwarded is recorded.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Starts forwarding `service`'s runs as `config` says. Fails if the
/// store keeps no positions (memory only), the hub's URL is not one, or
/// CAs are given for an `http://` hub.
pub fn start_forwarding(
    service: &StateService,
    config: ForwardConfig,
) -> Result<Forwarder, StateError> {
    trainstate_schema::validate_name("cluster", &config.cluster)?;
    let hub = StateHandle::connect_with_ca(&config.hub, config.token.clone(), config.cas.as_ref())?
        .with_timeout(config.call_timeout);
    let (stop, stopped) = watch::channel(false);
    let stats = Arc::new(ForwardStats::default());
    *service.writer().shared.forwarding.lock().unwrap_or_else(|e| e.into_inner()) =
        Some(stats.clone());
    let forwarding = Forwarding {
        writer: service.writer(),
        hub,
        target: config.hub.trim_end_matches('/').to_owned(),
        cluster: config.cluster,
        stats: stats.clone(),
        stopped,
    };
    let task = tokio::spawn(forwarding.run());
    Ok(Forwarder { stop, task, stats })
}

struct Forwarding {
    writer: Arc<Writer>,
    hub: StateHandle,
    target: String,
    cluster: String,
    stats: Arc<ForwardStats>,
    stopped: watch::Receiver<bool>,
}

impl Forwarding {
    async fn run(mut self) {
        let mut position = loop {
            match self.writer.forward_position(&self.target).await {
                Ok(position) => break position,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot read the forwarding position; retrying");
                    if self.pause(IDLE_CHECK).await {
                        return;
                    }
                }
            }
        };
        tracing::info!(hub = %self.target, seq = position.seq, "forwarding runs to the hub");
        let mut changes = self.writer.shared.events.subscribe();
        loop {
            if *self.stopped.borrow() {
                return;
            }
            if !self.writer.shared.sweeps() {
                // Another head of this shared store forwards.
                if self.pause(IDLE_CHECK).await {
                    return;
                }
                continue;
            }
            let batch = match self.writer.changed_after(position.clone(), BATCH).await {
                Ok(batch) => batch,
                Err(err) => {
                    tracing::warn!(error = %err, "cannot read runs to forward; retrying");
                    if self.pause(IDLE_CHECK).await {
                        return;
                    }
                    continue;
                }
            };
            if batch.is_empty() {
                // Wait for a commit (any event), or look again in a while.
                let mut stopped = self.stopped.clone();
                tokio::select! {
                    _ = changes.recv() => {}
                    _ = tokio::time::sleep(IDLE_CHECK) => {}
                    _ = stopped.changed() => return,
                }
                continue;
            }
            self.stats.pending.store(batch.len() as u64, Ordering::Relaxed);
            for changed in batch {
                match self.stamped(&changed.json) {
                    Ok(run) => {
                        if !self.send(run).await {
                            // Stopped: the position stays before this run.
                            self.save(&position).await;
                            return;
                        }
                    }
                    Err(err) => {
                        tracing::error!(position = ?changed.at, error = %err, "a stored run does not parse; not forwarded");
                    }
                }
                position = changed.at;
                self.stats.pending.fetch_sub(1, Ordering::Relaxed);
            }
            self.save(&position).await;
        }
    }

    /// The stored run, with this head's cluster if it names none.
    fn stamped(&self, json: &str) -> Result<TrainRunInfo, String> {
        let run: TrainRunInfo = serde_json::from_str(json).map_err(|e| e.to_string())?;
        if run.cluster().is_some() {
            return Ok(run);
        }
        let mut draft = run.into_draft();
        draft.cluster = Some(self.cluster.clone());
        draft.validate().map_err(|e| e.to_string())
    }

    /// Sends one run until the hub has it or refuses it for good; false
    /// when stopped first.
    async fn send(&mut self, run: TrainRunInfo) -> bool {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.hub.forward(run.clone()).await {
                Ok(_) => {
                    self.stats.forwarded.fetch_add(1, Ordering::Relaxed);
                    let now = self.writer.shared.clock.now_ms();
                    self.stats.last_success_ms.store(now, Ordering::Relaxed);
                    return true;
                }
                Err(
                    err @ (StateError::Conflict { .. }
                    | StateError::IllegalTransition { .. }
                    | StateError::Invalid { .. }),
                ) => {
                    tracing::error!(run = %run.id(), error = %err, "the hub refused the run; skipping it");
                    self.stats.refused.fetch_add(1, Ordering::Relaxed);
                    return true;
                }
                Err(err) => {
                    // Unreachable, busy, or not (yet) accepting us: keep the
                    // position and try again.
                    let retries = self.stats.retries.fetch_add(1, Ordering::Relaxed);
                    if retries.is_multiple_of(20) {
                        tracing::warn!(hub = %self.target, error = %err, "cannot forward to the hub; retrying");
                    }
                    if self.pause(backoff).await {
                        return false;
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    async fn save(&self, position: &Position) {
        match self.writer.save_forward_position(&self.target, position.clone()).await {
            Ok(()) => self.stats.position.store(position.seq, Ordering::Relaxed),
            // Not fatal: the runs after the saved position are sent again.
            Err(err) => tracing::warn!(error = %err, "cannot save the forwarding position"),
        }
    }

    /// Waits `duration`; true if stopped meanwhile.
    async fn pause(&self, duration: Duration) -> bool {
        let mut stopped = self.stopped.clone();
        if *stopped.borrow() {
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep(duration) => *stopped.borrow(),
            _ = stopped.changed() => true,
        }
    }
}
