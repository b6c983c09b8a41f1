//! The node ledger: per node, what happened on it under the retained runs
//! (attempts hosted, failures blamed on it, stalls and stragglers named on
//! it), kept as runs change and answered per window, with the one rule that
//! names a node a suspect ([`verdict`]).
//!
//! A run's part in the ledger is its [`Contribution`], read from its record;
//! the caller adds and removes contributions under a compact key of its own
//! for the run (a `u32`), which the answers name the runs by.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};

use serde::Deserialize;
use trainstate_schema::api::{FailureCounts, NodeSummary};
use trainstate_schema::limits::MAX_NODE_RUNS_LISTED;
use trainstate_schema::{CauseClass, CauseKind, HealthState};

use crate::decisions::record::RunRecord;
use crate::decisions::time_text::iso_ms;

/// The caller's compact key of a run.
pub(crate) type RunKey = u32;

/// The most events one node keeps: past it, its oldest are forgotten (and
/// the answers say that the ledger holds nothing before what remains).
pub(crate) const MAX_EVENTS_PER_NODE: usize = 4_096;

/// How many infrastructure failures in the window make a node a suspect.
pub(crate) const SUSPECT_FAILURES: u32 = 2;

/// The rule, in words: what the answers and `docs/nodes.md` say.
pub(crate) const RULE: &str = "a node is a suspect when ranks on it failed first, or it was lost, at least twice in the window of a fault the machine is known to have made: OOM, NODE_LOST or HARDWARE (SYSTEM_ERROR, a signal from no one known, and LOST_CONTROLLER, the controller's lease, are counted but make no suspect)";

/// The kinds of failure that make a node a suspect: the machine's faults
/// whose source is known. `SYSTEM_ERROR` is left out: a rank killed by a
/// signal no one is known to have sent is as often a person's `kill -9` or
/// the code's segfault as the node's doing.
pub(crate) const SUSPECT_KINDS: [CauseKind; 3] =
    [CauseKind::Oom, CauseKind::NodeLost, CauseKind::Hardware];

/// What one event on a node was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tag {
    /// An attempt had a rank on the node, with the node's weight in the
    /// attempt: its GPUs there (rounded up), or its workers there when the
    /// attempt has no GPUs.
    Attempt(u16),
    /// A rank on the node failed first (or the node was lost).
    Failure(CauseKind, CauseClass),
    /// A rank on the node was named a culprit of a stall.
    StallSuspect,
    /// A rank on the node was named a straggler.
    Straggler,
}

/// One event on a node: sixteen bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Event {
    at_ms: u64,
    run: RunKey,
    tag: Tag,
}

/// A run's part in the ledger: its cluster and its events, each on a node.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Contribution {
    cluster: Option<Box<str>>,
    events: Vec<(Box<str>, u64, Tag)>,
}

impl Contribution {
    /// The nodes the run had a rank on, each once.
    pub(crate) fn nodes(&self) -> impl Iterator<Item = &str> {
        let mut seen: HashSet<&str> = HashSet::new();
        self.events.iter().map(|(node, ..)| &**node).filter(move |node| seen.insert(node))
    }
}

/// The events of one node in one cluster.
#[derive(Debug, Default)]
struct Entry {
    events: Vec<Event>,
}

/// A node's events in one cluster (`None`: runs of no cluster).
type InCluster = (Option<Box<str>>, Entry);

/// The ledger: by node name, the node in each cluster it was seen in.
#[derive(Debug, Default)]
pub(crate) struct NodeLedger {
    nodes: HashMap<Box<str>, Vec<InCluster>>,
}

/// What a node's counts are in a window, with the runs behind them.
#[derive(Debug, Default)]
pub(crate) struct Counted {
    pub(crate) summary: Option<NodeSummary>,
    pub(crate) attempts: Vec<RunKey>,
    pub(crate) failures: Vec<(RunKey, CauseKind, CauseClass, u64)>,
    pub(crate) stall_suspect: Vec<RunKey>,
    pub(crate) straggler: Vec<RunKey>,
}

