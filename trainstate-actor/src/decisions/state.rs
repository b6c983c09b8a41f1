//! The run state machine: the actor's working state and every transition.
//!
//! The working state is ahead of the committed view by the writes in flight;
//! transitions are decided here, in message order, and their effects are
//! committed by the writer before anyone is answered.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use trainstate_client::{
    EventKind, NewAttempt, Registration, RunDocument, StateError, StatusUpdate,
};
use trainstate_schema::limits::{MAX_ATTEMPT_HISTORY_BYTES, MAX_STATUS_DETAIL_LEN};
use trainstate_schema::text::{errored_status_detail, last_chars};
use trainstate_schema::{
    ActorStatus, AttemptStatus, CauseClass, CauseKind, HealthState, NewRun, Rule, RunAttemptDraft,
    RunCause, RunHealth, RunId, RunStatus, TrainRunInfo, TrainRunInfoDraft, TrainWorkerInfoDraft,
    ValidationError, validate_client_cause, validate_time,
};

use crate::decisions::change::{PendingEvent, StoreOp};
use crate::decisions::goodput::{BoardCount, next_goodput};
use crate::decisions::liveness::{Beat, Liveness, NEVER_SWEPT};
use crate::decisions::record::RunRecord;
use crate::decisions::retention::Retention;

mod progress;
mod ray;
mod remote;

use remote::refuse_qualified;
#[cfg(test)]
mod tests;

/// How far ahead of the head's clock a time a client writes may be: a
/// day, for clocks that disagree; more is a clock far off, or a time in
/// the wrong unit, and would sort and age the run wrongly for years.
pub(crate) const MAX_AHEAD_OF_CLOCK_MS: u64 = 24 * 60 * 60 * 1000;

#[cfg(feature = "server")]
pub(crate) use ray::prepare as prepare_ray_write;
pub(crate) use ray::{PreparedRayWrite, RayWrite};
pub(crate) use remote::is_foreign;

/// The result of a request: either nothing to write (a repeat), or a change
/// to commit before answering.
pub(crate) enum Outcome<T> {
    Unchanged(T),
    Changed(Change<T>),
}

impl<T> Outcome<T> {
    /// The same outcome, with its answer mapped by `f`.
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Outcome<U> {
        match self {
            Self::Unchanged(answer) => Outcome::Unchanged(f(answer)),
            Self::Changed(Change { ops, events, answer }) => {
                Outcome::Changed(Change { ops, events, answer: f(answer) })
            }
        }
    }
}

/// Writes to commit, events to announce after, and the answer.
pub(crate) struct Change<T> {
    pub(crate) ops: Vec<StoreOp>,
    pub(crate) events: Vec<PendingEvent>,
    pub(crate) answer: T,
}

struct Entry {
    record: Arc<RunRecord>,
    /// When the controller was last heard from, on the wall clock (live
    /// runs; memory only): what `last_heartbeat_ms` shows; and when the
    /// run's lease last began, on the monotonic clock: what the sweep
    /// decides on (see [`Runs::lease_now`]). Shared with the connections
    /// that take heartbeats without the actor ([`crate::decisions::liveness`]). Live
    /// runs only: nothing is heard from an ended run.
    beat: Option<Arc<Beat>>,
}

impl Entry {
    /// When a live run was last heard from; `None` for an ended run.
    fn last_heard_ms(&self) -> Option<u64> {
        self.beat.as_ref().map(|beat| beat.heard_ms())
    }

    fn lease_from_ms(&self) -> u64 {
        self.beat.as_ref().map_or(NEVER_SWEPT, |beat| beat.lease_from_ms())
    }

    /// A live run's beat (every live run has one).
    fn live_beat(&self) -> Option<&Beat> {
        self.beat.as_deref()
    }
}

/// Every retained run, as the actor sees it (committed and in flight).
pub(crate) struct Runs {
    by_id: HashMap<RunId, Entry>,
    /// Ended runs by (start_time_ms, id): eviction takes the oldest first.
    ended: BTreeSet<(u64, RunId)>,
    lease: Duration,
    retention: Retention,
    /// The monotonic reading of the actor's current turn; `None` until set
    /// (pure-state tests), when the wall times given to each call stand in.
    monotonic_ms: Option<u64>,
    /// Other heads' heartbeats as last read from a shared store: the wall
    /// time read, and this head's monotonic time when it was read.
    shared_heard: HashMap<RunId, (u64, u64)>,
    /// When every shared heartbeat was last read, on the monotonic clock.
    shared_read_mono_ms: Option<u64>,
    /// The bytes of JSON of every run in `by_id`, of their stack captures
    /// and of their metric histories, for retention by bytes.
    bytes: u64,
    /// The bytes of each run's stack captures (runs that have some).
    capture_bytes: HashMap<RunId, u64>,
    /// The bytes of each run's metric histories (runs that have some), as
    /// the store last answered (see `store/metrics.rs`).
    history_bytes: HashMap<RunId, u64>,
    /// The part of `bytes` that live runs take (their JSON, captures and
    /// histories), for [`Retention::live_bytes_bound`].
    live_bytes: u64,
    /// The wall clock's reading of the actor's current turn; `None` until
    /// set (pure-state tests), when the times given to each call stand in.
    wall_ms: Option<u64>,
    /// Where every entry's beat is published.
    liveness: Arc<Liveness>,
}

impl Runs {
    /// The working state after loading the store. Every live run gets a
    /// fresh lease from `now`, on the wall clock standing in for the
    /// monotonic one (pure-state tests; the actor uses [`Runs::load_at`]).
    #[allow(dead_code)]
    pub(crate) fn load(
        records: Vec<Arc<RunRecord>>,
        now_ms: u64,
        lease: Duration,
        retention: Retention,
    ) -> Self {
        Self::load_at(records, now_ms, None, lease, retention, Arc::default())
    }

    /// [`Runs::load`], with leases on the monotonic clock reading
    /// `monotonic_ms` (see [`Runs::set_monotonic`]).
    pub(crate) fn load_at(
        records: Vec<Arc<RunRecord>>,
        now_ms: u64,
        monotonic_ms: Option<u64>,
        lease: Duration,
        retention: Retention,
        liveness: Arc<Liveness>,
    ) -> Self {
        liveness.clear_beats();
        liveness.clear_controller_progress();
        let mut runs = Self {
            by_id: HashMap::with_capacity(records.len()),
            ended: BTreeSet::new(),
            lease,
            retention,
            monotonic_ms,
            shared_heard: HashMap::new(),
            shared_read_mono_ms: None,
            bytes: 0,
            capture_bytes: HashMap::new(),
            history_bytes: HashMap::new(),
            live_bytes: 0,
            wall_ms: None,
            liveness,
        };
        for record in records {
            runs.put(record, now_ms);
        }
        runs
    }

