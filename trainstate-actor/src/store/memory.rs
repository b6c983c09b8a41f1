//! The in-memory store: runs and tokens live as long as the process. A
//! head that restarts its actor loads them back from here, as from a
//! durable store; nothing survives the process.

use std::collections::HashMap;
use std::sync::Arc;

use trainstate_schema::RunId;

use super::metrics::{MemoryHistories, MetricBatch, MetricReader};
use super::{ChangedRun, Committed, JobChanges, NotifyRun, Position, Store};
use crate::decisions::change::StoreOp;
use crate::decisions::record::RunRecord;
use crate::decisions::tokens::StoredToken;
use crate::engine::error::StoreError;

/// Why an in-memory store cannot be forwarded or notified from.
const NO_POSITIONS: &str = "an in-memory store keeps no positions to forward or notify from";

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

    fn commit(&mut self, jobs: &[JobChanges<'_>]) -> Result<Committed, String> {
        for op in jobs.iter().flat_map(|job| job.ops) {
            match op {
                StoreOp::Put(record) => {
                    self.runs.insert(record.id.clone(), record.clone());
                }
                StoreOp::Delete(id) => {
                    self.runs.remove(id);
                    self.histories.delete(id);
                }
            }
        }
        Ok(Committed::default())
    }

    fn append_metrics(&mut self, batches: &[MetricBatch]) -> Result<(), String> {
        let stored: Vec<MetricBatch> =
            batches.iter().filter(|b| self.runs.contains_key(&b.run_id)).cloned().collect();
        self.histories.append(&stored);
        Ok(())
    }

    fn metric_reader(&mut self) -> Result<Arc<dyn MetricReader>, StoreError> {
        Ok(Arc::new(self.histories.clone()))
    }

    fn changed_after(&mut self, _: &Position, _: usize) -> Result<Vec<ChangedRun>, String> {
        Err(NO_POSITIONS.into())
    }

    fn forward_position(&mut self, _: &str) -> Result<Position, String> {
        Err(NO_POSITIONS.into())
    }

    fn save_forward_position(&mut self, _: &str, _: &Position) -> Result<(), String> {
        Err(NO_POSITIONS.into())
    }

    fn notify_changed_after(
        &mut self,
        _: &str,
        _: &Position,
        _: usize,
    ) -> Result<Vec<NotifyRun>, String> {
        Err(NO_POSITIONS.into())
    }

    fn notify_position(&mut self, _: &str) -> Result<Position, String> {
        Err(NO_POSITIONS.into())
    }

    fn save_notify_progress(
        &mut self,
        _: &str,
        _: &Position,
        _: &[(String, String)],
    ) -> Result<(), String> {
        Err(NO_POSITIONS.into())
    }

    fn tokens(&mut self) -> Result<Vec<StoredToken>, String> {
        Ok(self.tokens.clone())
    }

    fn insert_token(&mut self, token: &StoredToken) -> Result<(), String> {
        self.tokens.push(token.clone());
        Ok(())
    }

    fn revoke_token(&mut self, id: &str, at_ms: u64) -> Result<Option<StoredToken>, String> {
        Ok(self.tokens.iter_mut().find(|t| t.id == id).map(|token| {
            token.revoked_at_ms.get_or_insert(at_ms);
            token.clone()
        }))
    }
}