/// The verdict on a node's failures in the window: the reason it is a
/// suspect, or `None`. The one rule ([`RULE`]): at least
/// [`SUSPECT_FAILURES`] failures of class INFRASTRUCTURE of a kind in
/// [`SUSPECT_KINDS`].
pub(crate) fn verdict(failures: &[(CauseKind, CauseClass)], since_ms: u64) -> Option<String> {
    let infrastructure: Vec<CauseKind> = failures
        .iter()
        .filter(|(kind, class)| {
            *class == CauseClass::Infrastructure && SUSPECT_KINDS.contains(kind)
        })
        .map(|(kind, _)| *kind)
        .collect();
    let count = infrastructure.len() as u32;
    if count < SUSPECT_FAILURES {
        return None;
    }
    let kinds: Vec<String> = CauseKind::ALL
        .iter()
        .filter_map(|kind| {
            let n = infrastructure.iter().filter(|k| *k == kind).count();
            (n > 0).then(|| format!("{n} {kind}"))
        })
        .collect();
    Some(format!(
        "{count} infrastructure failures since {} ({}); {SUSPECT_FAILURES} make a suspect",
        iso_ms(since_ms),
        kinds.join(", ")
    ))
}

impl NodeLedger {
    /// The ledger of `runs`, each under its key.
    pub(crate) fn of<'a>(runs: impl Iterator<Item = (RunKey, &'a RunRecord)>) -> Self {
        let mut ledger = Self::default();
        for (key, record) in runs {
            ledger.add(key, &contribution(record));
        }
        ledger
    }

    /// Adds run `run`'s contribution.
    pub(crate) fn add(&mut self, run: RunKey, contribution: &Contribution) {
        for (node, at_ms, tag) in &contribution.events {
            let entry = self.entry(node, contribution.cluster.as_deref());
            entry.events.push(Event { at_ms: *at_ms, run, tag: *tag });
            if entry.events.len() > MAX_EVENTS_PER_NODE {
                let oldest = (0..entry.events.len())
                    .min_by_key(|&i| entry.events[i].at_ms)
                    .expect("a node past its bound has events");
                entry.events.swap_remove(oldest);
            }
        }
    }

    /// Removes run `run`'s contribution (what [`add`](Self::add) added
    /// under the same key).
    pub(crate) fn remove(&mut self, run: RunKey, contribution: &Contribution) {
        let cluster = contribution.cluster.as_deref();
        for node in contribution.nodes() {
            let Some(clusters) = self.nodes.get_mut(node) else { continue };
            if let Some(i) = clusters.iter().position(|(c, _)| c.as_deref() == cluster) {
                clusters[i].1.events.retain(|e| e.run != run);
                if clusters[i].1.events.is_empty() {
                    clusters.swap_remove(i);
                }
            }
            if clusters.is_empty() {
                self.nodes.remove(node);
            }
        }
    }

    fn entry(&mut self, node: &str, cluster: Option<&str>) -> &mut Entry {
        if !self.nodes.contains_key(node) {
            self.nodes.insert(node.into(), Vec::new());
        }
        let clusters = self.nodes.get_mut(node).expect("inserted above");
        let i = match clusters.iter().position(|(c, _)| c.as_deref() == cluster) {
            Some(i) => i,
            None => {
                clusters.push((cluster.map(Into::into), Entry::default()));
                clusters.len() - 1
            }
        };
        &mut clusters[i].1
    }

    /// Every attempt held: its node, the node's cluster, the run, the
    /// attempt's start and the node's weight in it.
    pub(crate) fn attempts(
        &self,
    ) -> impl Iterator<Item = (&str, Option<&str>, RunKey, u64, u16)> + '_ {
        self.nodes.iter().flat_map(|(node, clusters)| {
            clusters.iter().flat_map(move |(cluster, entry)| {
                entry.events.iter().filter_map(move |e| match e.tag {
                    Tag::Attempt(weight) => {
                        Some((&**node, cluster.as_deref(), e.run, e.at_ms, weight))
                    }
                    _ => None,
                })
            })
        })
    }

    /// The oldest event held, if any.
    pub(crate) fn oldest_ms(&self) -> Option<u64> {
        self.nodes.values().flatten().flat_map(|(_, e)| e.events.iter().map(|e| e.at_ms)).min()
    }

    /// Every node with an event at or after `since_ms` (of `cluster`, when
    /// given), suspects first, then by failures, then by name.
    pub(crate) fn summaries(&self, since_ms: u64, cluster: Option<&str>) -> Vec<NodeSummary> {
        let mut summaries: Vec<NodeSummary> = self
            .nodes
            .iter()
            .flat_map(|(node, clusters)| clusters.iter().map(move |(c, e)| (node, c, e)))
            .filter(|(_, c, _)| cluster.is_none_or(|want| c.as_deref() == Some(want)))
            .filter_map(|(node, c, entry)| {
                count(node, c.as_deref(), entry, since_ms, false).summary
            })
            .collect();
        sort(&mut summaries);
        summaries
    }

    /// Node `node` in each cluster (or only `cluster`), counted from
    /// `since_ms`, with the runs behind its counts; empty when it was never
    /// seen under a retained run.
    pub(crate) fn detail(&self, node: &str, cluster: Option<&str>, since_ms: u64) -> Vec<Counted> {
        let Some(clusters) = self.nodes.get(node) else { return Vec::new() };
        clusters
            .iter()
            .filter(|(c, _)| cluster.is_none_or(|want| c.as_deref() == Some(want)))
            .map(|(c, entry)| count(node, c.as_deref(), entry, since_ms, true))
            .collect()
    }

    /// Why node `node` of `cluster` is a suspect from `since_ms`, if it is.
    pub(crate) fn suspect_reason(
        &self,
        node: &str,
        cluster: Option<&str>,
        since_ms: u64,
    ) -> Option<String> {
        let (_, entry) = self.nodes.get(node)?.iter().find(|(c, _)| c.as_deref() == cluster)?;
        count(node, cluster, entry, since_ms, false).summary?.reason
    }
}

