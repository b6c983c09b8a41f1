//! The configuration of the manager: a value, never the environment.

use std::sync::Arc;
use std::time::Duration;

use trainstate_client::{Clock, SystemClock};

/// The default deadline of every call to the state actor.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// The default deadline for gathering every worker's metadata.
pub const DEFAULT_GATHER_TIMEOUT: Duration = Duration::from_secs(5);

/// The first wait before a delivery to an unreachable actor is retried.
pub const DEFAULT_MIN_BACKOFF: Duration = Duration::from_millis(50);

/// The longest wait between retries of a delivery.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How often the progress of a run's ranks is sent, at most.
pub const DEFAULT_PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// How a [`TrainRunStateManager`](crate::TrainRunStateManager) behaves.
///
/// ```
/// use std::time::Duration;
/// use trainstate_manager::ManagerConfig;
///
/// let config = ManagerConfig::default().with_call_timeout(Duration::from_millis(500));
/// assert_eq!(config.call_timeout, Duration::from_millis(500));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ManagerConfig {
    /// The deadline of every call to the state actor, and the longest a
    /// caller waits for an acknowledgement before it is told the write is
    /// pending.
    pub call_timeout: Duration,
    /// The deadline for gathering every worker's metadata.
    pub gather_timeout: Duration,
    /// The first wait before a failed delivery is retried; it doubles on
    /// each failure up to `max_backoff`.
    pub min_backoff: Duration,
    /// The longest wait between retries of a delivery.
    pub max_backoff: Duration,
    /// The clock the times the manager writes are read from (a run's and an
    /// attempt's start, a run's end); the system's wall clock by default.
    /// Deadlines, retries and heartbeats are Tokio timers, not this clock.
    pub clock: Arc<dyn Clock>,
    /// How often the progress the ranks report
    /// ([`report_progress`](crate::TrainRunStateManager::report_progress))
    /// is sent, at most: what is reported in between is merged.
    pub progress_interval: Duration,
}

/// Two configurations are equal when their durations are and they read the
/// same clock.
impl PartialEq for ManagerConfig {
    fn eq(&self, other: &Self) -> bool {
        self.call_timeout == other.call_timeout
            && self.gather_timeout == other.gather_timeout
            && self.min_backoff == other.min_backoff
            && self.max_backoff == other.max_backoff
            && self.progress_interval == other.progress_interval
            && Arc::ptr_eq(&self.clock, &other.clock)
    }
}

impl Eq for ManagerConfig {}

impl Default for ManagerConfig {
    fn default() -> Self {
        Self {
            call_timeout: DEFAULT_CALL_TIMEOUT,
            gather_timeout: DEFAULT_GATHER_TIMEOUT,
            min_backoff: DEFAULT_MIN_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
            clock: Arc::new(SystemClock),
            progress_interval: DEFAULT_PROGRESS_INTERVAL,
        }
    }
}

impl ManagerConfig {
    /// The default configuration.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the deadline of every call to the state actor.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Sets the deadline for gathering the workers' metadata.
    pub fn with_gather_timeout(mut self, timeout: Duration) -> Self {
        self.gather_timeout = timeout;
        self
    }

    /// Sets the retry backoff: the first wait and the longest.
    pub fn with_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.min_backoff = min;
        self.max_backoff = max.max(min);
        self
    }

    /// Sends the ranks' progress at most once per `interval` (at least
    /// 1 ms).
    pub fn with_progress_interval(mut self, interval: Duration) -> Self {
        self.progress_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Reads the times the manager writes from `clock`.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }
}
