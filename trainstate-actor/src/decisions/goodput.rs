//! A run's goodput, counted: where each interval of its wall-clock time
//! goes, decided from the run's versions (the bucket of an interval is
//! the state the run was in during it), and what a progress board counts
//! between two versions (announced pauses, steps slower than the run's
//! pace, the attempt's highest checkpoint mark). The buckets are defined
//! in `trainstate_schema::goodput`.
//!
//! Pure: the time is given.

use std::collections::VecDeque;

use trainstate_schema::{
    CheckpointMark, GoodputBucket, RESTART_LOOP_RESTARTS, RunGoodput, RunStatus, SLOW_STEP_FACTOR,
    TrainRunInfo,
};

/// How many of its recent per-step times a run's reference step time is
/// the median of.
pub(crate) const PACE_SAMPLES: usize = 64;

/// How many per-step times a run shows before it has a reference: fewer
/// say nothing of its pace.
pub(crate) const MIN_PACE_SAMPLES: usize = 5;

/// What a progress board counted since its run's last version was written:
/// announced pauses and slow steps (moved out of productive time when the
/// next version is written), the run's reference step time, and the
/// attempt's highest checkpoint mark when it is not written yet.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct BoardCount {
    pub(crate) checkpointing_ms: u64,
    pub(crate) slower_than_pace_ms: u64,
    pub(crate) reference_step_ms: Option<f64>,
    /// The attempt's highest checkpoint mark not yet written: its step and
    /// when the report that made it arrived (wall ms).
    pub(crate) mark: Option<(u64, u64)>,
}

/// The bucket an interval of a run in `status` goes to; `None` for an
/// ended run, whose counting stopped at its end.
pub(crate) fn bucket_of(status: RunStatus, stalled: bool) -> Option<GoodputBucket> {
    match status {
        RunStatus::Initializing | RunStatus::Scheduling => Some(GoodputBucket::WaitingToStart),
        RunStatus::Restarting | RunStatus::Resizing => Some(GoodputBucket::Restarting),
        RunStatus::Running if stalled => Some(GoodputBucket::Stalled),
        RunStatus::Running => Some(GoodputBucket::Productive),
        _ => None,
    }
}

/// True when `run` is stalled for its goodput: its health is a stall
/// that has not ended, decided in its current attempt (a stall an attempt
/// ended in is no stall of the next one, before its ranks advance).
pub(crate) fn live_stall(run: &TrainRunInfo) -> bool {
    let attempt_start = run.attempts().last().map_or(0, |a| a.start_time_ms());
    run.health().is_some_and(|h| h.is_live_stall() && h.since_ms >= attempt_start)
}

