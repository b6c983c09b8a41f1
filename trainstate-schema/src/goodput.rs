//! What a run cost: where its wall-clock time went, as the head counts it
//! from the record.
//!
//! Goodput is the share of a run's wall-clock time that went into training
//! progress that was kept: Meta's "effective training time ratio", Google's
//! "ML productivity goodput". The rest is badput, by bucket:
//!
//! - **waiting to start**: the run was `INITIALIZING` or `SCHEDULING`;
//! - **restarting**: `RESTARTING` or `RESIZING`, between an attempt's
//!   failure and the next attempt's ranks training;
//! - **stalled**: a `STALLED` run, counted from its ranks' last advance (not
//!   from when the stall window ran out) to the advance that ended it or to
//!   the run's end;
//! - **checkpointing**: from a rank's announcement of a pause (`phase`
//!   `checkpoint` or `save`, or `expect_next_within_ms`) to the run's next
//!   advance;
//! - **progress lost**: at an attempt's failure, the productive time since
//!   the run's last checkpoint mark (`checkpoint` in a progress report);
//!   that work is done again after the restart, so it is moved from
//!   productive to lost. A run that never marked a checkpoint has no mark to
//!   measure from: nothing is counted lost, and `checkpoint` is absent;
//! - **slower than its pace**: the part of steps that took more than
//!   [`SLOW_STEP_FACTOR`] times the run's reference step time (the median of
//!   its own step times), counted beyond the reference.
//!
//! Productive is what remains of the time the run was `RUNNING`. The
//! buckets add up to the wall-clock time exactly: `wall_ms = productive_ms +
//! badput.total()`. The head keeps them on the run as running totals,
//! updated with each version of the run, so a long run loses nothing to the
//! bounded histories; a live run is served counted to the moment of the
//! read. The rules, with a worked example, are in `docs/goodput.md`.

use serde::{Deserialize, Serialize};

use crate::{Rule, ValidationError};

/// A step counts as slow when it took more than this times the run's
/// reference step time; its time beyond the reference is badput.
pub const SLOW_STEP_FACTOR: f64 = 1.25;

/// A run whose attempts failed this many times in a row without a new
/// checkpoint mark between them is in a restart loop.
pub const RESTART_LOOP_RESTARTS: u32 = 3;

/// The buckets a run's wall-clock time is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum GoodputBucket {
    /// Progress that was kept.
    Productive,
    /// `INITIALIZING` or `SCHEDULING`.
    WaitingToStart,
    /// `RESTARTING` or `RESIZING`.
    Restarting,
    /// `STALLED`, from the ranks' last advance.
    Stalled,
    /// An announced pause: a checkpoint, an evaluation.
    Checkpointing,
    /// Work since the last checkpoint mark, lost at a failure.
    ProgressLost,
    /// Steps slower than the run's own pace, beyond it.
    SlowerThanPace,
}

impl GoodputBucket {
    /// Every bucket, productive first, then the badput buckets in the order
    /// a page draws them.
    pub const ALL: [GoodputBucket; 7] = [
        GoodputBucket::Productive,
        GoodputBucket::WaitingToStart,
        GoodputBucket::Restarting,
        GoodputBucket::Stalled,
        GoodputBucket::Checkpointing,
        GoodputBucket::ProgressLost,
        GoodputBucket::SlowerThanPace,
    ];

    /// The wire name, for example `progress_lost`.
    pub fn as_str(self) -> &'static str {
        match self {
            GoodputBucket::Productive => "productive",
            GoodputBucket::WaitingToStart => "waiting_to_start",
            GoodputBucket::Restarting => "restarting",
            GoodputBucket::Stalled => "stalled",
            GoodputBucket::Checkpointing => "checkpointing",
            GoodputBucket::ProgressLost => "progress_lost",
            GoodputBucket::SlowerThanPace => "slower_than_pace",
        }
    }
}

