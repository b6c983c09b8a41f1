//! The stores behind the state actor, behind one interface ([`Store`]):
//! SQLite (the embedded default, [`sqlite`]), memory only ([`memory`]) and
//! PostgreSQL ([`postgres`], feature `postgres`), which several heads can
//! share. [`open`] is the only place that names a backend; what only a
//! shared store can do (follow other heads, share heartbeats, hold the sweep
//! lock) is its own capability, [`SharedStore`], which [`Store::shared`]
//! answers for PostgreSQL alone.
//!
//! Only the writer thread calls a store. A store commits a group of write
//! jobs in one transaction and reports what it did; it never answers a
//! caller itself. What differs between the two:
//!
//! - SQLite belongs to one head (the data directory's lock says so), so the
//!   actor's working state is the truth and every job commits.
//! - PostgreSQL may be shared by several heads. Each head decides changes
//!   against its own working state, so a commit checks every put against
//!   the version of the run it was decided on ([`RunRecord::version`] and
//!   [`RunRecord::base`]), under a lock that orders the commits of all heads.
//!   A job decided on a version that another head has since replaced is
//!   refused as *stale*, and writes nothing; its caller is told to retry,
//!   and the actor is given the stored version first. The same commit
//!   reports the changes other heads committed before it, and
//!   [`SharedStore::follow`] reports them between commits (on `NOTIFY`).

// Parts serve only the PostgreSQL store, forwarding or notifications.
#![cfg_attr(
    not(all(feature = "postgres", feature = "forward", feature = "notify")),
    allow(dead_code)
)]

pub(crate) mod columns;
pub(crate) mod config;
pub(crate) mod error;
pub(crate) mod load;
#[cfg(feature = "server")]
pub(crate) mod lock;
pub(crate) mod memory;
pub(crate) mod metrics;
pub(crate) mod private;
pub(crate) mod sqlite;
pub(crate) mod stacks;

#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "postgres")]
pub(crate) mod relay;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use trainstate_client::EventKind;
use trainstate_schema::RunId;

use crate::decisions::change::{PendingEvent, RemoteChange, StoreOp};
use crate::decisions::record::RunRecord;
use crate::decisions::tokens::{Idempotency, StoredToken, hash_from_hex, hex, scopes_from_text};
use crate::store::config::{PostgresConfig, StoreConfig};
pub(crate) use error::StoreError;
use metrics::{MetricBatch, MetricReader};

/// The changes of one write job: committed together or not at all.
#[derive(Clone, Copy)]
pub(crate) struct JobChanges<'a> {
    pub(crate) ops: &'a [StoreOp],
    pub(crate) events: &'a [PendingEvent],
}

/// What a commit did.
#[derive(Debug, Default)]
pub(crate) struct Committed {
    /// Changes other heads committed before this transaction, in commit
    /// order (shared stores only).
    pub(crate) remote: Vec<RemoteChange>,
    /// The jobs (by index) refused as stale: decided on a version of a run
    /// that another head has replaced. Nothing of theirs was written.
    pub(crate) stale: Vec<usize>,
    /// The stored version of every run a stale job touched (`None`: gone).
    pub(crate) truth: Vec<(RunId, Option<Arc<RunRecord>>)>,
}

/// What other heads committed since this head last looked.
#[derive(Debug)]
pub(crate) enum Followed {
    /// These changes, in commit order.
    Changes(Vec<RemoteChange>),
    /// Too much happened to replay (the change log was pruned past this
    /// head's position): every stored run, to start again from.
    Reload(Vec<Arc<RunRecord>>),
}

/// A position in a store's commits: the runs changed after it are the
/// ones a feed has yet to take. Keyset order: commit sequence number, then
/// run id.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Position {
    pub(crate) seq: u64,
    pub(crate) id: String,
}

