//! Each rank's progress of a live run's current attempt: memory only,
//! shared by the actor and the connections' tasks.
//!
//! A [`ProgressBoard`] keeps the latest progress report of every rank of
//! one attempt and the metric points not yet handed to the store (see
//! `store/metrics.rs`), behind one lock. Its
//! reports come from the ranks of a rendezvous run, with their heartbeats
//! (the board is its group's rank board's), or from the controller of a
//! run it registered, several ranks at a time. Either way the board is
//! published in the liveness tables, where readers serve it
//! (`rank_progress`), the writer takes its metric points about once a
//! second, and the lease sweep decides the run's health from it (see
//! [`crate::decisions::health`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use trainstate_client::StateError;
use trainstate_schema::api::{MetricPoint, RankProgress, RankProgressServed, RankReport};
use trainstate_schema::limits::MAX_METRIC_NAMES_PER_RUN;
use trainstate_schema::{Rule, RunId, ValidationError};

use crate::decisions::goodput::{BoardCount, PaceCount, announces_pause};
use crate::decisions::stall_window::{RecentSlowest, StallWindow};

/// The points of one run's attempt reported since the last flush, in the
/// order they were reported.
#[derive(Debug, Clone)]
pub(crate) struct MetricBatch {
    pub(crate) run_id: RunId,
    pub(crate) attempt_id: Box<str>,
    pub(crate) points: Vec<NamedPoint>,
    /// The last progress of the attempt's ranks, when its board goes away
    /// (the run ended, or started another attempt): `rank_progress` as
    /// served, in JSON. The store keeps the latest of each run, so an
    /// ended run still serves it (the store's `LastProgress`).
    pub(crate) last_progress: Option<Arc<str>>,
}

/// A point of the metric `name`.
#[derive(Debug, Clone)]
pub(crate) struct NamedPoint {
    pub(crate) name: Arc<str>,
    pub(crate) point: MetricPoint,
}

/// The most metric points a board holds between two flushes to the store
/// (about a second): past it, points are dropped and counted, never queued
/// without bound.
const MAX_PENDING_POINTS: usize = 65_536;

/// How much a rank's newest step time weighs in its smoothed step time:
/// with a report about once a second, a change of pace shows within a few
/// seconds and one odd interval (a data loader's hiccup) moves it by a
/// quarter.
pub(crate) const STEP_TIME_WEIGHT: f64 = 0.25;

/// The progress of every rank of one attempt of a run.
pub(crate) struct ProgressBoard {
    attempt_id: Box<str>,
    world_size: u32,
    reporter: Reporter,
    /// The run's own stall window, when it asked for one (a rendezvous
    /// run's joins may); `None`: the head's.
    stall_after_ms: Option<u64>,
    /// Each rank's latest progress report (one report per rank per
    /// heartbeat, or a few per second from a controller: a lock per board
    /// is enough).
    progress: Mutex<ProgressTable>,
    /// What the health tick reads without the board's lock.
    marks: HealthMarks,
}

/// What a board tells the health tick without its lock, so that a tick
/// over every board costs a few atomic reads each: when its ranks last
/// moved, and whether a stall the head wrote has ended.
#[derive(Default)]
struct HealthMarks {
    /// The latest `last_advance_ms` of any rank (wall ms).
    newest_ms: AtomicU64,
    /// The latest end of an announced pause (`expect_next_within_ms`) of
    /// any rank (wall ms); 0: none.
    covered_until_ms: AtomicU64,
    /// Since when the run's health is STALLED, as the head wrote it (wall
    /// ms); 0: it is not.
    stalled_since_ms: AtomicU64,
    /// The first advance of a rank after the stall the head wrote (wall
    /// ms), stamped by the report that made it; 0: none yet.
    resumed_ms: AtomicU64,
    /// The run's slowest recent step (ms, as `f64` bits) as of its latest
    /// report, which its stall window follows; 0: it has not shown its
    /// pace yet.
    slowest_step_bits: AtomicU64,
    /// The attempt's highest checkpoint mark is not written on the run
    /// yet: the health sweep writes it.
    mark_due: AtomicBool,
}

