//! Ray Train V2's whole-object writes, decided against one version of
//! their run.
//!
//! A V2 write is a whole document: converting it into a change of the
//! run, validating the changed run and serializing it grow with the run
//! (a 65,536-worker attempt is about 13 MiB). [`decide`] does all of it
//! from the version it is given, without the working state, so the head's
//! HTTP handlers do it off the actor's turn against the committed version
//! ([`prepare`]); the actor then only checks that the run is still that
//! version and applies the result ([`Runs::apply_prepared`]). A write
//! prepared on a version that is no longer the run's is prepared again.

use std::sync::Arc;

use trainstate_client::{EventKind, RunDocument, StateError};
use trainstate_schema::limits::MAX_ATTEMPT_HISTORY_BYTES;
use trainstate_schema::{
    ActorStatus, AttemptStatus, NewRun, RunAttemptDraft, RunId, RunStatus, ray_v2, validate_time,
};

use crate::decisions::goodput::BoardCount;

use super::{
    Change, Outcome, Runs, bound_attempt_history, end_run, not_ahead_of, ray_cause, recorded_after,
    replace_current_attempt,
};
use crate::decisions::change::{PendingEvent, StoreOp};
use crate::decisions::record::RunRecord;

/// One Ray Train V2 write: a whole run or a whole attempt document.
#[derive(Debug)]
pub(crate) enum RayWrite {
    /// `PUT /api/train/v2/runs/{id}`.
    Run(Box<ray_v2::TrainRun>),
    /// `PUT /api/train/v2/runs/{id}/attempts/{attempt_id}`.
    Attempt(Box<ray_v2::TrainRunAttempt>),
}

impl RayWrite {
    /// The run the write is about.
    pub(crate) fn run_id(&self) -> Result<RunId, StateError> {
        let id = match self {
            Self::Run(run) => &run.id,
            Self::Attempt(attempt) => &attempt.run_id,
        };
        Ok(RunId::parse(id)?)
    }
}

/// What a V2 write does to the version of its run it was decided on.
#[derive(Debug)]
pub(crate) enum RayDecision {
    /// Nothing: a repeat.
    Unchanged,
    /// A new run, with its record.
    Create(Arc<RunRecord>),
    /// The run's next version, and the event that announces it.
    Replace(Arc<RunRecord>, EventKind),
}

/// A V2 write decided off the actor's turn against one version of its
/// run: what the actor applies if the run is still that version.
#[derive(Debug)]
pub(crate) struct PreparedRayWrite {
    id: RunId,
    /// The version decided on; `None`: the run did not exist.
    base: Option<u64>,
    /// The write's time: when the run's last word was heard.
    at_ms: u64,
    decision: Result<RayDecision, StateError>,
}

/// Decides `write` against `base` (the committed version of its run, or
/// `None`), at `at_ms` (the write's time), with the head's clock reading
/// `now_ms`: every step that grows with the run, off the actor's turn.
#[cfg_attr(not(feature = "server"), allow(dead_code))]
pub(crate) fn prepare(
    base: Option<Arc<RunRecord>>,
    write: &RayWrite,
    at_ms: u64,
    now_ms: u64,
) -> Result<PreparedRayWrite, StateError> {
    let id = write.run_id()?;
    let decision = decide(base.as_ref(), write, at_ms, now_ms);
    Ok(PreparedRayWrite { id, base: base.map(|record| record.version), at_ms, decision })
}

/// Checks the times of a Ray Train V2 write (Unix ns): plausible once in
/// milliseconds, like every time a client writes, and not far ahead of
/// the head's clock (`now_ms`).
fn ray_times(start_time_ns: u64, end_time_ns: Option<u64>, now_ms: u64) -> Result<(), StateError> {
    let start = ray_v2::ns_to_ms(start_time_ns);
    validate_time("start_time_ns", start)?;
    not_ahead_of("start_time_ns", start, now_ms)?;
    if let Some(end) = end_time_ns.map(ray_v2::ns_to_ms) {
        validate_time("end_time_ns", end)?;
        not_ahead_of("end_time_ns", end, now_ms)?;
    }
    Ok(())
}

/// What `write` does to `base`, the version of its run it is decided on
/// (`None`: no such run), at `at_ms`, with the head's clock at `now_ms`.
pub(crate) fn decide(
    base: Option<&Arc<RunRecord>>,
    write: &RayWrite,
    at_ms: u64,
    now_ms: u64,
) -> Result<RayDecision, StateError> {
    match write {
        RayWrite::Run(v2) => decide_run(base, v2, at_ms, now_ms),
        RayWrite::Attempt(v2) => decide_attempt(base, v2, at_ms, now_ms),
    }
}

