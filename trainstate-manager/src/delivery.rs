//! Delivery of a manager's writes to the state actor: kept per run, in
//! order, retried with backoff, and replayed when the actor has lost a run.
//!
//! Each run keeps a journal of everything it would send (its registration,
//! its later attempts, its terminal status), and how much of it the actor
//! has acknowledged. One task per manager sends, for each run, the first
//! unacknowledged write, so a run's writes reach the actor in order; runs do
//! not wait on each other. Every write is idempotent on the actor, so a
//! write whose answer was lost is simply sent again. When the actor answers
//! that it does not know a run (an in-memory head that restarted), the
//! journal is replayed from the registration.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::{Notify, oneshot};
use tokio::task::{AbortHandle, JoinSet};
use tokio::time::Instant;
use trainstate_client::{NewAttempt, StateError, StateHandle, StatusUpdate};
use trainstate_schema::{RunId, TrainRunInfo, TrainWorkerInfo};

use crate::config::ManagerConfig;
use crate::error::ManagerError;

/// The shortest heartbeat interval, whatever the lease.
const MIN_HEARTBEAT_INTERVAL: Duration = Duration::from_millis(10);

/// The answer a caller waits for: the write was acknowledged, or refused
/// for good.
pub(crate) type Ack = oneshot::Receiver<Result<(), StateError>>;

/// One write to the state actor.
#[derive(Debug, Clone)]
enum Write {
    Register(Box<TrainRunInfo>),
    Attempt(NewAttempt),
    Status(StatusUpdate),
}

impl Write {
    fn is_terminal(&self) -> bool {
        matches!(self, Write::Status(update) if update.status.is_terminal())
    }

    fn describe(&self) -> String {
        match self {
            Write::Register(_) => "registration".to_owned(),
            Write::Attempt(attempt) => format!("attempt {:?}", attempt.attempt_id),
            Write::Status(update) => format!("status {}", update.status),
        }
    }

    /// Sends the write; a registration answers with the lease.
    async fn send(self, handle: &StateHandle, id: RunId) -> Result<Option<Duration>, StateError> {
        match self {
            Write::Register(run) => handle.register(*run).await.map(|r| Some(r.lease)),
            Write::Attempt(attempt) => handle.start_attempt(id, attempt).await.map(|_| None),
            Write::Status(update) => handle.set_status(id, update).await.map(|_| None),
        }
    }
}

struct Entry {
    seq: u64,
    write: Write,
}

/// What a manager keeps about one run until its terminal status is
/// acknowledged.
struct Track {
    /// Every write of the run, oldest first.
    journal: Vec<Entry>,
    /// `journal[..acked]` is acknowledged by the actor.
    acked: usize,
    /// A write of this run is being sent.
    in_flight: bool,
    /// Not before this instant is the next write sent.
    retry_at: Option<Instant>,
    backoff: Duration,
    /// Failed deliveries since the last success.
    failures: u32,
    /// Replays from the registration since a write after it was last
    /// acknowledged: a head that keeps losing the run is not hammered.
    rewinds: u32,
    /// Callers waiting for the acknowledgement of a write, by its `seq`.
    waiters: HashMap<u64, oneshot::Sender<Result<(), StateError>>>,
    heartbeat: Option<AbortHandle>,
    /// A terminal status has been written: no more writes.
    ended: bool,
    /// The number in the id of the next attempt.
    next_attempt: u32,
    /// How many workers the latest attempt has.
    world_size: u32,
    /// The start of the latest attempt (or of the run).
    last_start_ms: u64,
}

impl Track {
    fn stop_heartbeat(&mut self) {
        if let Some(heartbeat) = self.heartbeat.take() {
            heartbeat.abort();
        }
    }
}

#[derive(Default)]
struct Book {
    runs: HashMap<RunId, Track>,
    next_seq: u64,
    closed: bool,
}

/// The outbox: the journals of the writes not yet delivered, the handle
/// they are delivered through, and the wake-ups of those who wait on them;
/// shared by the manager, its delivery task and its heartbeat tasks.
pub(crate) struct Outbox {
    handle: StateHandle,
    config: ManagerConfig,
    book: Mutex<Book>,
    /// Wakes the delivery task: there is a new write.
    wake: Notify,
    /// Wakes those waiting for the journals to drain: a write was settled.
    progress: Notify,
}

/// The actor's answer to one write.
type Sent = Result<Option<Duration>, StateError>;

