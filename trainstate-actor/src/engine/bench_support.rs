//! The store without the actor, for benchmarks only (the `inproc` example
//! that `cargo xtask bench` starts for `--path store` and to fill stores,
//! and the criterion benches). Not part of the API: it skips validation,
//! transitions and back-pressure, and may change at any time.

use trainstate_client::{EventKind, RunDocument, RunPage, RunQuery, StateError};
use trainstate_schema::{RunId, TrainRunInfo};

use crate::decisions::change::{PendingEvent, StoreOp};
use crate::decisions::record::RunRecord;
use crate::engine::config::StateConfig;
use crate::engine::error::StoreError;
use crate::engine::writer::{WriteJob, Writer};

/// The store writer and its committed view, driven directly.
pub struct StoreBench {
    writer: Writer,
}

impl std::fmt::Debug for StoreBench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreBench").finish_non_exhaustive()
    }
}

impl StoreBench {
    /// Opens the store of `config` and starts its writer thread.
    pub fn open(config: &StateConfig) -> Result<Self, StoreError> {
        Ok(Self { writer: Writer::start(config)? })
    }

    /// Loads every stored run into the committed view, as the actor does at
    /// start; returns how many.
    pub async fn load(&self) -> Result<usize, StoreError> {
        Ok(self.writer.load().await?.len())
    }

    /// Queues `run` as a new run (its record and `Registered` event, as a
    /// registration writes them); `done` runs after the commit.
    pub fn put(
        &self,
        run: &TrainRunInfo,
        done: impl FnOnce(Result<(), StateError>) + Send + 'static,
    ) {
        let record = match RunRecord::new(run) {
            Ok(record) => record,
            Err(err) => return done(Err(err)),
        };
        let event = PendingEvent {
            kind: EventKind::Registered,
            run_id: record.id.clone(),
            record: Some(record.clone()),
        };
        self.writer.submit(WriteJob {
            decided_at: self.writer.shared.generation.load(std::sync::atomic::Ordering::SeqCst),
            ops: vec![StoreOp::Put(record)],
            events: vec![event],
            done: Box::new(done),
        });
    }

    /// One page of committed runs, as the actor answers a list.
    pub fn list(&self, query: &RunQuery) -> RunPage {
        self.writer.shared.view.read().unwrap_or_else(|e| e.into_inner()).list(query, |_| None)
    }

    /// One committed run, as the actor answers a get.
    pub fn get(&self, id: &RunId) -> Option<RunDocument> {
        let view = self.writer.shared.view.read().unwrap_or_else(|e| e.into_inner());
        view.get(id).map(|record| record.document(None))
    }

    /// The bytes the committed view's goodput summaries hold: what they
    /// add to the retained runs.
    pub fn goodput_summary_bytes(&self) -> usize {
        self.writer.shared.view.read().unwrap_or_else(|e| e.into_inner()).goodput_bytes()
    }

    /// Commits everything queued, then stops the writer. Blocking.
    pub fn close(&self) {
        self.writer.close();
    }
}