/// Creates or updates a run from Ray Train V2's whole run document.
fn decide_run(
    base: Option<&Arc<RunRecord>>,
    v2: &ray_v2::TrainRun,
    at_ms: u64,
    now_ms: u64,
) -> Result<RayDecision, StateError> {
    let id = RunId::parse(&v2.id)?;
    ray_times(v2.start_time_ns, v2.end_time_ns, now_ms)?;
    let Some(record) = base else {
        let mut draft = v2.to_draft();
        draft.cause = ray_cause(v2.status == RunStatus::Errored, &draft.status_detail);
        let run = NewRun::from_ray(draft.validate()?).into_run(at_ms);
        return Ok(RayDecision::Create(recorded_after(None, run, at_ms, BoardCount::default())?));
    };
    let stored = record.run()?;
    let conflict = |field: &str| StateError::Conflict {
        id: id.clone(),
        reason: format!("stored with a different {field}; a run's static metadata never changes"),
    };
    if stored.name() != v2.name {
        return Err(conflict("name"));
    }
    if stored.job_id() != v2.job_id {
        return Err(conflict("job_id"));
    }
    if stored.controller_actor_id() != v2.controller_actor_id {
        return Err(conflict("controller_actor_id"));
    }
    if stored.start_time_ms() != ray_v2::ns_to_ms(v2.start_time_ns) {
        return Err(conflict("start_time_ns"));
    }
    let (from, to) = (stored.status(), v2.status);
    if from.is_terminal() && !(record.lost_controller && to.is_terminal()) {
        return if from == to {
            Ok(RayDecision::Unchanged)
        } else {
            Err(StateError::IllegalTransition {
                id: id.clone(),
                from,
                to,
                reason: "a terminal status is final".into(),
            })
        };
    }
    let mut draft = stored.clone().into_draft();
    v2.apply_to(&mut draft);
    draft.cause = ray_cause(to == RunStatus::Errored, &draft.status_detail);
    if to.is_terminal() {
        let given = draft.end_time_ms;
        end_run(&mut draft, given, at_ms);
    }
    // Bounded before comparing, so that a repeat changes nothing.
    bound_attempt_history(&mut draft, MAX_ATTEMPT_HISTORY_BYTES);
    let changed = draft.validate()?;
    if changed == stored {
        return Ok(RayDecision::Unchanged);
    }
    let record = recorded_after(Some(&stored), changed, at_ms, BoardCount::default())?;
    Ok(RayDecision::Replace(record, EventKind::StatusChanged))
}

/// Creates or updates an attempt of a run from Ray Train V2's whole
/// attempt document.
fn decide_attempt(
    base: Option<&Arc<RunRecord>>,
    v2: &ray_v2::TrainRunAttempt,
    at_ms: u64,
    now_ms: u64,
) -> Result<RayDecision, StateError> {
    let id = RunId::parse(&v2.run_id)?;
    ray_times(v2.start_time_ns, v2.end_time_ns, now_ms)?;
    let record = base.ok_or_else(|| StateError::NotFound { id: id.clone() })?;
    let stored = record.run()?;
    let run_status = stored.status();
    let illegal = |reason: &str| StateError::IllegalTransition {
        id: id.clone(),
        from: run_status,
        to: run_status,
        reason: reason.to_owned(),
    };
    let start_time_ms = ray_v2::ns_to_ms(v2.start_time_ns);
    let end_time_ms = v2.end_time_ns.map(ray_v2::ns_to_ms);
    let detail = v2.status_detail.clone().unwrap_or_default();
    let cause = ray_cause(v2.status == AttemptStatus::Errored, &detail);
    let mut workers = v2.worker_drafts();
    if v2.status.is_terminal() {
        for worker in &mut workers {
            worker.status = ActorStatus::Dead;
        }
    }
    let mut draft = stored.clone().into_draft();
    let last = draft.attempts.len().checked_sub(1);
    let kind = match draft.attempts.iter().position(|a| a.attempt_id == v2.attempt_id) {
        Some(i) => {
            let existing = &mut draft.attempts[i];
            // An attempt of an ended run is final, like the run: only
            // the head's own lost-controller abort gives way to the
            // controller's late report.
            if let Some(ended) = existing
                .status
                .filter(|s| s.is_terminal() && run_status.is_terminal() && !record.lost_controller)
            {
                // (Back to live is an illegal transition, below.)
                if ended != v2.status && v2.status.is_terminal() {
                    return Err(StateError::Conflict {
                        id: id.clone(),
                        reason: format!(
                            "attempt {:?} of this ended run ended {}; an ended run's attempts \
                             are final, so its status cannot become {}; nothing was written",
                            v2.attempt_id,
                            ended.as_str(),
                            v2.status.as_str()
                        ),
                    });
                }
            }
            if existing.start_time_ms != start_time_ms {
                return Err(StateError::Conflict {
                    id: id.clone(),
                    reason: format!(
                        "attempt {:?} already exists with another start time",
                        v2.attempt_id
                    ),
                });
            }
            let was_terminal = existing.status.is_some_and(|s| s.is_terminal());
            if was_terminal && !v2.status.is_terminal() {
                return Err(illegal("a terminal attempt never moves back to live"));
            }
            existing.status = Some(v2.status);
            existing.status_detail = detail;
            existing.cause = cause;
            existing.end_time_ms = end_time_ms;
            if Some(i) == last {
                if !workers.is_empty() || v2.status.is_terminal() {
                    draft.workers = if workers.is_empty() {
                        std::mem::take(&mut draft.workers)
                    } else {
                        workers
                    };
                }
                if v2.status.is_terminal() {
                    for worker in &mut draft.workers {
                        worker.status = ActorStatus::Dead;
                    }
                }
            } else if !workers.is_empty() {
                existing.workers = Some(workers);
                existing.dropped_workers = None;
            }
            EventKind::StatusChanged
        }
        None => {
            // An ended run may still learn of its attempts, once they
            // have ended too (Ray's documents may arrive run first).
            if run_status.is_terminal() && !v2.status.is_terminal() {
                return Err(illegal("an ended run starts no new live attempts"));
            }
            let next = RunAttemptDraft {
                end_time_ms,
                status: Some(v2.status),
                status_detail: detail,
                cause,
                ..RunAttemptDraft::new(v2.attempt_id.clone(), start_time_ms)
            };
            replace_current_attempt(&mut draft, next, workers);
            EventKind::AttemptStarted
        }
    };
    // Bounded before comparing, so that a repeat changes nothing.
    bound_attempt_history(&mut draft, MAX_ATTEMPT_HISTORY_BYTES);
    let changed = draft.validate()?;
    if changed == stored {
        return Ok(RayDecision::Unchanged);
    }
    Ok(RayDecision::Replace(
        recorded_after(Some(&stored), changed, at_ms, BoardCount::default())?,
        kind,
    ))
}

