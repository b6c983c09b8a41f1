//! How long a run may go without an advance before it is STALLED: its
//! stall window (pure).
//!
//! A run that asked for a window (its join's `stall_after_ms`) has it.
//! Any other run's window follows its own pace: [`PACE_FACTOR`] times the
//! slow end of its recent steps, at least [`FLOOR_MS`], at most the head's
//! `--stall-after` (the ceiling), which is also the window of a run that
//! has not shown its pace yet (fewer than [`MIN_PACE_SAMPLES`] step times
//! seen). The rule and why its constants are what they are:
//! `docs/health.md`, "How long a stall window is".

use crate::decisions::time_text::duration_words;

/// How many times the slow end of a run's recent steps its window is. A
/// run's steps vary (a data loader's hiccup, a garbage collection, a
/// collective that waits on a slow peer), but ten times the slowest step
/// or gap seen lately is far past that noise, while a run of 30 s steps is
/// still called STALLED after about 5 minutes, not the head's 15.
pub(crate) const PACE_FACTOR: f64 = 10.0;

/// The shortest window a run's pace gives it: a minute. A rank's reports
/// reach the head about once a second and a loop can stand for tens of
/// seconds without being hung (a slow filesystem, a long garbage
/// collection, a checkpoint nobody announced), so a fast run is called
/// STALLED within a minute of its last advance, and no sooner.
pub(crate) const FLOOR_MS: u64 = 60_000;

/// How many step times (reported, or seen between a rank's advances) a
/// run must have shown before its pace sets its window: before that, the
/// ceiling applies. A handful: one odd first step says little.
pub(crate) const MIN_PACE_SAMPLES: u32 = 5;

/// The grain of a board's memory of step times: the slowest of each of
/// the last [`PACE_BUCKETS`] periods of this length is kept.
const PACE_BUCKET_MS: u64 = 5 * 60_000;

/// How many periods of [`PACE_BUCKET_MS`] a board remembers: an hour, so
/// that an evaluation nobody announced, which the run does every so often
/// (every half hour, every hour), widens its window until the next one,
/// however many ranks report in between.
const PACE_BUCKETS: usize = 12;

/// The slow end of a run's recent steps: the largest step time seen in
/// the last hour, kept as the largest of each five-minute period (twelve
/// slots a board, whatever the run's length or world size), and how many
/// were seen, up to [`MIN_PACE_SAMPLES`].
#[derive(Debug, Clone, Default)]
pub(crate) struct RecentSlowest {
    /// By period number modulo [`PACE_BUCKETS`]: (period number, the
    /// largest step time seen in it, ms). A slot of an older period is
    /// overwritten when its period comes round again.
    periods: [(u64, f64); PACE_BUCKETS],
    /// Step times seen, counted up to [`MIN_PACE_SAMPLES`].
    seen: u32,
}

impl RecentSlowest {
    /// Notes a step time of `step_ms` seen at `now_ms` (wall).
    pub(crate) fn note(&mut self, step_ms: f64, now_ms: u64) {
        if !step_ms.is_finite() || step_ms <= 0.0 {
            return;
        }
        let period = now_ms / PACE_BUCKET_MS;
        let slot = &mut self.periods[(period % PACE_BUCKETS as u64) as usize];
        if slot.0 == period {
            slot.1 = slot.1.max(step_ms);
        } else {
            *slot = (period, step_ms);
        }
        self.seen = (self.seen + 1).min(MIN_PACE_SAMPLES);
    }

    /// The largest step time of the last hour as of `now_ms`; `None` until
    /// the run has shown its pace ([`MIN_PACE_SAMPLES`] step times).
    pub(crate) fn slowest_ms(&self, now_ms: u64) -> Option<f64> {
        if self.seen < MIN_PACE_SAMPLES {
            return None;
        }
        let period = now_ms / PACE_BUCKET_MS;
        let recent = |p: u64| p <= period && period - p < PACE_BUCKETS as u64;
        self.periods
            .iter()
            .filter(|(p, ms)| *ms > 0.0 && recent(*p))
            .map(|(_, ms)| *ms)
            .max_by(f64::total_cmp)
    }
}

/// Where a run's window comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum WindowSource {
    /// The run asked for it (its join's `stall_after_ms`).
    Asked,
    /// Its pace: [`PACE_FACTOR`] times its slowest recent step (ms),
    /// between the floor and the ceiling.
    Pace { slowest_ms: f64 },
    /// The head's `--stall-after`: the run has not shown its pace yet.
    NoPaceYet,
}

/// A run's stall window and where it comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct StallWindow {
    pub(crate) ms: u64,
    pub(crate) source: WindowSource,
    /// The head's `--stall-after`, the longest a pace gives.
    pub(crate) ceiling_ms: u64,
}

