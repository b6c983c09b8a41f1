//! The store writer: one thread that owns the store, commits writes in
//! groups, then updates the committed view, announces events and answers
//! the callers, in that order.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::{broadcast, oneshot};
use trainstate_client::{EventKind, StateError, StateEvent};
use trainstate_schema::RunId;

use crate::config::{StateConfig, StoreConfig};
use crate::errors::StoreError;
use crate::record::RunRecord;
use crate::store::{SqliteStore, StoreOp};
use crate::view::View;

/// The most writes committed in one transaction.
const MAX_BATCH: usize = 4_096;

/// The capacity of the event channel per subscriber before it lags.
const EVENT_CHANNEL_CAPACITY: usize = 4_096;

/// A change announced once its write is committed.
pub(crate) struct PendingEvent {
    pub(crate) kind: EventKind,
    pub(crate) run_id: RunId,
    pub(crate) record: Option<Arc<RunRecord>>,
}

/// What runs once a write is committed (or has failed): the caller's answer.
pub(crate) type Completion = Box<dyn FnOnce(Result<(), StateError>) + Send>;

/// One write request's changes, committed atomically with its group.
pub(crate) struct WriteJob {
    pub(crate) ops: Vec<StoreOp>,
    pub(crate) events: Vec<PendingEvent>,
    pub(crate) done: Completion,
}

enum Job {
    Write(WriteJob),
    Load(oneshot::Sender<Result<Vec<Arc<RunRecord>>, StoreError>>),
}

/// Counters of the store, for metrics and tests.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Transactions committed.
    pub transactions: AtomicU64,
    /// Write requests committed.
    pub writes: AtomicU64,
    /// Total time spent committing, in microseconds.
    pub commit_micros: AtomicU64,
    /// Commits that failed.
    pub failures: AtomicU64,
}

/// What the writer shares with the actor and readers.
pub(crate) struct Shared {
    pub(crate) view: RwLock<View>,
    pub(crate) events: broadcast::Sender<StateEvent>,
    /// Write requests handed to the writer and not yet answered.
    pub(crate) in_flight: AtomicUsize,
    /// Set when a commit failed: the writer refuses writes until the store
    /// is loaded again (the actor restarts to do that).
    pub(crate) poisoned: AtomicBool,
    pub(crate) stats: Arc<StoreStats>,
}

/// The handle to the writer thread. It outlives restarts of the actor, so
/// writes queued by a failed actor are committed before its successor loads.
pub(crate) struct Writer {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    pub(crate) shared: Arc<Shared>,
}

