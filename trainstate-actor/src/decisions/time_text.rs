//! Times and durations in the words of reasons a person reads
//! (`status_detail`): RFC 3339 instants in UTC and seconds, never raw Unix
//! milliseconds.

use std::time::{Duration, UNIX_EPOCH};

/// `time_ms` (Unix ms) as an RFC 3339 instant in UTC, to the millisecond:
/// `2026-12-02T03:40:12.345Z`.
pub(crate) fn iso_ms(time_ms: u64) -> String {
    let time = UNIX_EPOCH + Duration::from_millis(time_ms);
    humantime::format_rfc3339_millis(time).to_string()
}

/// `duration_ms` in seconds for a reason: `61.2 s`, and `60 s` for whole
/// seconds.
pub(crate) fn seconds(duration_ms: u64) -> String {
    if duration_ms.is_multiple_of(1000) {
        format!("{} s", duration_ms / 1000)
    } else {
        format!("{:.1} s", duration_ms as f64 / 1000.0)
    }
}

/// `duration_ms` in words for a person, to the second: `42 s` (or
/// `61.2 s`, as [`seconds`], under a minute), `1 min 2 s`, `15 min`,
/// `2 h 5 min`.
pub(crate) fn duration_words(duration_ms: u64) -> String {
    if duration_ms < 60_000 {
        return seconds(duration_ms);
    }
    let whole = duration_ms / 1000;
    let (hours, minutes, secs) = (whole / 3600, whole / 60 % 60, whole % 60);
    match (hours, minutes, secs) {
        (0, m, 0) => format!("{m} min"),
        (0, m, s) => format!("{m} min {s} s"),
        (h, 0, _) => format!("{h} h"),
        (h, m, _) => format!("{h} h {m} min"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_are_rfc_3339_in_utc() {
        assert_eq!(iso_ms(1_764_646_812_345), "2025-12-02T03:40:12.345Z");
        assert_eq!(iso_ms(0), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn durations_are_seconds() {
        assert_eq!(seconds(60_000), "60 s");
        assert_eq!(seconds(61_234), "61.2 s");
    }

    #[test]
    fn long_durations_are_minutes_and_hours() {
        assert_eq!(duration_words(42_000), "42 s");
        assert_eq!(duration_words(62_000), "1 min 2 s");
        assert_eq!(duration_words(900_000), "15 min");
        assert_eq!(duration_words(7_500_000), "2 h 5 min");
    }
}