impl StallWindow {
    /// The window of a run that asked for `asked_ms`, else of a run whose
    /// slowest recent step is `slowest_ms` (`None`: not shown yet), under
    /// the head's `--stall-after` of `ceiling_ms`.
    pub(crate) fn of(asked_ms: Option<u64>, slowest_ms: Option<f64>, ceiling_ms: u64) -> Self {
        let (ms, source) = match (asked_ms, slowest_ms) {
            (Some(asked), _) => (asked, WindowSource::Asked),
            (None, Some(slowest)) => {
                // A head whose ceiling is below the floor keeps its ceiling.
                let floor = FLOOR_MS.min(ceiling_ms);
                let paced = (PACE_FACTOR * slowest).ceil().min(u64::MAX as f64) as u64;
                (paced.clamp(floor, ceiling_ms), WindowSource::Pace { slowest_ms: slowest })
            }
            (None, None) => (ceiling_ms, WindowSource::NoPaceYet),
        };
        Self { ms, source, ceiling_ms }
    }

    /// A window of `ms` the run asked for.
    #[cfg(test)]
    pub(crate) fn asked(ms: u64) -> Self {
        Self::of(Some(ms), None, ms)
    }

    /// The window in words, for a stall's detail: `the run's window is 1
    /// min: 10 × its slowest recent step (0.21 s), at least 1 min`.
    pub(crate) fn text(&self) -> String {
        let window = duration_words(self.ms);
        match self.source {
            WindowSource::Asked => format!("the run's window is {window}, as the run asked"),
            WindowSource::NoPaceYet => format!(
                "the run's window is {window}, the head's --stall-after: the run has not shown its pace yet"
            ),
            WindowSource::Pace { slowest_ms } => {
                let mut text = format!(
                    "the run's window is {window}: {PACE_FACTOR} \u{d7} its slowest recent step ({})",
                    step_words(slowest_ms)
                );
                let paced = PACE_FACTOR * slowest_ms;
                if paced < self.ms as f64 {
                    text.push_str(&format!(", at least {window}"));
                } else if paced > self.ms as f64 && self.ms == self.ceiling_ms {
                    text.push_str(&format!(", at most the head's --stall-after ({window})"));
                }
                text
            }
        }
    }
}

/// A step time in words, to the grain that suits it: `3.2 ms`, `0.21 s`,
/// `31.0 s`, `3 min`.
fn step_words(ms: f64) -> String {
    if ms < 100.0 {
        format!("{ms:.1} ms")
    } else if ms < 10_000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else if ms < 60_000.0 {
        format!("{:.1} s", ms / 1000.0)
    } else {
        duration_words(ms.round() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_780_000_000_000;
    const CEILING: u64 = 900_000;

    #[test]
    fn the_slowest_step_of_the_last_hour_counts_once_the_pace_is_shown() {
        let mut recent = RecentSlowest::default();
        for i in 0..4 {
            recent.note(200.0, T + i * 1_000);
        }
        assert_eq!(recent.slowest_ms(T + 4_000), None, "four step times: not a pace yet");
        recent.note(180_000.0, T + 5_000);
        assert_eq!(recent.slowest_ms(T + 5_000), Some(180_000.0));
        // Remembered for the hour, whatever comes after it.
        for i in 0..10_000 {
            recent.note(200.0, T + 6_000 + i * 300);
        }
        assert_eq!(recent.slowest_ms(T + 50 * 60_000), Some(180_000.0));
        // Past the hour, the next periods' slowest rule.
        for i in 0..13 {
            recent.note(250.0, T + 60 * 60_000 + i * PACE_BUCKET_MS);
        }
        assert_eq!(recent.slowest_ms(T + 60 * 60_000 + 12 * PACE_BUCKET_MS), Some(250.0));
        recent.note(f64::NAN, T);
        recent.note(-1.0, T);
    }

    #[test]
    fn a_window_is_asked_or_paced_between_the_floor_and_the_ceiling() {
        // (asked, slowest step, ceiling, window, words)
        let cases = [
            (
                None,
                Some(210.0),
                CEILING,
                60_000,
                "1 min: 10 \u{d7} its slowest recent step (0.21 s), at least 1 min",
            ),
            (
                None,
                Some(31_000.0),
                CEILING,
                310_000,
                "5 min 10 s: 10 \u{d7} its slowest recent step (31.0 s)",
            ),
            (
                None,
                Some(180_000.0),
                CEILING,
                CEILING,
                "15 min: 10 \u{d7} its slowest recent step (3 min), at most the head's --stall-after (15 min)",
            ),
            (
                None,
                None,
                CEILING,
                CEILING,
                "15 min, the head's --stall-after: the run has not shown its pace yet",
            ),
            (Some(20_000), Some(31_000.0), CEILING, 20_000, "20 s, as the run asked"),
            (
                None,
                Some(200.0),
                10_000,
                10_000,
                "10 s: 10 \u{d7} its slowest recent step (0.20 s), at least 10 s",
            ),
        ];
        for (asked, slowest, ceiling, ms, words) in cases {
            let window = StallWindow::of(asked, slowest, ceiling);
            assert_eq!(window.ms, ms, "{words}");
            assert_eq!(window.text(), format!("the run's window is {words}"));
        }
    }
}