/// A consumer of the committed changes whose cursor the store keeps. Each
/// kind keeps its cursor where it always has (the forwarding positions),
/// so a store written before keeps its positions.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Feed {
    /// Forwarding to the hub at this URL: it starts at the first change,
    /// and keeps nothing beside its cursor.
    Forward(String),
    /// The notification target of this name: it starts at the latest
    /// change, and keeps beside its cursor the events of each run it has
    /// delivered.
    Notify(String),
}

impl Feed {
    /// The key of the feed's cursor among the forwarding positions: the
    /// hub's URL, or `notify:<target>` (hub URLs never start so).
    pub(crate) fn key(&self) -> String {
        match self {
            Self::Forward(hub) => hub.clone(),
            Self::Notify(target) => format!("notify:{target}"),
        }
    }

    /// The notification target whose delivered events are kept, if any.
    pub(crate) fn target(&self) -> Option<&str> {
        match self {
            Self::Forward(_) => None,
            Self::Notify(target) => Some(target),
        }
    }
}

/// A run changed after a [`Position`], as stored now, with what the feed
/// recorded as delivered of its events.
#[derive(Debug, Clone)]
pub(crate) struct ChangedRun {
    pub(crate) at: Position,
    pub(crate) json: String,
    /// The ids of the run's events the feed delivered (or dropped), as
    /// [`Store::save_cursor`] saved them (a JSON array); `None` when none
    /// were, and always for a feed that keeps none.
    pub(crate) delivered: Option<String>,
}

/// The interface of a durable store, called from the writer thread only.
pub(crate) trait Store: Send {
    /// Every stored run. A shared store also starts following from here.
    fn load(&mut self) -> Result<Vec<Arc<RunRecord>>, StoreError>;

