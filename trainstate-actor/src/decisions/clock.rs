//! The head's use of time: the one [`Clock`] (defined in trainstate-client,
//! which the manager shares) and how late a sweep shows that the head was
//! not running.

use std::time::Duration;

pub use trainstate_client::{Clock, ManualClock, SystemClock};

/// How late a sweep must be to show that the head was not running: more
/// than this many sweep periods since the previous one.
pub(crate) const LATE_SWEEP_PERIODS: u32 = 2;

/// When the sweep that runs at `now_mono_ms` comes more than
/// [`LATE_SWEEP_PERIODS`] periods after the previous one (at
/// `previous_mono_ms`), how long the head went without sweeping: it was
/// not running (frozen, stopped, suspended) or could not take its turn, so
/// it could not hear heartbeats either.
pub(crate) fn late_sweep(previous_mono_ms: u64, now_mono_ms: u64, period: Duration) -> Option<u64> {
    let gap = now_mono_ms.saturating_sub(previous_mono_ms);
    let limit = (period * LATE_SWEEP_PERIODS).as_millis() as u64;
    (gap > limit).then_some(gap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_is_late_only_past_two_periods() {
        let period = Duration::from_millis(500);
        assert_eq!(late_sweep(1_000, 1_500, period), None);
        assert_eq!(late_sweep(1_000, 2_000, period), None, "exactly two periods is on time");
        assert_eq!(late_sweep(1_000, 2_001, period), Some(1_001));
        assert_eq!(late_sweep(5_000, 1_000, period), None, "never negative");
    }
}