    /// Sets the monotonic reading that this turn's lease decisions are made
    /// on (the actor calls it before every message). Leases compare only
    /// monotonic times, so a step of the wall clock neither expires nor
    /// extends one; the wall times the calls are given are what is stored
    /// and shown.
    pub(crate) fn set_monotonic(&mut self, monotonic_ms: u64) {
        self.monotonic_ms = Some(monotonic_ms);
    }

    /// The lease of a live run, in ms.
    pub(crate) fn lease_ms(&self) -> u64 {
        self.lease.as_millis() as u64
    }

    /// Sets the wall clock's reading of this turn: what a time a client
    /// writes may be at most [`MAX_AHEAD_OF_CLOCK_MS`] ahead of.
    pub(crate) fn set_wall(&mut self, wall_ms: u64) {
        self.wall_ms = Some(wall_ms);
    }

    /// Refuses a time a client writes (`path`, Unix ms) more than
    /// [`MAX_AHEAD_OF_CLOCK_MS`] ahead of the head's clock (this turn's
    /// reading, or `now_ms` when none was set).
    pub(crate) fn not_ahead(
        &self,
        path: &str,
        time_ms: u64,
        now_ms: u64,
    ) -> Result<(), StateError> {
        let now = self.wall_ms.unwrap_or(now_ms);
        not_ahead_of(path, time_ms, now)
    }

    /// Now, on the clock leases are decided on: the monotonic reading of
    /// this turn, or `wall_ms` when none was set.
    pub(crate) fn lease_now(&self, wall_ms: u64) -> u64 {
        self.monotonic_ms.unwrap_or(wall_ms)
    }

    /// Gives every live run this head sweeps a fresh lease from now, as
    /// after a restart: for when the head was not running (a late sweep)
    /// and so could not hear their heartbeats. Returns how many.
    pub(crate) fn renew_leases(&mut self, now_ms: u64) -> usize {
        let from = self.lease_now(now_ms);
        let mut renewed = 0;
        for entry in self.by_id.values() {
            if let Some(beat) = entry.live_beat().filter(|b| b.lease_from_ms() != NEVER_SWEPT) {
                beat.raise(0, from);
                renewed += 1;
            }
        }
        renewed
    }

    pub(crate) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// How many runs are live (not ended).
    pub(crate) fn live(&self) -> usize {
        self.by_id.len().saturating_sub(self.ended.len())
    }

    /// Refuses a new run this head does not take from a writer of its own
    /// cluster: one with a qualified id (only a hub's forwarding makes
    /// those, see [`Runs::upsert`]), or a live run past the bound on live
    /// runs (see [`Runs::refuse_past_live_bound`]).
    fn refuse_if_live_runs_full(&self, record: &RunRecord) -> Result<(), StateError> {
        refuse_qualified(&record.id)?;
        self.refuse_past_live_bound(record)
    }

    /// Refuses a new live run past the bound on live runs
    /// ([`Retention::max_live_runs`]), whatever its source: live runs are
    /// never evicted, so they are bounded here, at admission. A run already
    /// known, or one that arrives ended, is not refused.
    fn refuse_past_live_bound(&self, record: &RunRecord) -> Result<(), StateError> {
        if record.status.is_terminal() || self.by_id.contains_key(&record.id) {
            return Ok(());
        }
        let max = self.retention.max_live_runs;
        if self.live() >= max {
            return Err(StateError::TooManyLiveRuns { max: max as u64 });
        }
        Ok(())
    }

    /// The bytes run `id` takes (its JSON, captures and histories) when it
    /// is live; 0 for an ended run or one not kept.
    fn live_part(&self, id: &RunId) -> u64 {
        match self.by_id.get(id) {
            Some(entry) if !entry.record.status.is_terminal() => {
                record_bytes(&entry.record) + self.side_bytes_of(id)
            }
            _ => 0,
        }
    }

    /// The bytes of run `id`'s stack captures and metric histories.
    fn side_bytes_of(&self, id: &RunId) -> u64 {
        self.capture_bytes.get(id).copied().unwrap_or(0)
            + self.history_bytes.get(id).copied().unwrap_or(0)
    }

    /// Refuses a write that would make `record` its run's version when
    /// that grows the live runs past their bound on bytes
    /// ([`Retention::live_bytes_bound`]): live runs are never evicted, so
    /// their bytes are bounded here, at every write that grows them (a new
    /// live run, a new attempt's worker table, any larger version). A write
    /// that ends a run, or leaves it no larger, is always taken.
    fn refuse_if_live_bytes_full(&self, record: &RunRecord) -> Result<(), StateError> {
        if record.status.is_terminal() {
            return Ok(());
        }
        let before = self.live_part(&record.id);
        let after = record_bytes(record) + self.side_bytes_of(&record.id);
        if after <= before {
            return Ok(());
        }
        let max = self.retention.live_bytes_bound();
        let live = self.live_bytes;
        let would_be = live - before + after;
        if would_be <= max {
            return Ok(());
        }
        Err(StateError::unavailable(format!(
            "the head keeps at most {max} bytes of live runs (--max-live-bytes, which defaults \
             to --max-retained-bytes): the live runs take {live} bytes and this write would bring \
             them to {would_be} ({} bytes for run {}); nothing was stored; retry when a live run \
             ends",
            after, record.id
        )))
    }

