//! Bounded log fields: a count and a short sample instead of every item, so
//! one event cannot write a line of unbounded length.

use std::fmt::Display;

/// How many items a log line names at most.
pub(crate) const LOG_SAMPLE: usize = 8;

/// The first [`LOG_SAMPLE`] items, comma-separated, with "…" when some were
/// left out. Log it beside the full count.
pub(crate) fn sample<T: Display>(items: &[T]) -> String {
    let mut text = items.iter().take(LOG_SAMPLE).map(ToString::to_string).collect::<Vec<_>>();
    if items.len() > LOG_SAMPLE {
        text.push("…".into());
    }
    text.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regression_sweep_log_line_is_bounded_whatever_the_count() {
        let ids: Vec<String> = (0..20_000).map(|i| format!("{i:032x}")).collect();
        let line = sample(&ids);
        assert!(line.len() < 40 * (LOG_SAMPLE + 1), "{} bytes", line.len());
        assert!(line.starts_with(&ids[0]) && line.ends_with('…'));
        assert_eq!(sample(&ids[..2]), format!("{}, {}", ids[0], ids[1]));
        assert_eq!(sample::<String>(&[]), "");
    }
}