/// The goodput of `next`, the new version of a run whose version before
/// was `previous` (`None`: a new run), written at `at_ms`, with what the
/// run's progress board counted since (`count`).
///
/// A new live run starts counting at its start; one registered already
/// ended gets none. A run stored without goodput (by an older head)
/// starts counting at this version. Otherwise `[as_of, at]` (for an
/// ending run, up to its end) goes to the bucket of the previous
/// version's state, then what the new version changes is applied: a
/// stall counted from the ranks' last advance, the board's pauses and slow
/// steps, a new checkpoint mark, a failure's lost progress and the
/// restart loop.
pub(crate) fn next_goodput(
    previous: Option<&TrainRunInfo>,
    next: &TrainRunInfo,
    at_ms: u64,
    count: BoardCount,
) -> Option<RunGoodput> {
    let Some(previous) = previous else {
        if next.status().is_terminal() {
            return None;
        }
        let mut goodput = RunGoodput::starting_at(next.start_time_ms());
        accrue(&mut goodput, bucket_of(next.status(), false), at_ms);
        return Some(goodput);
    };
    let Some(stored) = previous.goodput() else {
        return (!previous.status().is_terminal() && !next.status().is_terminal())
            .then(|| RunGoodput::starting_at(at_ms));
    };
    let mut goodput = stored.clone();
    if previous.status().is_terminal() {
        // Counting stopped at the run's end.
        return Some(goodput);
    }
    let until = match next.status().is_terminal() {
        true => next.end_time_ms().unwrap_or(at_ms),
        false => at_ms,
    };
    let bucket = bucket_of(previous.status(), live_stall(previous));

    // A new mark's productive time is counted as of the mark.
    let attempt_id = next.attempts().last().map_or("0", |a| a.attempt_id()).to_owned();
    if let Some((step, marked_ms)) = count.mark {
        accrue(&mut goodput, bucket, marked_ms.min(until));
        goodput.checkpoint = Some(CheckpointMark::new(step, marked_ms, attempt_id));
        goodput.productive_at_checkpoint_ms = goodput.productive_ms;
        goodput.restarts_since_checkpoint = 0;
        goodput.restart_loop = false;
    }

    // A stall starts at the ranks' last advance, not when it was decided.
    let stall_starts = live_stall(next) && !live_stall(previous);
    match next.health().filter(|_| stall_starts && bucket == Some(GoodputBucket::Productive)) {
        Some(health) => {
            let last_advance = health.last_advance_ms.unwrap_or(health.since_ms);
            if last_advance < goodput.as_of_ms {
                let since = goodput.as_of_ms - last_advance;
                goodput.reclassify(GoodputBucket::Stalled, since);
            }
            accrue(&mut goodput, bucket, last_advance.min(until));
            accrue(&mut goodput, Some(GoodputBucket::Stalled), until);
        }
        None => accrue(&mut goodput, bucket, until),
    }

    // What the board counted is taken out of productive time.
    goodput.reclassify(GoodputBucket::Checkpointing, count.checkpointing_ms);
    goodput.reclassify(GoodputBucket::SlowerThanPace, count.slower_than_pace_ms);
    if count.reference_step_ms.is_some() {
        goodput.reference_step_ms = count.reference_step_ms;
    }

    let restarts = attempt_failed(previous, next);
    let ends_failed = matches!(next.status(), RunStatus::Errored | RunStatus::Aborted);
    if restarts || ends_failed {
        if goodput.checkpoint.is_some() {
            let lost = goodput.productive_ms.saturating_sub(goodput.productive_at_checkpoint_ms);
            goodput.reclassify(GoodputBucket::ProgressLost, lost);
            // The next attempt resumes from the mark.
            goodput.productive_at_checkpoint_ms = goodput.productive_ms;
        }
        if restarts {
            goodput.restarts_since_checkpoint = goodput.restarts_since_checkpoint.saturating_add(1);
            goodput.restart_loop |= goodput.restarts_since_checkpoint >= RESTART_LOOP_RESTARTS;
        }
    }
    Some(goodput)
}

/// True when `next` is `previous` whose current attempt failed and the run
/// restarts: it enters RESTARTING (a controller says so, the rendezvous
/// fails the attempt, Ray Train V2 writes it).
fn attempt_failed(previous: &TrainRunInfo, next: &TrainRunInfo) -> bool {
    next.status() == RunStatus::Restarting && previous.status() != RunStatus::Restarting
}

/// Adds `[as_of, until]` to `bucket` (nothing for an ended run), and moves
/// `as_of` to `until`; a time before `as_of` counts nothing.
fn accrue(goodput: &mut RunGoodput, bucket: Option<GoodputBucket>, until: u64) {
    let ms = until.saturating_sub(goodput.as_of_ms);
    if let Some(bucket) = bucket {
        goodput.add(bucket, ms);
    }
    goodput.as_of_ms = goodput.as_of_ms.max(until);
}