    fn put(&mut self, record: Arc<RunRecord>, last_heard_ms: u64) {
        let live_before = self.live_part(&record.id);
        self.follow_progress(&record);
        if record.status.is_terminal() {
            self.ended.insert((record.start_time_ms, record.id.clone()));
        }
        let id = record.id.clone();
        let id_of_put = id.clone();
        let lease_from_ms = match last_heard_ms {
            NEVER_SWEPT => NEVER_SWEPT,
            wall_ms => self.lease_now(wall_ms),
        };
        self.bytes += record_bytes(&record);
        let previous_beat = self.by_id.get(&id).and_then(|previous| previous.beat.clone());
        let beat = match previous_beat {
            _ if record.status.is_terminal() => {
                self.liveness.remove_beat(&id);
                None
            }
            Some(beat) => {
                beat.set(last_heard_ms, lease_from_ms, record.status);
                Some(beat)
            }
            None => {
                let beat = Arc::new(Beat::new(last_heard_ms, lease_from_ms, record.status));
                self.liveness.put_beat(id.clone(), beat.clone());
                Some(beat)
            }
        };
        if let Some(previous) = self.by_id.insert(id, Entry { record, beat }) {
            self.bytes -= record_bytes(&previous.record);
            let now_live = !self.by_id[&previous.record.id].record.status.is_terminal();
            if previous.record.status.is_terminal() && now_live {
                // Another head's version may be behind ours: keep `ended` exact.
                self.ended.remove(&(previous.record.start_time_ms, previous.record.id.clone()));
            }
            remote::note_base(&self.by_id[&previous.record.id].record, &previous.record);
        }
        let live_after = self.live_part(&id_of_put);
        self.live_bytes = self.live_bytes - live_before + live_after;
    }

    fn remove(&mut self, id: &RunId) -> Option<Arc<RunRecord>> {
        self.live_bytes -= self.live_part(id);
        let entry = self.by_id.remove(id)?;
        self.liveness.remove_beat(id);
        if self.controller_board(id).is_some() {
            self.liveness.remove_progress(id);
        }
        self.bytes -= record_bytes(&entry.record);
        self.bytes -= self.capture_bytes.remove(id).unwrap_or(0);
        self.bytes -= self.history_bytes.remove(id).unwrap_or(0);
        self.ended.remove(&(entry.record.start_time_ms, id.clone()));
        Some(entry.record)
    }

    fn entry(&self, id: &RunId) -> Result<&Entry, StateError> {
        self.by_id.get(id).ok_or_else(|| StateError::NotFound { id: id.clone() })
    }

    /// A live run's last heartbeat; `None` for ended or unknown runs.
    pub(crate) fn heartbeat_of(&self, record: &RunRecord) -> Option<u64> {
        if record.status.is_terminal() {
            return None;
        }
        self.by_id.get(&record.id).and_then(Entry::last_heard_ms).filter(|&t| t != NEVER_SWEPT)
    }

    fn document(&self, record: &Arc<RunRecord>) -> RunDocument {
        record.document(self.heartbeat_of(record))
    }

    /// Registers a run, or recognises a repeat of the same registration.
    pub(crate) fn register(
        &mut self,
        new: NewRun,
        now_ms: u64,
    ) -> Result<Outcome<Registration>, StateError> {
        refuse_qualified(new.run().id())?;
        self.registered_times_not_ahead(new.run(), now_ms)?;
        let lease_from_ms = self.lease_now(now_ms);
        if let Some(entry) = self.by_id.get_mut(new.run().id()) {
            // Compared with what the record keeps: the stored JSON is not parsed.
            if let Some(field) = entry.record.static_difference(new.run()) {
                return Err(StateError::Conflict {
                    id: new.run().id().clone(),
                    reason: format!(
                        "already registered with a different {field}; a run's static metadata never changes"
                    ),
                });
            }
            if let Some(beat) = entry.live_beat() {
                beat.set_heard(now_ms, lease_from_ms);
            }
            let record = entry.record.clone();
            return Ok(Outcome::Unchanged(Registration::new(
                self.document(&record),
                self.lease,
                false,
            )));
        }

        let record = self.recorded(new.into_run(now_ms), now_ms)?;
        self.refuse_if_live_runs_full(&record)?;
        self.refuse_if_live_bytes_full(&record)?;
        self.refuse_if_evicted_at_once(&record)?;
        let id = record.id.clone();
        self.put(record.clone(), now_ms);

        let mut change = Change {
            ops: vec![StoreOp::Put(record.clone())],
            events: vec![PendingEvent {
                kind: EventKind::Registered,
                run_id: id,
                record: Some(record.clone()),
            }],
            answer: Registration::new(self.document(&record), self.lease, true),
        };
        self.evict_over_capacity(&mut change.ops, &mut change.events);
        Ok(Outcome::Changed(change))
    }

    /// Sets a run's status along a legal transition, as a client asks: the
    /// rules of what a client may write hold (a plausible end, not before
    /// the current attempt's start; a cause only on a failure, never
    /// `LOST_CONTROLLER`, naming one of the run's ranks).
    pub(crate) fn set_status(
        &mut self,
        id: &RunId,
        update: StatusUpdate,
        now_ms: u64,
    ) -> Result<Outcome<RunDocument>, StateError> {
        let record = self.entry(id)?.record.clone();
        let failed = matches!(update.status, RunStatus::Errored | RunStatus::Aborted);
        if update.cause.is_some() && !failed {
            return Err(StateError::invalid("cause", "only an ERRORED or ABORTED run has a cause"));
        }
        if update.cause.is_some() || update.end_time_ms.is_some() {
            let run = record.run()?;
            validate_client_cause("cause", update.cause.clone(), failed, run.workers().len())?;
            if let Some(end) = update.end_time_ms {
                validate_time("end_time_ms", end)?;
                self.not_ahead("end_time_ms", end, now_ms)?;
                let current_start = run.attempts().last().map(|a| a.start_time_ms());
                if current_start.is_some_and(|start| end < start) {
                    return Err(
                        ValidationError::new("end_time_ms", Rule::EndBeforeAttemptStart).into()
                    );
                }
            }
        }
        self.apply_status(id, update, now_ms)
    }

