//! A run's health, decided from its ranks' progress (pure: no I/O).
//!
//! The lease sweep asks, for each RUNNING run with a progress board (a
//! tracked rendezvous group's, or the board its controller reports to),
//! whether its health changes ([`HealthSweep`]): STALLED when no rank
//! advanced for the run's stall window (and no rank's announced pause
//! still covers now), PROGRESSING again when a rank advances after that
//! ([`decide`]). The rules, and what they cannot see, are in
//! `docs/health.md`.

use std::collections::{HashMap, HashSet};

use trainstate_schema::limits::MAX_HEALTH_RANKS;
use trainstate_schema::{HealthState, RunHealth, RunId, RunStatus};

use crate::liveness::Liveness;
use crate::progress::Progress;
use crate::state::{Change, Outcome, Runs};
use crate::time_text::{iso_ms, seconds};

/// The health decisions of the lease sweep, for every kind of run alike:
/// each RUNNING run whose progress board has a report is decided by
/// [`decide`], and a change is written through [`Runs::set_health`].
///
/// A rendezvous group still assembling has no board, and a group closed
/// before it assembled has one of no ranks, so neither is ever judged.
pub(crate) struct HealthSweep {
    /// Each judged run's health as last written (state, since), once read
    /// from the run: the run is not parsed at every sweep.
    written: HashMap<RunId, Option<(HealthState, u64)>>,
    /// The stall window of a run that asks for none (the head's
    /// `--stall-after`), in ms.
    stall_after_ms: u64,
}

impl HealthSweep {
    /// No run judged yet; `stall_after_ms` is the stall window of a run
    /// that asks for none.
    pub(crate) fn new(stall_after_ms: u64) -> Self {
        Self { written: HashMap::new(), stall_after_ms }
    }

    /// Decides the health of every RUNNING run with progress on a board
    /// of `liveness`, adding what it writes to `change`.
    pub(crate) fn sweep(
        &mut self,
        liveness: &Liveness,
        runs: &mut Runs,
        now_ms: u64,
        change: &mut Change<Vec<RunId>>,
    ) {
        let boards = liveness.progress_boards();
        let judged: HashSet<&RunId> = boards.iter().map(|(id, _)| id).collect();
        self.written.retain(|id, _| judged.contains(id));
        for (id, board) in &boards {
            if runs.status_of(id) != Some(RunStatus::Running) {
                continue;
            }
            let Some(ranks) = board.progress() else { continue };
            let current = *self.written.entry(id.clone()).or_insert_with(|| runs.health_of(id));
            let window = board.stall_after_ms().unwrap_or(self.stall_after_ms);
            let Some(next) = decide(&ranks, current, window, now_ms) else { continue };
            let decided = (next.state, next.since_ms);
            match runs.set_health(id, next, now_ms) {
                Ok(Outcome::Changed(written)) => {
                    tracing::info!(run = %id, health = %decided.0, "a run's health changed");
                    change.ops.extend(written.ops);
                    change.events.extend(written.events);
                    self.written.insert(id.clone(), Some(decided));
                }
                Ok(Outcome::Unchanged(())) => {}
                Err(err) => tracing::error!(run = %id, error = %err, "cannot write a run's health"),
            }
        }
    }
}

/// How many ranks a detail names one by one.
const MAX_RANKS_NAMED: usize = 8;

