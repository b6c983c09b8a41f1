//! The stores behind the state actor, behind one interface: SQLite (the
//! embedded default, [`sqlite`]) and PostgreSQL ([`postgres`], feature
//! `postgres`), which several heads can share.
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
//!   [`Store::follow`] reports them between commits (on `NOTIFY`).

// Parts serve only the PostgreSQL store or forwarding.
#![cfg_attr(not(all(feature = "postgres", feature = "forward")), allow(dead_code))]

pub(crate) mod load;
pub(crate) mod sqlite;

#[cfg(feature = "postgres")]
pub(crate) mod postgres;

use std::sync::Arc;

use trainstate_client::EventKind;
use trainstate_schema::RunId;

use crate::change::{PendingEvent, RemoteChange, StoreOp};
use crate::errors::StoreError;
use crate::record::RunRecord;
use crate::tokens::{StoredToken, hash_from_hex, scopes_from_text};

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
/// ones to forward. Keyset order: commit sequence number, then run id.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Position {
    pub(crate) seq: u64,
    pub(crate) id: String,
}

/// A run changed after a [`Position`], as stored now.
#[derive(Debug, Clone)]
pub(crate) struct ChangedRun {
    pub(crate) at: Position,
    pub(crate) json: String,
}

/// The interface of a durable store, called from the writer thread only.
pub(crate) trait Store: Send {
    /// Every stored run. A shared store also starts following from here.
    fn load(&mut self) -> Result<Vec<Arc<RunRecord>>, StoreError>;

    /// Commits the changes of every job in `jobs` that is not stale, in one
    /// transaction. An error means nothing was committed (or, if the
    /// connection was lost while committing, that it is unknown).
    fn commit(&mut self, jobs: &[JobChanges<'_>]) -> Result<Committed, String>;

    /// True when other heads may write the same store.
    fn is_shared(&self) -> bool {
        false
    }

    /// What other heads committed since the last load, commit or follow.
    fn follow(&mut self) -> Result<Followed, String> {
        Ok(Followed::Changes(Vec::new()))
    }

    /// Shares the heartbeats this head received, so that whichever head
    /// sweeps leases sees them (shared stores only; never durable).
    fn share_heartbeats(&mut self, _beats: &[(RunId, u64)]) -> Result<(), String> {
        Ok(())
    }

    /// Every heartbeat shared by any head (shared stores only).
    fn shared_heartbeats(&mut self) -> Result<Vec<(RunId, u64)>, String> {
        Ok(Vec::new())
    }

    /// Runs changed after `after`, in position order, at most `limit`.
    fn changed_after(&mut self, after: &Position, limit: usize) -> Result<Vec<ChangedRun>, String>;

    /// The durable position of forwarding to `target`.
    fn forward_position(&mut self, target: &str) -> Result<Position, String>;

    /// Makes `at` the durable position of forwarding to `target`.
    fn save_forward_position(&mut self, target: &str, at: &Position) -> Result<(), String>;

    /// Every bearer token, revoked ones included, oldest first.
    fn tokens(&mut self) -> Result<Vec<StoredToken>, String>;

    /// Stores a new token (its hash, never its secret).
    fn insert_token(&mut self, token: &StoredToken) -> Result<(), String>;

    /// Marks the token `id` revoked at `at_ms`, unless it already is, and
    /// answers it as stored after; `None` when no token has this id.
    fn revoke_token(&mut self, id: &str, at_ms: u64) -> Result<Option<StoredToken>, String>;
}

/// The columns both stores keep a token in, in this order: id, name,
/// scopes, cluster, secret_sha256, created_at_ms, revoked_at_ms.
pub(crate) const TOKEN_COLUMNS: &str =
    "id, name, scopes, cluster, secret_sha256, created_at_ms, revoked_at_ms";

/// A token from its stored columns (see [`TOKEN_COLUMNS`]).
pub(crate) fn token_from_columns(
    id: String,
    name: Option<String>,
    scopes: &str,
    cluster: Option<String>,
    hash: &str,
    created_at_ms: i64,
    revoked_at_ms: Option<i64>,
) -> Result<StoredToken, String> {
    let damaged = |e: String| format!("stored token {id}: {e}");
    Ok(StoredToken {
        scopes: scopes_from_text(scopes).map_err(damaged)?,
        hash: hash_from_hex(hash).map_err(damaged)?,
        id,
        name,
        cluster,
        created_at_ms: created_at_ms.max(0) as u64,
        revoked_at_ms: revoked_at_ms.map(|t| t.max(0) as u64),
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