/// Who reports a board's progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reporter {
    /// Each rank of a rendezvous run, with its heartbeats: the board is
    /// its group's rank board's, and goes with it.
    Ranks,
    /// The run's controller (`POST /api/train/runs/{id}/progress`): the
    /// board goes with the run's attempt.
    Controller,
}

/// One rank's progress as the head keeps it.
#[derive(Debug, Clone)]
pub(crate) struct Progress {
    pub(crate) step: Option<u64>,
    pub(crate) total_steps: Option<u64>,
    pub(crate) phase: Option<Box<str>>,
    pub(crate) metrics: BTreeMap<String, f64>,
    /// When the rank's step last grew (wall ms), or, before it grew on
    /// this head, when this head first heard its progress: after a
    /// restart, the stall window starts again.
    pub(crate) last_advance_ms: u64,
    /// The step grew on this head at least once.
    pub(crate) advanced: bool,
    /// Until when (wall ms) the rank's announced pause
    /// (`expect_next_within_ms`) covers it; 0: none.
    pub(crate) expect_until_ms: u64,
    /// The rank's smoothed time per step (ms): an exponentially weighted
    /// mean of the `step_time_ms` its reports carried with a new step,
    /// each weighing [`STEP_TIME_WEIGHT`]; `None` until one did.
    pub(crate) step_time_ms: Option<f64>,
    /// The rank's latest checkpoint mark in this attempt: progress up to
    /// this step is saved.
    pub(crate) checkpoint: Option<u64>,
}

/// The progress of every rank of a board, every metric name its ranks
/// reported, and the metric points not yet handed to the store.
#[derive(Default)]
struct ProgressTable {
    /// By world rank; empty until a rank reports.
    ranks: Vec<Option<Progress>>,
    names: BTreeSet<Arc<str>>,
    /// Points reported with a step since the last flush, in order; at most
    /// [`MAX_PENDING_POINTS`].
    pending: Vec<NamedPoint>,
    /// Points dropped because `pending` was full, since the last flush.
    dropped: u64,
    /// By world rank, the metric names that have a history point at the
    /// rank's current step: a report that repeats the step adds a point
    /// only for a name not among them, so a rank that does not advance
    /// adds none.
    pointed: Vec<Vec<Arc<str>>>,
    /// The slow end of the ranks' recent steps: the step times they
    /// reported with a new step, and the time between a rank's
    /// consecutive advances as the head saw it.
    pace: RecentSlowest,
    /// What the run's goodput counts of this attempt between two versions
    /// of the run (memory only: see [`PaceCount`]).
    goodput: PaceCount,
}

impl ProgressBoard {
    /// An empty board of attempt `attempt_id`, of `world_size` ranks,
    /// whose progress `reporter` reports; `stall_after_ms` is the run's
    /// own stall window, if it asked for one.
    pub(crate) fn new(
        attempt_id: &str,
        world_size: u32,
        reporter: Reporter,
        stall_after_ms: Option<u64>,
    ) -> Self {
        Self {
            attempt_id: attempt_id.into(),
            world_size,
            reporter,
            stall_after_ms,
            progress: Mutex::default(),
            marks: HealthMarks::default(),
        }
    }

    /// Notes the run's health as the head wrote it: STALLED since
    /// `stalled_since_ms`, or (`None`) not stalled. A new stall forgets
    /// the advance that ended the one before.
    pub(crate) fn note_health(&self, stalled_since_ms: Option<u64>) {
        let since = stalled_since_ms.unwrap_or(0);
        if self.marks.stalled_since_ms.swap(since, Ordering::SeqCst) != since {
            self.marks.resumed_ms.store(0, Ordering::SeqCst);
        }
    }