/// A live run's latest attempt, as its manager knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Attempt {
    pub(crate) attempt_id: String,
    /// How many workers it has.
    pub(crate) world_size: u32,
    /// The head has acknowledged every write of the run.
    pub(crate) acknowledged: bool,
}

impl Outbox {
    pub(crate) fn new(handle: StateHandle, config: ManagerConfig) -> Arc<Self> {
        let handle = handle.with_timeout(config.call_timeout);
        Arc::new(Self {
            handle,
            config,
            book: Mutex::new(Book::default()),
            wake: Notify::new(),
            progress: Notify::new(),
        })
    }

    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens the journal of a new run with its registration.
    pub(crate) fn register(&self, run: TrainRunInfo) -> Result<Ack, ManagerError> {
        let mut book = self.book();
        if book.closed {
            return Err(ManagerError::ShutDown);
        }
        let id = run.id().clone();
        let track = Track {
            journal: Vec::new(),
            acked: 0,
            in_flight: false,
            retry_at: None,
            backoff: self.config.min_backoff,
            failures: 0,
            rewinds: 0,
            waiters: HashMap::new(),
            heartbeat: None,
            ended: false,
            next_attempt: 1,
            world_size: run.workers().len() as u32,
            last_start_ms: run.start_time_ms(),
        };
        book.runs.insert(id.clone(), track);
        let ack = Self::append(&mut book, &id, Write::Register(Box::new(run)));
        drop(book);
        self.wake.notify_one();
        Ok(ack)
    }

    /// Fails unless `id` is a live run of this manager.
    pub(crate) fn check_live(&self, id: &RunId) -> Result<(), ManagerError> {
        let book = self.book();
        if book.closed {
            return Err(ManagerError::ShutDown);
        }
        match book.runs.get(id) {
            Some(track) if !track.ended => Ok(()),
            _ => Err(ManagerError::UnknownRun { id: id.clone() }),
        }
    }

    /// Appends a new attempt with `workers` (sorted by world rank).
    pub(crate) fn start_attempt(
        &self,
        id: &RunId,
        workers: Vec<TrainWorkerInfo>,
    ) -> Result<Ack, ManagerError> {
        let mut book = self.book();
        self.live_track(&mut book, id)?;
        let track = book.runs.get_mut(id).ok_or_else(|| unknown(id))?;
        let attempt_id = track.next_attempt.to_string();
        track.next_attempt += 1;
        track.world_size = workers.len() as u32;
        let start_ms = self.config.clock.now_ms().max(track.last_start_ms);
        track.last_start_ms = start_ms;
        let ack = Self::append(
            &mut book,
            id,
            Write::Attempt(NewAttempt::new(attempt_id, start_ms, workers)),
        );
        drop(book);
        self.wake.notify_one();
        Ok(ack)
    }

    /// Appends the run's terminal status and stops its heartbeat.
    pub(crate) fn end(&self, id: &RunId, update: StatusUpdate) -> Result<Ack, ManagerError> {
        let mut book = self.book();
        self.live_track(&mut book, id)?;
        let track = book.runs.get_mut(id).ok_or_else(|| unknown(id))?;
        track.ended = true;
        track.stop_heartbeat();
        let update = update.ended_at(self.config.clock.now_ms().max(track.last_start_ms));
        let ack = Self::append(&mut book, id, Write::Status(update));
        drop(book);
        self.wake.notify_one();
        Ok(ack)
    }

    fn live_track(&self, book: &mut Book, id: &RunId) -> Result<(), ManagerError> {
        if book.closed {
            return Err(ManagerError::ShutDown);
        }
        match book.runs.get(id) {
            Some(track) if !track.ended => Ok(()),
            _ => Err(unknown(id)),
        }
    }

    fn append(book: &mut Book, id: &RunId, write: Write) -> Ack {
        let seq = book.next_seq;
        book.next_seq += 1;
        let (tx, rx) = oneshot::channel();
        if let Some(track) = book.runs.get_mut(id) {
            track.journal.push(Entry { seq, write });
            track.waiters.insert(seq, tx);
        }
        rx
    }

    /// Where live run `id` stands, for its progress reports: its latest
    /// attempt, and whether the head has acknowledged every write of the
    /// run (so the head knows that attempt). `None` when it is not a live
    /// run of this manager.
    pub(crate) fn attempt(&self, id: &RunId) -> Option<Attempt> {
        let book = self.book();
        let track = book.runs.get(id).filter(|track| !track.ended && !book.closed)?;
        Some(Attempt {
            attempt_id: (track.next_attempt - 1).to_string(),
            world_size: track.world_size,
            acknowledged: track.acked == track.journal.len(),
        })
    }

