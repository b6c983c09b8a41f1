//! Notifications: a head tells people when a run needs them, through
//! generic webhooks, Slack incoming webhooks and Alertmanager.
//!
//! Events are derived from the committed run documents (`events.rs`), never
//! from the writes that made them: each target reads the runs changed after
//! its durable position, as forwarding does, and sends the events of each
//! run's latest document that it has not delivered yet, each with an id
//! that is a function of the document (`<run_id>:ERRORED`,
//! `<run_id>:STALLED:<at_ms>`, ...). Delivery is at least once: the position
//! moves on only past runs whose events were delivered (or dropped past the
//! backlog bound, counted and logged), so after a crash the events in
//! flight are sent again, with the same ids, for the receiver to drop.
//!
//! Each target is a sink of a change feed of its own (`delivery.rs` says
//! how to send; the engine's feed reads, queues, retries and saves); a
//! target that is down slows nothing else. With a shared (PostgreSQL) store only the head
//! that sweeps sends. The rules are in `docs/notify.md`.

mod alertmanager;
mod delivery;
mod events;
mod slack;
mod target;

use std::sync::Arc;
use std::time::Duration;

use trainstate_schema::api::NotifyTargetInfo;

use self::delivery::Delivery;
use self::target::KindFilter;
pub use self::target::{DEFAULT_EVENTS, DEFAULT_RESEND, EventChoice, NotifyTarget, TargetError};
use crate::decisions::log_throttle::LogThrottle;
pub use crate::engine::stats::NotifyStats;
use crate::engine::supervisor::StateService;
use crate::engine::supervisor::{Feed, FeedHandle};

/// The most events a target holds to send by default; past it, while the
/// target fails, the oldest are dropped.
pub const DEFAULT_NOTIFY_BACKLOG: usize = 10_000;

/// How long one request to a target may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How long connecting to a target may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why notifications cannot start as configured.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NotifyError {
    /// Two targets share a name (their default names come from their hosts).
    #[error(
        "two targets are named {0:?}; name them apart with #target=NAME at the end of their URLs"
    )]
    DuplicateName(String),
    /// The public URL is not one.
    #[error("--public-url: {0}")]
    PublicUrl(String),
    /// The store keeps no positions (memory only), or cannot be read.
    #[error("notification target {target:?}: {reason}")]
    Store {
        /// The target.
        target: String,
        /// What the store said.
        reason: String,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client of notifications: {0}")]
    Client(String),
}

/// The notification targets of a head and what they share.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NotifyConfig {
    /// The targets, in the order given.
    pub targets: Vec<NotifyTarget>,
    /// The head's URL as people reach it (`https://trainstate.example`):
    /// each event links its run's page under it. `None`: no links.
    pub public_url: Option<String>,
    /// The most events each target holds to send.
    pub backlog: usize,
}

impl NotifyConfig {
    /// Notifications to `targets`, whose names must differ.
    pub fn new(targets: Vec<NotifyTarget>) -> Result<Self, NotifyError> {
        let mut names = std::collections::BTreeSet::new();
        for target in &targets {
            if !names.insert(target.name()) {
                return Err(NotifyError::DuplicateName(target.name().to_owned()));
            }
        }
        Ok(Self { targets, public_url: None, backlog: DEFAULT_NOTIFY_BACKLOG })
    }

    /// Links each event to its run's page under `public_url` (see
    /// [`check_public_url`]).
    pub fn with_public_url(mut self, public_url: Option<String>) -> Result<Self, NotifyError> {
        self.public_url = public_url.map(|url| check_public_url(&url)).transpose()?;
        Ok(self)
    }

    /// Holds at most `backlog` events per target (at least 1).
    pub fn with_backlog(mut self, backlog: usize) -> Self {
        self.backlog = backlog.max(1);
        self
    }
}