    /// The first advance of a rank after the stall the head wrote (wall
    /// ms), if one came.
    pub(crate) fn resumed_ms(&self) -> Option<u64> {
        Some(self.marks.resumed_ms.load(Ordering::SeqCst)).filter(|&ms| ms != 0)
    }

    /// The run's stall window: its own when it asked for one, else from
    /// its pace as of its latest report, under the head's `--stall-after`
    /// of `ceiling_ms` (see [`StallWindow::of`]). Lock free.
    pub(crate) fn stall_window(&self, ceiling_ms: u64) -> StallWindow {
        let bits = self.marks.slowest_step_bits.load(Ordering::Relaxed);
        let slowest = (bits != 0).then(|| f64::from_bits(bits));
        StallWindow::of(self.stall_after_ms, slowest, ceiling_ms)
    }

    /// True when the run's health may change at `now_ms` for a stall
    /// window of `window_ms`: a stall the head wrote has ended, or, for a
    /// run not stalled, its ranks have not moved for the window and no
    /// announced pause covers now. Lock free: a few atomic reads.
    pub(crate) fn health_due(&self, window_ms: u64, now_ms: u64) -> bool {
        if self.marks.stalled_since_ms.load(Ordering::Relaxed) != 0 {
            return self.marks.resumed_ms.load(Ordering::Relaxed) != 0;
        }
        let newest = self.marks.newest_ms.load(Ordering::Relaxed);
        let covered = self.marks.covered_until_ms.load(Ordering::Relaxed);
        newest != 0 && now_ms >= newest.saturating_add(window_ms).max(covered)
    }

    /// Records rank `rank`'s progress report `report`, received at
    /// `now_ms` (wall), for run `id`. Refuses, changing nothing, a step
    /// below the rank's previous one (409) and a report that would bring
    /// the run past [`MAX_METRIC_NAMES_PER_RUN`] metric names (422, naming
    /// the first new name). A rank out of range is ignored.
    pub(crate) fn report(
        &self,
        id: &RunId,
        rank: u32,
        report: &RankProgress,
        now_ms: u64,
    ) -> Result<(), StateError> {
        let mut table = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        self.record(&mut table, id, rank, report, now_ms)
    }

    /// Records the reports of several ranks at once, received at `now_ms`
    /// (wall), for run `id`: all of them or, when one is refused, none. A
    /// rank that is not below the world size, a step below the rank's
    /// previous one (409), and reports that would bring the run past
    /// [`MAX_METRIC_NAMES_PER_RUN`] metric names (422, naming the first
    /// new name as `ranks[i].progress.metrics["name"]`) are refused.
    pub(crate) fn report_ranks(
        &self,
        id: &RunId,
        ranks: &[RankReport],
        now_ms: u64,
    ) -> Result<(), StateError> {
        self.check_ranks(id, ranks)?;
        let mut table = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        let mut new_names = BTreeSet::new();
        for (i, entry) in ranks.iter().enumerate() {
            let rank = entry.rank;
            let previous = table.ranks.get(rank as usize).and_then(Option::as_ref);
            self.check_step(id, rank, &entry.progress, previous, &format!("ranks[{i}]: "))?;
            check_checkpoint(&entry.progress, previous, &format!("ranks[{i}]."))?;
            for name in entry.progress.metrics.keys() {
                if table.names.contains(name.as_str()) || !new_names.insert(name) {
                    continue;
                }
                if table.names.len() + new_names.len() > MAX_METRIC_NAMES_PER_RUN {
                    let rule = Rule::TooManyMetricNames { max: MAX_METRIC_NAMES_PER_RUN };
                    let field = format!("ranks[{i}].progress.metrics[{name:?}]");
                    return Err(ValidationError::new(field, rule).into());
                }
            }
        }
        for entry in ranks {
            self.record(&mut table, id, entry.rank, &entry.progress, now_ms)?;
        }
        Ok(())
    }

