//! The change vocabulary every part of the actor shares: a change to the
//! store ([`StoreOp`]), an event announced once its write is committed
//! ([`PendingEvent`]), a change another head committed ([`RemoteChange`]),
//! and what the writer hands the actor to take in ([`Absorb`]).
//!
//! A leaf: it names nothing of the actor but [`RunRecord`], itself a leaf,
//! so the state machine, the committed view, the writer and the stores all
//! speak it without importing each other.

use std::sync::Arc;

use trainstate_client::EventKind;
use trainstate_schema::RunId;

use crate::decisions::record::RunRecord;

/// One change to the store.
#[derive(Debug, Clone)]
pub(crate) enum StoreOp {
    /// Insert or replace a run.
    Put(Arc<RunRecord>),
    /// Remove a run (and every stack capture of it).
    Delete(RunId),
    /// Insert or replace rows of a run's stack capture: its header and the
    /// ranks it lists.
    PutCapture(Arc<CaptureRows>),
    /// Remove a run's stack capture (the oldest, when a new one would make
    /// more than `MAX_CAPTURES_PER_RUN`).
    DropCapture { run_id: RunId, capture_id: u64 },
}

/// Rows of one stack capture to write.
///
/// A capture is kept as a header row (the capture with no ranks, as JSON:
/// when, why, its state, groups and suspects) and one row per rank (its
/// `RankStack`, as JSON), rather than as one document: the ranks of a
/// large run answer one at a time, and each answer then writes its own
/// row, not the whole capture again (which would write a run of 1,000
/// ranks' 8 MiB a thousand times).
#[derive(Debug, Clone)]
pub(crate) struct CaptureRows {
    pub(crate) run_id: RunId,
    pub(crate) capture_id: u64,
    /// The bytes the whole capture keeps once written (its header and
    /// every rank's row): what it counts against the retained bytes.
    pub(crate) bytes: u64,
    /// The capture with no ranks, as JSON.
    pub(crate) header: String,
    /// The rows of the ranks to write, by world rank, each a `RankStack`
    /// as JSON.
    pub(crate) ranks: Vec<(u32, String)>,
}

/// A change announced once its write is committed.
pub(crate) struct PendingEvent {
    pub(crate) kind: EventKind,
    pub(crate) run_id: RunId,
    pub(crate) record: Option<Arc<RunRecord>>,
}

/// A change another head committed to a shared store.
#[derive(Debug, Clone)]
pub(crate) struct RemoteChange {
    pub(crate) kind: EventKind,
    pub(crate) id: RunId,
    /// The run as stored now; `None` when it is gone.
    pub(crate) record: Option<Arc<RunRecord>>,
}

/// What the writer hands the actor to take into its working state before
/// its next decision: changes committed by other heads, the stored
/// versions of runs a stale write touched, heartbeats other heads received.
#[derive(Debug)]
pub(crate) enum Absorb {
    /// Another head's committed change, taken in at this time: a sign of
    /// life of a live run.
    Remote(RemoteChange, u64),
    /// A write decided on a version of `id` that another head replaced was
    /// refused: put back the stored version, unless the working state has
    /// moved on from the refused one (`stale`: the refused put's version;
    /// `None` for a refused delete).
    Reset { id: RunId, stale: Option<u64>, truth: Option<Arc<RunRecord>> },
    /// Start again from every stored run.
    Reload(Vec<Arc<RunRecord>>),
    /// Some head heard from the run's controller at this time.
    Heard(RunId, u64),
    /// The bytes of metric histories these runs keep now, as the store
    /// answered a flush of their points.
    Histories(Vec<(RunId, u64)>),
}
