//! The progress of a run's ranks, as the controller reports it: coalesced
//! per rank and sent in the background at most once per interval, never
//! holding up the training loop.
//!
//! A report is merged into what waits for its rank (the latest step,
//! phase and total win, but a step never goes back; metrics are merged;
//! the higher checkpoint mark is kept, so a mark is never lost to
//! merging), so what waits is bounded by the attempt's ranks, whatever the
//! rate of reports. A report that breaks a rule is refused at the call,
//! among them a checkpoint mark ahead of the rank's step or below its
//! previous mark of the attempt: the outbox remembers each rank's latest
//! step and mark of the attempt, sent or not. Once an interval, the progress of every run whose writes the
//! head has all acknowledged (it knows the run and its attempt) is sent in
//! one request per run, one request in flight per run. What cannot be
//! sent (a report that breaks a rule, a rank the attempt does not have,
//! a request the head refused or did not answer, a report of an attempt
//! since replaced) is dropped and counted, never kept to send later.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use trainstate_client::StateError;
use trainstate_schema::api::RankProgress;
use trainstate_schema::limits::MAX_METRIC_NAMES_PER_REPORT;
use trainstate_schema::{Rule, RunId, ValidationError};

use crate::delivery::Outbox;

/// What waits to be sent of every run's progress, and what was dropped.
#[derive(Default)]
pub(crate) struct ProgressOutbox {
    runs: Mutex<HashMap<RunId, Waiting>>,
    /// Rank reports dropped: never sent, or refused.
    dropped: AtomicU64,
}

/// One run's progress waiting to be sent.
struct Waiting {
    /// The attempt the reports are of.
    attempt_id: String,
    /// By rank, each rank's reports merged.
    ranks: BTreeMap<u32, RankProgress>,
    /// By rank, the latest step and checkpoint mark taken of the attempt,
    /// whether sent already or still waiting.
    known: BTreeMap<u32, Known>,
    /// A request of this run's is being sent: the next waits for its answer.
    in_flight: bool,
    /// A report that broke a rule was logged for this run.
    warned: bool,
}

/// A rank's latest step and checkpoint mark of an attempt.
#[derive(Debug, Clone, Copy, Default)]
struct Known {
    step: Option<u64>,
    checkpoint: Option<u64>,
}

impl Known {
    /// Checks `next`'s checkpoint mark against the rank's step (`next`'s
    /// own, else the latest taken; 0 when the rank has none yet) and its
    /// previous mark; the error names `progress.checkpoint`.
    fn check_mark(&self, next: &RankProgress) -> Result<(), ValidationError> {
        let Some(mark) = next.checkpoint else { return Ok(()) };
        let step = self.step.max(next.step).unwrap_or(0);
        if mark > step {
            let rule = Rule::CheckpointAheadOfStep { step };
            return Err(ValidationError::new("progress.checkpoint", rule));
        }
        if let Some(previous) = self.checkpoint
            && mark < previous
        {
            let rule = Rule::CheckpointGoesBack { previous };
            return Err(ValidationError::new("progress.checkpoint", rule));
        }
        Ok(())
    }

    /// Takes `next`'s step and mark: the highest of each is kept.
    fn take(&mut self, next: &RankProgress) {
        self.step = self.step.max(next.step);
        self.checkpoint = self.checkpoint.max(next.checkpoint);
    }
}

/// One run's progress, taken to be sent.
struct Batch {
    id: RunId,
    attempt_id: String,
    ranks: Vec<(u32, RankProgress)>,
}

impl ProgressOutbox {
    fn runs(&self) -> MutexGuard<'_, HashMap<RunId, Waiting>> {
        self.runs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many rank reports were dropped: never sent, or refused.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    fn drop_reports(&self, count: usize) {
        self.dropped.fetch_add(count as u64, Ordering::Relaxed);
    }