/// Suspects first, then by failures (infrastructure, then all), then by
/// name and cluster.
pub(crate) fn sort(summaries: &mut [NodeSummary]) {
    summaries.sort_by(|a, b| {
        b.suspect
            .cmp(&a.suspect)
            .then(b.failures.infrastructure.cmp(&a.failures.infrastructure))
            .then(b.failures.total().cmp(&a.failures.total()))
            .then_with(|| a.node.cmp(&b.node))
            .then_with(|| a.cluster.cmp(&b.cluster))
    });
}

/// One node's counts from `since_ms`; with `runs`, the runs behind them
/// (newest first, at most [`MAX_NODE_RUNS_LISTED`] each). No summary when
/// nothing on it is in the window.
fn count(node: &str, cluster: Option<&str>, entry: &Entry, since_ms: u64, runs: bool) -> Counted {
    let mut counted = Counted::default();
    let mut failures = FailureCounts::default();
    let mut kinds: Vec<(CauseKind, CauseClass)> = Vec::new();
    let (mut attempts, mut stalls, mut stragglers) = (0u32, 0u32, 0u32);
    let mut last_seen: Option<u64> = None;
    let in_window = entry.events.iter().filter(|e| e.at_ms >= since_ms);
    // The runs behind the counts are listed newest first; the counts alone
    // need no order, nor a list to sort.
    let in_window: Box<dyn Iterator<Item = &Event>> = if runs {
        let mut newest_first: Vec<&Event> = in_window.collect();
        newest_first.sort_by_key(|e| std::cmp::Reverse(e.at_ms));
        Box::new(newest_first.into_iter())
    } else {
        Box::new(in_window)
    };
    let listed = |list: &mut Vec<RunKey>, run: RunKey| {
        if runs && list.len() < MAX_NODE_RUNS_LISTED && !list.contains(&run) {
            list.push(run);
        }
    };
    for event in in_window {
        last_seen = last_seen.max(Some(event.at_ms));
        match event.tag {
            Tag::Attempt(_) => {
                attempts += 1;
                listed(&mut counted.attempts, event.run);
            }
            Tag::Failure(kind, class) => {
                failures.add(class);
                kinds.push((kind, class));
                if runs && counted.failures.len() < MAX_NODE_RUNS_LISTED {
                    counted.failures.push((event.run, kind, class, event.at_ms));
                }
            }
            Tag::StallSuspect => {
                stalls += 1;
                listed(&mut counted.stall_suspect, event.run);
            }
            Tag::Straggler => {
                stragglers += 1;
                listed(&mut counted.straggler, event.run);
            }
        }
    }
    if last_seen.is_none() {
        return counted; // nothing on it in the window
    }
    let reason = verdict(&kinds, since_ms);
    counted.summary = Some(NodeSummary {
        node: node.to_owned(),
        cluster: cluster.map(str::to_owned),
        attempts,
        failures,
        stall_suspect: stalls,
        straggler: stragglers,
        last_seen_ms: last_seen,
        suspect: reason.is_some(),
        reason,
    });
    counted
}