    /// Sets a run's status along a legal transition: the head's own
    /// writes (a lost-controller abort) as well as a client's.
    fn apply_status(
        &mut self,
        id: &RunId,
        update: StatusUpdate,
        now_ms: u64,
    ) -> Result<Outcome<RunDocument>, StateError> {
        let record = self.entry(id)?.record.clone();
        let mut update = update;
        if update.cause.is_some() {
            update.cause = classified(update.cause, was_stalled(&record)?);
        }
        let from = record.status;
        let to = update.status;
        let illegal = |reason: &str| StateError::IllegalTransition {
            id: id.clone(),
            from,
            to,
            reason: reason.to_owned(),
        };
        if to.is_live() {
            if from.is_terminal() {
                return Err(illegal("a terminal status is final"));
            }
            if from == to {
                return Ok(Outcome::Unchanged(self.document(&record)));
            }
            // Any live status may move to any other: a sub-status change.
            let mut draft = record.run()?.into_draft();
            draft.run_status = to.v1();
            draft.status = Some(to);
            draft.status_detail = last_chars(&update.detail, MAX_STATUS_DETAIL_LEN).to_owned();
            return Ok(Outcome::Changed(self.replace(draft, EventKind::StatusChanged, now_ms)?));
        }
        if from.is_terminal() {
            let stored = record.run()?;
            if from == to && stored.cause() == update.cause {
                return Ok(Outcome::Unchanged(self.document(&record)));
            }
            if !record.lost_controller {
                return Err(illegal("a terminal status is final"));
            }
            // The controller's own late report replaces a lost-controller abort.
        }

        let mut draft = record.run()?.into_draft();
        draft.run_status = to;
        draft.status = Some(to);
        draft.status_detail = failure_detail(to, update.cause.as_ref(), &update.detail);
        draft.cause = update.cause;
        end_run(&mut draft, update.end_time_ms, now_ms);
        Ok(Outcome::Changed(self.replace(draft, EventKind::StatusChanged, now_ms)?))
    }

    /// The status of run `id` in the working state.
    pub(crate) fn status_of(&self, id: &RunId) -> Option<RunStatus> {
        self.by_id.get(id).map(|e| e.record.status)
    }

    /// Ends a live run's current attempt with a failure its launcher
    /// recovers from: the attempt keeps the failure (`update`'s status,
    /// detail and cause), its workers are marked DEAD, and the run is
    /// RESTARTING until its next attempt starts. A repeat is a no-op.
    pub(crate) fn fail_attempt(
        &mut self,
        id: &RunId,
        update: StatusUpdate,
        now_ms: u64,
    ) -> Result<Outcome<RunDocument>, StateError> {
        let record = self.entry(id)?.record.clone();
        if record.status.is_terminal() || !update.status.is_terminal() {
            return Err(StateError::IllegalTransition {
                id: id.clone(),
                from: record.status,
                to: RunStatus::Restarting,
                reason: "only a live run's attempt fails and restarts".into(),
            });
        }
        let mut update = update;
        update.cause = classified(update.cause, was_stalled(&record)?);
        let mut draft = record.run()?.into_draft();
        if draft.attempts.is_empty() {
            let first = RunAttemptDraft::new(NewRun::FIRST_ATTEMPT_ID, draft.start_time_ms);
            draft.attempts.push(first);
        }
        let current = draft.attempts.last_mut().expect("an attempt was added");
        if current.end_time_ms.is_some() {
            return Ok(Outcome::Unchanged(self.document(&record)));
        }
        let detail = failure_detail(update.status, update.cause.as_ref(), &update.detail);
        current.end_time_ms = Some(update.end_time_ms.unwrap_or(now_ms).max(current.start_time_ms));
        current.status = AttemptStatus::ending(update.status);
        current.cause = update.cause.clone();
        let attempt_id = current.attempt_id.clone();
        let headline = detail.lines().next().unwrap_or_default().trim_end().to_owned();
        current.status_detail = detail;
        for worker in &mut draft.workers {
            worker.status = ActorStatus::Dead;
        }
        draft.status = Some(RunStatus::Restarting);
        draft.run_status = RunStatus::Restarting.v1();
        draft.status_detail = last_chars(
            &format!("Restarting: attempt {attempt_id} {}. {headline}", update.status.as_str()),
            MAX_STATUS_DETAIL_LEN,
        )
        .to_owned();
        Ok(Outcome::Changed(self.replace(draft, EventKind::StatusChanged, now_ms)?))
    }

    /// Replaces a live run's worker group with a new attempt.
    pub(crate) fn start_attempt(
        &mut self,
        id: &RunId,
        attempt: NewAttempt,
        now_ms: u64,
    ) -> Result<Outcome<RunDocument>, StateError> {
        validate_time("start_time_ms", attempt.start_time_ms)?;
        self.not_ahead("start_time_ms", attempt.start_time_ms, now_ms)?;
        let record = self.entry(id)?.record.clone();
        let run = record.run()?;
        if let Some(existing) = run.attempts().iter().find(|a| a.attempt_id() == attempt.attempt_id)
        {
            let is_current =
                run.attempts().last().map(|a| a.attempt_id()) == Some(existing.attempt_id());
            let same_workers = run.workers().len() == attempt.workers.len()
                && run.workers().iter().zip(&attempt.workers).all(|(a, b)| a.same_identity(b));
            return if is_current
                && same_workers
                && existing.start_time_ms() == attempt.start_time_ms
            {
                Ok(Outcome::Unchanged(self.document(&record)))
            } else {
                Err(StateError::Conflict {
                    id: id.clone(),
                    reason: format!(
                        "attempt {:?} already exists with other workers or start time",
                        attempt.attempt_id
                    ),
                })
            };
        }
        if record.status.is_terminal() {
            return Err(StateError::IllegalTransition {
                id: id.clone(),
                from: record.status,
                to: record.status,
                reason: "an ended run starts no new attempts".into(),
            });
        }

        let mut draft = run.into_draft();
        if draft.attempts.is_empty() {
            let first = RunAttemptDraft::new(NewRun::FIRST_ATTEMPT_ID, draft.start_time_ms);
            draft.attempts.push(first);
        }
        let workers = attempt.workers.into_iter().map(|w| w.into_draft()).collect();
        replace_current_attempt(
            &mut draft,
            RunAttemptDraft::new(attempt.attempt_id, attempt.start_time_ms),
            workers,
        );
        Ok(Outcome::Changed(self.replace(draft, EventKind::AttemptStarted, now_ms)?))
    }

    /// Refuses a registration any of whose times is far ahead of the
    /// head's clock (see [`Runs::not_ahead`]).
    fn registered_times_not_ahead(
        &self,
        run: &TrainRunInfo,
        now_ms: u64,
    ) -> Result<(), StateError> {
        self.not_ahead("start_time_ms", run.start_time_ms(), now_ms)?;
        if let Some(end) = run.end_time_ms() {
            self.not_ahead("end_time_ms", end, now_ms)?;
        }
        for (i, attempt) in run.attempts().iter().enumerate() {
            self.not_ahead(
                &format!("attempts[{i}].start_time_ms"),
                attempt.start_time_ms(),
                now_ms,
            )?;
            if let Some(end) = attempt.end_time_ms() {
                self.not_ahead(&format!("attempts[{i}].end_time_ms"), end, now_ms)?;
            }
        }
        for (i, change) in run.status_history().iter().enumerate() {
            self.not_ahead(&format!("status_history[{i}].at_ms"), change.at_ms, now_ms)?;
        }
        Ok(())
    }