    /// The handle the writes go through.
    pub(crate) fn handle(&self) -> &StateHandle {
        &self.handle
    }

    /// Writes not yet acknowledged, over every run.
    pub(crate) fn pending(&self) -> usize {
        self.book().runs.values().map(|t| t.journal.len() - t.acked).sum()
    }

    /// True once the manager has been shut down.
    pub(crate) fn is_closed(&self) -> bool {
        self.book().closed
    }

    /// Refuses every new write from now on.
    pub(crate) fn close(&self) {
        self.book().closed = true;
    }

    /// Waits until every write is acknowledged, or `deadline`. Returns the
    /// writes still unacknowledged.
    pub(crate) async fn drain(&self, deadline: Instant) -> usize {
        loop {
            let progress = self.progress.notified();
            tokio::pin!(progress);
            progress.as_mut().enable();
            let pending = self.pending();
            if pending == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, progress).await.is_err() {
                return self.pending();
            }
        }
    }

    /// Stops every heartbeat.
    pub(crate) fn stop_heartbeats(&self) {
        for track in self.book().runs.values_mut() {
            track.stop_heartbeat();
        }
    }

    /// The actor no longer knows `id`: send everything again from the
    /// registration.
    fn rewind(&self, id: &RunId) {
        let mut book = self.book();
        if let Some(track) = book.runs.get_mut(id)
            && track.acked > 0
        {
            tracing::warn!(run = %id, "the state actor does not know this run; registering it again");
            track.acked = 0;
            track.retry_at = None;
            drop(book);
            self.wake.notify_one();
        }
    }

    /// Starts sending the next write of every run that has one due, and
    /// returns when the earliest delayed one is due.
    fn dispatch(
        &self,
        in_flight: &mut JoinSet<Sent>,
        sending: &mut HashMap<tokio::task::Id, (RunId, u64)>,
    ) -> Option<Instant> {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        let mut book = self.book();
        for (id, track) in book.runs.iter_mut() {
            if track.in_flight || track.acked >= track.journal.len() {
                continue;
            }
            if let Some(at) = track.retry_at.filter(|at| *at > now) {
                next = Some(next.map_or(at, |n| n.min(at)));
                continue;
            }
            track.in_flight = true;
            let entry = &track.journal[track.acked];
            let (handle, run, seq, write) =
                (self.handle.clone(), id.clone(), entry.seq, entry.write.clone());
            // The answer comes back through `deliver`, which settles it.
            let task = in_flight.spawn(async move { write.send(&handle, run).await });
            sending.insert(task.id(), (id.clone(), seq));
        }
        next
    }

    /// Records the actor's answer to write `seq` of run `id`.
    fn settle(self: &Arc<Self>, id: RunId, seq: u64, result: Sent) {
        let mut book = self.book();
        let Some(track) = book.runs.get_mut(&id) else { return };
        track.in_flight = false;
        // An answer to a write that is no longer next (the journal was
        // rewound meanwhile) is stale: the write will be sent again in order.
        if track.journal.get(track.acked).map(|e| e.seq) != Some(seq) {
            return;
        }
        let index = track.acked;
        let what = track.journal[index].write.describe();
        let mut run_done = false;
        match result {
            Ok(lease) => {
                if track.failures > 0 {
                    tracing::info!(run = %id, write = %what, failures = track.failures, "delivered to the state actor after retries");
                }
                track.failures = 0;
                track.backoff = self.config.min_backoff;
                track.retry_at = None;
                track.acked += 1;
                if index > 0 {
                    track.rewinds = 0;
                }
                if let Some(waiter) = track.waiters.remove(&seq) {
                    let _ = waiter.send(Ok(()));
                }
                if let Some(lease) = lease
                    && track.heartbeat.is_none()
                    && !track.ended
                {
                    let task = tokio::spawn(heartbeat(
                        Arc::downgrade(self),
                        self.handle.clone(),
                        id.clone(),
                        lease,
                    ));
                    track.heartbeat = Some(task.abort_handle());
                }
                run_done = track.journal[index].write.is_terminal();
            }
            Err(StateError::NotFound { .. }) if index > 0 => {
                tracing::warn!(run = %id, write = %what, "the state actor does not know this run; registering it again");
                track.acked = 0;
                track.rewinds += 1;
                // The first replay goes at once; later ones back off.
                let exponent = track.rewinds.saturating_sub(2).min(16);
                let delay =
                    (self.config.min_backoff * (1 << exponent)).min(self.config.max_backoff);
                track.retry_at = (track.rewinds > 1).then(|| Instant::now() + delay);
            }
            // A URL that reaches no route of a head (a proxy's prefix, a
            // typo) says nothing of the run: kept and retried like an
            // unreachable head, never taken for "run not found".
            Err(err) if err.is_retryable() || matches!(err, StateError::NoSuchRoute { .. }) => {
                if track.failures == 0 {
                    tracing::warn!(run = %id, write = %what, error = %err, "the state actor is unreachable; the write is kept and retried");
                } else {
                    tracing::debug!(run = %id, write = %what, error = %err, failures = track.failures, "retrying");
                }
                track.failures += 1;
                track.retry_at = Some(Instant::now() + track.backoff);
                track.backoff = (track.backoff * 2).min(self.config.max_backoff);
            }
            Err(err) => {
                let entry = track.journal.remove(index);
                if let Write::Register(_) = entry.write {
                    tracing::error!(run = %id, error = %err, "the state actor refused the run's registration; the run is not tracked");
                    for (_, waiter) in track.waiters.drain() {
                        let _ = waiter.send(Err(err.clone()));
                    }
                    run_done = true;
                } else {
                    tracing::error!(run = %id, write = %what, error = %err, "the state actor refused the write; it is dropped");
                    if let Some(waiter) = track.waiters.remove(&seq) {
                        let _ = waiter.send(Err(err));
                    }
                    run_done = entry.write.is_terminal();
                }
            }
        }
        if run_done && let Some(mut track) = book.runs.remove(&id) {
            track.stop_heartbeat();
        }
        drop(book);
        self.progress.notify_waiters();
    }
}

