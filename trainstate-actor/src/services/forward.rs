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

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use trainstate_client::{StateError, StateHandle, TrustedCas};
use trainstate_schema::TrainRunInfo;

pub use crate::engine::stats::ForwardStats;
use crate::engine::supervisor::StateService;
use crate::engine::supervisor::{
    Feed, FeedContext, FeedCounters, FeedHandle, Item, QueuePolicy, RunItems, Sent, Sink,
};

/// How long one send of a run may take by default (tries to an
/// unreachable hub included).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The first wait before a failed send is tried again.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

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
    feed: FeedHandle,
    stats: Arc<ForwardStats>,
}

impl Forwarder {
    /// The counters.
    pub fn stats(&self) -> Arc<ForwardStats> {
        self.stats.clone()
    }

    /// Stops forwarding; what was forwarded is recorded.
    pub async fn stop(self) {
        self.feed.stop().await;
    }
}

/// Starts forwarding `service`'s runs as `config` says. Fails if the
/// hub's URL is not one, or CAs are given for an `http://` hub; a store
/// that keeps no positions (memory only) is retried, and logged.
pub fn start_forwarding(
    service: &StateService,
    config: ForwardConfig,
) -> Result<Forwarder, StateError> {
    trainstate_schema::validate_name("cluster", &config.cluster)?;
    let hub = StateHandle::connect_with_ca(&config.hub, config.token.clone(), config.cas.as_ref())?
        .with_timeout(config.call_timeout);
    let stats = Arc::new(ForwardStats::default());
    *service.feeds().forwarding.lock().unwrap_or_else(|e| e.into_inner()) = Some(stats.clone());
    let target = config.hub.trim_end_matches('/').to_owned();
    tracing::info!(hub = %target, "forwarding runs to the hub");
    let sink = HubSink { hub, target, cluster: config.cluster, stats: stats.clone() };
    Ok(Forwarder { feed: service.follow_changes(sink), stats })
}

/// Forwarding as a sink of the change feed: each changed run is sent, as
/// it is stored now, to the hub.
struct HubSink {
    hub: StateHandle,
    /// The hub's URL: the name of the feed's cursor.
    target: String,
    cluster: String,
    stats: Arc<ForwardStats>,
}

/// A run to forward, as stored at one commit.
struct ForwardedRun {
    /// The run's id and the commit's sequence number: a run that changes
    /// again is sent again.
    id: String,
    run_id: String,
    run: TrainRunInfo,
}

impl Item for ForwardedRun {
    fn id(&self) -> &str {
        &self.id
    }

    fn run_id(&self) -> &str {
        &self.run_id
    }
}

impl HubSink {
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
}

impl Sink for HubSink {
    type Item = ForwardedRun;

    fn name(&self) -> &str {
        &self.target
    }

    fn feed(&self) -> Feed {
        Feed::Forward(self.target.clone())
    }

    fn policy(&self) -> QueuePolicy {
        // One batch of runs at a time, none ever dropped: the store holds
        // the rest until the hub takes them, and they are counted pending
        // there too, each run once (it is sent as it is now).
        QueuePolicy {
            backlog: 1,
            drop_oldest: false,
            first_backoff: FIRST_BACKOFF,
            max_backoff: MAX_BACKOFF,
            count_ahead: true,
        }
    }

    fn counters(&self) -> Arc<dyn FeedCounters> {
        self.stats.clone()
    }

    fn items(&mut self, seq: u64, json: &str) -> Result<RunItems<ForwardedRun>, String> {
        let run = self.stamped(json)?;
        let run_id = run.id().to_string();
        let id = format!("{run_id}@{seq}");
        Ok(RunItems {
            derivable: BTreeSet::from([id.clone()]),
            wanted: vec![ForwardedRun { id, run_id, run }],
        })
    }

    fn send<'a>(
        &'a mut self,
        front: &'a [&'a ForwardedRun],
        _: &'a FeedContext,
    ) -> impl Future<Output = (usize, Sent)> + Send + 'a {
        let run = front[0].run.clone();
        async move {
            let sent = match self.hub.forward(run).await {
                Ok(_) => Sent::Delivered,
                Err(
                    err @ (StateError::Conflict { .. }
                    | StateError::IllegalTransition { .. }
                    | StateError::Invalid { .. }),
                ) => Sent::Refused(err.to_string()),
                // Unreachable, busy, or not (yet) accepting us: keep the
                // position and try again.
                Err(err) => Sent::Retry { error: err.to_string(), after: None },
            };
            (1, sent)
        }
    }
}