    /// Validates a changed run, makes it the run's latest version, and
    /// returns the write that commits it and the event that announces it.
    /// The worker lists of its ended attempts are bounded first
    /// ([`bound_attempt_history`]); a run still too large is refused and
    /// nothing changes.
    fn replace(
        &mut self,
        mut draft: TrainRunInfoDraft,
        kind: EventKind,
        now_ms: u64,
    ) -> Result<Change<RunDocument>, StateError> {
        bound_attempt_history(&mut draft, MAX_ATTEMPT_HISTORY_BYTES);
        let record = self.recorded(draft.validate()?, now_ms)?;
        self.refuse_if_live_bytes_full(&record)?;
        // A write from the controller is a sign of life, like a heartbeat.
        self.put(record.clone(), now_ms);
        Ok(Change {
            ops: vec![StoreOp::Put(record.clone())],
            events: vec![PendingEvent {
                kind,
                run_id: record.id.clone(),
                record: Some(record.clone()),
            }],
            answer: self.document(&record),
        })
    }

    /// The record of a new version of a run, decided at `at_ms`: its status
    /// is appended to its `status_history` when it is not the status the
    /// run had (for a new run, not the last its history names). Every
    /// change and registration passes here on its way to the store, so
    /// every status change is recorded, whichever transition made it.
    ///
    /// The run's goodput is counted here too (see
    /// [`crate::decisions::goodput::next_goodput`]), with what the progress
    /// board of its attempt counted since its last version, taken now.
    fn recorded(&self, run: TrainRunInfo, at_ms: u64) -> Result<Arc<RunRecord>, StateError> {
        let before = match self.by_id.get(run.id()) {
            Some(entry) => Some(entry.record.run()?),
            None => None,
        };
        let count = self.liveness.progress(run.id()).map(|b| b.take_goodput()).unwrap_or_default();
        recorded_after(before.as_ref(), run, at_ms, count)
    }

    /// Writes the highest checkpoint mark of run `id`'s current attempt
    /// on the run, as a new version, when its progress board has one not
    /// written yet (the health sweep's write: not a sign of life).
    pub(crate) fn write_checkpoint(
        &mut self,
        id: &RunId,
        now_ms: u64,
    ) -> Result<Outcome<()>, StateError> {
        let record = self.entry(id)?.record.clone();
        let due = self.liveness.progress(id).is_some_and(|board| board.mark_due());
        if record.status.is_terminal() || !due {
            return Ok(Outcome::Unchanged(()));
        }
        let record = self.recorded(record.run()?, now_ms)?;
        self.replace_keeping_beat(record.clone());
        Ok(Outcome::Changed(Change {
            ops: vec![StoreOp::Put(record.clone())],
            events: vec![PendingEvent {
                kind: EventKind::StatusChanged,
                run_id: id.clone(),
                record: Some(record),
            }],
            answer: (),
        }))
    }

    /// Renews a live run's lease.
    pub(crate) fn heartbeat(&mut self, id: &RunId, now_ms: u64) -> Result<Duration, StateError> {
        let lease = self.lease;
        let lease_from_ms = self.lease_now(now_ms);
        let entry =
            self.by_id.get_mut(id).ok_or_else(|| StateError::NotFound { id: id.clone() })?;
        if entry.record.status.is_terminal() {
            return Err(StateError::IllegalTransition {
                id: id.clone(),
                from: entry.record.status,
                to: RunStatus::Running,
                reason: "the run has ended; heartbeats are for live runs".into(),
            });
        }
        if let Some(beat) = entry.live_beat() {
            beat.set_heard(now_ms, lease_from_ms);
        }
        Ok(lease)
    }

    /// The health of run `id` as last written; `None` for a run with
    /// none, or one not known.
    pub(crate) fn health_of(&self, id: &RunId) -> Option<RunHealth> {
        let record = &self.by_id.get(id)?.record;
        record.health?;
        let run = record.run().ok()?;
        run.health().cloned()
    }

    /// Writes a live run's new health (and appends it to its
    /// `health_history`, dated `now_ms`: for a stall's end, the advance
    /// that ended it), as the head decided it. Not a sign of
    /// life: the run's lease stays as it was. An ended run keeps the
    /// health it had.
    pub(crate) fn set_health(
        &mut self,
        id: &RunId,
        health: RunHealth,
        now_ms: u64,
    ) -> Result<Outcome<()>, StateError> {
        let record = self.entry(id)?.record.clone();
        if record.status.is_terminal() {
            return Ok(Outcome::Unchanged(()));
        }
        let run = record.run()?.with_health(health, now_ms)?;
        let record = self.recorded(run, now_ms)?;
        self.replace_keeping_beat(record.clone());
        Ok(Outcome::Changed(Change {
            ops: vec![StoreOp::Put(record.clone())],
            events: vec![PendingEvent {
                kind: EventKind::HealthChanged,
                run_id: id.clone(),
                record: Some(record),
            }],
            answer: (),
        }))
    }

    /// Counts `bytes` of stack captures for run `id` against the retained
    /// bytes (instead of what was counted before); a run not kept counts
    /// none.
    pub(crate) fn set_capture_bytes(&mut self, id: &RunId, bytes: u64) {
        if !self.by_id.contains_key(id) {
            return;
        }
        let live_before = self.live_part(id);
        let before = self.capture_bytes.insert(id.clone(), bytes).unwrap_or(0);
        self.bytes = self.bytes + bytes - before;
        self.live_bytes = self.live_bytes - live_before + self.live_part(id);
    }

    /// Counts `bytes` of metric histories for run `id` against the
    /// retained bytes (instead of what was counted before), as the store
    /// answered a flush or a load; a run not kept counts none. A run whose
    /// histories bring the retained bytes past their bound makes the oldest
    /// ended runs evicted, with theirs, at the next write or sweep.
    pub(crate) fn set_history_bytes(&mut self, id: &RunId, bytes: u64) {
        if !self.by_id.contains_key(id) {
            return;
        }
        let live_before = self.live_part(id);
        let before = self.history_bytes.insert(id.clone(), bytes).unwrap_or(0);
        self.bytes = self.bytes + bytes - before;
        self.live_bytes = self.live_bytes - live_before + self.live_part(id);
    }

