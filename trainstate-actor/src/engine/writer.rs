//! The store writer: one thread that owns the store, commits writes in
//! groups, then updates the committed view, announces events and answers
//! the callers, in that order.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, oneshot};
use trainstate_client::{EventKind, StateError, StateEvent};
use trainstate_schema::RunId;

use crate::decisions::change::{Absorb, PendingEvent, RemoteChange, StoreOp};
use crate::decisions::log_throttle::LogThrottle;
use crate::decisions::record::RunRecord;
use crate::decisions::tokens::StoredToken;
use crate::engine::config::StateConfig;
use crate::engine::error::StoreError;
use crate::engine::stats::StoreStats;
use crate::engine::view::View;
use crate::store::metrics::{HistoryBound, MetricReader};
use crate::store::{
    self, ChangedRun, Committed, Feed, Followed, JobChanges, Position, SharedStoreHandle, Store,
};

/// The most writes committed in one transaction.
const MAX_BATCH: usize = 4_096;

/// How often the points of metric histories reported meanwhile are handed
/// to the store: one transaction for every rank's reports of the period.
const METRICS_FLUSH_EVERY: Duration = Duration::from_secs(1);

/// The capacity of the event channel per subscriber before it lags.
const EVENT_CHANNEL_CAPACITY: usize = 4_096;

/// What runs once a write is committed (or has failed): the caller's answer.
pub(crate) type Completion = Box<dyn FnOnce(Result<(), StateError>) + Send>;

/// One write request's changes, committed atomically with its group.
pub(crate) struct WriteJob {
    /// The writer's [`Published::generation`] the actor had taken in when it
    /// decided this write: an older one means the write may build on a
    /// write that failed, so it is refused.
    pub(crate) decided_at: u64,
    pub(crate) ops: Vec<StoreOp>,
    pub(crate) events: Vec<PendingEvent>,
    pub(crate) done: Completion,
}

