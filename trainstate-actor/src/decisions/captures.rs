//! Stack captures, kept: which captures each run has, the one it waits
//! for, and every write a capture makes (pure: the time is given).
//!
//! A capture is opened when a run of the rendezvous becomes STALLED
//! ([`Captures::open_for_stalls`]) or when someone asks
//! ([`Captures::post`] with no ranks); the run's rank board then hands
//! its order to each rank's heartbeat (see `RankBoard::capture_order`).
//! Each watcher's answer is cut to its bound and written as the rank's row
//! at once, so a read serves what has arrived. When every rank answered,
//! or the deadline passed ([`Captures::sweep`]), the capture is complete:
//! grouped, its suspects named, and, for a stall, written into the run's
//! health. Only the pending capture of a run is held in memory; complete
//! ones live in the store, which [`Captures::load`] reads an index of.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use trainstate_client::{EventKind, StateError};
use trainstate_schema::api::{
    CaptureState, CaptureTrigger, RankStack, RankStackReport, StackCapture, StacksRequest,
};
use trainstate_schema::limits::{
    CAPTURE_DEADLINE_MS, MAX_CAPTURES_PER_RUN, MAX_STACK_NOTE_LEN, MIN_CAPTURE_INTERVAL_MS,
};
use trainstate_schema::{HealthState, RunId, StallCapture};

use crate::decisions::change::{CaptureRows, StoreOp};
use crate::decisions::liveness::{Liveness, RankBoard};
use crate::decisions::stacks::{cut, group, rank_stack_bytes};
use crate::decisions::state::{Change, Outcome, Runs};
use crate::decisions::time_text::iso_ms;

/// The longest `reason` a request may give, in characters.
pub(crate) const MAX_CAPTURE_REASON_LEN: usize = 256;

/// The most suspects a run's health names (`StallCapture.suspects`).
const MAX_HEALTH_SUSPECTS: usize = 1_024;

/// Every run's captures, as the actor knows them.
#[derive(Default)]
pub(crate) struct Captures {
    runs: HashMap<RunId, RunCaptures>,
}

/// One run's captures.
#[derive(Default)]
struct RunCaptures {
    /// The stored captures, oldest first: their ids and bytes.
    stored: VecDeque<(u64, u64)>,
    /// The highest capture id the run has had.
    last_id: u64,
    /// When the latest capture that reached the ranks was opened.
    last_reached_ms: Option<u64>,
    /// The capture waiting for its ranks, if any.
    open: Option<OpenCapture>,
}

impl RunCaptures {
    /// The writes that keep a new capture of run `id` whole: the oldest
    /// dropped while the run keeps `MAX_CAPTURES_PER_RUN`, then its rows.
    fn store_new(&mut self, id: &RunId, new: &OpenCapture) -> Vec<StoreOp> {
        let mut ops = Vec::new();
        while self.stored.len() >= MAX_CAPTURES_PER_RUN {
            let (oldest, _) = self.stored.pop_front().expect("not empty");
            ops.push(StoreOp::DropCapture { run_id: id.clone(), capture_id: oldest });
        }
        let rows = new.rows(id, 0..new.capture.ranks.len());
        self.stored.push_back((new.capture.capture_id, rows.bytes));
        ops.push(StoreOp::PutCapture(Arc::new(rows)));
        ops
    }
}

/// A capture waiting for its ranks.
struct OpenCapture {
    capture: StackCapture,
    /// The bytes of each rank's row, by index in `capture.ranks`.
    row_bytes: Vec<u64>,
    /// The bytes one rank's stack keeps.
    max_stack_bytes: usize,
}

impl OpenCapture {
    fn new(capture: StackCapture, world_size: u32) -> Self {
        let row_bytes = capture.ranks.iter().map(|r| json(r).len() as u64).collect();
        Self { capture, row_bytes, max_stack_bytes: rank_stack_bytes(world_size) }
    }

