//! Which runs the head keeps: the bounds retention and admission decide by.

use std::time::Duration;

/// The default number of runs kept.
pub const DEFAULT_MAX_RUNS: usize = 10_000;

/// The default bound on the bytes of JSON of the runs kept (1 GiB): what
/// the head holds in memory for them, and about what the store holds.
pub const DEFAULT_MAX_RETAINED_BYTES: u64 = 1024 * 1024 * 1024;

/// Which runs are kept: at most a number of runs and of bytes, and
/// optionally not past an age. Only ended runs are evicted, the oldest
/// (by start time) first; a live run is never evicted, so live runs are
/// bounded at admission instead: a new live run past `max_live_runs` is
/// refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retention {
    /// The most runs kept. When exceeded, the oldest ended runs are evicted.
    pub max_runs: usize,
    /// Ended runs older than this (since their end) are evicted.
    pub max_age: Option<Duration>,
    /// The most bytes the runs kept may take together: their JSON, their
    /// stack captures and their metric histories (at
    /// `HISTORY_POINT_BYTES` a point kept). When exceeded, the oldest ended
    /// runs are evicted, as for `max_runs`. It also bounds one run's
    /// histories, all its attempts together (see `store/metrics.rs`).
    pub max_bytes: u64,
    /// The most live (not ended) runs, of every source: a registration,
    /// a run Ray Train V2 creates, a run the rendezvous forms or one
    /// forwarded to a hub past it is refused (`overloaded`) and nothing is
    /// stored. Defaults to `max_runs`, so the runs kept never outnumber it.
    pub max_live_runs: usize,
    /// The most bytes the live runs may take together (their JSON, stack
    /// captures and metric histories, as for `max_bytes`): a write that
    /// would grow the live runs past it (a new live run, a new attempt's
    /// worker table, any larger version of a live run) is refused
    /// (`unavailable`, naming the bound) and nothing changes; a write that
    /// ends a run or does not grow it is always taken. `None`: `max_bytes`,
    /// so live runs, which are never evicted, never take the store past it.
    pub max_live_bytes: Option<u64>,
}

impl Retention {
    /// Keeps at most `max_runs` runs, of any age, at most
    /// [`DEFAULT_MAX_RETAINED_BYTES`] bytes of them, and at most
    /// `max_runs` live runs.
    pub fn max_runs(max_runs: usize) -> Self {
        Self {
            max_runs,
            max_age: None,
            max_bytes: DEFAULT_MAX_RETAINED_BYTES,
            max_live_runs: max_runs,
            max_live_bytes: None,
        }
    }

    /// Keeps at most `max_live_bytes` bytes of live runs (instead of
    /// `max_bytes`).
    pub fn with_max_live_bytes(mut self, max_live_bytes: u64) -> Self {
        self.max_live_bytes = Some(max_live_bytes);
        self
    }

    /// The bound on the bytes of live runs: `max_live_bytes`, or else
    /// `max_bytes`.
    pub fn live_bytes_bound(&self) -> u64 {
        self.max_live_bytes.unwrap_or(self.max_bytes)
    }

    /// Keeps at most `max_live_runs` live runs (instead of `max_runs`).
    pub fn with_max_live_runs(mut self, max_live_runs: usize) -> Self {
        self.max_live_runs = max_live_runs;
        self
    }

    /// Keeps at most `max_bytes` bytes of runs (live runs are bounded at
    /// their writes instead: see `max_live_bytes`).
    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// Also evicts ended runs that ended more than `max_age` ago.
    pub fn with_max_age(mut self, max_age: Duration) -> Self {
        self.max_age = Some(max_age);
        self
    }
}

impl Default for Retention {
    fn default() -> Self {
        Self::max_runs(DEFAULT_MAX_RUNS)
    }
}
