//! A run's health, decided from its ranks' progress (pure: no I/O).
//!
//! The lease sweep asks, for each RUNNING run with a progress board (a
//! tracked rendezvous group's, or the board its controller reports to),
//! whether its health changes ([`HealthSweep`]): STALLED when no rank
//! advanced for the run's stall window (and no rank's announced pause
//! still covers now), PROGRESSING again when a rank advances after that
//! ([`decide`]); and which ranks are stragglers, whose own time per step
//! is persistently slower than their peers'. The rules, and what they
//! cannot see, are in `docs/health.md`.

use std::collections::{BTreeMap, HashMap, HashSet};

use trainstate_schema::limits::{MAX_HEALTH_RANKS, MAX_STEP_TIME_MS};
use trainstate_schema::{HealthState, RunHealth, RunId, RunStatus, Straggler};

use crate::decisions::liveness::Liveness;
use crate::decisions::progress::{Progress, ProgressBoard};
use crate::decisions::stall_window::StallWindow;
use crate::decisions::state::{Change, Outcome, Runs};
use crate::decisions::time_text::{duration_words, iso_ms, seconds};

/// The health decisions of the lease sweep, for every kind of run alike:
/// each RUNNING run whose progress board has a report is decided by
/// [`decide`], and a change is written through [`Runs::set_health`].
///
/// A rendezvous group still assembling has no board, and a group closed
/// before it assembled has one of no ranks, so neither is ever judged.
pub(crate) struct HealthSweep {
    /// Each judged run's health as last written, once read from the run:
    /// the run is not parsed at every sweep.
    written: HashMap<RunId, Option<Written>>,
    /// What earlier decisions saw of each judged run's pace.
    paces: HashMap<RunId, Pace>,
    /// The head's `--stall-after`, in ms: the longest stall window a
    /// run's pace gives it, and the window of a run that has not shown its
    /// pace yet (see [`StallWindow`]).
    stall_after_ms: u64,
}

impl HealthSweep {
    /// No run judged yet; `stall_after_ms` is the head's `--stall-after`,
    /// the ceiling of every run's window that the run did not ask for.
    pub(crate) fn new(stall_after_ms: u64) -> Self {
        Self { written: HashMap::new(), paces: HashMap::new(), stall_after_ms }
    }

    /// Decides the health of every RUNNING run with progress on a board
    /// of `liveness`, adding what it writes to `change`.
    pub(crate) fn sweep<T>(
        &mut self,
        liveness: &Liveness,
        runs: &mut Runs,
        now_ms: u64,
        change: &mut Change<T>,
    ) {
        let boards = liveness.progress_boards();
        let judged: HashSet<&RunId> = boards.iter().map(|(id, _)| id).collect();
        self.written.retain(|id, _| judged.contains(id));
        self.paces.retain(|id, _| judged.contains(id));
        for (id, board) in &boards {
            self.judge(id, board, runs, now_ms, change);
        }
        write_marks(liveness, runs, now_ms, change);
    }

    /// The health tick, about once a second: decides only the runs whose
    /// health may change now (see [`ProgressBoard::health_due`]: a stall
    /// ended by a rank's advance, a stall window just passed), so it costs
    /// a few atomic reads per board and a decision per run that changes.
    /// Answers how many runs it decided.
    pub(crate) fn tick<T>(
        &mut self,
        liveness: &Liveness,
        runs: &mut Runs,
        now_ms: u64,
        change: &mut Change<T>,
    ) -> usize {
        let due = liveness.progress_boards_where(|board| {
            board.health_due(board.stall_window(self.stall_after_ms).ms, now_ms)
        });
        for (id, board) in &due {
            self.judge(id, board, runs, now_ms, change);
        }
        write_marks(liveness, runs, now_ms, change);
        due.len()
    }

    /// Before run `id` may end: when a rank advanced after its stall, the
    /// stall's end is written first, dated by that advance, so that a run
    /// that resumes and ends before the next tick ends resolved.
    pub(crate) fn settle<T>(
        &mut self,
        liveness: &Liveness,
        runs: &mut Runs,
        id: &RunId,
        now_ms: u64,
        change: &mut Change<T>,
    ) {
        let Some(board) = liveness.progress(id) else { return };
        if board.resumed_ms().is_some() {
            self.judge(id, &board, runs, now_ms, change);
        }
    }

    /// Decides the health of run `id` from `board` if it is RUNNING and
    /// its ranks reported, and writes a change.
    fn judge<T>(
        &mut self,
        id: &RunId,
        board: &ProgressBoard,
        runs: &mut Runs,
        now_ms: u64,
        change: &mut Change<T>,
    ) {
        if runs.status_of(id) != Some(RunStatus::Running) {
            return;
        }
        let Some(ranks) = board.progress() else { return };
        let current = self
            .written
            .entry(id.clone())
            .or_insert_with(|| runs.health_of(id).as_ref().map(Written::of));
        board.note_health(current.as_ref().and_then(Written::stalled_since));
        let resumed_ms = board.resumed_ms();
        let pace = self.paces.entry(id.clone()).or_default();
        let window = board.stall_window(self.stall_after_ms);
        let Some(next) =
            decide_resumed(&ranks, current.as_ref(), pace, &window, now_ms, resumed_ms)
        else {
            return;
        };
        let decided = Written::of(&next);
        // A stall's end is dated by the advance that ended it, not by the
        // decision that saw it.
        let at_ms = if decided.state == current.as_ref().map_or(decided.state, |c| c.state) {
            now_ms
        } else {
            decided.since_ms
        };
        match runs.set_health(id, next, at_ms) {
            Ok(Outcome::Changed(written)) => {
                let stragglers: Vec<u32> = decided.stragglers.iter().map(|s| s.rank).collect();
                tracing::info!(run = %id, health = %decided.state, ?stragglers, "a run's health changed");
                change.ops.extend(written.ops);
                change.events.extend(written.events);
                board.note_health(decided.stalled_since());
                self.written.insert(id.clone(), Some(decided));
            }
            Ok(Outcome::Unchanged(())) => {}
            Err(err) => tracing::error!(run = %id, error = %err, "cannot write a run's health"),
        }
    }
}