#[cfg_attr(not(all(feature = "forward", feature = "notify")), allow(dead_code))]
pub(crate) enum Job {
    Write(WriteJob),
    Load(oneshot::Sender<Result<Vec<Arc<RunRecord>>, StoreError>>),
    /// Takes in what other heads committed to a shared store (and, with
    /// `heartbeats`, the heartbeats they received), then answers.
    Follow {
        heartbeats: bool,
        reply: Option<oneshot::Sender<()>>,
    },
    /// Runs changed after a position, with what a feed recorded of their
    /// events.
    ChangesAfter {
        feed: Feed,
        after: Position,
        limit: usize,
        reply: oneshot::Sender<Result<Vec<ChangedRun>, StoreError>>,
    },
    /// The durable cursor of a feed.
    LoadCursor {
        feed: Feed,
        reply: oneshot::Sender<Result<Position, StoreError>>,
    },
    /// Makes a feed's cursor and the events it delivered durable.
    SaveCursor {
        feed: Feed,
        at: Position,
        delivered: Vec<(String, String)>,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    /// Reads or changes the bearer tokens.
    Tokens(TokenJob),
}

/// A request about the stored bearer tokens.
pub(crate) enum TokenJob {
    /// Every token, oldest first.
    List(oneshot::Sender<Result<Vec<StoredToken>, String>>),
    /// Stores a new token, stamped with the writer's time of creation.
    Insert(Box<StoredToken>, oneshot::Sender<Result<StoredToken, String>>),
    /// Revokes a token now; answers it (`None`: no such token).
    Revoke(String, oneshot::Sender<Result<Option<StoredToken>, String>>),
}

/// The queue of the writer thread; closed (`None`) when the writer stops.
type JobQueue = Arc<Mutex<Option<mpsc::Sender<Job>>>>;

/// What the writer publishes to the actor and readers: the committed view
/// and its events, the counters, and what the actor takes in before its
/// next decision.
pub(crate) struct Published {
    pub(crate) view: RwLock<View>,
    pub(crate) events: broadcast::Sender<StateEvent>,
    /// Write requests handed to the writer and not yet answered.
    pub(crate) in_flight: AtomicUsize,
    /// How many commits have failed. Each failure refuses every write
    /// decided before the actor took it in (see [`WriteJob::decided_at`]);
    /// the actor then puts the committed runs back into its working state.
    pub(crate) generation: AtomicU64,
    /// False from a failed commit until a commit succeeds again.
    pub(crate) writable: AtomicBool,
    /// Restarts of the state actor by its supervisor.
    pub(crate) actor_restarts: AtomicU64,
    /// Why the supervisor gave up on the state actor, once it has.
    pub(crate) gave_up: tokio::sync::watch::Sender<Option<String>>,
    pub(crate) stats: Arc<StoreStats>,
    /// The store other heads share, if that is where runs are kept: the
    /// one source of truth for "is the store shared", as the store says.
    pub(crate) shared_store: Option<SharedStoreHandle>,
    /// What the actor takes in before its next decision.
    inbox: Mutex<Vec<Absorb>>,
    inbox_pending: AtomicBool,
    /// Heartbeats received here and not yet shared with other heads.
    beats: Mutex<HashMap<RunId, u64>>,
    /// What is heard from live runs and their ranks (memory only): the
    /// actor keeps its entries, connections stamp heartbeats into them.
    /// Here so that it outlives restarts of the actor, as readers do.
    pub(crate) liveness: Arc<crate::decisions::liveness::Liveness>,
    /// Reads the metric histories from the store, on a connection of its own.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) metric_reader: Arc<dyn MetricReader>,
    /// The service's clock, for what is stamped outside the writer thread
    /// (forwarding's last success).
    #[cfg_attr(not(feature = "forward"), allow(dead_code))]
    pub(crate) clock: Arc<dyn crate::decisions::clock::Clock>,
    /// The feeds of the committed changes (forwarding, notifications)
    /// and their counters.
    pub(crate) feeds: crate::engine::stats::Feeds,
}

impl Published {
    /// Takes what the writer left for the actor, in order.
    pub(crate) fn take_inbox(&self) -> Vec<Absorb> {
        if !self.inbox_pending.swap(false, Ordering::SeqCst) {
            return Vec::new();
        }
        std::mem::take(&mut *self.inbox.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn push_inbox(&self, items: impl IntoIterator<Item = Absorb>) {
        let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
        let before = inbox.len();
        inbox.extend(items);
        if inbox.len() > before {
            self.inbox_pending.store(true, Ordering::SeqCst);
        }
    }

    /// True while this head is the one that sweeps leases and retention:
    /// always with a store of its own; with a shared store, while it holds
    /// the store's sweep lock.
    pub(crate) fn sweeps(&self) -> bool {
        self.shared_store.as_ref().is_none_or(SharedStoreHandle::holds_sweep_lock)
    }

    /// Notes a heartbeat, to share with the other heads of a shared store.
    pub(crate) fn note_heartbeat(&self, id: &RunId, at_ms: u64) {
        if self.shared_store.is_some() {
            self.beats.lock().unwrap_or_else(|e| e.into_inner()).insert(id.clone(), at_ms);
        }
    }
}

/// The handle to the writer thread. It outlives restarts of the actor, so
/// writes queued by a failed actor are committed before its successor loads.
pub(crate) struct Writer {
    jobs: JobQueue,
    thread: Mutex<Option<JoinHandle<()>>>,
    pub(crate) shared: Arc<Published>,
}

impl Writer {
    /// Opens the store and starts the writer thread.
    pub(crate) fn start(config: &StateConfig) -> Result<Self, StoreError> {
        let (tx, rx) = mpsc::channel();
        let jobs: JobQueue = Arc::new(Mutex::new(Some(tx)));
        // The store is opened (and dropped) on the writer thread: a
        // PostgreSQL store runs a runtime of its own, which must not be
        // started or stopped inside the caller's. What it says of itself
        // (shared or not) comes back before the rest is built on it.
        let (opened, is_open) = mpsc::sync_channel(1);
        let (give_shared, take_shared) = mpsc::sync_channel::<Arc<Published>>(1);
        let store_config = config.store.clone();
        let quarantine = config.quarantine_corrupt;
        let queue = jobs.clone();
        let clock = config.clock.clone();
        let history_bound = HistoryBound::new(config.retention.max_bytes);
        #[cfg(feature = "fault-injection")]
        let faults = config.faults.clone();
        let handle = std::thread::Builder::new()
            .name("trainstate-writer".into())
            .spawn(move || {
                let mut store = match store::open(&store_config, quarantine) {
                    Ok(store) => store,
                    Err(err) => {
                        let _ = opened.send(Err(err));
                        return;
                    }
                };
                let shared_store = store.shared().map(|s| s.handle());
                let reader = match store.metric_reader() {
                    Ok(reader) => reader,
                    Err(err) => {
                        let _ = opened.send(Err(err));
                        return;
                    }
                };
                let _ = opened.send(Ok((shared_store, reader)));
                let Ok(shared) = take_shared.recv() else { return };
                let follow_pending = Arc::new(AtomicBool::new(false));
                if let Some(wakeups) = store.shared().and_then(|s| s.take_wakeups()) {
                    follow_on_wakeups(wakeups, queue, follow_pending.clone());
                }
                let mut thread = WriterThread {
                    store,
                    shared,
                    clock,
                    follow_pending,
                    last_failure: String::new(),
                    failure_log: FailureLog::default(),
                    metrics_flushed: Instant::now(),
                    history_bound,
                    #[cfg(feature = "fault-injection")]
                    faults,
                };
                thread.run(rx);
            })
            .map_err(|_| StoreError::Writer("thread could not start"))?;
        let (shared_store, metric_reader) = match is_open.recv() {
            Ok(Ok(opened)) => opened,
            Ok(Err(err)) => {
                let _ = handle.join();
                return Err(err);
            }
            Err(_) => return Err(StoreError::Writer("thread stopped while opening the store")),
        };
        let shared = Arc::new(Published {
            view: RwLock::new(View::new(config.event_backlog, config.event_backlog_bytes)),
            events: broadcast::channel(EVENT_CHANNEL_CAPACITY).0,
            in_flight: AtomicUsize::new(0),
            generation: AtomicU64::new(0),
            writable: AtomicBool::new(true),
            actor_restarts: AtomicU64::new(0),
            gave_up: tokio::sync::watch::channel(None).0,
            stats: Arc::default(),
            shared_store,
            inbox: Mutex::default(),
            inbox_pending: AtomicBool::new(false),
            beats: Mutex::default(),
            liveness: Arc::default(),
            metric_reader,
            clock: config.clock.clone(),
            feeds: Default::default(),
        });
        if give_shared.send(shared.clone()).is_err() {
            let _ = handle.join();
            return Err(StoreError::Writer("thread stopped while opening the store"));
        }
        Ok(Self { jobs, thread: Mutex::new(Some(handle)), shared })
    }

    fn send(&self, job: Job) -> bool {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|jobs| jobs.send(job).is_ok())
    }

    /// Takes in what other heads committed to a shared store (with
    /// `heartbeats`, also the heartbeats they received), after every write
    /// queued before; the actor then finds it in its inbox.
    pub(crate) async fn sync(&self, heartbeats: bool) {
        let (tx, rx) = oneshot::channel();
        if self.send(Job::Follow { heartbeats, reply: Some(tx) }) {
            let _ = rx.await;
        }
    }

    /// Runs changed after `after`, at most `limit`, in position order,
    /// with what `feed` recorded of their events.
    #[cfg_attr(not(any(feature = "forward", feature = "notify")), allow(dead_code))]
    pub(crate) async fn changes_after(
        &self,
        feed: &Feed,
        after: Position,
        limit: usize,
    ) -> Result<Vec<ChangedRun>, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.ask(Job::ChangesAfter { feed: feed.clone(), after, limit, reply }, rx).await
    }

