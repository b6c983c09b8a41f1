//! The counters a head keeps for `/metrics` and for tests: the store's,
//! forwarding's and each notification target's (the feeds', [`Feeds`]). A leaf, so the writer that
//! holds them and the parts that count into them import it, not each other.

use std::sync::atomic::AtomicU64;
#[cfg(any(feature = "forward", feature = "notify"))]
use std::sync::{Arc, Mutex};

/// Counters of the store, for metrics and tests.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Transactions committed.
    pub transactions: AtomicU64,
    /// Write requests committed.
    pub writes: AtomicU64,
    /// Total time spent committing, in microseconds.
    pub commit_micros: AtomicU64,
    /// Commits that failed.
    pub failures: AtomicU64,
    /// Transactions that added metric points to their histories.
    pub metric_flushes: AtomicU64,
    /// Total time spent adding metric points, in microseconds.
    pub metric_flush_micros: AtomicU64,
    /// Metric points handed to the store (before its series kept or
    /// dropped each by its stride).
    pub metric_points: AtomicU64,
    /// Metric points lost: their flush failed, or a rank board's pending
    /// points were full.
    pub metric_points_dropped: AtomicU64,
}

/// Counters of forwarding.
#[cfg(feature = "forward")]
#[derive(Debug, Default)]
pub struct ForwardStats {
    /// Runs the hub accepted (or already had).
    pub forwarded: AtomicU64,
    /// Runs the hub refused for good (conflicting or invalid); skipped.
    pub refused: AtomicU64,
    /// Tries that found the hub unreachable or busy.
    pub retries: AtomicU64,
    /// The sequence number of the store's commit forwarded up to.
    pub position: AtomicU64,
    /// Runs with a change not yet accepted (or refused) by the hub: those
    /// of the batch being sent and those changed in the store behind it,
    /// each run once however often it changed (it is sent as it is now).
    pub pending: AtomicU64,
    /// When the hub last accepted a run, in Unix milliseconds of the
    /// service's clock; 0 until it first does.
    pub last_success_ms: AtomicU64,
}

/// A notification target and its counters, for `/metrics`, `GET
/// /api/notify` and tests.
#[cfg(feature = "notify")]
#[derive(Debug)]
pub struct NotifyStats {
    /// What the target is (its name, kind, URL without secrets, events and
    /// filters); the counters below fill the rest when it is shown.
    pub(crate) described: trainstate_schema::api::NotifyTargetInfo,
    /// True while this head sends (on a shared store, the head that sweeps).
    pub sending: std::sync::atomic::AtomicBool,
    /// The commit sequence number of the durable position.
    pub position: AtomicU64,
    /// Events read and not yet delivered (at most the backlog bound).
    pub pending: AtomicU64,
    /// When the oldest of them was read to be sent (Unix ms of the
    /// service's clock); 0 when none is pending.
    pub oldest_pending_ms: AtomicU64,
    /// Events delivered.
    pub sent: AtomicU64,
    /// Tries that failed (each is tried again).
    pub failures: AtomicU64,
    /// Events dropped: past the backlog bound, or refused for good.
    pub dropped: AtomicU64,
    /// When the last event was delivered (Unix ms); 0 until one is.
    pub last_sent_ms: AtomicU64,
    /// Why the last try failed, and when (Unix ms).
    pub(crate) last_error: std::sync::Mutex<Option<(String, u64)>>,
}

#[cfg(feature = "notify")]
impl NotifyStats {
    /// Counters of the target `described`, all zero.
    pub(crate) fn new(described: trainstate_schema::api::NotifyTargetInfo) -> Self {
        Self {
            described,
            sending: Default::default(),
            position: AtomicU64::default(),
            pending: AtomicU64::default(),
            oldest_pending_ms: AtomicU64::default(),
            sent: AtomicU64::default(),
            failures: AtomicU64::default(),
            dropped: AtomicU64::default(),
            last_sent_ms: AtomicU64::default(),
            last_error: std::sync::Mutex::default(),
        }
    }

    /// The target's name.
    pub fn name(&self) -> &str {
        &self.described.name
    }

    /// Notes a failed try, for [`NotifyStats::info`].
    pub(crate) fn failed(&self, error: String, at_ms: u64) {
        use std::sync::atomic::Ordering;
        self.failures.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some((error, at_ms));
    }

    /// The target as `GET /api/notify` shows it, now.
    pub fn info(&self) -> trainstate_schema::api::NotifyTargetInfo {
        use std::sync::atomic::Ordering;
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let mut info = self.described.clone();
        info.sending = self.sending.load(Ordering::Relaxed);
        info.position = read(&self.position);
        info.pending = read(&self.pending);
        info.sent = read(&self.sent);
        info.failures = read(&self.failures);
        info.dropped = read(&self.dropped);
        info.last_sent_ms = Some(read(&self.last_sent_ms)).filter(|&ms| ms > 0);
        let last_error = self.last_error.lock().unwrap_or_else(|e| e.into_inner()).clone();
        (info.last_error, info.last_error_ms) = last_error.unzip();
        info
    }
}

/// The feeds of a head, by what they send: what `/metrics` and `GET
/// /api/notify` show of them.
#[derive(Default)]
pub(crate) struct Feeds {
    /// The counters of forwarding to a hub, once the head forwards.
    #[cfg(feature = "forward")]
    pub(crate) forwarding: Mutex<Option<Arc<ForwardStats>>>,
    /// The state of each notification target, once the head notifies.
    #[cfg(feature = "notify")]
    pub(crate) notify: Mutex<Vec<Arc<NotifyStats>>>,
}

/// A live run's goodput counted to the moment of a read, as the metrics
/// show it.
#[cfg_attr(not(feature = "server"), allow(dead_code))]
#[derive(Debug, Clone)]
pub(crate) struct LiveGoodput {
    pub(crate) id: trainstate_schema::RunId,
    pub(crate) name: Box<str>,
    pub(crate) cluster: Option<Box<str>>,
    pub(crate) goodput: trainstate_schema::RunGoodput,
}