/// A live run's goodput as served at `now_ms`: the stored totals plus
/// `[as_of, now]` in the bucket of the run's state (`status`, `stalled`),
/// with what its board counted since (`count`, not taken) moved out of
/// productive time. An ended run's totals are served as stored.
pub(crate) fn served(
    stored: &RunGoodput,
    status: RunStatus,
    stalled: bool,
    now_ms: u64,
    count: &BoardCount,
) -> RunGoodput {
    let mut goodput = stored.clone();
    if status.is_terminal() {
        return goodput;
    }
    accrue(&mut goodput, bucket_of(status, stalled), now_ms);
    goodput.reclassify(GoodputBucket::Checkpointing, count.checkpointing_ms);
    goodput.reclassify(GoodputBucket::SlowerThanPace, count.slower_than_pace_ms);
    if count.reference_step_ms.is_some() {
        goodput.reference_step_ms = count.reference_step_ms;
    }
    goodput
}

/// What one attempt's progress board counts of its run's pace, kept in
/// memory only between two versions of the run: the counters are taken
/// when the next version is written, and a restart of the head loses what
/// was counted since the last one (and the sample of step times).
#[derive(Debug, Default)]
pub(crate) struct PaceCount {
    /// The highest step of the attempt and when it was reached (wall ms).
    top: Option<(u64, u64)>,
    /// When the earliest pause announced since the last advance was
    /// announced (wall ms).
    paused_since_ms: Option<u64>,
    /// A pause was announced since the highest step last grew: the next
    /// run-level advance is no measure of the run's pace.
    paused_since_top: bool,
    /// The most recent per-step times (ms), at most [`PACE_SAMPLES`].
    samples: VecDeque<f64>,
    checkpointing_ms: u64,
    slower_than_pace_ms: f64,
    /// The attempt's highest checkpoint mark: its step and when it came.
    mark: Option<(u64, u64)>,
    /// The step of the mark last handed to a version of the run.
    mark_taken: Option<u64>,
}

impl PaceCount {
    /// A rank announced a pause at `now_ms` (see [`announces_pause`]).
    pub(crate) fn note_pause(&mut self, now_ms: u64) {
        self.paused_since_ms.get_or_insert(now_ms);
        self.paused_since_top = true;
    }

    /// A rank's step grew at `now_ms`: an announced pause ends here.
    pub(crate) fn note_advance(&mut self, now_ms: u64) {
        if let Some(since) = self.paused_since_ms.take() {
            self.checkpointing_ms =
                self.checkpointing_ms.saturating_add(now_ms.saturating_sub(since));
        }
    }

    /// A rank reported `step` at `now_ms`: when it is the attempt's new
    /// highest step, the time per step since the previous highest one
    /// measures the run's pace, and its excess over the reference (beyond
    /// [`SLOW_STEP_FACTOR`] times it) is slow.
    pub(crate) fn note_step(&mut self, step: u64, now_ms: u64) {
        let Some((top, at)) = self.top else {
            self.top = Some((step, now_ms));
            return;
        };
        if step <= top {
            return;
        }
        self.top = Some((step, now_ms));
        if std::mem::take(&mut self.paused_since_top) {
            return;
        }
        let (steps, elapsed) = ((step - top) as f64, now_ms.saturating_sub(at) as f64);
        let per_step = elapsed / steps;
        if let Some(reference) = self.reference_ms()
            && per_step > SLOW_STEP_FACTOR * reference
        {
            self.slower_than_pace_ms += elapsed - steps * reference;
        }
        if self.samples.len() == PACE_SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(per_step);
    }

    /// A rank marked step `step` saved, by a report that arrived at
    /// `now_ms`; answers true when it is the attempt's new highest mark.
    pub(crate) fn note_mark(&mut self, step: u64, now_ms: u64) -> bool {
        if self.mark.is_some_and(|(highest, _)| highest >= step) {
            return false;
        }
        self.mark = Some((step, now_ms));
        true
    }

    /// True when the attempt's highest mark was not handed to a version.
    pub(crate) fn mark_due(&self) -> bool {
        self.mark.is_some_and(|(step, _)| self.mark_taken.is_none_or(|taken| taken < step))
    }

