//! Durations on the command line: `250ms`, `2s`, `60s`, `5m`, `2h`.

use std::time::Duration;

/// Parses a number followed by a unit (`ms`, `s`, `m`, `h`).
pub(crate) fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .ok_or_else(|| format!("{text:?} has no unit: write e.g. 2s, 60s, 5m"))?;
    let (number, unit) = text.split_at(split);
    let value: f64 =
        number.parse().map_err(|_| format!("{text:?} does not start with a number"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("unknown unit {unit:?} in {text:?}: use ms, s, m or h")),
    };
    if !seconds.is_finite() || seconds <= 0.0 {
        return Err(format!("{text:?} must be a positive duration"));
    }
    // Not `from_secs_f64`, which panics on a value too large for a Duration.
    Duration::try_from_secs_f64(seconds).map_err(|_| format!("{text:?} is too long a duration"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_with_units() {
        assert_eq!(parse("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert!(parse("5").is_err());
        assert!(parse("0s").is_err());
        assert!(parse("5d").is_err());
        assert!(parse("99999999999999999999999999s").is_err(), "too long, not a panic");
    }
}