    /// The durable cursor of `feed` (see [`Store::load_cursor`]).
    #[cfg_attr(not(any(feature = "forward", feature = "notify")), allow(dead_code))]
    pub(crate) async fn load_cursor(&self, feed: &Feed) -> Result<Position, StoreError> {
        let (reply, rx) = oneshot::channel();
        self.ask(Job::LoadCursor { feed: feed.clone(), reply }, rx).await
    }

    /// Makes `at` the durable cursor of `feed`, with the events of runs it
    /// delivered (see [`Store::save_cursor`]).
    #[cfg_attr(not(any(feature = "forward", feature = "notify")), allow(dead_code))]
    pub(crate) async fn save_cursor(
        &self,
        feed: &Feed,
        at: Position,
        delivered: Vec<(String, String)>,
    ) -> Result<(), StoreError> {
        let (reply, rx) = oneshot::channel();
        self.ask(Job::SaveCursor { feed: feed.clone(), at, delivered, reply }, rx).await
    }

    /// Sends `job` and waits for its answer on `answer`.
    #[cfg_attr(not(any(feature = "forward", feature = "notify")), allow(dead_code))]
    async fn ask<T>(
        &self,
        job: Job,
        answer: oneshot::Receiver<Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        if !self.send(job) {
            return Err(StoreError::Writer("has stopped"));
        }
        answer.await.map_err(|_| StoreError::Writer("has stopped"))?
    }