    /// The run's reference step time: the median of its recent per-step
    /// times, once it showed [`MIN_PACE_SAMPLES`] of them.
    pub(crate) fn reference_ms(&self) -> Option<f64> {
        if self.samples.len() < MIN_PACE_SAMPLES {
            return None;
        }
        let mut sorted: Vec<f64> = self.samples.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        Some(sorted[sorted.len() / 2]).filter(|ms| *ms > 0.0)
    }

    /// What was counted since the last version, left in place (a read).
    pub(crate) fn peek(&self) -> BoardCount {
        BoardCount {
            checkpointing_ms: self.checkpointing_ms,
            slower_than_pace_ms: self.slower_than_pace_ms as u64,
            reference_step_ms: self.reference_ms(),
            mark: self.mark.filter(|_| self.mark_due()),
        }
    }

    /// What was counted since the last version, taken for the next one.
    pub(crate) fn take(&mut self) -> BoardCount {
        let count = self.peek();
        self.checkpointing_ms = 0;
        self.slower_than_pace_ms -= count.slower_than_pace_ms as f64;
        if let Some((step, _)) = count.mark {
            self.mark_taken = Some(step);
        }
        count
    }
}

/// True when a report announces a pause: it says when to expect the next
/// one (`expect_next_within_ms`), or its phase is `checkpoint` or `save`
/// (in any case).
pub(crate) fn announces_pause(phase: Option<&str>, expect_next_within_ms: Option<u64>) -> bool {
    expect_next_within_ms.is_some()
        || phase
            .is_some_and(|p| p.eq_ignore_ascii_case("checkpoint") || p.eq_ignore_ascii_case("save"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_slower_than_its_pace_counts_the_excess_beyond_the_reference() {
        let mut pace = PaceCount::default();
        for step in 0..=10 {
            pace.note_step(step, step * 1_000);
        }
        assert_eq!(pace.reference_ms(), Some(1_000.0));
        for step in 11..=15 {
            pace.note_step(step, 10_000 + (step - 10) * 3_000);
        }
        // Five steps of 3 s against a 1 s reference: 2 s too slow each.
        assert_eq!(pace.take().slower_than_pace_ms, 10_000);
        assert_eq!(pace.take().slower_than_pace_ms, 0, "taken once");
    }

    #[test]
    fn an_announced_pause_counts_until_the_next_advance_and_is_no_measure_of_pace() {
        let mut pace = PaceCount::default();
        for step in 0..=10 {
            pace.note_step(step, step * 1_000);
        }
        pace.note_pause(10_000);
        pace.note_pause(12_000);
        pace.note_advance(25_000);
        pace.note_step(11, 25_000);
        let count = pace.take();
        assert_eq!((count.checkpointing_ms, count.slower_than_pace_ms), (15_000, 0));
        assert!(announces_pause(Some("Checkpoint"), None));
        assert!(announces_pause(None, Some(5_000)));
        assert!(!announces_pause(Some("train"), None));
    }

    #[test]
    fn a_mark_is_handed_to_one_version_only() {
        let mut pace = PaceCount::default();
        assert!(pace.note_mark(40, 50_000));
        assert!(!pace.note_mark(30, 51_000));
        assert!(pace.mark_due());
        assert_eq!(pace.take().mark, Some((40, 50_000)));
        assert!(!pace.mark_due());
        assert_eq!(pace.take().mark, None);
    }

    use trainstate_schema::{HealthState, RunHealth, TrainRunInfoDraft};

    const T: u64 = 1_760_000_000_000;

    fn run_in(status: RunStatus, goodput: Option<RunGoodput>) -> TrainRunInfo {
        let mut draft = TrainRunInfoDraft::new("r1", "bert", "j1", "c", T);
        draft.run_status = status.v1();
        draft.status = Some(status);
        draft.goodput = goodput;
        if status.is_terminal() {
            draft.end_time_ms = Some(T + 100_000);
        }
        draft.validate().unwrap()
    }

    #[test]
    fn a_live_run_counts_from_its_start_and_one_registered_ended_gets_none() {
        let live = next_goodput(
            None,
            &run_in(RunStatus::Scheduling, None),
            T + 2_000,
            BoardCount::default(),
        )
        .unwrap();
        assert_eq!(
            (live.wall_ms, live.badput.waiting_to_start_ms, live.as_of_ms),
            (2_000, 2_000, T + 2_000)
        );
        let ended = run_in(RunStatus::Finished, None);
        assert_eq!(next_goodput(None, &ended, T + 200_000, BoardCount::default()), None);
        // A run stored by an older head starts counting at its next version.
        let older = run_in(RunStatus::Running, None);
        let started =
            next_goodput(Some(&older), &older, T + 50_000, BoardCount::default()).unwrap();
        assert_eq!((started.wall_ms, started.as_of_ms), (0, T + 50_000));
    }

    #[test]
    fn a_failure_without_a_mark_loses_nothing_and_counts_the_restart() {
        let mut counted = RunGoodput::starting_at(T);
        counted.add(GoodputBucket::Productive, 30_000);
        counted.as_of_ms = T + 30_000;
        let running = run_in(RunStatus::Running, Some(counted));
        let restarting = running.clone().into_draft();
        let restarting = TrainRunInfoDraft { status: Some(RunStatus::Restarting), ..restarting };
        let next = next_goodput(
            Some(&running),
            &restarting.validate().unwrap(),
            T + 40_000,
            BoardCount::default(),
        )
        .unwrap();
        assert_eq!((next.productive_ms, next.badput.progress_lost_ms), (40_000, 0));
        assert_eq!((next.restarts_since_checkpoint, next.restart_loop), (1, false));
        assert_eq!(next.checkpoint, None);
    }

    #[test]
    fn a_stall_counts_from_the_last_advance_even_before_the_last_version() {
        let mut counted = RunGoodput::starting_at(T);
        counted.add(GoodputBucket::Productive, 30_000);
        counted.as_of_ms = T + 30_000;
        let running = run_in(RunStatus::Running, Some(counted));
        let mut stall = RunHealth::new(HealthState::Stalled, T + 35_000, vec![0], String::new());
        stall.last_advance_ms = Some(T + 25_000);
        let stalled = running.clone().with_health(stall, T + 35_000).unwrap();
        let next =
            next_goodput(Some(&running), &stalled, T + 35_000, BoardCount::default()).unwrap();
        // Productive to T+25 s; stalled from then to T+35 s.
        assert_eq!(
            (next.productive_ms, next.badput.stalled_ms, next.wall_ms),
            (25_000, 10_000, 35_000)
        );
    }

    #[test]
    fn the_bucket_of_an_interval_is_the_runs_state_during_it() {
        assert_eq!(bucket_of(RunStatus::Scheduling, false), Some(GoodputBucket::WaitingToStart));
        assert_eq!(bucket_of(RunStatus::Resizing, false), Some(GoodputBucket::Restarting));
        assert_eq!(bucket_of(RunStatus::Running, true), Some(GoodputBucket::Stalled));
        assert_eq!(bucket_of(RunStatus::Running, false), Some(GoodputBucket::Productive));
        assert_eq!(bucket_of(RunStatus::Finished, false), None);
    }

    #[test]
    fn a_live_read_counts_to_now_in_the_current_bucket() {
        let mut stored = RunGoodput::starting_at(0);
        stored.add(GoodputBucket::WaitingToStart, 10_000);
        stored.as_of_ms = 10_000;
        let count = BoardCount { checkpointing_ms: 5_000, ..BoardCount::default() };
        let served = served(&stored, RunStatus::Running, false, 30_000, &count);
        assert_eq!(
            (served.wall_ms, served.productive_ms, served.as_of_ms),
            (30_000, 15_000, 30_000)
        );
        assert_eq!(served.badput.checkpointing_ms, 5_000);
        let ended = super::served(&stored, RunStatus::Finished, false, 30_000, &count);
        assert_eq!(ended, stored);
    }
}