    /// Merges rank `rank`'s `progress` into what waits for run `id`, whose
    /// writes `outbox` keeps. A report that breaks a rule is refused (and
    /// counted as dropped): a rule of [`RankProgress::check`], or a
    /// checkpoint mark ahead of the rank's step or below its previous mark
    /// of the attempt; the error names its field (`progress.checkpoint`).
    /// Drops it (counted) when `id` is not a live run of this manager, or
    /// when its latest attempt has no such rank.
    pub(crate) fn report(
        &self,
        outbox: &Outbox,
        id: &RunId,
        rank: u32,
        progress: RankProgress,
    ) -> Result<(), ValidationError> {
        let Some(attempt) = outbox.attempt(id) else {
            self.drop_reports(1);
            return Ok(());
        };
        let mut runs = self.runs();
        let waiting = runs.entry(id.clone()).or_insert_with(|| Waiting {
            attempt_id: attempt.attempt_id.clone(),
            ranks: BTreeMap::new(),
            known: BTreeMap::new(),
            in_flight: false,
            warned: false,
        });
        if rank >= attempt.world_size {
            drop(runs);
            self.drop_reports(1);
            return Ok(());
        }
        if waiting.attempt_id != attempt.attempt_id {
            // A new worker group: what waits was of the one before.
            let replaced = std::mem::take(&mut waiting.ranks).len();
            waiting.known.clear();
            waiting.attempt_id = attempt.attempt_id;
            self.drop_reports(replaced);
        }
        let known = waiting.known.get(&rank).copied().unwrap_or_default();
        if let Err(err) = progress.check().and_then(|()| known.check_mark(&progress)) {
            if !std::mem::replace(&mut waiting.warned, true) {
                tracing::warn!(run = %id, rank, error = %err, "a progress report breaks a rule; it is refused (and so are later ones that do)");
            }
            drop(runs);
            self.drop_reports(1);
            return Err(err);
        }
        waiting.known.entry(rank).or_default().take(&progress);
        match waiting.ranks.get_mut(&rank) {
            Some(before) => merge(before, progress),
            None => {
                waiting.ranks.insert(rank, progress);
            }
        }
        Ok(())
    }

    /// Takes what waits of every run whose writes the head has all
    /// acknowledged and that has no request in flight; drops (counted)
    /// what waits for runs no longer live, or of an attempt replaced.
    fn take(&self, outbox: &Outbox) -> Vec<Batch> {
        let mut batches = Vec::new();
        let mut dropped = 0;
        self.runs().retain(|id, waiting| {
            if waiting.in_flight {
                return true;
            }
            let Some(attempt) = outbox.attempt(id) else {
                dropped += waiting.ranks.len();
                return false;
            };
            if attempt.attempt_id != waiting.attempt_id {
                dropped += std::mem::take(&mut waiting.ranks).len();
                waiting.known.clear();
                waiting.attempt_id = attempt.attempt_id;
                return true;
            }
            if !attempt.acknowledged || waiting.ranks.is_empty() {
                return true;
            }
            waiting.in_flight = true;
            batches.push(Batch {
                id: id.clone(),
                attempt_id: waiting.attempt_id.clone(),
                ranks: std::mem::take(&mut waiting.ranks).into_iter().collect(),
            });
            true
        });
        self.drop_reports(dropped);
        batches
    }

    /// Records the head's answer to run `id`'s request of `count` rank
    /// reports.
    fn settle(&self, id: &RunId, count: usize, answer: Result<(), StateError>) {
        if let Some(waiting) = self.runs().get_mut(id) {
            waiting.in_flight = false;
        }
        if let Err(err) = answer {
            tracing::debug!(run = %id, reports = count, error = %err, "progress not taken by the head; dropped");
            self.drop_reports(count);
        }
    }

    /// Drops (counted) everything that waits: the manager shuts down.
    pub(crate) fn close(&self) {
        let waiting: usize = self.runs().drain().map(|(_, w)| w.ranks.len()).sum();
        self.drop_reports(waiting);
    }
}

/// `next` merged into `before`, one rank's reports: the latest step, total
/// and phase win, but the step never goes back (the highest is kept), and
/// neither does the checkpoint mark (the higher is kept, and a report
/// without one keeps the mark before it); the metrics are merged, the latest value of each name winning, unless that
/// would carry more names than one report may, when only the latest
/// report's are kept.
fn merge(before: &mut RankProgress, next: RankProgress) {
    before.step = before.step.max(next.step);
    before.checkpoint = before.checkpoint.max(next.checkpoint);
    before.total_steps = next.total_steps.or(before.total_steps);
    before.phase = next.phase.or(before.phase.take());
    before.expect_next_within_ms = next.expect_next_within_ms.or(before.expect_next_within_ms);
    let new_names = next.metrics.keys().filter(|name| !before.metrics.contains_key(*name)).count();
    if before.metrics.len() + new_names > MAX_METRIC_NAMES_PER_REPORT {
        before.metrics = next.metrics;
    } else {
        before.metrics.extend(next.metrics);
    }
}

