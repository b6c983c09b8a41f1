//! The counters a head keeps for `/metrics` and for tests: the store's,
//! and forwarding's. A leaf, so the writer that holds them and the parts
//! that count into them import it, not each other.

use std::sync::atomic::AtomicU64;

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
    /// Runs read from the store to forward and not yet accepted (or
    /// refused) by the hub: the rest of the batch being sent, so at most
    /// one batch (256); more changes may wait in the store behind it.
    pub pending: AtomicU64,
    /// When the hub last accepted a run, in Unix milliseconds of the
    /// service's clock; 0 until it first does.
    pub last_success_ms: AtomicU64,
}