    /// Commits the changes of every job in `jobs` that is not stale, in one
    /// transaction. An error means nothing was committed (or, if the
    /// connection was lost while committing, that it is unknown).
    fn commit(&mut self, jobs: &[JobChanges<'_>]) -> Result<Committed, StoreError>;

    /// What this store can do as a store other heads share; `None` for a
    /// store of this head's own (the default).
    fn shared(&mut self) -> Option<&mut dyn SharedStore> {
        None
    }

    /// Adds the points of `batches` to their runs' metric histories, in one
    /// transaction, each series bounded by [`metrics::SeriesState`] and each
    /// run's histories, all attempts together, by `bound` (the oldest
    /// attempts give way: [`metrics::attempts_giving_way`]). The points of
    /// a run that is not stored (deleted meanwhile) are dropped. Answers
    /// the bytes of histories each run written to keeps now
    /// ([`metrics::HISTORY_POINT_BYTES`] a point).
    fn append_metrics(
        &mut self,
        batches: &[MetricBatch],
        bound: metrics::HistoryBound,
    ) -> Result<Vec<(RunId, u64)>, StoreError>;

    /// A reader of the metric histories, on a connection of its own.
    fn metric_reader(&mut self) -> Result<Arc<dyn MetricReader>, StoreError>;

    /// Runs changed after `after`, in position order, at most `limit`,
    /// each with what `feed` recorded as delivered of its events.
    fn changes_after(
        &mut self,
        feed: &Feed,
        after: &Position,
        limit: usize,
    ) -> Result<Vec<ChangedRun>, StoreError>;

    /// The durable cursor of `feed`. A forwarding feed seen for the first
    /// time starts at the first change; a notification target at the
    /// latest, saved at once (it tells of what happens from now on, not of
    /// every stored run's past).
    fn load_cursor(&mut self, feed: &Feed) -> Result<Position, StoreError>;

    /// Makes `at` the durable cursor of `feed` (unless it is behind the
    /// saved one) and, in the same transaction, records for each `(run id,
    /// event ids as a JSON array)` in `delivered` the events of that run
    /// the feed has delivered (an empty array forgets the run; a feed that
    /// keeps none is given none). A run no longer stored is skipped; a
    /// run's record goes when the run does.
    fn save_cursor(
        &mut self,
        feed: &Feed,
        at: &Position,
        delivered: &[(String, String)],
    ) -> Result<(), StoreError>;

    /// Every bearer token, revoked ones included, oldest first.
    fn tokens(&mut self) -> Result<Vec<StoredToken>, StoreError>;

    /// Stores a new token (its hash, never its secret).
    fn insert_token(&mut self, token: &StoredToken) -> Result<(), StoreError>;

    /// Marks the token `id` revoked at `at_ms`, unless it already is, and
    /// answers it as stored after; `None` when no token has this id.
    fn revoke_token(&mut self, id: &str, at_ms: u64) -> Result<Option<StoredToken>, StoreError>;
}

/// The capability of a store that several heads share (PostgreSQL only):
/// following what the others commit, sharing heartbeats, and the sweep lock
/// (see [`SharedStoreHandle`]).
pub(crate) trait SharedStore {
    /// What the rest of the head knows of this store: where it is, and
    /// whether this head holds its sweep lock.
    fn handle(&self) -> SharedStoreHandle;

    /// The wake-ups of this store's listener, once: one each time other
    /// heads commit and every tick (so heartbeats are shared and a missed
    /// notification is caught up). Whoever takes them follows the store on
    /// each; the listener stops when they are dropped.
    fn take_wakeups(&mut self) -> Option<mpsc::Receiver<()>>;

    /// What other heads committed since the last load, commit or follow.
    fn follow(&mut self) -> Result<Followed, StoreError>;

    /// Shares the heartbeats this head received, so that whichever head
    /// sweeps leases sees them (never durable).
    fn share_heartbeats(&mut self, beats: &[(RunId, u64)]) -> Result<(), StoreError>;

    /// Every heartbeat shared by any head.
    fn shared_heartbeats(&mut self) -> Result<Vec<(RunId, u64)>, StoreError>;
}

/// A shared store as the rest of the head sees it: the one source of truth
/// for "is the store shared", and for "does this head sweep".
#[derive(Debug, Clone)]
pub(crate) struct SharedStoreHandle {
    /// Where the store is, for the rendezvous relay's table.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    config: PostgresConfig,
    sweep_lock: Arc<AtomicBool>,
    closing: Arc<AtomicBool>,
}

impl SharedStoreHandle {
    /// A handle to the store at `config`, not yet holding the sweep lock.
    pub(crate) fn new(config: PostgresConfig) -> Self {
        Self { config, sweep_lock: Arc::default(), closing: Arc::default() }
    }

    /// The table through which heads relay rendezvous calls to the one that
    /// owns the groups, on this store; its connections wait at most `wait`.
    #[cfg(feature = "postgres")]
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn relay_table(
        &self,
        wait: std::time::Duration,
    ) -> Result<relay::RelayTable, relay::RelayError> {
        relay::RelayTable::open(&self.config.url, wait)
    }

    /// True while this head holds the sweep lock: it sweeps leases and
    /// retention, forwards, and owns the rendezvous groups.
    pub(crate) fn holds_sweep_lock(&self) -> bool {
        self.sweep_lock.load(Ordering::SeqCst)
    }

    /// The flag behind [`holds_sweep_lock`](Self::holds_sweep_lock), set
    /// and cleared by the store's listener.
    pub(crate) fn sweep_lock(&self) -> Arc<AtomicBool> {
        self.sweep_lock.clone()
    }

    /// Tells the store that the head is shutting down: it stops waiting
    /// for a database that does not answer.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::SeqCst);
    }

    /// True once [`close`](Self::close) was called.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::SeqCst)
    }
}

/// Opens the store `config` names: the only place that names a backend.
/// Runs that do not load are moved aside with `quarantine`, instead of
/// refusing the store.
pub(crate) fn open(config: &StoreConfig, quarantine: bool) -> Result<Box<dyn Store>, StoreError> {
    Ok(match config {
        StoreConfig::Sqlite { path, synchronous } => {
            Box::new(sqlite::SqliteStore::open(path, *synchronous)?.quarantining(quarantine))
        }
        StoreConfig::InMemory => Box::new(memory::MemoryStore::default()),
        #[cfg(feature = "postgres")]
        StoreConfig::Postgres(pg) => {
            Box::new(postgres::PgStore::open(pg)?.quarantining(quarantine))
        }
        #[cfg(not(feature = "postgres"))]
        StoreConfig::Postgres(_) => {
            return Err(StoreError::Unsupported(
                "PostgreSQL: this build lacks the `postgres` feature",
            ));
        }
    })
}