    /// The bytes of every run's stack captures and metric histories: what
    /// a reload of the runs' records keeps counting.
    pub(crate) fn side_bytes(&self) -> [HashMap<RunId, u64>; 2] {
        [self.capture_bytes.clone(), self.history_bytes.clone()]
    }

    /// Counts again the bytes [`Runs::side_bytes`] took, for the runs kept.
    pub(crate) fn restore_side_bytes(&mut self, [captures, histories]: [HashMap<RunId, u64>; 2]) {
        for (id, bytes) in captures {
            self.set_capture_bytes(&id, bytes);
        }
        for (id, bytes) in histories {
            self.set_history_bytes(&id, bytes);
        }
    }

    /// True when more runs, or more bytes of runs, are kept than retention
    /// allows and an ended run could be evicted.
    pub(crate) fn over_capacity(&self) -> bool {
        let over =
            self.by_id.len() > self.retention.max_runs || self.bytes > self.retention.max_bytes;
        over && !self.ended.is_empty()
    }

    /// Evicts the oldest ended runs while more is kept than retention
    /// allows: what the actor writes when the store's answer to a flush of
    /// metric points brought the retained bytes past their bound.
    pub(crate) fn evict_excess(&mut self) -> Change<()> {
        let mut change = Change { ops: Vec::new(), events: Vec::new(), answer: () };
        self.evict_over_capacity(&mut change.ops, &mut change.events);
        change
    }

    /// Writes `capture` into a live run's STALLED health (the stack
    /// capture its stall opened, as it now stands), as a health change:
    /// its event carries the capture. Any other run is left as it is.
    pub(crate) fn set_stall_capture(
        &mut self,
        id: &RunId,
        capture: trainstate_schema::StallCapture,
        now_ms: u64,
    ) -> Result<Outcome<()>, StateError> {
        let record = self.entry(id)?.record.clone();
        if record.status.is_terminal() || record.health != Some(HealthState::Stalled) {
            return Ok(Outcome::Unchanged(()));
        }
        let run = record.run()?.with_stall_capture(capture);
        let record = self.recorded(run, now_ms)?;
        self.replace_keeping_beat(record.clone());
        Ok(Outcome::Changed(Change {
            ops: vec![StoreOp::Put(record.clone())],
            events: vec![PendingEvent {
                kind: EventKind::HealthChanged,
                run_id: id.clone(),
                record: Some(record),
            }],
            answer: (),
        }))
    }

    /// Makes `record` its run's latest version, with the same status, and
    /// leaves the run's beat as it is (a write of the head's own, not a
    /// sign of life).
    fn replace_keeping_beat(&mut self, record: Arc<RunRecord>) {
        let bytes = record_bytes(&record);
        let id = record.id.clone();
        let live_before = self.live_part(&id);
        let Some(entry) = self.by_id.get_mut(&id) else { return };
        let previous = std::mem::replace(&mut entry.record, record);
        self.bytes = self.bytes + bytes - record_bytes(&previous);
        remote::note_base(&entry.record, &previous);
        self.live_bytes = self.live_bytes - live_before + self.live_part(&id);
    }

    /// Deletes an ended run.
    pub(crate) fn delete(&mut self, id: &RunId) -> Result<Outcome<()>, StateError> {
        let status = self.entry(id)?.record.status;
        if !status.is_terminal() {
            return Err(StateError::IllegalTransition {
                id: id.clone(),
                from: status,
                to: status,
                reason: "only an ended run can be deleted".into(),
            });
        }
        self.remove(id);
        Ok(Outcome::Changed(Change {
            ops: vec![StoreOp::Delete(id.clone())],
            events: vec![PendingEvent {
                kind: EventKind::Deleted,
                run_id: id.clone(),
                record: None,
            }],
            answer: (),
        }))
    }

    /// Aborts every live run whose lease expired (on the monotonic clock),
    /// and evicts ended runs past the retention age (on the wall clock: ages
    /// are of stored times). Every live run this head sweeps is leased, a
    /// run Ray Train V2 writes too: each of its writes renews its lease, as
    /// a heartbeat does, and one its source stopped telling about is
    /// aborted like a run whose controller was lost (see [`lost_detail`]).
    pub(crate) fn sweep(&mut self, now_ms: u64) -> Change<Vec<RunId>> {
        let lease_ms = self.lease.as_millis() as u64;
        let lease_now = self.lease_now(now_ms);
        // A heartbeat a connection takes meanwhile may stamp a lease later
        // than this turn's reading: each lease is read once.
        let expired: Vec<(Arc<RunRecord>, u64, u64)> = self
            .by_id
            .values()
            .filter(|e| !e.record.status.is_terminal())
            .filter_map(|e| {
                let silent_ms = lease_now.saturating_sub(e.lease_from_ms());
                let heard = e.last_heard_ms().unwrap_or_default();
                (silent_ms > lease_ms).then(|| (e.record.clone(), heard, silent_ms))
            })
            .collect();
        let mut change = Change { ops: Vec::new(), events: Vec::new(), answer: Vec::new() };
        for (record, last_heard_ms, silent_ms) in expired {
            let id = record.id.clone();
            let detail = lost_detail(&record, last_heard_ms, silent_ms, self.lease);
            // The end is stamped by `set_status`, never before the run's start,
            // even when the head's clock is behind the controller's. A run of
            // the rendezvous ended when its ranks were last heard from: the
            // lease only decides when that is concluded.
            let mut update = StatusUpdate::aborted(CauseKind::LostController, detail);
            if of_rendezvous(&record) && last_heard_ms > 0 {
                update.end_time_ms = Some(last_heard_ms.max(record.start_time_ms));
            }
            match self.apply_status(&id, update, now_ms) {
                Ok(Outcome::Changed(abort)) => {
                    change.ops.extend(abort.ops);
                    change.events.extend(abort.events);
                    change.answer.push(id);
                }
                Ok(Outcome::Unchanged(_)) => {}
                Err(err) => tracing::error!(run = %id, error = %err, "cannot abort an expired run"),
            }
        }
        if let Some(max_age) = self.retention.max_age {
            let max_age_ms = max_age.as_millis() as u64;
            let too_old: Vec<RunId> = self
                .ended
                .iter()
                .filter(|(_, id)| {
                    self.by_id[id]
                        .record
                        .end_time_ms
                        .is_some_and(|end| now_ms.saturating_sub(end) > max_age_ms)
                })
                .map(|(_, id)| id.clone())
                .collect();
            for id in too_old {
                self.evict(&id, &mut change.ops, &mut change.events);
            }
        }
        self.evict_over_capacity(&mut change.ops, &mut change.events);
        change
    }