    /// Every stored token, oldest first.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) async fn tokens(&self) -> Result<Vec<StoredToken>, String> {
        let (reply, rx) = oneshot::channel();
        self.token_job(TokenJob::List(reply), rx).await
    }

    /// Stores `token`, stamped with the time of its creation; answers it as stored.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) async fn insert_token(&self, token: StoredToken) -> Result<StoredToken, String> {
        let (reply, rx) = oneshot::channel();
        self.token_job(TokenJob::Insert(Box::new(token), reply), rx).await
    }

    /// Revokes the token `id` now (unless it already is); answers it as stored.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) async fn revoke_token(&self, id: &str) -> Result<Option<StoredToken>, String> {
        let (reply, rx) = oneshot::channel();
        self.token_job(TokenJob::Revoke(id.to_owned(), reply), rx).await
    }

    async fn token_job<T>(
        &self,
        job: TokenJob,
        answer: oneshot::Receiver<Result<T, String>>,
    ) -> Result<T, String> {
        if !self.send(Job::Tokens(job)) {
            return Err("the store writer has stopped".into());
        }
        answer.await.map_err(|_| "the store writer has stopped".to_owned())?
    }

    /// Queues a write. Its completion runs after the commit.
    pub(crate) fn submit(&self, job: WriteJob) {
        self.shared.in_flight.fetch_add(1, Ordering::SeqCst);
        let refused = match self.jobs.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            Some(jobs) => jobs.send(Job::Write(job)).err().map(|e| e.0),
            None => Some(Job::Write(job)),
        };
        if let Some(Job::Write(job)) = refused {
            self.shared.in_flight.fetch_sub(1, Ordering::SeqCst);
            (job.done)(Err(StateError::unavailable("the store is shutting down")));
        }
    }

    /// Loads every stored run, after every write queued before it is
    /// committed, and makes it the committed view.
    pub(crate) async fn load(&self) -> Result<Vec<Arc<RunRecord>>, StoreError> {
        let (tx, rx) = oneshot::channel();
        if !self.send(Job::Load(tx)) {
            return Err(StoreError::Writer("has stopped"));
        }
        rx.await.map_err(|_| StoreError::Writer("has stopped"))?
    }

    /// Commits everything queued, then stops the thread. Blocking.
    pub(crate) fn close(&self) {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(store) = &self.shared.shared_store {
            store.close();
        }
        if let Some(thread) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.close();
    }
}

