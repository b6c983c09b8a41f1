//! Stack captures in the store: what every store shares to keep and read
//! them.
//!
//! A capture is written through the writer like a run
//! ([`StoreOp::PutCapture`](crate::decisions::change::StoreOp), rows of
//! [`CaptureRows`]): a header row and one row per rank. Reads come from
//! the store on demand ([`CaptureReader`]), on a connection of their own,
//! so the head keeps only the pending capture of a run in memory, and a
//! restart keeps every capture. A run's captures go with the run.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use trainstate_schema::RunId;
use trainstate_schema::api::{RankStack, StackCapture};

use crate::decisions::change::CaptureRows;

/// A stored capture as the head loads it at start: its run, its bytes
/// and its header (the capture with no ranks).
#[derive(Debug, Clone)]
pub(crate) struct StoredCapture {
    pub(crate) run_id: RunId,
    pub(crate) bytes: u64,
    pub(crate) header: StackCapture,
}

/// Reads stack captures from the store, on a connection of its own (never
/// the writer's): callable from any thread, blocking.
pub(crate) trait CaptureReader: Send + Sync {
    /// The captures of run `run`, newest first, each with every rank.
    fn captures(&self, run: &RunId) -> Result<Vec<StackCapture>, String>;

    /// The header of every stored capture, of every run.
    fn capture_index(&self) -> Result<Vec<StoredCapture>, String>;
}

/// A capture from its stored header and rank rows (JSON): each rank's
/// `group` is the group that lists it.
pub(crate) fn assemble(
    header: &str,
    ranks: impl IntoIterator<Item = String>,
) -> Result<StackCapture, String> {
    let mut capture = parse_header(header)?;
    for row in ranks {
        let rank: RankStack = serde_json::from_str(&row)
            .map_err(|e| format!("capture {}: a rank's row: {e}", capture.capture_id))?;
        capture.ranks.push(rank);
    }
    capture.ranks.sort_by_key(|r| r.rank);
    for rank in &mut capture.ranks {
        rank.group =
            capture.groups.iter().position(|g| g.ranks.contains(&rank.rank)).map(|g| g as u32);
    }
    Ok(capture)
}

/// A capture's header from its stored JSON.
pub(crate) fn parse_header(header: &str) -> Result<StackCapture, String> {
    serde_json::from_str(header).map_err(|e| format!("a capture's header: {e}"))
}

/// The captures of the memory-only store, shared with its reader.
#[derive(Default, Clone)]
pub(crate) struct MemoryCaptures {
    captures: Arc<Mutex<BTreeMap<(RunId, u64), MemoryCapture>>>,
}

/// One capture of the memory-only store: its bytes, header and rank rows.
#[derive(Default)]
struct MemoryCapture {
    bytes: u64,
    header: String,
    ranks: BTreeMap<u32, String>,
}

impl MemoryCaptures {
    /// Writes `rows`.
    pub(crate) fn put(&self, rows: &CaptureRows) {
        let mut all = self.captures.lock().unwrap_or_else(|e| e.into_inner());
        let capture = all.entry((rows.run_id.clone(), rows.capture_id)).or_default();
        capture.bytes = rows.bytes;
        capture.header.clone_from(&rows.header);
        for (rank, row) in &rows.ranks {
            capture.ranks.insert(*rank, row.clone());
        }
    }

    /// Forgets capture `capture_id` of run `run`.
    pub(crate) fn drop_capture(&self, run: &RunId, capture_id: u64) {
        self.captures.lock().unwrap_or_else(|e| e.into_inner()).remove(&(run.clone(), capture_id));
    }

    /// Forgets every capture of run `run`.
    pub(crate) fn delete(&self, run: &RunId) {
        self.captures.lock().unwrap_or_else(|e| e.into_inner()).retain(|(id, _), _| id != run);
    }
}

impl CaptureReader for MemoryCaptures {
    fn captures(&self, run: &RunId) -> Result<Vec<StackCapture>, String> {
        let all = self.captures.lock().unwrap_or_else(|e| e.into_inner());
        all.iter()
            .rev()
            .filter(|((id, _), _)| id == run)
            .map(|(_, c)| assemble(&c.header, c.ranks.values().cloned()))
            .collect()
    }

    fn capture_index(&self) -> Result<Vec<StoredCapture>, String> {
        let all = self.captures.lock().unwrap_or_else(|e| e.into_inner());
        all.iter()
            .map(|((run_id, _), c)| {
                Ok(StoredCapture {
                    run_id: run_id.clone(),
                    bytes: c.bytes,
                    header: parse_header(&c.header)?,
                })
            })
            .collect()
    }
}
