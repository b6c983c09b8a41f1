//! A stored run: its canonical JSON and the few fields the actor indexes.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use std::borrow::Cow;
use trainstate_client::{RunDocument, RunJson, StateError};

use serde::Deserialize;
use trainstate_schema::{CauseKind, RunCause, RunId, RunStatus, TrainRunInfo};

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
    /// The run's reporter heartbeats: the lease sweep may abort it.
    pub(crate) leased: bool,
    pub(crate) job_id: Box<str>,
    pub(crate) name: Box<str>,
    /// Distinct node ids of every attempt's workers.
    pub(crate) node_ids: Names,
    /// Distinct node IPs of every attempt's workers.
    pub(crate) node_ips: Names,
    json: RunJson,
    /// The cluster the run belongs to (`None` for runs registered without one).
    pub(crate) cluster: Option<Box<str>>,
    /// Which version of the run this is: unique to this record, so a
    /// shared store can tell whether a change was decided on the version
    /// it holds (see `crate::store::versions`).
    pub(crate) version: u64,
    /// The version this record replaced in the working state (0: none).
    pub(crate) base: AtomicU64,
}

impl RunRecord {
    /// The record of a validated run. The stored JSON never carries
    /// `last_heartbeat_ms`: heartbeats live in memory only.
    pub(crate) fn new(run: &TrainRunInfo) -> Arc<Self> {
        let json = RunJson::of(run);
        let attempts = run.attempts().iter().filter_map(|a| a.workers());
        let nodes = attempts.flatten().chain(run.workers()).map(|w| (w.node_id(), w.node_ip()));
        let (node_ids, node_ips) = distinct_nodes(nodes);
        Arc::new(Self {
            id: run.id().clone(),
            start_time_ms: run.start_time_ms(),
            end_time_ms: run.end_time_ms(),
            status: run.status(),
            lost_controller: run.cause().is_some_and(|c| c.kind == CauseKind::LostController),
            leased: run.heartbeats(),
            job_id: run.job_id().into(),
            name: run.name().into(),
            node_ids,
            node_ips,
            json,
            cluster: run.cluster().map(Into::into),
            version: crate::store::versions::next(),
            base: AtomicU64::new(0),
        })
    }

    /// Reads a record back from the store's JSON, which this store wrote
    /// after validating it: only the indexed fields are parsed, so loading
    /// grows with the bytes stored and no more.
    pub(crate) fn from_stored(json: String) -> Result<Arc<Self>, String> {
        Self::from_stored_version(json, crate::store::versions::next())
    }

    /// [`from_stored`](Self::from_stored), for a store that keeps each
    /// run's version beside its JSON.
    pub(crate) fn from_stored_version(json: String, version: u64) -> Result<Arc<Self>, String> {
        let json = RunJson::from_text(json, false).map_err(|e| e.to_string())?;
        let record = {
            let text = json.text();
            let index: StoredIndex<'_> = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            let id = RunId::parse(&index.id).map_err(|e| e.to_string())?;
            let attempts = index.attempts.iter().filter_map(|a| a.workers.as_deref());
            let nodes = attempts
                .flatten()
                .chain(&index.workers)
                .map(|w| (w.node_id.as_ref(), w.node_ip.as_ref()));
            let (node_ids, node_ips) = distinct_nodes(nodes);
            Self {
                id,
                start_time_ms: index.start_time_ms,
                end_time_ms: index.end_time_ms,
                // Stores written before V2 statuses have only `run_status`.
                status: index.status.unwrap_or(index.run_status),
                lost_controller: index.cause.is_some_and(|c| c.kind == CauseKind::LostController),
                leased: index.heartbeats.unwrap_or(true),
                job_id: index.job_id.as_ref().into(),
                name: index.name.as_ref().into(),
                node_ids,
                node_ips,
                json: json.clone(),
                cluster: index.cluster.map(|c| c.as_ref().into()),
                version,
                base: AtomicU64::new(0),
            }
        };
        // A live run is served with its heartbeat: kept as its members.
        let json = if record.status.is_live() { json.into_members() } else { Ok(json) };
        Ok(Arc::new(Self { json: json.map_err(|e| e.to_string())?, ..record }))
    }

    /// The run's JSON.
    pub(crate) fn json(&self) -> &RunJson {
        &self.json
    }

    /// The typed run.
    pub(crate) fn run(&self) -> Result<TrainRunInfo, StateError> {
        serde_json::from_str(&self.json().text())
            .map_err(|e| StateError::Corrupt { reason: format!("stored run {}: {e}", self.id) })
    }

    /// The document served to readers.
    pub(crate) fn document(&self, last_heartbeat_ms: Option<u64>) -> RunDocument {
        RunDocument::new(self.json().clone(), last_heartbeat_ms)
    }
}

/// A short list of distinct names.
type Names = Box<[Box<str>]>;

/// Distinct node ids and node IPs, in order of first appearance.
fn distinct_nodes<'a>(nodes: impl Iterator<Item = (&'a str, &'a str)>) -> (Names, Names) {
    let mut ids: Vec<Box<str>> = Vec::new();
    let mut ips: Vec<Box<str>> = Vec::new();
    for (id, ip) in nodes {
        if !ids.iter().any(|n| **n == *id) {
            ids.push(id.into());
        }
        if !ips.iter().any(|n| **n == *ip) {
            ips.push(ip.into());
        }
    }
    (ids.into(), ips.into())
}

/// The fields of a stored run that the actor indexes.
#[derive(Deserialize)]
struct StoredIndex<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    start_time_ms: u64,
    end_time_ms: Option<u64>,
    run_status: RunStatus,
    #[serde(default)]
    status: Option<RunStatus>,
    #[serde(default)]
    heartbeats: Option<bool>,
    #[serde(borrow)]
    job_id: Cow<'a, str>,
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(default)]
    cause: Option<RunCause>,
    #[serde(borrow)]
    workers: Vec<StoredNode<'a>>,
    #[serde(default, borrow)]
    attempts: Vec<StoredAttempt<'a>>,
    #[serde(default, borrow)]
    cluster: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct StoredNode<'a> {
    #[serde(borrow)]
    node_id: Cow<'a, str>,
    #[serde(borrow)]
    node_ip: Cow<'a, str>,
}

#[derive(Deserialize)]
struct StoredAttempt<'a> {
    #[serde(default, borrow)]
    workers: Option<Vec<StoredNode<'a>>>,
}