/// Checks a head's public URL: `http://` or `https://`, a host, perhaps
/// a path (behind a proxy), no query or fragment. Answers it without a
/// trailing `/`.
pub fn check_public_url(text: &str) -> Result<String, NotifyError> {
    let bad = |rule: &str| NotifyError::PublicUrl(format!("{text:?} {rule}"));
    let url = url::Url::parse(text).map_err(|e| bad(&format!("is not a URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad("must start with http:// or https://"));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("names no host"));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(bad("must have no query or fragment: run pages are linked under it"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad("must name no user: it is sent to every target"));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

/// Notifications in progress; stop them with [`Notifier::stop`].
#[derive(Debug)]
pub struct Notifier {
    feeds: Vec<FeedHandle>,
    stats: Vec<Arc<NotifyStats>>,
}

impl Notifier {
    /// Each target's counters, in the order given.
    pub fn stats(&self) -> &[Arc<NotifyStats>] {
        &self.stats
    }

    /// Stops every target's loop; what was delivered is saved.
    pub async fn stop(self) {
        for feed in self.feeds {
            feed.stop().await;
        }
    }
}

/// Starts notifying `config`'s targets of `service`'s runs. Fails if the
/// store keeps no positions (memory only) or cannot be read.
pub async fn start_notifying(
    service: &StateService,
    config: NotifyConfig,
) -> Result<Notifier, NotifyError> {
    for target in &config.targets {
        service.check_feed(&Feed::Notify(target.name().to_owned())).await.map_err(|reason| {
            NotifyError::Store { target: target.name().to_owned(), reason: reason.to_string() }
        })?;
    }
    let client = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("trainstate/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| NotifyError::Client(e.to_string()))?;
    if config.public_url.is_none() && !config.targets.is_empty() {
        tracing::warn!("no --public-url: notifications carry no link to the run's page");
    }
    let mut feeds = Vec::new();
    let mut all = Vec::new();
    for target in config.targets {
        let stats = Arc::new(NotifyStats::new(describe(&target)));
        all.push(stats.clone());
        let delivery = Delivery {
            target: Arc::new(target),
            client: client.clone(),
            stats,
            link_base: config.public_url.clone(),
            backlog: config.backlog,
            firing: Default::default(),
            resend_at: tokio::time::Instant::now(),
            resend_log: LogThrottle::default(),
        };
        feeds.push(service.follow_changes(delivery));
    }
    service.feeds().notify.lock().unwrap_or_else(|e| e.into_inner()).clone_from(&all);
    Ok(Notifier { feeds, stats: all })
}

/// What `GET /api/notify` says of `target` beside its counters.
fn describe(target: &NotifyTarget) -> NotifyTargetInfo {
    let mut info = NotifyTargetInfo::new(target.name(), target.kind(), target.shown_url());
    info.events = target.events();
    info.clusters.clone_from(&target.clusters);
    info.run_name = target.run_name.as_ref().map(|p| p.as_str().to_owned());
    info.classes = target.causes.classes.iter().flatten().copied().collect();
    match &target.causes.kinds {
        Some(KindFilter::Only(kinds)) => info.causes = kinds.iter().copied().collect(),
        Some(KindFilter::Except(kinds)) => info.causes_left_out = kinds.iter().copied().collect(),
        None => {}
    }
    info
}

#[cfg(test)]
mod tests {
    use trainstate_schema::api::NotifyTargetKind;

    use super::*;

    #[test]
    fn public_urls_are_checked_and_trimmed() {
        assert_eq!(check_public_url("https://ts.example/").unwrap(), "https://ts.example");
        assert_eq!(check_public_url("http://h:8266/ts/").unwrap(), "http://h:8266/ts");
        for bad in ["ts.example", "ftp://h", "https://h/?a=1", "https://u:p@h/"] {
            assert!(check_public_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn two_targets_may_not_share_a_name() {
        let parse = |url| NotifyTarget::parse(NotifyTargetKind::Webhook, url).unwrap();
        let err = NotifyConfig::new(vec![parse("http://h/a"), parse("http://h/b")]).unwrap_err();
        assert!(
            matches!(err, NotifyError::DuplicateName(ref name) if name == "webhook-h"),
            "{err}"
        );
        assert!(NotifyConfig::new(vec![parse("http://h/a"), parse("http://h/b#target=b")]).is_ok());
    }
}