    /// Refuses a new run that the commit storing it would evict at once:
    /// an ended run that, with the oldest ended runs evicted first while
    /// more runs or more bytes are kept than retention allows, would be
    /// evicted itself. Answering "created" for a run that is gone would not
    /// match what happened; nothing is stored. Mirrors
    /// [`Runs::evict_over_capacity`]'s rule.
    fn refuse_if_evicted_at_once(&self, record: &RunRecord) -> Result<(), StateError> {
        if !record.status.is_terminal() {
            return Ok(());
        }
        let (max_runs, max_bytes) = (self.retention.max_runs, self.retention.max_bytes);
        let mut runs = self.by_id.len() + 1;
        let mut bytes = self.bytes + record_bytes(record);
        let fits = |runs: usize, bytes: u64| runs <= max_runs && bytes <= max_bytes;
        // The ended runs evicted before this one: those that started before it.
        for (_, id) in self.ended.range(..(record.start_time_ms, record.id.clone())) {
            if fits(runs, bytes) {
                return Ok(());
            }
            runs -= 1;
            bytes = bytes.saturating_sub(self.by_id.get(id).map_or(0, |e| record_bytes(&e.record)));
        }
        if fits(runs, bytes) {
            return Ok(());
        }
        Err(StateError::Conflict {
            id: record.id.clone(),
            reason: format!(
                "retention is full ({max_runs} runs, {max_bytes} bytes of runs kept) and this \
                 ended run started before every ended run kept, so storing it would evict it \
                 at once; nothing was stored"
            ),
        })
    }

    /// Evicts the oldest ended runs while more runs, or more bytes of
    /// runs, are kept than retention allows.
    fn evict_over_capacity(&mut self, ops: &mut Vec<StoreOp>, events: &mut Vec<PendingEvent>) {
        while self.by_id.len() > self.retention.max_runs || self.bytes > self.retention.max_bytes {
            let Some((_, oldest)) = self.ended.first().cloned() else {
                // Only live runs remain; they are never evicted.
                break;
            };
            self.evict(&oldest, ops, events);
        }
    }

    fn evict(&mut self, id: &RunId, ops: &mut Vec<StoreOp>, events: &mut Vec<PendingEvent>) {
        if self.remove(id).is_some() {
            ops.push(StoreOp::Delete(id.clone()));
            events.push(PendingEvent {
                kind: EventKind::Evicted,
                run_id: id.clone(),
                record: None,
            });
        }
    }
}

/// The record of a new version of a run whose version before was `previous`
/// (`None`: a new run), decided at `at_ms`, with what its progress board
/// counted since (`count`): see [`Runs::recorded`].
fn recorded_after(
    previous: Option<&TrainRunInfo>,
    run: TrainRunInfo,
    at_ms: u64,
    count: BoardCount,
) -> Result<Arc<RunRecord>, StateError> {
    let before = previous
        .map(TrainRunInfo::status)
        .or_else(|| run.status_history().last().map(|change| change.status));
    let run = if before == Some(run.status()) { run } else { run.with_status_recorded(at_ms) };
    // A run that ends while stalled ends its stall: it is kept, marked
    // ended, and no longer counts as a stall anyone needs to see.
    let run = match run.health() {
        Some(health) if health.is_live_stall() && run.status().is_terminal() => {
            let ended_ms = run.end_time_ms().unwrap_or(at_ms);
            run.with_stall_ended(ended_ms)
        }
        _ => run,
    };
    let run = match next_goodput(previous, &run, at_ms, count) {
        Some(goodput) => run.with_goodput(goodput)?,
        None => run,
    };
    RunRecord::new(&run)
}

/// The bytes a run counts for retention: its stored JSON.
fn record_bytes(record: &RunRecord) -> u64 {
    record.json().approximate_len() as u64
}

/// Stamps the end of a run, and of its current attempt: at `end_time_ms`
/// if the caller gave one, else now, but never before the run's start.
/// Refuses `time_ms` (at `path`) when it is more than
/// [`MAX_AHEAD_OF_CLOCK_MS`] ahead of `now_ms`, the head's clock.
pub(crate) fn not_ahead_of(path: &str, time_ms: u64, now_ms: u64) -> Result<(), StateError> {
    if time_ms.saturating_sub(now_ms) <= MAX_AHEAD_OF_CLOCK_MS {
        return Ok(());
    }
    Err(StateError::invalid(
        path,
        format!(
            "{} is more than a day ahead of the head's clock ({}); a time a client writes may \
             be at most 1 day ahead (is the writer's clock wrong, or the time in another unit?)",
            crate::decisions::time_text::iso_ms(time_ms),
            crate::decisions::time_text::iso_ms(now_ms)
        ),
    ))
}

/// True when `record`'s run had stopped making progress: its health is
/// STALLED (an ended run keeps the health it ended with).
fn was_stalled(record: &RunRecord) -> Result<bool, StateError> {
    if record.status.is_live() {
        return Ok(record.health == Some(HealthState::Stalled));
    }
    Ok(record.run()?.health().is_some_and(|health| health.state == HealthState::Stalled))
}

/// `cause` with the head's class: the kind's own (a class a client sent is
/// not taken), except that a run that was STALLED when it was interrupted,
/// timed out or lost its controller is `NO_PROGRESS`, the hang being what
/// a person needs to hear of (see `docs/causes.md`).
pub(crate) fn classified(cause: Option<RunCause>, stalled: bool) -> Option<RunCause> {
    cause.map(|cause| {
        let own = cause.kind.class();
        let followed_a_hang =
            stalled && (own == CauseClass::Interrupted || cause.kind == CauseKind::LostController);
        let class = if followed_a_hang { CauseClass::NoProgress } else { own };
        cause.with_class(class)
    })
}