impl Runs {
    /// Applies a V2 write in the actor's turn: decided against the working
    /// version of its run, at `at_ms`.
    pub(crate) fn upsert_ray(
        &mut self,
        write: &RayWrite,
        at_ms: u64,
        now_ms: u64,
    ) -> Result<Outcome<RunDocument>, StateError> {
        let id = write.run_id()?;
        let base = self.by_id.get(&id).map(|entry| entry.record.clone());
        let decision = decide(base.as_ref(), write, at_ms, self.wall_ms.unwrap_or(now_ms))?;
        self.apply_ray(&id, decision, at_ms)
    }

    /// Applies a V2 write prepared off the actor's turn, if its run is
    /// still the version it was decided on; `None` otherwise (the run
    /// changed since: it is prepared again).
    pub(crate) fn apply_prepared(
        &mut self,
        prepared: PreparedRayWrite,
    ) -> Option<Result<Outcome<RunDocument>, StateError>> {
        let current = self.by_id.get(&prepared.id).map(|entry| entry.record.version);
        if current != prepared.base {
            return None;
        }
        Some(prepared.decision.and_then(|d| self.apply_ray(&prepared.id, d, prepared.at_ms)))
    }

    /// Makes a decided V2 write the working state: what depends on the
    /// other runs (the bounds of live and retained runs) is checked here.
    fn apply_ray(
        &mut self,
        id: &RunId,
        decision: RayDecision,
        at_ms: u64,
    ) -> Result<Outcome<RunDocument>, StateError> {
        let (record, kind) = match decision {
            RayDecision::Unchanged => {
                let record = self.entry(id)?.record.clone();
                return Ok(Outcome::Unchanged(self.document(&record)));
            }
            RayDecision::Create(record) => {
                self.refuse_if_live_runs_full(&record)?;
                self.refuse_if_evicted_at_once(&record)?;
                (record, EventKind::Registered)
            }
            RayDecision::Replace(record, kind) => (record, kind),
        };
        self.refuse_if_live_bytes_full(&record)?;
        // A write from the controller is a sign of life, like a heartbeat.
        self.put(record.clone(), at_ms);
        let mut change = Change {
            ops: vec![StoreOp::Put(record.clone())],
            events: vec![PendingEvent { kind, run_id: id.clone(), record: Some(record.clone()) }],
            answer: self.document(&record),
        };
        if kind == EventKind::Registered {
            self.evict_over_capacity(&mut change.ops, &mut change.events);
        }
        Ok(Outcome::Changed(change))
    }
}