impl std::fmt::Display for GoodputBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The badput of a run (or of a group of runs), by bucket, in ms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct Badput {
    /// `INITIALIZING` or `SCHEDULING`.
    pub waiting_to_start_ms: u64,
    /// `RESTARTING` or `RESIZING`.
    pub restarting_ms: u64,
    /// `STALLED`, from the ranks' last advance.
    pub stalled_ms: u64,
    /// Announced pauses (checkpoints, evaluations).
    pub checkpointing_ms: u64,
    /// Work since the last checkpoint mark, lost at failures.
    pub progress_lost_ms: u64,
    /// Steps slower than the run's own pace, beyond it.
    pub slower_than_pace_ms: u64,
}

impl Badput {
    /// The ms of `bucket`; 0 for `Productive`, which is not badput.
    pub fn get(&self, bucket: GoodputBucket) -> u64 {
        match bucket {
            GoodputBucket::Productive => 0,
            GoodputBucket::WaitingToStart => self.waiting_to_start_ms,
            GoodputBucket::Restarting => self.restarting_ms,
            GoodputBucket::Stalled => self.stalled_ms,
            GoodputBucket::Checkpointing => self.checkpointing_ms,
            GoodputBucket::ProgressLost => self.progress_lost_ms,
            GoodputBucket::SlowerThanPace => self.slower_than_pace_ms,
        }
    }

    /// The ms of `bucket`, to change; `None` for `Productive`.
    pub fn get_mut(&mut self, bucket: GoodputBucket) -> Option<&mut u64> {
        match bucket {
            GoodputBucket::Productive => None,
            GoodputBucket::WaitingToStart => Some(&mut self.waiting_to_start_ms),
            GoodputBucket::Restarting => Some(&mut self.restarting_ms),
            GoodputBucket::Stalled => Some(&mut self.stalled_ms),
            GoodputBucket::Checkpointing => Some(&mut self.checkpointing_ms),
            GoodputBucket::ProgressLost => Some(&mut self.progress_lost_ms),
            GoodputBucket::SlowerThanPace => Some(&mut self.slower_than_pace_ms),
        }
    }

    /// Every bucket's ms, summed (saturating).
    pub fn total(&self) -> u64 {
        GoodputBucket::ALL.iter().fold(0u64, |sum, b| sum.saturating_add(self.get(*b)))
    }
}

/// A run's latest checkpoint mark: progress up to `step` is saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct CheckpointMark {
    /// The step saved.
    pub step: u64,
    /// When the head took the mark (Unix ms, the head's clock).
    pub at_ms: u64,
    /// The attempt that marked it.
    pub attempt_id: String,
}

impl CheckpointMark {
    /// Step `step` saved at `at_ms` by attempt `attempt_id`.
    pub fn new(step: u64, at_ms: u64, attempt_id: impl Into<String>) -> Self {
        Self { step, at_ms, attempt_id: attempt_id.into() }
    }
}

/// Extension: where a run's wall-clock time went (see the module's docs and
/// `docs/goodput.md`). Set by the head: a registration's value is ignored.
/// Absent for a run registered already ended (the head saw none of it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct RunGoodput {
    /// The wall-clock time counted, in ms: from the run's start to its end,
    /// or, for a live run, to `as_of_ms`. Always `productive_ms` plus every
    /// bucket of `badput`.
    pub wall_ms: u64,
    /// Time spent on progress that was kept, in ms.
    pub productive_ms: u64,
    /// The rest, by bucket.
    pub badput: Badput,
    /// `productive_ms / wall_ms`, between 0 and 1; absent while `wall_ms` is 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ratio: Option<f64>,
    /// Up to when the totals are counted (Unix ms, the head's clock): the
    /// run's end, or for a live run the moment it was served.
    pub as_of_ms: u64,
    /// The run's latest checkpoint mark; absent while it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<CheckpointMark>,
    /// The productive ms counted when `checkpoint` was marked (or at the
    /// start of the attempt that resumed from it): what a failure now would
    /// lose is `productive_ms` minus this.
    #[serde(default)]
    pub productive_at_checkpoint_ms: u64,
    /// Attempts that failed since the latest checkpoint mark (since the
    /// run's start when it has none).
    #[serde(default)]
    pub restarts_since_checkpoint: u32,
    /// True when `restarts_since_checkpoint` reached
    /// [`RESTART_LOOP_RESTARTS`]: the run restarts without getting
    /// anywhere. Cleared by the next checkpoint mark.
    #[serde(default)]
    pub restart_loop: bool,
    /// The run's reference step time (the median of its step times, in
    /// ms), against which slow steps are counted; absent before it has
    /// shown its pace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_step_ms: Option<f64>,
}

