//! Time, injectable so tests decide it: the one `Clock` of trainstate.
//! The head runs lease expiry on it in milliseconds; a controller's
//! manager stamps the times it writes with it.
//!
//! Two readings: the wall clock (Unix milliseconds), which is what is
//! stored and shown (start and end times, `last_heartbeat_ms`, retention
//! ages), and a monotonic clock, which only moves forward at the pace of
//! real time and is what lease decisions are made on: a step of the wall
//! clock (NTP, an operator) never expires or extends a lease.

use std::fmt::Debug;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// A source of wall-clock and monotonic time, in milliseconds.
pub trait Clock: Send + Sync + Debug + 'static {
    /// Now, in Unix milliseconds (the wall clock: it may jump either way).
    fn now_ms(&self) -> u64;

    /// Now on a monotonic clock, in milliseconds from an arbitrary origin:
    /// it never goes back, and does not follow steps of the wall clock.
    /// Only differences between two readings mean anything.
    fn monotonic_ms(&self) -> u64;
}

/// The system's clocks: `SystemTime` for the wall, `Instant` (Linux's
/// `CLOCK_MONOTONIC`) for leases.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
    }

    fn monotonic_ms(&self) -> u64 {
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        ORIGIN.get_or_init(Instant::now).elapsed().as_millis() as u64
    }
}

/// A clock that moves only when told to. [`ManualClock::advance_ms`] moves
/// both readings, as time passing does; [`ManualClock::set_ms`] and
/// [`ManualClock::step_wall_ms`] move the wall clock alone, as a clock step
/// does.
///
/// ```
/// use trainstate_client::{Clock, ManualClock};
///
/// let clock = ManualClock::new(1_760_000_000_000);
/// clock.advance_ms(250);
/// assert_eq!(clock.now_ms(), 1_760_000_000_250);
/// assert_eq!(clock.monotonic_ms(), 250);
/// ```
#[derive(Debug, Default)]
pub struct ManualClock {
    wall: AtomicU64,
    monotonic: AtomicU64,
}

impl ManualClock {
    /// A clock reading `now_ms` on the wall, and 0 on the monotonic clock.
    pub fn new(now_ms: u64) -> Self {
        Self { wall: AtomicU64::new(now_ms), monotonic: AtomicU64::new(0) }
    }

    /// Lets `ms` pass: both readings move forward by `ms`.
    pub fn advance_ms(&self, ms: u64) {
        self.wall.fetch_add(ms, Ordering::SeqCst);
        self.monotonic.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the wall clock (a step: the monotonic clock does not move).
    pub fn set_ms(&self, now_ms: u64) {
        self.wall.store(now_ms, Ordering::SeqCst);
    }

    /// Steps the wall clock by `delta_ms` (forward if positive, back if
    /// negative); the monotonic clock does not move.
    pub fn step_wall_ms(&self, delta_ms: i64) {
        let now = self.wall.load(Ordering::SeqCst);
        self.set_ms(now.saturating_add_signed(delta_ms));
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.wall.load(Ordering::SeqCst)
    }

    fn monotonic_ms(&self) -> u64 {
        self.monotonic.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_steps_the_wall_alone_and_advances_both() {
        let clock = ManualClock::new(1_000_000);
        clock.advance_ms(10);
        assert_eq!((clock.now_ms(), clock.monotonic_ms()), (1_000_010, 10));
        clock.step_wall_ms(-500_000);
        clock.set_ms(clock.now_ms() + 1);
        assert_eq!((clock.now_ms(), clock.monotonic_ms()), (500_011, 10));
        let system = SystemClock;
        let (a, b) = (system.monotonic_ms(), system.monotonic_ms());
        assert!(b >= a);
    }
}