/// Queues a follow on each wake-up of a shared store's listener (one at a
/// time: `pending` is cleared when the follow starts), on a thread of its
/// own, until the writer's queue closes or the store stops waking.
fn follow_on_wakeups(wakeups: mpsc::Receiver<()>, jobs: JobQueue, pending: Arc<AtomicBool>) {
    let spawned = std::thread::Builder::new().name("trainstate-follow".into()).spawn(move || {
        while wakeups.recv().is_ok() {
            let jobs = jobs.lock().unwrap_or_else(|e| e.into_inner());
            let Some(jobs) = jobs.as_ref() else { return };
            if !pending.swap(true, Ordering::SeqCst)
                && jobs.send(Job::Follow { heartbeats: false, reply: None }).is_err()
            {
                return;
            }
        }
    });
    if let Err(err) = spawned {
        tracing::error!(error = %err, "cannot start following the other heads' commits");
    }
}

struct WriterThread {
    store: Box<dyn Store>,
    shared: Arc<Published>,
    /// Set while a follow asked for by the store's listener is queued.
    follow_pending: Arc<AtomicBool>,
    clock: Arc<dyn crate::decisions::clock::Clock>,
    /// Why the last failed commit failed, for the writes refused after it.
    last_failure: String,
    /// Store failures logged at most once per interval each.
    failure_log: FailureLog,
    /// When the metric points pending were last handed to the store.
    metrics_flushed: Instant,
    /// The bound on each run's metric histories, all attempts together.
    history_bound: HistoryBound,
    #[cfg(feature = "fault-injection")]
    faults: Arc<crate::engine::faults::Faults>,
}

/// The store failures the writer logs, each at most one line per
/// [`crate::decisions::log_throttle::LOG_INTERVAL`]: an outage of a shared database
/// fails every commit, and every read's follow.
#[derive(Debug, Default)]
struct FailureLog {
    commits: LogThrottle,
    share_heartbeats: LogThrottle,
    follow: LogThrottle,
    read_heartbeats: LogThrottle,
    metrics: LogThrottle,
}