    /// The rows of the capture's header and of the ranks at `indexes`.
    fn rows(&self, run_id: &RunId, indexes: impl IntoIterator<Item = usize>) -> CaptureRows {
        let header = header_json(&self.capture);
        let bytes = header.len() as u64 + self.row_bytes.iter().sum::<u64>();
        let ranks = indexes
            .into_iter()
            .map(|i| (self.capture.ranks[i].rank, json(&self.capture.ranks[i])))
            .collect();
        CaptureRows {
            run_id: run_id.clone(),
            capture_id: self.capture.capture_id,
            bytes,
            header,
            ranks,
        }
    }
}

/// `value` as JSON.
fn json(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).expect("a capture serializes")
}

/// A capture's header: the capture with no ranks, as JSON.
fn header_json(capture: &StackCapture) -> String {
    let mut header = capture.clone();
    header.ranks = Vec::new();
    json(&header)
}

/// A capture request's checks that need no run: each names its field.
fn check_request(request: &StacksRequest) -> Result<(), StateError> {
    if let Some(reason) = &request.reason
        && reason.chars().count() > MAX_CAPTURE_REASON_LEN
    {
        return Err(StateError::invalid(
            "reason",
            format!("at most {MAX_CAPTURE_REASON_LEN} characters"),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, report) in request.ranks.iter().enumerate() {
        let source = &report.source;
        let source_ok = (1..=32).contains(&source.len())
            && source
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        if !source_ok {
            return Err(StateError::invalid(
                format!("ranks[{i}].source"),
                "1 to 32 characters of a-z, 0-9, - and _",
            ));
        }
        if report.note.as_ref().is_some_and(|n| n.chars().count() > MAX_STACK_NOTE_LEN) {
            return Err(StateError::invalid(
                format!("ranks[{i}].note"),
                format!("at most {MAX_STACK_NOTE_LEN} characters"),
            ));
        }
        if !seen.insert(report.rank) {
            return Err(StateError::invalid(
                format!("ranks[{i}].rank"),
                format!("rank {} is given twice: one entry per rank", report.rank),
            ));
        }
    }
    if request.capture_id.is_some() && request.ranks.is_empty() {
        return Err(StateError::invalid("ranks", "an answer to a capture lists at least one rank"));
    }
    Ok(())
}

/// Refuses a rank out of the ranks `listed` (by index of `request.ranks`).
fn check_ranks_listed(request: &StacksRequest, listed: &[RankStack]) -> Result<(), StateError> {
    for (i, report) in request.ranks.iter().enumerate() {
        if listed.binary_search_by_key(&report.rank, |r| r.rank).is_err() {
            return Err(StateError::invalid(
                format!("ranks[{i}].rank"),
                format!(
                    "rank {} is not a rank of the capture's attempt ({} ranks)",
                    report.rank,
                    listed.len()
                ),
            ));
        }
    }
    Ok(())
}

/// The ranks of run `id`'s current attempt, unanswered, with their nodes,
/// its attempt and its world size: those of its rank board when it has
/// one, else its workers.
fn ranks_of(
    runs: &Runs,
    board: Option<&RankBoard>,
    id: &RunId,
) -> Result<(Vec<RankStack>, String, u32), StateError> {
    let record = runs.record(id).ok_or_else(|| StateError::NotFound { id: id.clone() })?;
    let run = record.run()?;
    let node_of = |rank: u32| {
        run.workers()
            .iter()
            .find(|w| w.world_rank() == rank)
            .map(|w| w.node_name().unwrap_or(w.node_id()).to_owned())
    };
    let current = run.attempts().last().map(|a| a.attempt_id().to_owned()).unwrap_or_default();
    Ok(match board {
        Some(board) => {
            let ranks = (0..board.world_size()).map(|r| RankStack::unanswered(r, node_of(r)));
            (ranks.collect(), board.attempt_id().to_owned(), board.world_size())
        }
        None => {
            let mut ranks: Vec<u32> = run.workers().iter().map(|w| w.world_rank()).collect();
            ranks.sort_unstable();
            ranks.dedup();
            let n = ranks.len() as u32;
            (ranks.into_iter().map(|r| RankStack::unanswered(r, node_of(r))).collect(), current, n)
        }
    })
}

/// Refuses an attempt that is not the capture's.
fn check_attempt(id: &RunId, given: Option<&str>, current: &str) -> Result<(), StateError> {
    match given {
        Some(attempt) if attempt != current => Err(StateError::Conflict {
            id: id.clone(),
            reason: format!(
                "attempt {attempt:?} is not the run's current attempt {current:?}: its ranks are no longer captured"
            ),
        }),
        _ => Ok(()),
    }
}

impl Captures {
    /// Takes in the captures the store keeps: `index` (every capture's
    /// header) and `pending` (the captures still waiting, whole), which
    /// complete at their deadline. Answers each run's captured bytes.
    pub(crate) fn load(
        &mut self,
        index: impl IntoIterator<Item = (RunId, u64, StackCapture)>,
        pending: impl IntoIterator<Item = (RunId, StackCapture)>,
    ) -> Vec<(RunId, u64)> {
        let mut index: Vec<(RunId, u64, StackCapture)> = index.into_iter().collect();
        index.sort_by_key(|(_, _, header)| header.capture_id);
        for (id, bytes, header) in index {
            let run = self.runs.entry(id).or_default();
            run.stored.push_back((header.capture_id, bytes));
            run.last_id = run.last_id.max(header.capture_id);
            if header.trigger != CaptureTrigger::Controller {
                run.last_reached_ms = run.last_reached_ms.max(Some(header.at_ms));
            }
        }
        for (id, capture) in pending {
            let world_size = capture.ranks.len() as u32;
            if let Some(run) = self.runs.get_mut(&id) {
                run.open = Some(OpenCapture::new(capture, world_size));
            }
        }
        self.runs.keys().map(|id| (id.clone(), self.bytes_of(id))).collect()
    }

    /// The bytes run `id`'s stored captures keep.
    pub(crate) fn bytes_of(&self, id: &RunId) -> u64 {
        self.runs.get(id).map_or(0, |run| run.stored.iter().map(|(_, b)| b).sum())
    }

    /// A `POST .../stacks` of run `id`: a capture of its ranks asked for
    /// (no ranks: answered `true`, opened), the ranks' answer to a
    /// capture (`capture_id`), or a controller's own capture.
    pub(crate) fn post(
        &mut self,
        id: &RunId,
        request: StacksRequest,
        runs: &mut Runs,
        liveness: &Liveness,
        now_ms: u64,
    ) -> Result<Outcome<(StackCapture, bool)>, StateError> {
        check_request(&request)?;
        let status = runs.status_of(id).ok_or_else(|| StateError::NotFound { id: id.clone() })?;
        if request.capture_id.is_none() && status.is_terminal() {
            return Err(StateError::Conflict {
                id: id.clone(),
                reason: format!("the run has ended ({status}): it has no ranks to capture"),
            });
        }
        let outcome = match request.capture_id {
            None if request.ranks.is_empty() => {
                if request.attempt_id.is_some() {
                    let board = liveness.ranks(id);
                    let (_, current, _) = ranks_of(runs, board.as_deref(), id)?;
                    check_attempt(id, request.attempt_id.as_deref(), &current)?;
                }
                let reason = request.reason.unwrap_or_else(|| "asked for".to_owned());
                self.open(id, CaptureTrigger::Requested, reason, runs, liveness, now_ms)?
                    .map(|c| (c, true))
            }
            None => self.attach(id, request, runs, liveness, now_ms)?.map(|c| (c, false)),
            Some(capture_id) => {
                self.answer(id, capture_id, request, runs, liveness, now_ms)?.map(|c| (c, false))
            }
        };
        runs.set_capture_bytes(id, self.bytes_of(id));
        Ok(outcome)
    }

    /// Opens a capture of every rank of run `id`'s current attempt.
    fn open(
        &mut self,
        id: &RunId,
        trigger: CaptureTrigger,
        reason: String,
        runs: &mut Runs,
        liveness: &Liveness,
        now_ms: u64,
    ) -> Result<Outcome<StackCapture>, StateError> {
        let board = liveness.ranks(id);
        let (ranks, attempt_id, world_size) = ranks_of(runs, board.as_deref(), id)?;
        let run = self.runs.entry(id.clone()).or_default();
        if let Some(open) = &run.open {
            return Err(StateError::Conflict {
                id: id.clone(),
                reason: format!(
                    "capture {} is pending until {}: wait for it (GET .../stacks)",
                    open.capture.capture_id,
                    iso_ms(open.capture.deadline_ms)
                ),
            });
        }
        if trigger == CaptureTrigger::Requested
            && let Some(last) = run.last_reached_ms
            && now_ms.saturating_sub(last) < MIN_CAPTURE_INTERVAL_MS
        {
            return Err(StateError::Conflict {
                id: id.clone(),
                reason: format!(
                    "the last capture reached the ranks at {}: ask again from {} (at most one capture every {} s)",
                    iso_ms(last),
                    iso_ms(last + MIN_CAPTURE_INTERVAL_MS),
                    MIN_CAPTURE_INTERVAL_MS / 1000
                ),
            });
        }
        let capture_id = run.last_id + 1;
        run.last_id = capture_id;
        let deadline_ms = now_ms + CAPTURE_DEADLINE_MS;
        let capture =
            StackCapture::new(capture_id, attempt_id, now_ms, trigger, reason, deadline_ms, ranks);
        let open = OpenCapture::new(capture.clone(), world_size);
        let ops = run.store_new(id, &open);
        if let Some(board) = board.filter(|b| b.world_size() > 0) {
            board.open_capture(capture_id);
            run.last_reached_ms = Some(now_ms);
        }
        run.open = Some(open);
        Ok(Outcome::Changed(Change { ops, events: Vec::new(), answer: capture }))
    }

    /// The answer of some ranks to capture `capture_id`.
    fn answer(
        &mut self,
        id: &RunId,
        capture_id: u64,
        request: StacksRequest,
        runs: &mut Runs,
        liveness: &Liveness,
        now_ms: u64,
    ) -> Result<Outcome<StackCapture>, StateError> {
        let run = self.runs.get_mut(id);
        let Some(open) = run
            .and_then(|run| run.open.as_mut())
            .filter(|open| open.capture.capture_id == capture_id)
        else {
            return Err(StateError::Conflict {
                id: id.clone(),
                reason: format!(
                    "capture {capture_id} is not pending: it is complete, or the run never had it"
                ),
            });
        };
        check_attempt(id, request.attempt_id.as_deref(), &open.capture.attempt_id)?;
        check_ranks_listed(&request, &open.capture.ranks)?;
        let mut indexes = Vec::with_capacity(request.ranks.len());
        for (i, report) in request.ranks.iter().enumerate() {
            let index = open
                .capture
                .ranks
                .binary_search_by_key(&report.rank, |r| r.rank)
                .expect("checked above");
            if open.capture.ranks[index].at_ms.is_some() {
                return Err(StateError::Conflict {
                    id: id.clone(),
                    reason: format!(
                        "ranks[{i}]: rank {} already answered capture {capture_id}",
                        report.rank
                    ),
                });
            }
            indexes.push(index);
        }
        let board = liveness.ranks(id).filter(|b| b.attempt_id() == open.capture.attempt_id);
        for (report, &index) in request.ranks.into_iter().zip(&indexes) {
            let entry = &mut open.capture.ranks[index];
            *entry = kept(entry.clone(), report, open.max_stack_bytes, now_ms);
            open.row_bytes[index] = json(entry).len() as u64;
            if let Some(board) = &board {
                board.capture_answered(entry.rank);
            }
        }
        if open.capture.ranks.iter().all(|r| r.at_ms.is_some()) {
            return self.complete(id, runs, liveness, now_ms);
        }
        let rows = open.rows(id, indexes);
        let answer = open.capture.clone();
        let run = self.runs.get_mut(id).expect("found above");
        set_bytes(run, capture_id, rows.bytes);
        Ok(Outcome::Changed(Change {
            ops: vec![StoreOp::PutCapture(Arc::new(rows))],
            events: Vec::new(),
            answer,
        }))
    }

    /// A controller's own capture of its ranks, kept whole and complete.
    fn attach(
        &mut self,
        id: &RunId,
        request: StacksRequest,
        runs: &mut Runs,
        liveness: &Liveness,
        now_ms: u64,
    ) -> Result<Outcome<StackCapture>, StateError> {
        let board = liveness.ranks(id);
        let (mut ranks, attempt_id, world_size) = ranks_of(runs, board.as_deref(), id)?;
        check_attempt(id, request.attempt_id.as_deref(), &attempt_id)?;
        check_ranks_listed(&request, &ranks)?;
        let max_stack_bytes = rank_stack_bytes(world_size);
        for report in request.ranks {
            let index = ranks.binary_search_by_key(&report.rank, |r| r.rank).expect("checked");
            ranks[index] = kept(ranks[index].clone(), report, max_stack_bytes, now_ms);
        }
        let run = self.runs.entry(id.clone()).or_default();
        let capture_id = run.last_id + 1;
        run.last_id = capture_id;
        let reason = request.reason.unwrap_or_else(|| "attached by the controller".to_owned());
        let mut capture = StackCapture::new(
            capture_id,
            attempt_id,
            now_ms,
            CaptureTrigger::Controller,
            reason,
            now_ms,
            ranks,
        );
        capture.state = CaptureState::Complete;
        group(&mut capture);
        let ops = run.store_new(id, &OpenCapture::new(capture.clone(), world_size));
        Ok(Outcome::Changed(Change { ops, events: Vec::new(), answer: capture }))
    }

    /// Completes run `id`'s open capture: groups it, names its suspects,
    /// writes it whole and, for a stall's, the run's health.
    fn complete(
        &mut self,
        id: &RunId,
        runs: &mut Runs,
        liveness: &Liveness,
        now_ms: u64,
    ) -> Result<Outcome<StackCapture>, StateError> {
        let run = self.runs.get_mut(id).expect("the caller found it");
        let mut open = run.open.take().expect("the caller found it");
        open.capture.state = CaptureState::Complete;
        group(&mut open.capture);
        open.row_bytes = open.capture.ranks.iter().map(|r| json(r).len() as u64).collect();
        if let Some(board) =
            liveness.ranks(id).filter(|b| b.attempt_id() == open.capture.attempt_id)
        {
            board.close_capture();
        }
        let rows = open.rows(id, 0..open.capture.ranks.len());
        set_bytes(run, open.capture.capture_id, rows.bytes);
        let mut change = Change {
            ops: vec![StoreOp::PutCapture(Arc::new(rows))],
            events: Vec::new(),
            answer: open.capture.clone(),
        };
        if open.capture.trigger == CaptureTrigger::Stalled {
            let mut suspects = open.capture.suspects.clone();
            suspects.truncate(MAX_HEALTH_SUSPECTS);
            let short =
                StallCapture::new(open.capture.capture_id, CaptureState::Complete, suspects);
            if let Outcome::Changed(written) = runs.set_stall_capture(id, short, now_ms)? {
                change.ops.extend(written.ops);
                change.events.extend(written.events);
            }
        }
        runs.set_capture_bytes(id, self.bytes_of(id));
        Ok(Outcome::Changed(change))
    }

    /// Opens a capture for every run of the rendezvous that `change` makes
    /// STALLED and that has none yet, and writes it (PENDING) into the
    /// stall's health in the same change: the stall's event carries it.
    pub(crate) fn open_for_stalls<T>(
        &mut self,
        runs: &mut Runs,
        liveness: &Liveness,
        now_ms: u64,
        change: &mut Change<T>,
    ) {
        let stalled: Vec<RunId> = change
            .events
            .iter()
            .filter(|e| e.kind == EventKind::HealthChanged)
            .filter(|e| e.record.as_ref().is_some_and(|r| r.health == Some(HealthState::Stalled)))
            .map(|e| e.run_id.clone())
            .collect();
        for id in stalled {
            if liveness.ranks(&id).is_none() {
                continue;
            }
            let Some(health) = runs.health_of(&id) else { continue };
            if health.capture.is_some() || self.runs.get(&id).is_some_and(|r| r.open.is_some()) {
                continue;
            }
            let reason = health.detail.clone();
            let opened = match self.open(
                &id,
                CaptureTrigger::Stalled,
                reason,
                runs,
                liveness,
                now_ms,
            ) {
                Ok(Outcome::Changed(opened)) => opened,
                Ok(Outcome::Unchanged(_)) => continue,
                Err(err) => {
                    tracing::warn!(run = %id, error = %err, "cannot open a capture for a stall");
                    continue;
                }
            };
            change.ops.extend(opened.ops);
            runs.set_capture_bytes(&id, self.bytes_of(&id));
            let short =
                StallCapture::new(opened.answer.capture_id, CaptureState::Pending, Vec::new());
            match runs.set_stall_capture(&id, short, now_ms) {
                Ok(Outcome::Changed(written)) => {
                    change.ops.extend(written.ops);
                    // One event for the stall, carrying its capture.
                    for event in written.events {
                        match change
                            .events
                            .iter_mut()
                            .find(|e| e.run_id == id && e.kind == EventKind::HealthChanged)
                        {
                            Some(stall) => stall.record = event.record,
                            None => change.events.push(event),
                        }
                    }
                }
                Ok(Outcome::Unchanged(())) => {}
                Err(err) => {
                    tracing::warn!(run = %id, error = %err, "cannot write a stall's capture")
                }
            }
            tracing::info!(run = %id, capture = opened.answer.capture_id, "opened a stack capture for a stall");
        }
    }

    /// Completes every open capture whose deadline passed (a rank that did
    /// not answer is listed so), and forgets the runs no longer kept.
    pub(crate) fn sweep<T>(
        &mut self,
        runs: &mut Runs,
        liveness: &Liveness,
        now_ms: u64,
        change: &mut Change<T>,
    ) {
        self.runs.retain(|id, _| runs.status_of(id).is_some());
        let due: Vec<RunId> = self
            .runs
            .iter()
            .filter(|(_, run)| run.open.as_ref().is_some_and(|o| now_ms >= o.capture.deadline_ms))
            .map(|(id, _)| id.clone())
            .collect();
        for id in due {
            match self.complete(&id, runs, liveness, now_ms) {
                Ok(Outcome::Changed(done)) => {
                    change.ops.extend(done.ops);
                    change.events.extend(done.events);
                }
                Ok(Outcome::Unchanged(_)) => {}
                Err(err) => tracing::warn!(run = %id, error = %err, "cannot complete a capture"),
            }
        }
    }
}

/// Rank `entry` with `report` kept at `now_ms`, its stack cut to
/// `max_bytes`.
fn kept(entry: RankStack, report: RankStackReport, max_bytes: usize, now_ms: u64) -> RankStack {
    let (stack, was_cut) = cut(&report.stack, max_bytes);
    let truncated = report.truncated || was_cut;
    let mut report = report;
    report.stack = stack;
    report.truncated = truncated;
    let mut entry = entry.with_report(report, now_ms);
    entry.truncated = truncated;
    entry
}

/// Sets the bytes of stored capture `capture_id` of `run`.
fn set_bytes(run: &mut RunCaptures, capture_id: u64, bytes: u64) {
    if let Some(slot) = run.stored.iter_mut().find(|(id, _)| *id == capture_id) {
        slot.1 = bytes;
    }
}