/// Sends the progress of every run of a manager once per `interval`, one
/// request per run at a time, until aborted.
pub(crate) async fn send_progress(
    outbox: Arc<Outbox>,
    progress: Arc<ProgressOutbox>,
    interval: Duration,
) {
    let mut ticks = tokio::time::interval_at(Instant::now() + interval, interval);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut in_flight: JoinSet<(RunId, usize, Result<(), StateError>)> = JoinSet::new();
    loop {
        tokio::select! {
            _ = ticks.tick() => {
                for batch in progress.take(&outbox) {
                    let handle = outbox.handle().clone();
                    in_flight.spawn(async move {
                        let count = batch.ranks.len();
                        let answer = handle
                            .report_progress(&batch.id, Some(batch.attempt_id), batch.ranks)
                            .await
                            .map(drop);
                        (batch.id, count, answer)
                    });
                }
            }
            Some(joined) = in_flight.join_next(), if !in_flight.is_empty() => {
                if let Ok((id, count, answer)) = joined {
                    progress.settle(&id, count, answer);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(step: u64) -> RankProgress {
        RankProgress::at_step(step)
    }

    #[test]
    fn reports_merge_keeping_the_highest_step_and_every_metric() {
        let mut before = at(10);
        before.phase = Some("train".into());
        before.metrics.insert("loss".into(), 2.0);
        let mut next = at(9);
        next.total_steps = Some(100);
        next.metrics.insert("lr".into(), 0.1);
        merge(&mut before, next);
        assert_eq!(before.step, Some(10), "a step never goes back");
        assert_eq!(before.total_steps, Some(100));
        assert_eq!(before.phase.as_deref(), Some("train"), "kept when the next says none");
        assert_eq!(before.metrics.len(), 2, "{:?}", before.metrics);

        let mut many = at(11);
        for i in 0..MAX_METRIC_NAMES_PER_REPORT {
            many.metrics.insert(format!("m{i}"), 1.0);
        }
        merge(&mut before, many);
        assert_eq!(before.step, Some(11));
        assert_eq!(before.metrics.len(), MAX_METRIC_NAMES_PER_REPORT, "never past one report's");
        assert!(!before.metrics.contains_key("loss"));
    }

    fn marked(step: Option<u64>, checkpoint: u64) -> RankProgress {
        let mut progress = RankProgress::default();
        progress.step = step;
        progress.checkpoint = Some(checkpoint);
        progress
    }

    #[test]
    fn a_checkpoint_mark_is_never_lost_to_merging() {
        let mut before = marked(Some(40), 40);
        merge(&mut before, at(41));
        assert_eq!(
            (before.step, before.checkpoint),
            (Some(41), Some(40)),
            "a report without a mark keeps it"
        );
        merge(&mut before, marked(Some(50), 50));
        merge(&mut before, marked(Some(51), 45));
        assert_eq!(
            (before.step, before.checkpoint),
            (Some(51), Some(50)),
            "of two marks, the higher"
        );
    }

    #[test]
    fn a_mark_ahead_of_the_ranks_step_or_below_its_previous_mark_is_refused() {
        let mut known = Known::default();
        let err = known.check_mark(&marked(None, 1)).unwrap_err();
        assert_eq!(err.field(), "progress.checkpoint");
        assert_eq!(err.rule(), &Rule::CheckpointAheadOfStep { step: 0 }, "no step yet");
        known.check_mark(&marked(Some(10), 10)).unwrap();
        known.take(&marked(Some(10), 10));
        known.check_mark(&marked(None, 10)).unwrap();
        let err = known.check_mark(&marked(None, 11)).unwrap_err();
        assert_eq!(err.rule(), &Rule::CheckpointAheadOfStep { step: 10 }, "the latest step taken");
        let err = known.check_mark(&marked(Some(9), 11)).unwrap_err();
        assert_eq!(err.rule(), &Rule::CheckpointAheadOfStep { step: 10 }, "a step that goes back");
        let err = known.check_mark(&marked(Some(20), 9)).unwrap_err();
        assert_eq!(
            (err.field(), err.rule()),
            ("progress.checkpoint", &Rule::CheckpointGoesBack { previous: 10 })
        );
        known.take(&at(20));
        assert_eq!(
            (known.step, known.checkpoint),
            (Some(20), Some(10)),
            "a step without a mark keeps it"
        );
        known.check_mark(&marked(None, 20)).unwrap();
    }
}