/// Writes on each run whose progress board holds a checkpoint mark not yet
/// written the attempt's highest mark (its goodput's `checkpoint`): once
/// per new mark, not per report. Lock free for a board without one.
fn write_marks<T>(liveness: &Liveness, runs: &mut Runs, now_ms: u64, change: &mut Change<T>) {
    for (id, _) in liveness.progress_boards_where(ProgressBoard::mark_due) {
        match runs.write_checkpoint(&id, now_ms) {
            Ok(Outcome::Changed(written)) => {
                change.ops.extend(written.ops);
                change.events.extend(written.events);
            }
            Ok(Outcome::Unchanged(())) => {}
            Err(err) => tracing::error!(run = %id, error = %err, "cannot write a checkpoint mark"),
        }
    }
}

/// How many ranks a detail names one by one.
const MAX_RANKS_NAMED: usize = 8;

/// A rank becomes a straggler once its smoothed time per step has been at
/// least this many times the median of its peers' for
/// [`STRAGGLER_AFTER_MS`].
pub(crate) const STRAGGLER_RATIO: f64 = 1.5;

/// A straggler stops being one when its ratio to its peers falls below
/// this (below [`STRAGGLER_RATIO`], so a rank near the threshold is not
/// named and cleared at every sweep).
pub(crate) const STRAGGLER_CLEARED_RATIO: f64 = 1.25;

/// How long a rank must be slow, without a break, to be named a
/// straggler; also how recent its last advance must be for it to be
/// judged at all.
pub(crate) const STRAGGLER_AFTER_MS: u64 = 10_000;

/// The health last written, as much of it as the next decision needs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Written {
    pub(crate) state: HealthState,
    pub(crate) since_ms: u64,
    pub(crate) stragglers: Vec<Straggler>,
    /// For STALLED: when a rank last advanced before the stall.
    pub(crate) last_advance_ms: Option<u64>,
}

impl Written {
    pub(crate) fn of(health: &RunHealth) -> Self {
        Self {
            state: health.state,
            since_ms: health.since_ms,
            stragglers: health.stragglers.clone(),
            last_advance_ms: health.last_advance_ms,
        }
    }

    /// Since when the run is STALLED; `None` when it is not.
    fn stalled_since(&self) -> Option<u64> {
        (self.state == HealthState::Stalled).then_some(self.since_ms)
    }
}

/// What the sweep remembers of a run's ranks between decisions: since
/// when (wall ms) each rank has been at least [`STRAGGLER_RATIO`] times
/// slower than its peers, without a break.
#[derive(Debug, Default)]
pub(crate) struct Pace {
    slow_since_ms: BTreeMap<u32, u64>,
}

/// [`decide_resumed`] with no stamp of the first advance after a stall.
#[cfg(test)]
pub(crate) fn decide(
    ranks: &[Option<Progress>],
    current: Option<&Written>,
    pace: &mut Pace,
    window_ms: u64,
    now_ms: u64,
) -> Option<RunHealth> {
    decide_resumed(ranks, current, pace, &StallWindow::asked(window_ms), now_ms, None)
}