/// A run's part in the ledger, read from its stored JSON (only the fields
/// the ledger needs are parsed). A run whose JSON does not parse into them
/// contributes nothing.
pub(crate) fn contribution(record: &RunRecord) -> Contribution {
    contribution_of_json(&record.json().text())
}

/// A run's part in the ledger, read from its JSON.
fn contribution_of_json(text: &str) -> Contribution {
    match serde_json::from_str::<Facts<'_>>(text) {
        Ok(facts) => facts.contribution(),
        Err(_) => Contribution::default(),
    }
}

#[derive(Deserialize)]
struct Facts<'a> {
    start_time_ms: u64,
    #[serde(default)]
    end_time_ms: Option<u64>,
    #[serde(default, borrow)]
    cluster: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    workers: Vec<FactWorker<'a>>,
    #[serde(default, borrow)]
    attempts: Vec<FactAttempt<'a>>,
    #[serde(default)]
    cause: Option<FactCause>,
    #[serde(default)]
    health: Option<FactHealth>,
    #[serde(default)]
    health_history: Vec<FactChange>,
}

#[derive(Deserialize)]
struct FactWorker<'a> {
    world_rank: u32,
    #[serde(borrow)]
    node_id: Cow<'a, str>,
    #[serde(default, borrow)]
    node_name: Option<Cow<'a, str>>,
    #[serde(default)]
    gpu_ids: Vec<u32>,
    #[serde(default)]
    resources: FactResources,
}

#[derive(Deserialize, Default)]
struct FactResources {
    #[serde(default, rename = "GPU")]
    gpu: Option<f64>,
}

impl FactWorker<'_> {
    fn node(&self) -> &str {
        self.node_name.as_deref().unwrap_or(&self.node_id)
    }
}

/// A worker's GPUs: its `GPU` resource, else its visible GPU ids.
pub(crate) fn worker_gpus(gpu_resource: Option<f64>, gpu_ids: usize) -> f64 {
    match gpu_resource {
        Some(gpus) if gpus.is_finite() && gpus > 0.0 => gpus,
        _ => gpu_ids as f64,
    }
}

/// The distinct nodes of `workers`, in order of first appearance, each
/// with its weight in the group: its GPUs (rounded up), or its workers
/// when the group has no GPUs.
fn weighted<'w>(workers: &'w [FactWorker<'_>]) -> Vec<(&'w str, u16)> {
    let gpus = |w: &FactWorker<'_>| worker_gpus(w.resources.gpu, w.gpu_ids.len());
    let any_gpu = workers.iter().any(|w| gpus(w) > 0.0);
    // An index by name: a run may have tens of thousands of nodes, and a
    // scan per worker would make its registration quadratic.
    let mut index: HashMap<&'w str, usize> = HashMap::new();
    let mut nodes: Vec<(&'w str, f64)> = Vec::new();
    for worker in workers {
        let weight = if any_gpu { gpus(worker) } else { 1.0 };
        match index.get(worker.node()) {
            Some(&i) => nodes[i].1 += weight,
            None => {
                index.insert(worker.node(), nodes.len());
                nodes.push((worker.node(), weight));
            }
        }
    }
    nodes.into_iter().map(|(node, w)| (node, w.ceil().min(f64::from(u16::MAX)) as u16)).collect()
}

#[derive(Deserialize)]
struct FactAttempt<'a> {
    start_time_ms: u64,
    #[serde(default)]
    end_time_ms: Option<u64>,
    #[serde(default)]
    cause: Option<FactCause>,
    #[serde(default, borrow)]
    workers: Option<Vec<FactWorker<'a>>>,
}

#[derive(Deserialize)]
struct FactCause {
    kind: CauseKind,
    #[serde(default)]
    class: Option<CauseClass>,
    #[serde(default)]
    failed_world_rank: Option<u32>,
    #[serde(default)]
    failed_at_ms: Option<u64>,
}

