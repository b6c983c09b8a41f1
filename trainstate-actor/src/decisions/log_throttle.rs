//! One log line per interval for a failure that repeats: the first at once,
//! then a count of what failed since the last line and the last error. A
//! database outage fails every write; logging each one wrote thousands of
//! identical lines a second.

use std::time::{Duration, Instant};

/// How often a repeating failure is logged at most.
pub(crate) const LOG_INTERVAL: Duration = Duration::from_secs(5);

/// Counts failures and says when a line is due. The caller passes the
/// time, so that tests move it by hand.
#[derive(Debug)]
pub(crate) struct LogThrottle {
    interval: Duration,
    last_line: Option<Instant>,
    unreported: u64,
    last_error: String,
}

/// A line that is due: how many failed since the last line (this one
/// included), and the last error.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Due {
    pub(crate) count: u64,
    pub(crate) last_error: String,
}

impl Default for LogThrottle {
    fn default() -> Self {
        Self::new(LOG_INTERVAL)
    }
}

impl LogThrottle {
    /// At most one line per `interval`.
    pub(crate) fn new(interval: Duration) -> Self {
        Self { interval, last_line: None, unreported: 0, last_error: String::new() }
    }

    /// Counts `count` failures at `now` with `error`; a line is due for the
    /// first failure, and then once `interval` has passed since the last
    /// line (a failure after a quiet interval is logged at once).
    pub(crate) fn failed(&mut self, now: Instant, count: u64, error: &str) -> Option<Due> {
        self.unreported += count;
        error.clone_into(&mut self.last_error);
        let due =
            self.last_line.is_none_or(|last| now.saturating_duration_since(last) >= self.interval);
        if !due {
            return None;
        }
        self.last_line = Some(now);
        Some(Due {
            count: std::mem::take(&mut self.unreported),
            last_error: self.last_error.clone(),
        })
    }

    /// The failures no line has counted yet, taken when things work again
    /// (to be said in the line that says so). A store that fails and
    /// recovers by turns still gets one failure line per interval.
    pub(crate) fn recovered(&mut self) -> u64 {
        std::mem::take(&mut self.unreported)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regression_a_failing_store_logs_one_line_per_interval_with_the_count() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut throttle = LogThrottle::new(Duration::from_secs(5));
        // The first failure is logged at once.
        assert_eq!(
            throttle.failed(at(0), 3, "db error: e0"),
            Some(Due { count: 3, last_error: "db error: e0".into() })
        );
        // 2,001 failed writes over the next 20 s, one every 10 ms: a line
        // every 5 s (at 5, 10, 15 and 20 s), each counting what failed
        // since the last.
        let mut lines = Vec::new();
        for i in 1..=2_001u64 {
            if let Some(due) = throttle.failed(at(i * 10), 1, &format!("db error: e{i}")) {
                lines.push(due);
            }
        }
        assert_eq!(lines.len(), 4, "{lines:?}");
        assert_eq!(lines[0].count, 500);
        assert_eq!(lines[3].last_error, "db error: e2000");
        let unreported = throttle.recovered();
        assert_eq!(unreported, 1);
        let counted: u64 = lines.iter().map(|d| d.count).sum::<u64>() + unreported;
        assert_eq!(counted, 2_001, "every failure is counted once, in a line or at recovery");
        // A failure after a quiet interval is logged at once; one soon after
        // it is counted in the next line.
        assert_eq!(throttle.failed(at(30_000), 1, "x").map(|d| d.count), Some(1));
        assert_eq!(throttle.failed(at(30_001), 1, "y"), None);
        assert_eq!(throttle.failed(at(35_000), 1, "z").map(|d| d.count), Some(2));
    }
}
