//! A stored run: its canonical JSON and the few fields the actor indexes.

use std::sync::Arc;

use trainstate_client::{RunDocument, StateError};
use trainstate_schema::{CauseKind, RunId, RunStatus, TrainRunInfo};

/// One run as the actor keeps it in memory: the canonical JSON it serves,
/// plus what filters and transitions need without parsing it.
///
/// Keeping the JSON (not typed structs) is what keeps memory near the size
/// of the document and listings a matter of copying bytes.
#[derive(Debug)]
pub(crate) struct RunRecord {
    pub(crate) id: RunId,
    pub(crate) start_time_ms: u64,
    pub(crate) end_time_ms: Option<u64>,
    pub(crate) status: RunStatus,
    pub(crate) lost_controller: bool,
    pub(crate) job_id: Box<str>,
    pub(crate) name: Box<str>,
    /// Distinct node ids of every attempt's workers.
    pub(crate) node_ids: Box<[Box<str>]>,
    /// Distinct node IPs of every attempt's workers.
    pub(crate) node_ips: Box<[Box<str>]>,
    pub(crate) json: Arc<str>,
}

impl RunRecord {
    /// The record of a validated run. The stored JSON never carries
    /// `last_heartbeat_ms`: heartbeats live in memory only.
    pub(crate) fn new(run: &TrainRunInfo) -> Arc<Self> {
        let json = serde_json::to_string(run).expect("a validated run serializes");
        Self::with_json(run, json)
    }

    fn with_json(run: &TrainRunInfo, json: String) -> Arc<Self> {
        let mut node_ids: Vec<Box<str>> = Vec::new();
        let mut node_ips: Vec<Box<str>> = Vec::new();
        let attempts = run.attempts().iter().filter_map(|a| a.workers());
        for worker in attempts.flatten().chain(run.workers()) {
            if !node_ids.iter().any(|n| **n == *worker.node_id()) {
                node_ids.push(worker.node_id().into());
            }
            if !node_ips.iter().any(|n| **n == *worker.node_ip()) {
                node_ips.push(worker.node_ip().into());
            }
        }
        Arc::new(Self {
            id: run.id().clone(),
            start_time_ms: run.start_time_ms(),
            end_time_ms: run.end_time_ms(),
            status: run.run_status(),
            lost_controller: run.cause().is_some_and(|c| c.kind == CauseKind::LostController),
            job_id: run.job_id().into(),
            name: run.name().into(),
            node_ids: node_ids.into(),
            node_ips: node_ips.into(),
            json: json.into(),
        })
    }

    /// Reads a record back from the store's JSON.
    pub(crate) fn from_stored(json: String) -> Result<Arc<Self>, serde_json::Error> {
        let run: TrainRunInfo = serde_json::from_str(&json)?;
        // Re-serialize only if the stored text is not canonical (an older writer).
        let canonical = serde_json::to_string(&run)?;
        Ok(Self::with_json(&run, if canonical == json { json } else { canonical }))
    }

    /// The typed run.
    pub(crate) fn run(&self) -> Result<TrainRunInfo, StateError> {
        serde_json::from_str(&self.json).map_err(|e| {
            StateError::unavailable(format!("stored run {} does not parse: {e}", self.id))
        })
    }

    /// The document served to readers.
    pub(crate) fn document(&self, last_heartbeat_ms: Option<u64>) -> RunDocument {
        RunDocument::new(self.json.clone(), last_heartbeat_ms)
    }
}