/// The run's new health, if it changes: `ranks` is each rank's progress
/// by world rank, `current` the health last written, `pace` what earlier
/// decisions saw of the ranks' pace (updated here), `window` the run's
/// stall window (which a stall's detail names), `now_ms` the head's wall
/// clock.
///
/// A run with no health yet becomes PROGRESSING (or STALLED) at its first
/// decision. A STALLED run becomes PROGRESSING only when a rank's step grew
/// on this head after the stall: after a head restart, ranks that report
/// the same step again are not an advance. A change of the set of
/// stragglers is a change too, with the state and its `since_ms` kept;
/// their ratios drifting is not.
///
/// A STALLED run's stall ends at the first advance after it: `resumed_ms`,
/// as the report that made it stamped it on the board, or, without it, the
/// earliest last advance of the ranks that advanced after the stall.
pub(crate) fn decide_resumed(
    ranks: &[Option<Progress>],
    current: Option<&Written>,
    pace: &mut Pace,
    window: &StallWindow,
    now_ms: u64,
    resumed_ms: Option<u64>,
) -> Option<RunHealth> {
    let window_ms = window.ms;
    let reported: Vec<(u32, &Progress)> =
        (0u32..).zip(ranks).filter_map(|(rank, p)| Some((rank, p.as_ref()?))).collect();
    let newest = reported.iter().map(|(_, p)| p.last_advance_ms).max()?;
    let covered_until = reported.iter().map(|(_, p)| p.expect_until_ms).max().unwrap_or(0);
    let stalled = now_ms >= newest.saturating_add(window_ms).max(covered_until);
    let lagging = lagging(&reported);
    let named_before = current.map_or(&[][..], |c| c.stragglers.as_slice());
    // No rank's pace is judged while the run stands still: its stragglers
    // stay as they were, and their slowness is measured again once it moves.
    let standing = stalled || current.is_some_and(|c| c.state == HealthState::Stalled);
    let stragglers = if standing {
        pace.slow_since_ms.clear();
        named_before.to_vec()
    } else {
        stragglers(&reported, named_before, pace, now_ms)
    };
    let same_stragglers = stragglers.iter().map(|s| s.rank).eq(named_before.iter().map(|s| s.rank));
    let latest = || reported.iter().max_by_key(|(_, p)| p.last_advance_ms);
    let health = match current.map(|c| (c.state, c.since_ms)) {
        Some((HealthState::Stalled, since)) => {
            // An advance after the stall ends it, even when the ranks have
            // stood still again since: that is a new stall, decided next.
            let moved = || reported.iter().filter(|(_, p)| p.advanced && p.last_advance_ms > since);
            let advanced = moved().max_by_key(|(_, p)| p.last_advance_ms);
            match advanced {
                Some((rank, progress)) => {
                    let first = moved().map(|(_, p)| p.last_advance_ms).min().unwrap_or(now_ms);
                    let resumed =
                        resumed_ms.filter(|&ms| ms > since && ms <= first).unwrap_or(first);
                    let mut health = progressing(*rank, progress, &lagging, &reported, resumed);
                    let before = current.and_then(|c| c.last_advance_ms).unwrap_or(since);
                    health.detail.push_str(&format!(
                        " The stall ended at {}, {} after the last advance before it.",
                        iso_ms(resumed),
                        seconds(resumed.saturating_sub(before))
                    ));
                    health
                }
                None if same_stragglers => return None,
                None => stalled_health(&reported, &lagging, newest, window, since, now_ms),
            }
        }
        Some((HealthState::Progressing, since)) if !stalled => {
            if same_stragglers {
                return None;
            }
            let (rank, progress) = latest()?;
            progressing(*rank, progress, &lagging, &reported, since)
        }
        _ if stalled => stalled_health(&reported, &lagging, newest, window, now_ms, now_ms),
        _ => {
            let (rank, progress) = latest()?;
            progressing(*rank, progress, &lagging, &reported, now_ms)
        }
    };
    Some(named_stragglers(health, stragglers))
}

/// The stragglers now: each rank judged against the median of its peers'
/// smoothed step times. A rank is judged when it has a step time, at
/// least one peer has one, it advanced within [`STRAGGLER_AFTER_MS`] and
/// no announced pause covers it; a rank not judged stays as it was (named
/// or not). A judged rank is named once it has been at least
/// [`STRAGGLER_RATIO`] times slower for [`STRAGGLER_AFTER_MS`], and stays
/// named until it falls below [`STRAGGLER_CLEARED_RATIO`].
fn stragglers(
    reported: &[(u32, &Progress)],
    named_before: &[Straggler],
    pace: &mut Pace,
    now_ms: u64,
) -> Vec<Straggler> {
    let timed: Vec<(u32, &Progress, f64)> =
        reported.iter().filter_map(|&(rank, p)| Some((rank, p, p.step_time_ms?))).collect();
    let mut named = Vec::new();
    for &(rank, progress, step_time_ms) in &timed {
        let before = named_before.iter().find(|s| s.rank == rank);
        let peers = median(timed.iter().filter(|(r, ..)| *r != rank).map(|&(.., t)| t));
        let Some(peers_ms) = peers else {
            named.extend(before.copied());
            continue;
        };
        let judged = progress.expect_until_ms <= now_ms
            && now_ms.saturating_sub(progress.last_advance_ms) < STRAGGLER_AFTER_MS;
        // Both times are bounded before they are divided, so that the
        // ratio is finite however far apart legal step times are.
        let (step_time_ms, peers_ms) = (bounded(step_time_ms), bounded(peers_ms));
        let ratio = step_time_ms / peers_ms;
        let is_straggler = if !judged {
            before.is_some()
        } else {
            if ratio >= STRAGGLER_RATIO {
                pace.slow_since_ms.entry(rank).or_insert(now_ms);
            } else {
                pace.slow_since_ms.remove(&rank);
            }
            match before {
                Some(_) => ratio >= STRAGGLER_CLEARED_RATIO,
                None => pace
                    .slow_since_ms
                    .get(&rank)
                    .is_some_and(|&since| now_ms.saturating_sub(since) >= STRAGGLER_AFTER_MS),
            }
        };
        if is_straggler {
            named.push(Straggler::new(rank, step_time_ms, peers_ms));
        }
    }
    // A rank named before that has no step time now (its first reports to
    // a restarted head) is not judged either: it stays as it was written.
    named.extend(named_before.iter().filter(|s| !timed.iter().any(|(r, ..)| *r == s.rank)));
    named.sort_by_key(|s| s.rank);
    named.truncate(MAX_HEALTH_RANKS);
    named
}

/// The median of `values`; `None` when there are none.
fn median(values: impl Iterator<Item = f64>) -> Option<f64> {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    let middle = values.len() / 2;
    match values.len() {
        0 => None,
        n if n % 2 == 1 => Some(values[middle]),
        _ => Some((values[middle - 1] + values[middle]) / 2.0),
    }
}

/// The finest time per step a straggler's record holds: one microsecond,
/// the grain its times are written to.
const FINEST_STEP_TIME_MS: f64 = 0.001;