#[derive(Deserialize)]
struct FactHealth {
    state: HealthState,
    since_ms: u64,
    #[serde(default)]
    ranks: Vec<u32>,
    #[serde(default)]
    stragglers: Vec<FactStraggler>,
}

#[derive(Deserialize)]
struct FactStraggler {
    rank: u32,
}

#[derive(Deserialize)]
struct FactChange {
    state: HealthState,
    at_ms: u64,
    #[serde(default)]
    ranks: Vec<u32>,
    #[serde(default)]
    stragglers: Vec<u32>,
}

impl Facts<'_> {
    fn contribution(&self) -> Contribution {
        let mut events: Vec<(Box<str>, u64, Tag)> = Vec::new();
        let node_of = |workers: &[FactWorker<'_>], rank: u32| -> Option<Box<str>> {
            // Workers are kept in world-rank order: the rank's place first.
            let at = workers.get(rank as usize).filter(|w| w.world_rank == rank);
            at.or_else(|| workers.iter().find(|w| w.world_rank == rank)).map(|w| w.node().into())
        };
        let blame = |events: &mut Vec<(Box<str>, u64, Tag)>,
                     workers: &[FactWorker<'_>],
                     cause: &FactCause,
                     fallback_ms: u64| {
            let Some(node) = cause.failed_world_rank.and_then(|rank| node_of(workers, rank)) else {
                return;
            };
            let class = cause.class.unwrap_or_else(|| cause.kind.class());
            events.push((
                node,
                cause.failed_at_ms.unwrap_or(fallback_ms),
                Tag::Failure(cause.kind, class),
            ));
        };
        for attempt in &self.attempts {
            let workers = attempt.workers.as_deref().unwrap_or(&self.workers);
            events.extend(
                weighted(workers)
                    .into_iter()
                    .map(|(n, w)| (n.into(), attempt.start_time_ms, Tag::Attempt(w))),
            );
            if let Some(cause) = &attempt.cause {
                blame(
                    &mut events,
                    workers,
                    cause,
                    attempt.end_time_ms.unwrap_or(attempt.start_time_ms),
                );
            }
        }
        let last_workers =
            self.attempts.last().and_then(|a| a.workers.as_deref()).unwrap_or(&self.workers);
        if self.attempts.is_empty() {
            events.extend(
                weighted(&self.workers)
                    .into_iter()
                    .map(|(n, w)| (n.into(), self.start_time_ms, Tag::Attempt(w))),
            );
        }
        // The run's cause is its last attempt's failure when that attempt
        // has one: counted once.
        let last_has_cause = self.attempts.last().is_some_and(|a| a.cause.is_some());
        if let Some(cause) = self.cause.as_ref().filter(|_| !last_has_cause) {
            blame(&mut events, last_workers, cause, self.end_time_ms.unwrap_or(self.start_time_ms));
        }
        let named =
            |events: &mut Vec<(Box<str>, u64, Tag)>, ranks: &[u32], at_ms: u64, tag: Tag| {
                let mut seen: HashSet<Box<str>> = HashSet::new();
                for rank in ranks {
                    if let Some(node) = node_of(last_workers, *rank)
                        && seen.insert(node.clone())
                    {
                        events.push((node, at_ms, tag));
                    }
                }
            };
        if self.health_history.is_empty() {
            if let Some(health) = &self.health {
                if health.state == HealthState::Stalled {
                    named(&mut events, &health.ranks, health.since_ms, Tag::StallSuspect);
                }
                let ranks: Vec<u32> = health.stragglers.iter().map(|s| s.rank).collect();
                named(&mut events, &ranks, health.since_ms, Tag::Straggler);
            }
        } else {
            let mut previous: &[u32] = &[];
            for change in &self.health_history {
                if change.state == HealthState::Stalled {
                    named(&mut events, &change.ranks, change.at_ms, Tag::StallSuspect);
                }
                // A straggler is named when it becomes one, not again at
                // each change it stays one through.
                let new: Vec<u32> =
                    change.stragglers.iter().copied().filter(|r| !previous.contains(r)).collect();
                named(&mut events, &new, change.at_ms, Tag::Straggler);
                previous = &change.stragglers;
            }
        }
        Contribution { cluster: self.cluster.as_deref().map(Into::into), events }
    }
}

#[cfg(test)]
mod tests;