/// The columns both stores keep a token in, in this order: id, name,
/// scopes, cluster, secret_sha256, created_at_ms, revoked_at_ms,
/// expires_at_ms, idempotency_key_sha256, request_sha256, secret_sealed.
pub(crate) const TOKEN_COLUMNS: &str = "id, name, scopes, cluster, secret_sha256, created_at_ms, \
     revoked_at_ms, expires_at_ms, idempotency_key_sha256, request_sha256, secret_sealed";

/// A token's stored columns (see [`TOKEN_COLUMNS`]), as both stores read them.
pub(crate) struct TokenRow {
    pub(crate) id: String,
    pub(crate) name: Option<String>,
    pub(crate) scopes: String,
    pub(crate) cluster: Option<String>,
    pub(crate) hash: String,
    pub(crate) created_at_ms: i64,
    pub(crate) revoked_at_ms: Option<i64>,
    pub(crate) expires_at_ms: Option<i64>,
    pub(crate) idempotency_key_sha256: Option<String>,
    pub(crate) request_sha256: Option<String>,
    pub(crate) secret_sealed: Option<String>,
}

impl TokenRow {
    /// The columns of `token`, to store it.
    pub(crate) fn of(token: &StoredToken) -> Self {
        let kept = token.idempotency.as_ref();
        Self {
            id: token.id.clone(),
            name: token.name.clone(),
            scopes: token.scopes_text(),
            cluster: token.cluster.clone(),
            hash: token.hash_hex(),
            created_at_ms: token.created_at_ms as i64,
            revoked_at_ms: token.revoked_at_ms.map(|t| t as i64),
            expires_at_ms: token.expires_at_ms.map(|t| t.min(i64::MAX as u64) as i64),
            idempotency_key_sha256: kept.map(|k| hex(&k.key_hash)),
            request_sha256: kept.map(|k| hex(&k.request_hash)),
            secret_sealed: kept.map(|k| hex(&k.sealed_secret)),
        }
    }
}

/// A token from its stored columns (see [`TOKEN_COLUMNS`]).
pub(crate) fn token_from_columns(row: TokenRow) -> Result<StoredToken, StoreError> {
    let id = row.id;
    let damaged = |e: String| StoreError::CorruptRecord(format!("stored token {id}: {e}"));
    let idempotency = match (row.idempotency_key_sha256, row.request_sha256, row.secret_sealed) {
        (Some(key), Some(request), Some(sealed)) => Some(Idempotency {
            key_hash: hash_from_hex(&key).map_err(damaged)?,
            request_hash: hash_from_hex(&request).map_err(damaged)?,
            sealed_secret: hash_from_hex(&sealed).map_err(damaged)?,
        }),
        _ => None,
    };
    Ok(StoredToken {
        scopes: scopes_from_text(&row.scopes).map_err(damaged)?,
        hash: hash_from_hex(&row.hash).map_err(damaged)?,
        name: row.name,
        cluster: row.cluster,
        created_at_ms: row.created_at_ms.max(0) as u64,
        revoked_at_ms: row.revoked_at_ms.map(|t| t.max(0) as u64),
        expires_at_ms: row.expires_at_ms.map(|t| t.max(0) as u64),
        idempotency,
        id,
    })
}

/// The event kinds by their wire names, for stores that log them.
pub(crate) fn event_kind(name: &str) -> EventKind {
    [
        EventKind::Registered,
        EventKind::StatusChanged,
        EventKind::AttemptStarted,
        EventKind::Evicted,
        EventKind::Deleted,
    ]
    .into_iter()
    .find(|k| k.as_str() == name)
    .unwrap_or(EventKind::StatusChanged)
}