/// `ms` to the microsecond, and within [`FINEST_STEP_TIME_MS`] and
/// [`MAX_STEP_TIME_MS`]: a legal report's time may be far finer than a
/// microsecond, and a ratio to a time rounded to 0 would be infinite,
/// which no health record may hold. Bounded so, the largest ratio is
/// 604,800,000,000 and always finite.
fn bounded(ms: f64) -> f64 {
    ((ms * 1000.0).round() / 1000.0).clamp(FINEST_STEP_TIME_MS, MAX_STEP_TIME_MS as f64)
}

/// `health` naming `stragglers`, its detail saying so in words.
fn named_stragglers(health: RunHealth, stragglers: Vec<Straggler>) -> RunHealth {
    let mut detail = health.detail.clone();
    let (lead, was) = match health.state {
        HealthState::Stalled => ("Before the stall, rank", "was"),
        _ => ("Rank", "is"),
    };
    for straggler in stragglers.iter().take(MAX_RANKS_NAMED) {
        let text = step_time_text(straggler.step_time_ms);
        detail.push_str(&format!(
            " {lead} {} {was} a straggler: {} a step, {:.1}\u{d7} its peers' {}.",
            straggler.rank,
            text(straggler.step_time_ms),
            straggler.ratio,
            text(straggler.peers_step_time_ms),
        ));
    }
    if stragglers.len() > MAX_RANKS_NAMED {
        detail.push_str(&format!(" And {} more stragglers.", stragglers.len() - MAX_RANKS_NAMED));
    }
    let mut health = health;
    health.detail = detail;
    health.with_stragglers(stragglers)
}

/// How to write times per step in words, in the unit and to the grain
/// that suit `largest_ms`, so that a straggler's time and its peers' read
/// alike: `0.20 s` and `0.10 s`, `12.5 s`, `3.2 ms`.
fn step_time_text(largest_ms: f64) -> impl Fn(f64) -> String {
    move |ms| {
        if largest_ms < 100.0 {
            format!("{ms:.1} ms")
        } else if largest_ms < 10_000.0 {
            format!("{:.2} s", ms / 1000.0)
        } else {
            format!("{:.1} s", ms / 1000.0)
        }
    }
}

/// The ranks whose step is behind the highest step of the attempt by more
/// than max(1, 1% of it).
fn lagging(reported: &[(u32, &Progress)]) -> Vec<u32> {
    let Some(highest) = reported.iter().filter_map(|(_, p)| p.step).max() else {
        return Vec::new();
    };
    let slack = (highest / 100).max(1);
    reported
        .iter()
        .filter(|(_, p)| p.step.is_some_and(|step| step.saturating_add(slack) < highest))
        .map(|(rank, _)| *rank)
        .collect()
}

/// Ranks whose last advances lie within this of each other stopped
/// together, as far as the head can tell: a rank's reports reach it about
/// once a second, so a smaller gap is the reports' grain, not an order.
const TOGETHER_MS: u64 = 2_000;

/// STALLED since `since_ms`, as seen at `now_ms`, for the run's `window`.
fn stalled_health(
    reported: &[(u32, &Progress)],
    lagging: &[u32],
    newest: u64,
    window: &StallWindow,
    since_ms: u64,
    now_ms: u64,
) -> RunHealth {
    // In lock-step training a hung rank never finishes its step while its
    // peers finish theirs and wait for it in the next collective: when the
    // steps differ, the ranks at the lowest step are the ones that stopped.
    // When they agree, the ranks whose last advance is clearly the oldest;
    // when every rank stopped within the reports' own grain of the others,
    // nothing tells which one holds the others up, and none is named.
    let steps = reported.iter().filter_map(|(_, p)| p.step);
    let (lowest, highest) = (steps.clone().min(), steps.max());
    let oldest = reported.iter().map(|(_, p)| p.last_advance_ms).min().unwrap_or(newest);
    let together = newest.saturating_sub(oldest) <= TOGETHER_MS && reported.len() > 1;
    let stopped = |p: &Progress| match (lowest, highest) {
        (Some(lowest), Some(highest)) if lowest < highest => p.step == Some(lowest),
        _ => !together && p.last_advance_ms == oldest,
    };
    let mut culprits: Vec<u32> = reported
        .iter()
        .filter(|(_, p)| stopped(p))
        .map(|(rank, _)| *rank)
        .chain(lagging.iter().copied())
        .collect();
    culprits.sort_unstable();
    culprits.dedup();
    culprits.truncate(MAX_HEALTH_RANKS);
    let mut by_advance: Vec<&(u32, &Progress)> = reported.iter().collect();
    by_advance.sort_by_key(|(rank, p)| (p.last_advance_ms, *rank));
    let mut detail = format!(
        "No rank has advanced for {}; {}. ",
        duration_words(now_ms - newest),
        window.text()
    );
    for (i, (rank, progress)) in by_advance.iter().take(MAX_RANKS_NAMED).enumerate() {
        let lead = if i == 0 { "Rank" } else { ", rank" };
        let advanced = if i == 0 { "last advanced at" } else { "at" };
        detail.push_str(&format!(
            "{lead} {rank} {advanced} {} ({})",
            iso_ms(progress.last_advance_ms),
            where_text(progress)
        ));
    }
    if by_advance.len() > MAX_RANKS_NAMED {
        detail.push_str(&format!(", and {} more ranks", by_advance.len() - MAX_RANKS_NAMED));
    }
    detail.push('.');
    if culprits.is_empty() && together {
        detail.push_str(
            " Every rank stopped at the same step within moments of the others: the steps do \
             not tell which rank holds the others up; compare their phases and stacks.",
        );
    }
    push_lagging(&mut detail, lagging, reported);
    RunHealth::new(HealthState::Stalled, since_ms, culprits, detail).with_last_advance(newest)
}

