//! Wall-clock time, injectable so tests decide the times the manager
//! stamps.
//!
//! The manager reads the wall clock for the times it writes: a run's
//! `start_time_ms`, an attempt's start and a run's end. Its deadlines,
//! retries and heartbeats are Tokio timers instead (`tokio::time`), so a
//! test runs them on paused Tokio time.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A source of wall-clock time in Unix milliseconds.
pub trait Clock: Send + Sync + Debug + 'static {
    /// Now, in Unix milliseconds.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
    }
}

/// A clock that moves only when told to.
///
/// ```
/// use trainstate_manager::{Clock, ManualClock};
///
/// let clock = ManualClock::new(1_760_000_000_000);
/// clock.advance_ms(250);
/// assert_eq!(clock.now_ms(), 1_760_000_000_250);
/// ```
#[derive(Debug, Default)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// A clock reading `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Self(AtomicU64::new(now_ms))
    }

    /// Moves the clock forward by `ms`.
    pub fn advance_ms(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock.
    pub fn set_ms(&self, now_ms: u64) {
        self.0.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