impl WriterThread {
    fn run(&mut self, jobs: mpsc::Receiver<Job>) {
        loop {
            if self.metrics_flushed.elapsed() >= METRICS_FLUSH_EVERY {
                self.flush_metrics();
            }
            let wait = METRICS_FLUSH_EVERY.saturating_sub(self.metrics_flushed.elapsed());
            let first = match jobs.recv_timeout(wait) {
                Ok(job) => job,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            let mut batch = Vec::new();
            let mut other = None;
            match first {
                Job::Write(job) => batch.push(job),
                job => other = Some(job),
            }
            while other.is_none() && batch.len() < MAX_BATCH {
                match jobs.try_recv() {
                    Ok(Job::Write(job)) => batch.push(job),
                    Ok(job) => other = Some(job),
                    Err(_) => break,
                }
            }
            if !batch.is_empty() {
                self.commit(batch);
            }
            match other {
                None | Some(Job::Write(_)) => {}
                Some(Job::Load(reply)) => {
                    let _ = reply.send(self.load());
                }
                Some(Job::Follow { heartbeats, reply }) => {
                    // Requests that pile up while one is served are served together.
                    let mut replies: Vec<_> = reply.into_iter().collect();
                    let mut heartbeats = heartbeats;
                    self.follow(&mut heartbeats, &mut replies);
                }
                Some(Job::ChangesAfter { feed, after, limit, reply }) => {
                    let _ = reply.send(self.store.changes_after(&feed, &after, limit));
                }
                Some(Job::LoadCursor { feed, reply }) => {
                    let _ = reply.send(self.store.load_cursor(&feed));
                }
                Some(Job::SaveCursor { feed, at, delivered, reply }) => {
                    let _ = reply.send(self.store.save_cursor(&feed, &at, &delivered));
                }
                Some(Job::Tokens(job)) => self.tokens(job),
            }
        }
        // The head stops: what is pending is flushed on the way out.
        self.flush_metrics();
    }

    /// Hands the metric points reported since the last flush to the store,
    /// in one transaction; points whose flush fails are lost, counted and
    /// logged (the latest progress of each rank is still served).
    fn flush_metrics(&mut self) {
        self.metrics_flushed = Instant::now();
        let liveness = &self.shared.liveness;
        let stats = &self.shared.stats;
        let overflowed = liveness.take_points_dropped();
        let (batches, retired) = liveness.take_metric_points();
        if overflowed > 0 {
            stats.metric_points_dropped.fetch_add(overflowed, Ordering::Relaxed);
        }
        if batches.is_empty() {
            return;
        }
        let points: u64 = batches.iter().map(|b| b.points.len() as u64).sum();
        let started = Instant::now();
        let appended = self.store.append_metrics(&batches, self.history_bound);
        // Readers served the last progress of boards gone from memory until
        // now; from here on, from the store.
        liveness.flushed_retired(retired);
        let micros = started.elapsed().as_micros() as u64;
        stats.metric_flush_micros.fetch_add(micros, Ordering::Relaxed);
        match appended {
            Ok(history_bytes) => {
                stats.metric_flushes.fetch_add(1, Ordering::Relaxed);
                stats.metric_points.fetch_add(points, Ordering::Relaxed);
                // The actor counts them against the retained bytes.
                self.shared.push_inbox([Absorb::Histories(history_bytes)]);
            }
            Err(err) => {
                stats.metric_points_dropped.fetch_add(points, Ordering::Relaxed);
                if let Some(due) =
                    self.failure_log.metrics.failed(Instant::now(), points, &err.to_string())
                {
                    tracing::error!(
                        error = %due.last_error,
                        lost_points = due.count,
                        "cannot add metric points to their histories; they are lost \
                         (lost_points: since the last such line; one line per 5s at most)"
                    );
                }
            }
        }
    }

    /// Answers a request about the tokens.
    fn tokens(&mut self, job: TokenJob) {
        let now_ms = self.clock.now_ms();
        let store = &mut self.store;
        match job {
            TokenJob::List(reply) => {
                let _ = reply.send(store.tokens().map_err(|e| e.to_string()));
            }
            TokenJob::Insert(token, reply) => {
                let token = StoredToken { created_at_ms: now_ms, ..*token };
                let _ = reply
                    .send(store.insert_token(&token).map(|()| token).map_err(|e| e.to_string()));
            }
            TokenJob::Revoke(id, reply) => {
                let _ = reply.send(store.revoke_token(&id, now_ms).map_err(|e| e.to_string()));
            }
        }
    }

    /// Takes in what other heads committed (and shares and gathers
    /// heartbeats), then answers whoever asked.
    fn follow(&mut self, heartbeats: &mut bool, replies: &mut Vec<oneshot::Sender<()>>) {
        self.follow_pending.store(false, Ordering::SeqCst);
        let shared = self.shared.clone();
        if let Some(store) = self.store.shared() {
            let beats: Vec<(RunId, u64)> =
                shared.beats.lock().unwrap_or_else(|e| e.into_inner()).drain().collect();
            let log = &mut self.failure_log;
            if !beats.is_empty()
                && let Err(err) = store.share_heartbeats(&beats)
                && let Some(due) = log.share_heartbeats.failed(Instant::now(), 1, &err.to_string())
            {
                tracing::warn!(error = %due.last_error, failures = due.count, "cannot share heartbeats with the other heads");
            }
            match store.follow() {
                Ok(Followed::Changes(changes)) => {
                    take_remote(&shared, changes, self.clock.now_ms())
                }
                Ok(Followed::Reload(records)) => {
                    tracing::warn!(
                        runs = records.len(),
                        "too far behind the other heads to replay their changes: reloading"
                    );
                    shared.view.write().unwrap_or_else(|e| e.into_inner()).replace_all(&records);
                    shared.push_inbox([Absorb::Reload(records)]);
                }
                Err(err) => {
                    if let Some(due) = log.follow.failed(Instant::now(), 1, &err.to_string()) {
                        tracing::warn!(error = %due.last_error, failures = due.count, "cannot follow the other heads' changes");
                    }
                }
            }
            if *heartbeats {
                match store.shared_heartbeats() {
                    Ok(beats) => {
                        shared.push_inbox(beats.into_iter().map(|(id, at)| Absorb::Heard(id, at)))
                    }
                    Err(err) => {
                        if let Some(due) =
                            log.read_heartbeats.failed(Instant::now(), 1, &err.to_string())
                        {
                            tracing::warn!(error = %due.last_error, failures = due.count, "cannot read the other heads' heartbeats");
                        }
                    }
                }
            }
        }
        *heartbeats = false;
        for reply in replies.drain(..) {
            let _ = reply.send(());
        }
    }
}

/// Makes other heads' committed changes part of the committed view (and
/// announces them), then hands them to the actor.
fn take_remote(shared: &Published, changes: Vec<RemoteChange>, now_ms: u64) {
    if changes.is_empty() {
        return;
    }
    {
        let mut view = shared.view.write().unwrap_or_else(|e| e.into_inner());
        for change in &changes {
            match &change.record {
                Some(record) => {
                    view.apply(&StoreOp::Put(record.clone()));
                    view.publish(&shared.events, change.kind, change.id.clone(), Some(record));
                }
                None if matches!(change.kind, EventKind::Evicted | EventKind::Deleted)
                    && view.get(&change.id).is_some() =>
                {
                    view.apply(&StoreOp::Delete(change.id.clone()));
                    view.publish(&shared.events, change.kind, change.id.clone(), None);
                }
                // Changed, then removed later (the removal is announced),
                // or removed from a run this head never had.
                None => {}
            }
        }
    }
    shared.push_inbox(changes.into_iter().map(|change| Absorb::Remote(change, now_ms)));
}

impl WriterThread {
    fn commit(&mut self, batch: Vec<WriteJob>) {
        #[cfg(feature = "fault-injection")]
        self.faults.wait_while_held();

        let shared = self.shared.clone();
        let shared = &*shared;
        // A write decided before the actor took in a failed commit may
        // build on what failed (a run the failed write registered, a status
        // it set): it is refused, and writes nothing.
        let generation = shared.generation.load(Ordering::SeqCst);
        let (batch, doomed): (Vec<WriteJob>, Vec<WriteJob>) =
            batch.into_iter().partition(|job| job.decided_at >= generation);
        for job in doomed {
            shared.in_flight.fetch_sub(1, Ordering::SeqCst);
            (job.done)(Err(StateError::unavailable(format!(
                "the store could not commit a write that this one was decided after ({}); \
                 nothing of this request was written; retry",
                self.last_failure
            ))));
        }
        if batch.is_empty() {
            return;
        }
        let has_ops = batch.iter().any(|job| !job.ops.is_empty());
        let result = {
            let started = Instant::now();
            #[cfg(feature = "fault-injection")]
            let injected = has_ops && self.faults.take_commit_failure();
            #[cfg(not(feature = "fault-injection"))]
            let injected = false;
            let shared_store = shared.shared_store.is_some();
            let result = if injected {
                Err(StoreError::Injected("database or disk is full"))
            } else if has_ops {
                let changes: Vec<JobChanges<'_>> = batch
                    .iter()
                    .map(|job| JobChanges { ops: &job.ops, events: &job.events })
                    .collect();
                self.store.commit(&changes)
            } else {
                Ok(Committed::default())
            };
            match result {
                Ok(committed) if !has_ops => Ok(committed),
                Ok(committed) => {
                    let stats = &shared.stats;
                    if committed.stale.len() < batch.len() {
                        stats.transactions.fetch_add(1, Ordering::Relaxed);
                    }
                    stats
                        .writes
                        .fetch_add((batch.len() - committed.stale.len()) as u64, Ordering::Relaxed);
                    stats
                        .commit_micros
                        .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                    let unreported = self.failure_log.commits.recovered();
                    if !shared.writable.swap(true, Ordering::SeqCst) {
                        tracing::warn!(
                            failed_writes_not_yet_logged = unreported,
                            "the store commits again"
                        );
                    }
                    Ok(committed)
                }
                Err(err) => {
                    let writes = batch.len() as u64;
                    let err = err.to_string();
                    if let Some(due) = self.failure_log.commits.failed(Instant::now(), writes, &err)
                    {
                        tracing::error!(
                            error = %due.last_error,
                            failed_writes = due.count,
                            "store commit failed; answering writes unavailable, reads go on \
                             (failed_writes: since the last such line; one line per 5s at most)"
                        );
                    }
                    self.last_failure.clone_from(&err);
                    shared.stats.failures.fetch_add(1, Ordering::Relaxed);
                    shared.writable.store(false, Ordering::SeqCst);
                    // Every write decided before the actor takes this in is
                    // refused from now on; the actor puts the committed runs
                    // back before it decides another (no restart).
                    shared.generation.fetch_add(1, Ordering::SeqCst);
                    Err(if shared_store {
                        format!(
                            "the store did not confirm the commit ({err}); the write may not \
                             have taken effect; retry (a repeated write is a no-op)"
                        )
                    } else {
                        format!(
                            "the store cannot write ({err}); nothing of this request was \
                             written; retry when the store can write again"
                        )
                    })
                }
            }
        };

        let committed = match result {
            Ok(committed) => committed,
            Err(err) => {
                for job in batch {
                    shared.in_flight.fetch_sub(1, Ordering::SeqCst);
                    (job.done)(Err(StateError::unavailable(err.clone())));
                }
                return;
            }
        };
        let stale: HashSet<usize> = committed.stale.iter().copied().collect();
        take_remote(shared, committed.remote, self.clock.now_ms());
        {
            let mut view = shared.view.write().unwrap_or_else(|e| e.into_inner());
            for job in batch.iter().enumerate().filter(|(i, _)| !stale.contains(i)).map(|(_, j)| j)
            {
                for op in &job.ops {
                    view.apply(op);
                }
                for event in &job.events {
                    view.publish(
                        &shared.events,
                        event.kind,
                        event.run_id.clone(),
                        event.record.as_ref(),
                    );
                }
            }
        }
        if !stale.is_empty() {
            // The actor gets the stored versions before the callers hear
            // to retry, so a retry is decided on them.
            let truth: HashMap<RunId, Option<Arc<RunRecord>>> =
                committed.truth.into_iter().collect();
            let resets =
                batch.iter().enumerate().filter(|(i, _)| stale.contains(i)).flat_map(|(_, job)| {
                    job.ops.iter().filter_map(|op| {
                        let (id, stale) = match op {
                            StoreOp::Put(record) => (record.id.clone(), Some(record.version)),
                            StoreOp::Delete(id) => (id.clone(), None),
                            // A capture is no version of its run.
                            StoreOp::PutCapture(_) | StoreOp::DropCapture { .. } => return None,
                        };
                        let truth = truth.get(&id).cloned().flatten();
                        Some(Absorb::Reset { id, stale, truth })
                    })
                });
            shared.push_inbox(resets.collect::<Vec<_>>());
        }
        for (i, job) in batch.into_iter().enumerate() {
            shared.in_flight.fetch_sub(1, Ordering::SeqCst);
            let answer = if stale.contains(&i) {
                Err(StateError::unavailable(
                    "another head changed the run at the same time; nothing was written, retry",
                ))
            } else {
                Ok(())
            };
            (job.done)(answer);
        }
    }

    fn load(&mut self) -> Result<Vec<Arc<RunRecord>>, StoreError> {
        self.follow_pending.store(false, Ordering::SeqCst);
        let shared = &*self.shared;
        let records = self.store.load()?;
        shared.view.write().unwrap_or_else(|e| e.into_inner()).replace_all(&records);
        // The loaded runs include everything the inbox held.
        shared.take_inbox();
        Ok(records)
    }
}