/// The cause of a run or attempt Ray Train V2 reports `errored`: a user
/// error, on the rank its detail names first (`[Rank 1 Error Snippet]`).
fn ray_cause(errored: bool, detail: &str) -> Option<RunCause> {
    errored.then(|| RunCause::new(CauseKind::UserError, first_failed_rank(detail)))
}

/// Makes `next` the run's current attempt, with `workers`: the attempt it
/// replaces ends at `next`'s start if it has not ended (ABORTED, "replaced
/// by attempt …") and keeps the run's workers, marked DEAD.
fn replace_current_attempt(
    draft: &mut TrainRunInfoDraft,
    next: RunAttemptDraft,
    workers: Vec<TrainWorkerInfoDraft>,
) {
    let mut previous_workers = std::mem::replace(&mut draft.workers, workers);
    for worker in &mut previous_workers {
        worker.status = ActorStatus::Dead;
    }
    if let Some(current) = draft.attempts.last_mut() {
        if current.end_time_ms.is_none() {
            current.end_time_ms = Some(next.start_time_ms.max(current.start_time_ms));
            current.status = Some(AttemptStatus::Aborted);
            current.status_detail = format!("replaced by attempt {}", next.attempt_id);
        }
        current.workers = Some(previous_workers);
    }
    draft.attempts.push(next);
}

/// Keeps the worker lists of a run's ended attempts while they take at most
/// about `max_bytes` of JSON, the newest first, and drops the older ones:
/// such an attempt keeps everything else, its `workers` becomes `[]` and
/// its `dropped_workers` says how many it had. The first attempt's list
/// (static metadata: what a repeated registration is compared by) and the
/// current one's (the run's `workers`) are always kept. Linear in the
/// lists it measures; returns how many lists it dropped.
pub(crate) fn bound_attempt_history(draft: &mut TrainRunInfoDraft, max_bytes: usize) -> usize {
    let Some(last) = draft.attempts.len().checked_sub(1) else { return 0 };
    let mut kept = 0usize;
    let mut dropped = 0;
    for attempt in draft.attempts[..last].iter_mut().skip(1).rev() {
        let Some(workers) = attempt.workers.as_mut().filter(|w| !w.is_empty()) else { continue };
        if kept <= max_bytes {
            kept = kept.saturating_add(json_len(workers));
            if kept <= max_bytes {
                continue;
            }
        }
        attempt.dropped_workers = Some(workers.len() as u32);
        workers.clear();
        dropped += 1;
    }
    dropped
}

/// How many bytes `value` takes as JSON, counted without keeping them.
pub(crate) fn json_len(value: &impl serde::Serialize) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).map_or(usize::MAX, |()| count.0)
}

/// The rank of the first `[Rank N Error Snippet]` in Ray's error detail.
fn first_failed_rank(detail: &str) -> Option<u32> {
    let rest = &detail[detail.find("[Rank ")? + "[Rank ".len()..];
    let digits = &rest[..rest.find(' ')?];
    rest[digits.len()..].starts_with(" Error Snippet]").then(|| digits.parse().ok()).flatten()
}

/// The `status_detail` of a run (or attempt) that ends `status` for
/// `cause` with `detail`: after Ray's `Rank {r} worker raised an error.`
/// line for an error a rank raised; as it is for a rank that died without
/// reporting (the rendezvous wrote the words) and for other statuses.
pub(crate) fn failure_detail(status: RunStatus, cause: Option<&RunCause>, detail: &str) -> String {
    let died = cause.and_then(|c| c.how).is_some_and(|how| how.died_unreported());
    match status {
        RunStatus::Errored if !died => {
            errored_status_detail(cause.and_then(|c| c.failed_world_rank), detail)
        }
        _ => last_chars(detail, MAX_STATUS_DETAIL_LEN).to_owned(),
    }
}

/// True for a run the rendezvous assembled (its ranks report, not a
/// controller).
fn of_rendezvous(record: &RunRecord) -> bool {
    record.run().is_ok_and(|run| {
        run.controller_actor_id().starts_with(crate::decisions::record::CONTROLLER_PREFIX)
    })
}

/// Why a run whose lease ran out is aborted, in words for the person who
/// reads it: a run of the rendezvous has ranks, not a controller; a run
/// Ray Train V2 writes (its record not `leased` by heartbeats of its
/// controller) is told about by its source, Ray's writes or the ingester
/// of Ray's export events.
fn lost_detail(record: &RunRecord, last_heard_ms: u64, silent_ms: u64, lease: Duration) -> String {
    let last = crate::decisions::time_text::iso_ms(last_heard_ms);
    let silent = crate::decisions::time_text::seconds(silent_ms);
    let lease = crate::decisions::time_text::seconds(lease.as_millis() as u64);
    if !record.leased {
        format!(
            "Nothing was heard about this Ray Train V2 run for {silent} (last at {last}), longer \
             than the head's lease of {lease}: its source (Ray's writes, or `trainstate ingest \
             ray-export`, which renews the leases of the runs it follows) stopped telling about \
             it, so its controller is presumed lost."
        )
    } else if of_rendezvous(record) {
        format!(
            "No rank of this run has been heard from since {last} ({silent} before this was \
             concluded, longer than the head's lease of {lease}): the job was killed outright, \
             watchers included, its node was lost, or it lost its network to the head. The run \
             ended when its ranks were last heard from."
        )
    } else {
        format!(
            "The run's controller stopped heartbeating: nothing heard from it for {silent} (last \
             at {last}), longer than the head's lease of {lease}."
        )
    }
}

fn end_run(draft: &mut TrainRunInfoDraft, end_time_ms: Option<u64>, now_ms: u64) {
    let end = end_time_ms.unwrap_or_else(|| now_ms.max(draft.start_time_ms));
    draft.end_time_ms = Some(end);
    let status = draft.status.unwrap_or(draft.run_status);
    if let Some(current) = draft.attempts.last_mut().filter(|a| a.end_time_ms.is_none()) {
        current.end_time_ms = Some(end.max(current.start_time_ms));
        current.status = AttemptStatus::ending(status);
        current.status_detail.clone_from(&draft.status_detail);
        current.cause.clone_from(&draft.cause);
    }
    // The workers of an ended run are gone.
    for worker in &mut draft.workers {
        worker.status = ActorStatus::Dead;
    }
}