impl RunGoodput {
    /// A run's goodput with nothing counted yet, counting from `start_ms`.
    pub fn starting_at(start_ms: u64) -> Self {
        Self {
            wall_ms: 0,
            productive_ms: 0,
            badput: Badput::default(),
            ratio: None,
            as_of_ms: start_ms,
            checkpoint: None,
            productive_at_checkpoint_ms: 0,
            restarts_since_checkpoint: 0,
            restart_loop: false,
            reference_step_ms: None,
        }
    }

    /// The ms counted in `bucket`.
    pub fn ms(&self, bucket: GoodputBucket) -> u64 {
        match bucket {
            GoodputBucket::Productive => self.productive_ms,
            other => self.badput.get(other),
        }
    }

    /// Adds `ms` to `bucket`, and to the wall-clock time, and sets `ratio`.
    pub fn add(&mut self, bucket: GoodputBucket, ms: u64) {
        match self.badput.get_mut(bucket) {
            Some(total) => *total = total.saturating_add(ms),
            None => self.productive_ms = self.productive_ms.saturating_add(ms),
        }
        self.wall_ms = self.wall_ms.saturating_add(ms);
        self.ratio = ratio(self.productive_ms, self.wall_ms);
    }

    /// Moves up to `ms` of productive time into `bucket` (the wall-clock
    /// time is unchanged); returns what was moved.
    pub fn reclassify(&mut self, bucket: GoodputBucket, ms: u64) -> u64 {
        let moved = ms.min(self.productive_ms);
        if let Some(total) = self.badput.get_mut(bucket) {
            self.productive_ms -= moved;
            *total = total.saturating_add(moved);
            self.ratio = ratio(self.productive_ms, self.wall_ms);
            moved
        } else {
            0
        }
    }
}

/// `productive / wall`, between 0 and 1; `None` when `wall` is 0.
pub fn ratio(productive: u64, wall: u64) -> Option<f64> {
    (wall > 0).then(|| (productive.min(wall) as f64) / wall as f64)
}

/// The rules of a run's `goodput`: the buckets add up to `wall_ms`, the
/// ratio (when present) is theirs, the reference step time is finite and
/// positive.
pub(crate) fn check(goodput: Option<&RunGoodput>) -> Result<(), ValidationError> {
    let Some(g) = goodput else { return Ok(()) };
    let sum = g.productive_ms.saturating_add(g.badput.total());
    if sum != g.wall_ms {
        return Err(ValidationError::new("goodput.wall_ms", Rule::GoodputSum { sum }));
    }
    if let Some(r) = g.ratio
        && !(r.is_finite() && (0.0..=1.0).contains(&r))
    {
        return Err(ValidationError::new("goodput.ratio", Rule::OutOfRange { min: 0, max: 1 }));
    }
    if let Some(ms) = g.reference_step_ms
        && !(ms.is_finite() && ms > 0.0)
    {
        let rule = Rule::PositiveUpTo { max: crate::limits::MAX_STEP_TIME_MS };
        return Err(ValidationError::new("goodput.reference_step_ms", rule));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_add_up_to_the_wall_clock_time() {
        let mut g = RunGoodput::starting_at(0);
        g.add(GoodputBucket::WaitingToStart, 10_000);
        g.add(GoodputBucket::Productive, 60_000);
        assert_eq!(g.reclassify(GoodputBucket::ProgressLost, 20_000), 20_000);
        assert_eq!((g.wall_ms, g.productive_ms, g.badput.total()), (70_000, 40_000, 30_000));
        assert_eq!(g.ratio, Some(40.0 / 70.0));
        assert!(check(Some(&g)).is_ok());
        g.wall_ms += 1;
        assert_eq!(check(Some(&g)).unwrap_err().field(), "goodput.wall_ms");
    }

    #[test]
    fn bucket_names_are_the_wire_names() {
        for bucket in GoodputBucket::ALL {
            let json = serde_json::to_string(&bucket).unwrap();
            assert_eq!(json, format!("\"{bucket}\""));
        }
    }
}