impl Writer {
    /// Opens the store and starts the writer thread.
    pub(crate) fn start(config: &StateConfig) -> Result<Self, StoreError> {
        let store = match &config.store {
            StoreConfig::Sqlite { path, synchronous } => {
                Some(SqliteStore::open(path, *synchronous)?)
            }
            StoreConfig::InMemory => None,
        };
        let shared = Arc::new(Shared {
            view: RwLock::new(View::new(config.event_backlog)),
            events: broadcast::channel(EVENT_CHANNEL_CAPACITY).0,
            in_flight: AtomicUsize::new(0),
            poisoned: AtomicBool::new(false),
            stats: Arc::default(),
        });
        let (tx, rx) = mpsc::channel();
        let mut thread = WriterThread {
            store,
            store_config: config.store.clone(),
            shared: shared.clone(),
            #[cfg(feature = "fault-injection")]
            faults: config.faults.clone(),
        };
        let handle = std::thread::Builder::new()
            .name("trainstate-writer".into())
            .spawn(move || thread.run(rx))
            .map_err(|_| StoreError::Writer("thread could not start"))?;
        Ok(Self { jobs: Mutex::new(Some(tx)), thread: Mutex::new(Some(handle)), shared })
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
        let sent = self
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|jobs| jobs.send(Job::Load(tx)).is_ok())
            .unwrap_or(false);
        if !sent {
            return Err(StoreError::Writer("has stopped"));
        }
        rx.await.map_err(|_| StoreError::Writer("has stopped"))?
    }

    /// Commits everything queued, then stops the thread. Blocking.
    pub(crate) fn close(&self) {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
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

struct WriterThread {
    store: Option<SqliteStore>,
    store_config: StoreConfig,
    shared: Arc<Shared>,
    #[cfg(feature = "fault-injection")]
    faults: Arc<crate::faults::Faults>,
}

impl WriterThread {
    fn run(&mut self, jobs: mpsc::Receiver<Job>) {
        while let Ok(first) = jobs.recv() {
            let mut batch = Vec::new();
            let mut load = None;
            match first {
                Job::Write(job) => batch.push(job),
                Job::Load(reply) => load = Some(reply),
            }
            while load.is_none() && batch.len() < MAX_BATCH {
                match jobs.try_recv() {
                    Ok(Job::Write(job)) => batch.push(job),
                    Ok(Job::Load(reply)) => load = Some(reply),
                    Err(_) => break,
                }
            }
            if !batch.is_empty() {
                self.commit(batch);
            }
            if let Some(reply) = load {
                let _ = reply.send(self.load());
            }
        }
    }

    fn commit(&mut self, batch: Vec<WriteJob>) {
        #[cfg(feature = "fault-injection")]
        self.faults.wait_while_held();

        let shared = &*self.shared;
        let result = if shared.poisoned.load(Ordering::SeqCst) {
            Err("an earlier commit failed; the state actor is reloading the store".to_owned())
        } else {
            let started = Instant::now();
            let has_ops = batch.iter().any(|job| !job.ops.is_empty());
            #[cfg(feature = "fault-injection")]
            let injected = has_ops && self.faults.take_commit_failure();
            #[cfg(not(feature = "fault-injection"))]
            let injected = false;
            let result = match self.store.as_mut() {
                _ if injected => Err("injected fault: disk I/O error".to_owned()),
                Some(store) if has_ops => store
                    .commit(batch.iter().flat_map(|job| job.ops.iter()))
                    .map_err(|e| e.to_string()),
                _ => Ok(()),
            };
            match result {
                Ok(()) if !has_ops => Ok(()),
                Ok(()) => {
                    let stats = &shared.stats;
                    stats.transactions.fetch_add(1, Ordering::Relaxed);
                    stats.writes.fetch_add(batch.len() as u64, Ordering::Relaxed);
                    stats
                        .commit_micros
                        .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                    Ok(())
                }
                Err(err) => {
                    tracing::error!(error = %err, writes = batch.len(), "store commit failed");
                    shared.stats.failures.fetch_add(1, Ordering::Relaxed);
                    shared.poisoned.store(true, Ordering::SeqCst);
                    Err(format!("the store failed to commit: {err}"))
                }
            }
        };

        if result.is_ok() {
            let mut view = shared.view.write().unwrap_or_else(|e| e.into_inner());
            for job in &batch {
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
        for job in batch {
            shared.in_flight.fetch_sub(1, Ordering::SeqCst);
            (job.done)(result.clone().map_err(StateError::unavailable));
        }
    }

    fn load(&mut self) -> Result<Vec<Arc<RunRecord>>, StoreError> {
        let shared = &*self.shared;
        let records = match &self.store_config {
            StoreConfig::Sqlite { path, synchronous } => {
                if shared.poisoned.load(Ordering::SeqCst) || self.store.is_none() {
                    self.store = None;
                    self.store = Some(SqliteStore::open(path, *synchronous)?);
                }
                let store = self.store.as_ref().expect("opened above");
                let rows = store
                    .load()
                    .map_err(|source| StoreError::Sqlite { path: path.clone(), source })?;
                rows.into_iter()
                    .map(RunRecord::from_stored)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(StoreError::Corrupt)?
            }
            StoreConfig::InMemory => {
                let view = shared.view.read().unwrap_or_else(|e| e.into_inner());
                view.records()
            }
        };
        shared.view.write().unwrap_or_else(|e| e.into_inner()).replace_all(&records);
        shared.poisoned.store(false, Ordering::SeqCst);
        Ok(records)
    }
}