/// PROGRESSING since `since_ms`, rank `rank` the latest to advance.
fn progressing(
    rank: u32,
    progress: &Progress,
    lagging: &[u32],
    reported: &[(u32, &Progress)],
    since_ms: u64,
) -> RunHealth {
    let mut detail = format!(
        "Rank {rank} advanced at {} ({}).",
        iso_ms(progress.last_advance_ms),
        where_text(progress)
    );
    push_lagging(&mut detail, lagging, reported);
    let mut ranks = lagging.to_vec();
    ranks.truncate(MAX_HEALTH_RANKS);
    RunHealth::new(HealthState::Progressing, since_ms, ranks, detail)
}

/// `step 20, phase checkpoint`.
fn where_text(progress: &Progress) -> String {
    let step = progress.step.map_or_else(|| "no step reported".to_owned(), |s| format!("step {s}"));
    match &progress.phase {
        Some(phase) => format!("{step}, phase {phase}"),
        None => step,
    }
}

/// Names the lagging ranks, with their steps and the highest step.
fn push_lagging(detail: &mut String, lagging: &[u32], reported: &[(u32, &Progress)]) {
    if lagging.is_empty() {
        return;
    }
    let highest = reported.iter().filter_map(|(_, p)| p.step).max().unwrap_or(0);
    let step_of = |rank: u32| reported.iter().find(|(r, _)| *r == rank).and_then(|(_, p)| p.step);
    let named: Vec<String> = lagging
        .iter()
        .take(MAX_RANKS_NAMED)
        .map(|&rank| format!("rank {rank} at step {}", step_of(rank).unwrap_or(0)))
        .collect();
    detail.push_str(&format!(" Lagging behind the highest step ({highest}): {}", named.join(", ")));
    if lagging.len() > MAX_RANKS_NAMED {
        detail.push_str(&format!(", and {} more ranks", lagging.len() - MAX_RANKS_NAMED));
    }
    detail.push('.');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(step: u64, last_advance_ms: u64, advanced: bool) -> Option<Progress> {
        Some(Progress {
            step: Some(step),
            total_steps: None,
            phase: None,
            metrics: Default::default(),
            last_advance_ms,
            advanced,
            expect_until_ms: 0,
            step_time_ms: None,
            checkpoint: None,
        })
    }

    /// A rank that advanced at `last_advance_ms` taking `step_time_ms` a step.
    fn timed(step_time_ms: f64, last_advance_ms: u64) -> Option<Progress> {
        let mut progress = at(100, last_advance_ms, true)?;
        progress.step_time_ms = Some(step_time_ms);
        Some(progress)
    }

    const T: u64 = 1_780_000_000_000;

    /// Decides with no straggler state of earlier decisions.
    fn decide_once(
        ranks: &[Option<Progress>],
        current: Option<(HealthState, u64)>,
        window_ms: u64,
        now_ms: u64,
    ) -> Option<RunHealth> {
        let current = current.map(|(state, since_ms)| Written {
            state,
            since_ms,
            stragglers: Vec::new(),
            last_advance_ms: None,
        });
        decide(ranks, current.as_ref(), &mut Pace::default(), window_ms, now_ms)
    }

    /// Sweeps `ranks` every 500 ms from `from_ms` to `to_ms` (included),
    /// keeping what each decision wrote as the next one's current health,
    /// as the rendezvous sweep does; answers the last health written.
    fn sweep_through(
        ranks: &mut [Option<Progress>],
        written: &mut Option<Written>,
        pace: &mut Pace,
        from_ms: u64,
        to_ms: u64,
    ) -> Vec<u32> {
        let mut now = from_ms;
        while now <= to_ms {
            for rank in ranks.iter_mut().flatten() {
                rank.last_advance_ms = now;
            }
            if let Some(health) = decide(ranks, written.as_ref(), pace, 60_000, now) {
                *written = Some(Written::of(&health));
            }
            now += 500;
        }
        written.as_ref().map_or_else(Vec::new, |w| w.stragglers.iter().map(|s| s.rank).collect())
    }

    /// What the health tick costs beside what the lease sweep costs, over
    /// 1,250 boards of 8 ranks (10,000 ranks) none of which is due: measured
    /// with `cargo test --release -p trainstate-actor --lib
    /// health::tests::tick_cost -- --nocapture` (figures in
    /// `docs/benchmarks.md`). A debug build (the test suite) goes through
    /// a few rounds only: it checks that neither finds anything due.
    #[test]
    fn tick_cost() {
        use std::sync::Arc;

        use trainstate_schema::api::RankProgress;

        use crate::decisions::progress::{ProgressBoard, Reporter};

        let liveness = Liveness::default();
        for group in 0..1_250u32 {
            let id = RunId::parse(&format!("{group:032x}")).unwrap();
            let board = Arc::new(ProgressBoard::new("0", 8, Reporter::Controller, None));
            for rank in 0..8 {
                board.report(&id, rank, &RankProgress::at_step(100), T).unwrap();
            }
            liveness.put_progress(id, board);
        }
        let rounds = if cfg!(debug_assertions) { 3 } else { 200 };
        let started = std::time::Instant::now();
        let mut due = 0;
        for _ in 0..rounds {
            due +=
                liveness.progress_boards_where(|board| board.health_due(60_000, T + 1_000)).len();
        }
        let tick = started.elapsed() / rounds;
        assert_eq!(due, 0);
        // What the sweep does for the same boards before it decides: every
        // board listed and its ranks' progress copied, then a decision each.
        let started = std::time::Instant::now();
        for _ in 0..rounds {
            for (_, board) in liveness.progress_boards() {
                let ranks = board.progress().unwrap();
                let written = Written {
                    state: HealthState::Progressing,
                    since_ms: T,
                    stragglers: Vec::new(),
                    last_advance_ms: None,
                };
                assert!(
                    decide(&ranks, Some(&written), &mut Pace::default(), 60_000, T + 1_000)
                        .is_none()
                );
            }
        }
        let sweep = started.elapsed() / rounds;
        println!(
            "10,000 ranks on 1,250 boards: a tick {tick:?}, the sweep's health part {sweep:?}"
        );
    }

    /// The head's `--stall-after` in the tests of paced windows.
    const CEILING_MS: u64 = 900_000;

    /// A board of two ranks that report once a second, as the clients do,
    /// each step taking `step_ms` (carried as `step_time_ms` when
    /// `step_times`), for `steps` steps from `T`, the run asking for
    /// `asked_ms`, its last report announcing a pause of `pause_ms`.
    /// Answers the board and when its ranks last advanced.
    fn paced_board(
        step_ms: u64,
        steps: u64,
        step_times: bool,
        asked_ms: Option<u64>,
        pause_ms: Option<u64>,
    ) -> (ProgressBoard, u64) {
        use trainstate_schema::api::RankProgress;

        use crate::decisions::progress::Reporter;

        let id = RunId::parse(&format!("{:032x}", 7)).unwrap();
        let board = ProgressBoard::new("0", 2, Reporter::Ranks, asked_ms);
        let (mut now, mut last_advance, mut step_before) = (T, T, 0);
        loop {
            let step = (now - T) / step_ms;
            let mut report = RankProgress::at_step(step.min(steps));
            if step_times {
                report.step_time_ms = Some(step_ms as f64);
            }
            if step >= steps {
                report.expect_next_within_ms = pause_ms;
            }
            for rank in 0..2 {
                board.report(&id, rank, &report, now).unwrap();
            }
            if step > step_before {
                (last_advance, step_before) = (now, step);
            }
            if step >= steps {
                return (board, last_advance);
            }
            now += 1_000;
        }
    }

    #[test]
    fn a_runs_window_follows_its_pace_unless_it_asked_for_one() {
        // (what, step ms, steps, step times reported, asked, announced
        // pause, the window, when after the last advance it stalls, words
        // of the window in the stall's detail)
        let at_floor =
            "the run's window is 1 min: 10 \u{d7} its slowest recent step (1.00 s), at least 1 min";
        let cases = [
            ("0.2 s steps", 200, 100, true, None, None, 60_000, 60_000, at_floor),
            (
                "2 s steps",
                2_000,
                20,
                true,
                None,
                None,
                60_000,
                60_000,
                "the run's window is 1 min: 10 \u{d7} its slowest recent step (2.00 s), at least 1 min",
            ),
            (
                "30 s steps",
                30_000,
                10,
                true,
                None,
                None,
                300_000,
                300_000,
                "the run's window is 5 min: 10 \u{d7} its slowest recent step (30.0 s)",
            ),
            (
                "2 s steps told by their advances alone",
                2_000,
                20,
                false,
                None,
                None,
                60_000,
                60_000,
                "the run's window is 1 min: 10 \u{d7} its slowest recent step (2.00 s), at least 1 min",
            ),
            (
                "no pace shown yet: one advance each, no step times",
                2_000,
                1,
                false,
                None,
                None,
                CEILING_MS,
                CEILING_MS,
                "the run's window is 15 min, the head's --stall-after: the run has not shown its pace yet",
            ),
            (
                "a window the run asked for wins",
                30_000,
                10,
                true,
                Some(20_000),
                None,
                20_000,
                20_000,
                "the run's window is 20 s, as the run asked",
            ),
            (
                "an announced pause covers",
                200,
                100,
                true,
                None,
                Some(300_000),
                60_000,
                300_000,
                at_floor,
            ),
        ];
        for (what, step_ms, steps, step_times, asked, pause, window_ms, stalls_after, words) in
            cases
        {
            let (board, last_advance) = paced_board(step_ms, steps, step_times, asked, pause);
            let window = board.stall_window(CEILING_MS);
            assert_eq!(window.ms, window_ms, "{what}");
            let ranks = board.progress().unwrap();
            let written = Written {
                state: HealthState::Progressing,
                since_ms: T,
                stragglers: Vec::new(),
                last_advance_ms: None,
            };
            let decide_at = |now_ms| {
                decide_resumed(&ranks, Some(&written), &mut Pace::default(), &window, now_ms, None)
            };
            let stalls_at = last_advance + stalls_after;
            assert!(decide_at(stalls_at - 1).is_none(), "{what}: not stalled yet");
            assert!(!board.health_due(window.ms, stalls_at - 1), "{what}: the tick waits");
            assert!(board.health_due(window.ms, stalls_at), "{what}: the tick sees it due");
            let health = decide_at(stalls_at).expect(what);
            assert_eq!(health.state, HealthState::Stalled, "{what}");
            assert!(
                health.detail.contains(&format!("; {words}. Rank ")),
                "{what}: {}",
                health.detail
            );
        }
    }

    #[test]
    fn a_run_stalls_after_its_window_and_names_the_rank_that_stopped_first() {
        let ranks = [at(20, T + 5_000, true), at(20, T + 1_000, true)];
        let current = Some((HealthState::Progressing, T));
        assert!(decide_once(&ranks, current, 10_000, T + 14_999).is_none());
        let health = decide_once(&ranks, current, 10_000, T + 15_000).expect("stalled");
        assert_eq!(health.state, HealthState::Stalled);
        assert_eq!(health.ranks, vec![1]);
        assert!(
            health.detail.starts_with(
                "No rank has advanced for 10 s; the run's window is 10 s, as the run asked. \
                 Rank 1 last advanced at"
            ),
            "{}",
            health.detail
        );
        assert!(!health.detail.contains(&T.to_string()), "{}", health.detail);
    }

    #[test]
    fn the_rank_at_the_lowest_step_is_named_though_its_last_report_came_later() {
        // Rank 1 hung inside step 50: it reported step 49 last, after rank
        // 0 reported step 50 and went on to wait for it.
        let ranks = [at(50, T + 1_000, true), at(49, T + 1_400, true)];
        let current = Some((HealthState::Progressing, T));
        let health = decide_once(&ranks, current, 10_000, T + 11_400).expect("stalled");
        assert_eq!(health.state, HealthState::Stalled);
        assert_eq!(health.ranks, vec![1], "{}", health.detail);
    }

    #[test]
    fn ranks_that_stopped_together_at_one_step_are_not_told_apart() {
        // Rank 1 hung before step 15's collective; rank 0 waits in it. Both
        // reported step 14 last, 12 ms apart: nothing names either.
        let ranks = [at(14, T + 1_000, true), at(14, T + 1_012, true)];
        let current = Some((HealthState::Progressing, T));
        let health = decide_once(&ranks, current, 5_000, T + 7_000).expect("stalled");
        assert_eq!(health.state, HealthState::Stalled);
        assert!(health.ranks.is_empty(), "{:?}", health.ranks);
        assert!(health.detail.contains("do not tell which rank"), "{}", health.detail);
    }

    #[test]
    fn a_stalled_run_progresses_only_on_an_advance_after_the_stall() {
        let stalled = Some((HealthState::Stalled, T + 20_000));
        let heard_again = [at(20, T + 30_000, false)];
        assert!(decide_once(&heard_again, stalled, 60_000, T + 31_000).is_none());
        let advanced = [at(21, T + 30_000, true)];
        let health = decide_once(&advanced, stalled, 60_000, T + 31_000).expect("progressing");
        assert_eq!(health.state, HealthState::Progressing);
    }

    #[test]
    fn a_rank_behind_the_highest_step_lags() {
        let ranks = [at(1000, T, true), at(989, T, true), at(990, T, true)];
        let health = decide_once(&ranks, None, 60_000, T + 1).expect("first decision");
        assert_eq!(health.state, HealthState::Progressing);
        assert_eq!(health.ranks, vec![1]);
    }

    #[test]
    fn a_run_that_stands_still_names_no_new_straggler_and_says_its_old_ones_were() {
        // Rank 1 has been twice as slow for 9.5 s when every rank stops.
        let mut ranks = [timed(100.0, T), timed(200.0, T)];
        let (mut written, mut pace) = (None, Pace::default());
        sweep_through(&mut ranks, &mut written, &mut pace, T, T + 9_500);
        let stalled =
            decide(&ranks, written.as_ref(), &mut pace, 5_000, T + 14_500).expect("stalled");
        assert_eq!(stalled.state, HealthState::Stalled);
        assert!(stalled.stragglers.is_empty(), "{:?}", stalled.stragglers);
        let written = Written::of(&stalled);
        assert!(decide(&ranks, Some(&written), &mut pace, 5_000, T + 15_000).is_none());

        // A straggler named before the stall stays named, in the past tense.
        let before = Straggler::new(1, 200.0, 100.0);
        let named = Written { stragglers: vec![before], ..Written::of(&stalled) };
        let quiet = [timed(100.0, T), at(100, T, true)];
        let health = decide(
            &quiet,
            Some(&Written { state: HealthState::Progressing, ..named }),
            &mut pace,
            5_000,
            T + 14_500,
        )
        .expect("stalled");
        assert_eq!(health.stragglers.iter().map(|s| s.rank).collect::<Vec<_>>(), [1]);
        assert!(
            health.detail.contains(" Before the stall, rank 1 was a straggler: "),
            "{}",
            health.detail
        );
    }

    #[test]
    fn a_rank_twice_as_slow_is_named_after_the_persistence_window_and_not_before() {
        let mut ranks = [timed(100.0, T), timed(200.0, T)];
        let (mut written, mut pace) = (None, Pace::default());
        let named = sweep_through(&mut ranks, &mut written, &mut pace, T, T + 9_500);
        assert!(named.is_empty(), "slow for 9.5 s only: {named:?}");
        let named = sweep_through(&mut ranks, &mut written, &mut pace, T + 10_000, T + 10_000);
        assert_eq!(named, [1], "slow for the whole window");

        let health = decide(
            &ranks,
            Some(&Written { stragglers: Vec::new(), ..written.clone().unwrap() }),
            &mut pace,
            60_000,
            T + 10_000,
        )
        .expect("the set of stragglers changed");
        assert_eq!(health.state, HealthState::Progressing);
        assert_eq!(health.since_ms, T, "the state did not change: its since stays");
        assert!(health.ranks.is_empty(), "stragglers are not culprits: {:?}", health.ranks);
        let straggler = health.stragglers[0];
        assert_eq!((straggler.rank, straggler.ratio), (1, 2.0));
        assert_eq!((straggler.step_time_ms, straggler.peers_step_time_ms), (200.0, 100.0));
        assert!(
            health
                .detail
                .ends_with(" Rank 1 is a straggler: 0.20 s a step, 2.0\u{d7} its peers' 0.10 s."),
            "{}",
            health.detail
        );
    }

    #[test]
    fn a_stragglers_time_and_its_peers_read_alike_in_words() {
        let words = |own: f64, peers: f64| {
            let text = step_time_text(own);
            format!("{} / {}", text(own), text(peers))
        };
        assert_eq!(words(100.6, 50.3), "0.10 s / 0.05 s");
        assert_eq!(words(30.0, 15.0), "30.0 ms / 15.0 ms");
        assert_eq!(words(25_000.0, 12_000.0), "25.0 s / 12.0 s");
    }

    #[test]
    fn a_straggler_stays_named_until_it_falls_below_the_lower_ratio() {
        let mut ranks = [timed(100.0, T), timed(200.0, T)];
        let (mut written, mut pace) = (None, Pace::default());
        assert_eq!(sweep_through(&mut ranks, &mut written, &mut pace, T, T + 10_000), [1]);
        let health_then = written.clone();

        // 1.3 times its peers': no longer slow enough to be named, not
        // fast enough to be cleared. Nothing is written while it drifts.
        ranks[1].as_mut().unwrap().step_time_ms = Some(130.0);
        assert_eq!(sweep_through(&mut ranks, &mut written, &mut pace, T + 10_500, T + 30_000), [1]);
        assert_eq!(written, health_then, "a drifting ratio writes nothing");

        // Below 1.25: cleared at once.
        ranks[1].as_mut().unwrap().step_time_ms = Some(120.0);
        assert!(
            sweep_through(&mut ranks, &mut written, &mut pace, T + 30_500, T + 30_500).is_empty()
        );

        // Back above 1.5 for less than the window: not named again yet.
        ranks[1].as_mut().unwrap().step_time_ms = Some(160.0);
        assert!(
            sweep_through(&mut ranks, &mut written, &mut pace, T + 31_000, T + 40_500).is_empty()
        );
        ranks[1].as_mut().unwrap().step_time_ms = Some(140.0);
        assert!(
            sweep_through(&mut ranks, &mut written, &mut pace, T + 41_000, T + 60_000).is_empty(),
            "the window starts again after a break"
        );
    }

    #[test]
    fn ranks_at_one_pace_are_never_stragglers_nor_is_a_rank_alone() {
        let mut ranks = [timed(100.0, T), timed(110.0, T), timed(95.0, T), timed(140.0, T)];
        let (mut written, mut pace) = (None, Pace::default());
        assert!(sweep_through(&mut ranks, &mut written, &mut pace, T, T + 120_000).is_empty());

        let mut alone = [timed(500.0, T)];
        let (mut written, mut pace) = (None, Pace::default());
        assert!(sweep_through(&mut alone, &mut written, &mut pace, T, T + 120_000).is_empty());

        let mut untimed = [timed(100.0, T), at(100, T, true)];
        let (mut written, mut pace) = (None, Pace::default());
        assert!(sweep_through(&mut untimed, &mut written, &mut pace, T, T + 120_000).is_empty());
    }

    #[test]
    fn a_rank_in_an_announced_pause_or_not_advancing_is_not_judged() {
        // Rank 1 is slow but checkpointing under an announced pause: its
        // slowness does not count toward the window.
        let mut ranks = [timed(100.0, T), timed(300.0, T)];
        ranks[1].as_mut().unwrap().expect_until_ms = T + 20_000;
        let (mut written, mut pace) = (None, Pace::default());
        assert!(sweep_through(&mut ranks, &mut written, &mut pace, T, T + 19_500).is_empty());
        assert_eq!(sweep_through(&mut ranks, &mut written, &mut pace, T + 20_000, T + 30_000), [1]);

        // Named, then it stops advancing: it stays as it was, however its
        // peers' pace changes meanwhile.
        ranks[0].as_mut().unwrap().step_time_ms = Some(290.0);
        let health =
            decide(&ranks, written.as_ref(), &mut pace, 60_000, T + 30_000 + STRAGGLER_AFTER_MS);
        assert!(health.is_none(), "not judged: nothing changes");
    }

    #[test]
    fn the_stragglers_a_restarted_head_has_not_judged_yet_stay_named() {
        let mut ranks = [timed(100.0, T), timed(200.0, T)];
        let (mut written, mut pace) = (None, Pace::default());
        assert_eq!(sweep_through(&mut ranks, &mut written, &mut pace, T, T + 10_000), [1]);
        // After a restart the ranks' first reports carry no step time yet.
        let fresh = [at(101, T + 70_000, false), at(101, T + 70_000, false)];
        let health = decide(&fresh, written.as_ref(), &mut Pace::default(), 60_000, T + 70_000);
        assert!(health.is_none(), "{health:?}");
    }
}