    /// Refuses (409) the first of `ranks` that is not one of the
    /// attempt's workers: not below its world size.
    pub(crate) fn check_ranks(&self, id: &RunId, ranks: &[RankReport]) -> Result<(), StateError> {
        match ranks.iter().enumerate().find(|(_, entry)| entry.rank >= self.world_size) {
            None => Ok(()),
            Some((i, entry)) => Err(StateError::Conflict {
                id: id.clone(),
                reason: format!(
                    "ranks[{i}]: rank {} is not one of attempt {:?}'s workers: its world size is {}",
                    entry.rank, self.attempt_id, self.world_size
                ),
            }),
        }
    }

    /// Refuses (409) a report of rank `rank` whose step is below the step
    /// of its `previous` report; `context` leads the reason.
    fn check_step(
        &self,
        id: &RunId,
        rank: u32,
        report: &RankProgress,
        previous: Option<&Progress>,
        context: &str,
    ) -> Result<(), StateError> {
        match (report.step, previous.and_then(|p| p.step)) {
            (Some(step), Some(before)) if step < before => Err(StateError::Conflict {
                id: id.clone(),
                reason: format!(
                    "{context}rank {rank} reported step {step} after step {before} in attempt {:?}: steps never go back",
                    self.attempt_id
                ),
            }),
            _ => Ok(()),
        }
    }