fn unknown(id: &RunId) -> ManagerError {
    ManagerError::UnknownRun { id: id.clone() }
}

/// Delivers the writes of every run of a manager, until aborted.
pub(crate) async fn deliver(shared: Arc<Outbox>) {
    let mut in_flight: JoinSet<Sent> = JoinSet::new();
    let mut sending: HashMap<tokio::task::Id, (RunId, u64)> = HashMap::new();
    loop {
        let next = shared.dispatch(&mut in_flight, &mut sending);
        let far = Instant::now() + Duration::from_secs(3600);
        tokio::select! {
            () = shared.wake.notified() => {}
            Some(joined) = in_flight.join_next_with_id(), if !in_flight.is_empty() => {
                let (task, sent) = match joined {
                    Ok((task, sent)) => (task, Some(sent)),
                    Err(err) => (err.id(), None),
                };
                let Some((id, seq)) = sending.remove(&task) else { continue };
                let result = sent.unwrap_or_else(|| {
                    Err(StateError::unavailable("the delivery of the write failed"))
                });
                shared.settle(id, seq, result);
            }
            () = tokio::time::sleep_until(next.unwrap_or(far)), if next.is_some() => {}
        }
    }
}

/// Renews the lease of a live run every third of the lease, until aborted
/// or the run ends.
async fn heartbeat(shared: Weak<Outbox>, handle: StateHandle, id: RunId, lease: Duration) {
    let mut interval = (lease / 3).max(MIN_HEARTBEAT_INTERVAL);
    let mut failing = false;
    loop {
        tokio::time::sleep(interval).await;
        let answer = handle.heartbeat(id.clone()).await;
        let Some(shared) = shared.upgrade() else { return };
        match answer {
            Ok(lease) => {
                interval = (lease / 3).max(MIN_HEARTBEAT_INTERVAL);
                failing = false;
            }
            Err(StateError::NotFound { .. }) => shared.rewind(&id),
            Err(err @ StateError::IllegalTransition { .. }) => {
                tracing::warn!(run = %id, error = %err, "the state actor has ended this run; its heartbeat stops");
                if let Some(track) = shared.book().runs.get_mut(&id) {
                    track.heartbeat = None;
                }
                return;
            }
            Err(err) => {
                if !failing {
                    tracing::warn!(run = %id, error = %err, "heartbeat failed; retrying at the next beat");
                }
                failing = true;
            }
        }
    }
}
