//! The in-memory store: runs and tokens live as long as the process. A
//! head that restarts its actor loads them back from here, as from a
//! durable store; nothing survives the process.

use std::collections::HashMap;
use std::sync::Arc;

use trainstate_schema::RunId;

use super::metrics::{HistoryBound, MemoryHistories, MetricBatch, MetricReader};
use super::{ChangedRun, Committed, Feed, JobChanges, Position, Store};
use crate::decisions::change::StoreOp;
use crate::decisions::record::RunRecord;
use crate::decisions::tokens::StoredToken;
use crate::store::error::StoreError;

/// A store of this head's own, in memory only.
#[derive(Default)]
pub(crate) struct MemoryStore {
    runs: HashMap<RunId, Arc<RunRecord>>,
    tokens: Vec<StoredToken>,
    histories: MemoryHistories,
}

impl Store for MemoryStore {
    fn load(&mut self) -> Result<Vec<Arc<RunRecord>>, StoreError> {
        Ok(self.runs.values().cloned().collect())
    }

    fn commit(&mut self, jobs: &[JobChanges<'_>]) -> Result<Committed, StoreError> {
        for op in jobs.iter().flat_map(|job| job.ops) {
            match op {
                StoreOp::Put(record) => {
                    self.runs.insert(record.id.clone(), record.clone());
                }
                StoreOp::Delete(id) => {
                    self.runs.remove(id);
                    self.histories.delete(id);
                }
                StoreOp::PutCapture(rows) => {
                    if self.runs.contains_key(&rows.run_id) {
                        self.histories.captures.put(rows);
                    }
                }
                StoreOp::DropCapture { run_id, capture_id } => {
                    self.histories.captures.drop_capture(run_id, *capture_id);
                }
            }
        }
        Ok(Committed::default())
    }

    fn append_metrics(
        &mut self,
        batches: &[MetricBatch],
        bound: HistoryBound,
    ) -> Result<Vec<(RunId, u64)>, StoreError> {
        let stored: Vec<MetricBatch> =
            batches.iter().filter(|b| self.runs.contains_key(&b.run_id)).cloned().collect();
        Ok(self.histories.append(&stored, bound))
    }

    fn metric_reader(&mut self) -> Result<Arc<dyn MetricReader>, StoreError> {
        Ok(Arc::new(self.histories.clone()))
    }

    fn changes_after(
        &mut self,
        _: &Feed,
        _: &Position,
        _: usize,
    ) -> Result<Vec<ChangedRun>, StoreError> {
        Err(StoreError::NoCursors)
    }

    fn load_cursor(&mut self, _: &Feed) -> Result<Position, StoreError> {
        Err(StoreError::NoCursors)
    }

    fn save_cursor(
        &mut self,
        _: &Feed,
        _: &Position,
        _: &[(String, String)],
    ) -> Result<(), StoreError> {
        Err(StoreError::NoCursors)
    }

    fn tokens(&mut self) -> Result<Vec<StoredToken>, StoreError> {
        Ok(self.tokens.clone())
    }

    fn insert_token(&mut self, token: &StoredToken) -> Result<(), StoreError> {
        // Unique, as the other stores' column is.
        let key = token.idempotency.as_ref().map(|k| k.key_hash);
        if key.is_some()
            && self.tokens.iter().any(|t| t.idempotency.as_ref().map(|k| k.key_hash) == key)
        {
            return Err(StoreError::DuplicateIdempotencyKey);
        }
        self.tokens.push(token.clone());
        Ok(())
    }

    fn revoke_token(&mut self, id: &str, at_ms: u64) -> Result<Option<StoredToken>, StoreError> {
        Ok(self.tokens.iter_mut().find(|t| t.id == id).map(|token| {
            token.revoked_at_ms.get_or_insert(at_ms);
            token.clone()
        }))
    }
}