    /// [`ProgressBoard::report`], under the board's lock.
    fn record(
        &self,
        table: &mut ProgressTable,
        id: &RunId,
        rank: u32,
        report: &RankProgress,
        now_ms: u64,
    ) -> Result<(), StateError> {
        let slot = rank as usize;
        if slot >= self.world_size as usize {
            return Ok(());
        }
        let previous = table.ranks.get(slot).and_then(Option::as_ref);
        self.check_step(id, rank, report, previous, "")?;
        check_checkpoint(report, previous, "")?;
        let new_names: Vec<&String> =
            report.metrics.keys().filter(|name| !table.names.contains(name.as_str())).collect();
        if let Some(first) = new_names.first()
            && table.names.len() + new_names.len() > MAX_METRIC_NAMES_PER_RUN
        {
            let rule = Rule::TooManyMetricNames { max: MAX_METRIC_NAMES_PER_RUN };
            return Err(ValidationError::new(format!("progress.metrics[{first:?}]"), rule).into());
        }
        let advanced = match (report.step, previous.and_then(|p| p.step)) {
            (Some(step), Some(before)) => step > before,
            _ => false,
        };
        let expect_until_ms =
            report.expect_next_within_ms.map_or(0, |ms| now_ms.saturating_add(ms));
        // A step time describes the steps since the rank's previous report:
        // only a report with a new step brings one (a heartbeat that repeats
        // the rank's latest state counts nothing twice).
        let new_step =
            report.step.is_some() && (advanced || previous.is_none_or(|p| p.step.is_none()));
        let new_step_time = report.step_time_ms.filter(|_| new_step);
        let step_time_ms = match (new_step_time, previous.and_then(|p| p.step_time_ms)) {
            (Some(new), Some(smoothed)) => Some(smoothed + STEP_TIME_WEIGHT * (new - smoothed)),
            (new, smoothed) => new.or(smoothed),
        };
        let progress = match previous {
            Some(before) => Progress {
                step: report.step.or(before.step),
                total_steps: report.total_steps.or(before.total_steps),
                phase: report.phase.as_deref().map(Into::into).or_else(|| before.phase.clone()),
                metrics: if report.metrics.is_empty() {
                    before.metrics.clone()
                } else {
                    report.metrics.clone()
                },
                last_advance_ms: if advanced { now_ms } else { before.last_advance_ms },
                advanced: advanced || before.advanced,
                expect_until_ms: expect_until_ms.max(before.expect_until_ms),
                step_time_ms,
                checkpoint: report.checkpoint.or(before.checkpoint),
            },
            None => Progress {
                step: report.step,
                total_steps: report.total_steps,
                phase: report.phase.as_deref().map(Into::into),
                metrics: report.metrics.clone(),
                last_advance_ms: now_ms,
                advanced: false,
                expect_until_ms,
                step_time_ms,
                checkpoint: report.checkpoint,
            },
        };
        self.marks.newest_ms.fetch_max(progress.last_advance_ms, Ordering::SeqCst);
        self.marks.covered_until_ms.fetch_max(progress.expect_until_ms, Ordering::SeqCst);
        if advanced && self.marks.stalled_since_ms.load(Ordering::SeqCst) != 0 {
            // The first advance after the stall dates its end.
            let _ = self.marks.resumed_ms.compare_exchange(
                0,
                now_ms,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
        // The run's pace: what the rank says a step took, and how long the
        // head saw it go between two advances (an evaluation nobody
        // announced shows only there). The time from a rank's first report
        // to its first advance is no step: it may hold a restart's wait.
        if let Some(step_ms) = new_step_time {
            table.pace.note(step_ms, now_ms);
        }
        if let Some(before) = previous.filter(|p| advanced && p.advanced) {
            table.pace.note(now_ms.saturating_sub(before.last_advance_ms) as f64, now_ms);
        }
        // The run's goodput: an advance ends an announced pause, a new
        // highest step measures the run's pace, a new highest mark is
        // written on the run by the next health sweep.
        if advanced {
            table.goodput.note_advance(now_ms);
        }
        if let Some(step) = report.step {
            table.goodput.note_step(step, now_ms);
        }
        if announces_pause(report.phase.as_deref(), report.expect_next_within_ms) {
            table.goodput.note_pause(now_ms);
        }
        if let Some(mark) = report.checkpoint
            && table.goodput.note_mark(mark, now_ms)
        {
            self.marks.mark_due.store(true, Ordering::SeqCst);
        }
        let slowest = table.pace.slowest_ms(now_ms).map_or(0, f64::to_bits);
        self.marks.slowest_step_bits.store(slowest, Ordering::SeqCst);
        let names: Vec<Arc<str>> = new_names.into_iter().map(|n| Arc::from(n.as_str())).collect();
        table.names.extend(names);
        if table.ranks.is_empty() {
            table.ranks = vec![None; self.world_size as usize];
            table.pointed = vec![Vec::new(); self.world_size as usize];
        }
        if new_step {
            table.pointed[slot].clear();
        }
        if let Some(step) = report.step {
            for (name, value) in &report.metrics {
                // One point per rank, name and step: a heartbeat that
                // repeats the rank's step (a rank that does not advance)
                // adds none.
                if table.pointed[slot].iter().any(|p| **p == **name) {
                    continue;
                }
                let name =
                    table.names.get(name.as_str()).cloned().unwrap_or_else(|| name.as_str().into());
                table.pointed[slot].push(name.clone());
                if table.pending.len() >= MAX_PENDING_POINTS {
                    table.dropped += 1;
                    continue;
                }
                let point = MetricPoint::new(rank, step, *value);
                table.pending.push(NamedPoint { name, point });
            }
        }
        table.ranks[slot] = Some(progress);
        Ok(())
    }

    /// Takes the metric points reported since the last call, as run `id`'s
    /// batch for the store; `None` when there are none.
    pub(crate) fn take_points(&self, id: &RunId) -> Option<MetricBatch> {
        let mut table = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        if table.pending.is_empty() {
            return None;
        }
        let points = std::mem::take(&mut table.pending);
        Some(MetricBatch {
            run_id: id.clone(),
            attempt_id: self.attempt_id.clone(),
            points,
            last_progress: None,
        })
    }

    /// Takes the metric points not yet flushed, with the ranks' last
    /// progress as served, as run `id`'s last batch of this board (it goes
    /// away); `None` when it holds neither.
    pub(crate) fn take_last(&self, id: &RunId) -> Option<MetricBatch> {
        let last = self.served_progress().and_then(|served| serde_json::to_string(&*served).ok());
        let mut table = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        if table.pending.is_empty() && last.is_none() {
            return None;
        }
        let points = std::mem::take(&mut table.pending);
        Some(MetricBatch {
            run_id: id.clone(),
            attempt_id: self.attempt_id.clone(),
            points,
            last_progress: last.map(Into::into),
        })
    }

    /// Takes the count of points dropped since the last call.
    pub(crate) fn take_dropped(&self) -> u64 {
        std::mem::take(&mut self.progress.lock().unwrap_or_else(|e| e.into_inner()).dropped)
    }

    /// Each rank's progress, by world rank; `None` when no rank reported.
    pub(crate) fn progress(&self) -> Option<Vec<Option<Progress>>> {
        let table = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        (!table.ranks.is_empty()).then(|| table.ranks.clone())
    }

    /// Each rank's progress as a run serves it (`rank_progress`); `None`
    /// when no rank reported.
    pub(crate) fn served_progress(&self) -> Option<Arc<[Option<RankProgressServed>]>> {
        let table = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        if table.ranks.is_empty() {
            return None;
        }
        let served = table.ranks.iter().map(|rank| {
            rank.as_ref().map(|p| {
                RankProgressServed::new(
                    p.step,
                    p.total_steps,
                    p.phase.as_deref().map(str::to_owned),
                    Some(p.last_advance_ms),
                    p.metrics.clone(),
                )
                .with_checkpoint(p.checkpoint)
            })
        });
        Some(served.collect())
    }

    /// Each rank that reported a step: (world rank, step, when its step
    /// last grew in wall ms), by world rank.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn positions(&self) -> Vec<(u32, u64, u64)> {
        let table = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        let ranks = (0u32..).zip(&table.ranks);
        ranks
            .filter_map(|(rank, p)| Some((rank, p.as_ref()?.step?, p.as_ref()?.last_advance_ms)))
            .collect()
    }

    /// True when the attempt's highest checkpoint mark is not yet written
    /// on the run. Lock free.
    pub(crate) fn mark_due(&self) -> bool {
        self.marks.mark_due.load(Ordering::SeqCst)
    }

    /// What the run's goodput counted on this board since the run's last
    /// version, taken for the next one.
    pub(crate) fn take_goodput(&self) -> BoardCount {
        let mut table = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        self.marks.mark_due.store(false, Ordering::SeqCst);
        table.goodput.take()
    }

    /// What the run's goodput counted on this board since the run's last
    /// version, left in place: what a read of the live run adds.
    pub(crate) fn peek_goodput(&self) -> BoardCount {
        self.progress.lock().unwrap_or_else(|e| e.into_inner()).goodput.peek()
    }

    pub(crate) fn attempt_id(&self) -> &str {
        &self.attempt_id
    }

    /// How many ranks the attempt has.
    pub(crate) fn world_size(&self) -> u32 {
        self.world_size
    }

    pub(crate) fn reporter(&self) -> Reporter {
        self.reporter
    }
}

/// Refuses (422) a checkpoint mark ahead of the rank's own step (the
/// report's, else the rank's latest; a rank with no step has saved none)
/// and one lower than the rank's previous mark in this attempt; `prefix`
/// leads the field's path (`ranks[3].`).
fn check_checkpoint(
    report: &RankProgress,
    previous: Option<&Progress>,
    prefix: &str,
) -> Result<(), StateError> {
    let Some(mark) = report.checkpoint else { return Ok(()) };
    let field = || format!("{prefix}progress.checkpoint");
    let step = report.step.or(previous.and_then(|p| p.step)).unwrap_or(0);
    if mark > step {
        return Err(ValidationError::new(field(), Rule::CheckpointAheadOfStep { step }).into());
    }
    if let Some(before) = previous.and_then(|p| p.checkpoint).filter(|before| mark < *before) {
        let rule = Rule::CheckpointGoesBack { previous: before };
        return Err(ValidationError::new(field(), rule).into());
    }
    Ok(())
}