/// The run's new health, if it changes: `ranks` is each rank's progress
/// by world rank, `current` the health last written (state, since),
/// `window_ms` the run's stall window, `now_ms` the head's wall clock.
///
/// A run with no health yet becomes PROGRESSING (or STALLED) at its first
/// decision. A STALLED run becomes PROGRESSING only when a rank's step grew
/// on this head after the stall: after a head restart, ranks that report
/// the same step again are not an advance.
pub(crate) fn decide(
    ranks: &[Option<Progress>],
    current: Option<(HealthState, u64)>,
    window_ms: u64,
    now_ms: u64,
) -> Option<RunHealth> {
    let reported: Vec<(u32, &Progress)> =
        (0u32..).zip(ranks).filter_map(|(rank, p)| Some((rank, p.as_ref()?))).collect();
    let newest = reported.iter().map(|(_, p)| p.last_advance_ms).max()?;
    let covered_until = reported.iter().map(|(_, p)| p.expect_until_ms).max().unwrap_or(0);
    let stalled = now_ms >= newest.saturating_add(window_ms).max(covered_until);
    let lagging = lagging(&reported);
    match current {
        Some((HealthState::Stalled, since)) => {
            let advanced = reported
                .iter()
                .filter(|(_, p)| p.advanced && p.last_advance_ms > since)
                .max_by_key(|(_, p)| p.last_advance_ms);
            let (rank, progress) = advanced.filter(|_| !stalled)?;
            Some(progressing(*rank, progress, &lagging, &reported, now_ms))
        }
        Some((HealthState::Progressing, _)) if !stalled => None,
        _ if stalled => Some(stalled_health(&reported, &lagging, newest, now_ms)),
        _ => {
            let (rank, progress) = reported.iter().max_by_key(|(_, p)| p.last_advance_ms)?;
            Some(progressing(*rank, progress, &lagging, &reported, now_ms))
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

fn stalled_health(
    reported: &[(u32, &Progress)],
    lagging: &[u32],
    newest: u64,
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
    let mut detail = format!("No rank has advanced for {}; ", seconds(now_ms - newest));
    for (i, (rank, progress)) in by_advance.iter().take(MAX_RANKS_NAMED).enumerate() {
        let lead = if i == 0 { "rank" } else { ", rank" };
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
    RunHealth::new(HealthState::Stalled, now_ms, culprits, detail)
}

fn progressing(
    rank: u32,
    progress: &Progress,
    lagging: &[u32],
    reported: &[(u32, &Progress)],
    now_ms: u64,
) -> RunHealth {
    let mut detail = format!(
        "Rank {rank} advanced at {} ({}).",
        iso_ms(progress.last_advance_ms),
        where_text(progress)
    );
    push_lagging(&mut detail, lagging, reported);
    let mut ranks = lagging.to_vec();
    ranks.truncate(MAX_HEALTH_RANKS);
    RunHealth::new(HealthState::Progressing, now_ms, ranks, detail)
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
        })
    }

    const T: u64 = 1_780_000_000_000;

    #[test]
    fn a_run_stalls_after_its_window_and_names_the_rank_that_stopped_first() {
        let ranks = [at(20, T + 5_000, true), at(20, T + 1_000, true)];
        let current = Some((HealthState::Progressing, T));
        assert!(decide(&ranks, current, 10_000, T + 14_999).is_none());
        let health = decide(&ranks, current, 10_000, T + 15_000).expect("stalled");
        assert_eq!(health.state, HealthState::Stalled);
        assert_eq!(health.ranks, vec![1]);
        assert!(
            health.detail.starts_with("No rank has advanced for 10 s; rank 1 last advanced at")
        );
        assert!(!health.detail.contains(&T.to_string()), "{}", health.detail);
    }

    #[test]
    fn the_rank_at_the_lowest_step_is_named_though_its_last_report_came_later() {
        // Rank 1 hung inside step 50: it reported step 49 last, after rank
        // 0 reported step 50 and went on to wait for it.
        let ranks = [at(50, T + 1_000, true), at(49, T + 1_400, true)];
        let current = Some((HealthState::Progressing, T));
        let health = decide(&ranks, current, 10_000, T + 11_400).expect("stalled");
        assert_eq!(health.state, HealthState::Stalled);
        assert_eq!(health.ranks, vec![1], "{}", health.detail);
    }

    #[test]
    fn ranks_that_stopped_together_at_one_step_are_not_told_apart() {
        // Rank 1 hung before step 15's collective; rank 0 waits in it. Both
        // reported step 14 last, 12 ms apart: nothing names either.
        let ranks = [at(14, T + 1_000, true), at(14, T + 1_012, true)];
        let current = Some((HealthState::Progressing, T));
        let health = decide(&ranks, current, 5_000, T + 7_000).expect("stalled");
        assert_eq!(health.state, HealthState::Stalled);
        assert!(health.ranks.is_empty(), "{:?}", health.ranks);
        assert!(health.detail.contains("do not tell which rank"), "{}", health.detail);
    }

    #[test]
    fn a_stalled_run_progresses_only_on_an_advance_after_the_stall() {
        let stalled = Some((HealthState::Stalled, T + 20_000));
        let heard_again = [at(20, T + 30_000, false)];
        assert!(decide(&heard_again, stalled, 60_000, T + 31_000).is_none());
        let advanced = [at(21, T + 30_000, true)];
        let health = decide(&advanced, stalled, 60_000, T + 31_000).expect("progressing");
        assert_eq!(health.state, HealthState::Progressing);
    }

    #[test]
    fn a_rank_behind_the_highest_step_lags() {
        let ranks = [at(1000, T, true), at(989, T, true), at(990, T, true)];
        let health = decide(&ranks, None, 60_000, T + 1).expect("first decision");
        assert_eq!(health.state, HealthState::Progressing);
        assert_eq!(health.ranks, vec![1]);
    }
}
