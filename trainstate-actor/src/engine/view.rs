//! The committed view: what readers and subscribers see.
//!
//! Only the store writer changes it, after a commit, so reads and events
//! never show a write that is not durable.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::{broadcast, watch};
use trainstate_client::{Cursor, EventKind, RunPage, RunQuery, StateEvent, Subscription};
use trainstate_schema::api::{
    FailureCounts, NodeDetail, NodeDetailResponse, NodeFailure, NodeListResponse, NodeRuns,
    NodeSummary,
};
use trainstate_schema::{HealthState, RunId, RunStatus};

use crate::decisions::change::StoreOp;
use crate::decisions::nodes::{self, NodeLedger};
use crate::decisions::record::RunRecord;
use crate::decisions::rendezvous::StoredRuns;

mod goodput;
mod names;

/// The bits of an event id that count the events of one stream; the bits
/// above them name the stream.
const COUNTER_BITS: u32 = 26;

/// The bits of an event id: below 2^53, every id is exact as a JavaScript
/// number.
const ID_BITS: u32 = 53;

/// The first id of a new stream: its name in the high bits, the count 0.
///
/// Every view (a process, an actor restart, a reload of the store) starts
/// a stream of its own, named at random, so that an event id handed out by
/// another head, an earlier process or an earlier view of this one names
/// another stream and is answered with a snapshot, however close together
/// the heads started; within a stream, ids count up by one. Its
/// 27 bits make two streams share a name with a chance of one in 134
/// million; within one process a new stream never takes the previous name.
/// The randomness is std's per-process hash keys (seeded from the
/// operating system), mixed with the time and the process id: only
/// distinctness matters here, never secrecy.
fn new_stream() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let streams = 1u64 << (ID_BITS - COUNTER_BITS);
    loop {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
        hasher.write_u32(std::process::id());
        // Never stream 0, never the previous stream of this process.
        let name = hasher.finish() % (streams - 1) + 1;
        let first = name << COUNTER_BITS;
        if LAST.swap(first, Ordering::SeqCst) != first {
            return first;
        }
    }
}

/// The stream an event id belongs to.
fn stream_of(id: u64) -> u64 {
    id >> COUNTER_BITS
}

/// The bytes an event is counted for in the backlog: its run's JSON (the
/// version it carries stays pinned as long as the event is kept, even
/// after the run changed again) and the event itself.
fn event_bytes(event: &StateEvent) -> usize {
    std::mem::size_of::<StateEvent>() + event.run.as_ref().map_or(0, |r| r.approximate_len())
}

/// Every committed run as of one sequence number, newest first: references
/// to the committed records, shared (with the view and with every other
/// subscriber that started at the same number), never copies of their JSON.
#[cfg_attr(not(feature = "server"), allow(dead_code))]
#[derive(Clone)]
pub(crate) struct Snapshot {
    /// The sequence number it is current at.
    pub(crate) seq: u64,
    /// The runs, newest first.
    pub(crate) runs: Arc<[Arc<RunRecord>]>,
}

/// Where a follower of the event stream starts.
#[cfg_attr(not(feature = "server"), allow(dead_code))]
pub(crate) enum Start {
    /// After this sequence number: the events after it are still kept.
    After(u64),
    /// From a snapshot: the events after the one asked for are gone (or
    /// none was asked for, or it is not one of this view's).
    Snapshot(Snapshot),
}

/// The events after a position are no longer kept: the follower must start
/// again from a snapshot.
#[cfg_attr(not(feature = "server"), allow(dead_code))]
#[derive(Debug)]
pub(crate) struct Lagged;

/// A run's place in the secondary indexes: its start time, then its slot
/// in [`View::slots`]. Sixteen bytes, where `(start_time_ms, RunId)` would
/// take a heap copy of the id per index entry. Runs that share a start
/// millisecond are ordered by slot here, not by id: a page walk sorts each
/// millisecond's runs by id before it answers (see [`View::walk`]).
type Key = (u64, u32);

/// The runs one index key holds, in start-time order.
type Set = BTreeSet<Key>;

/// Secondary indexes over the committed runs, kept in step with `put` and
/// `apply`: each key (a status, a job id, a node id or IP, a cluster, a
/// three-byte piece of a name) holds the ordered set of its runs, so a
/// filtered page is a walk of the smallest set from the cursor and a
/// filter that matches nothing finds an empty set at once.
#[derive(Default)]
struct Indexes {
    /// In [`RunStatus::ALL`] order.
    status: [Set; RunStatus::ALL.len()],
    /// In [`HealthState::ALL`] order; a run with no health is in none.
    health: [Set; HealthState::ALL.len()],
    job: HashMap<Box<str>, Set>,
    node_id: HashMap<Box<str>, Set>,
    node_ip: HashMap<Box<str>, Set>,
    cluster: HashMap<Box<str>, Set>,
    /// The runs of each rendezvous key, by `controller_actor_id`
    /// (`rendezvous:<key>`): how a join finds the run of its key.
    rendezvous: HashMap<Box<str>, Set>,
    /// Every run's name, for searches in names.
    names: names::Names,
}

fn status_index(status: RunStatus) -> usize {
    RunStatus::ALL.iter().position(|s| *s == status).unwrap_or(0)
}

fn health_index(state: HealthState) -> usize {
    HealthState::ALL.iter().position(|s| *s == state).unwrap_or(0)
}

fn insert_into(map: &mut HashMap<Box<str>, Set>, name: &str, key: Key) {
    match map.get_mut(name) {
        Some(set) => {
            set.insert(key);
        }
        None => {
            map.insert(name.into(), Set::from([key]));
        }
    }
}

fn remove_from(map: &mut HashMap<Box<str>, Set>, name: &str, key: Key) {
    if let Some(set) = map.get_mut(name) {
        set.remove(&key);
        if set.is_empty() {
            map.remove(name);
        }
    }
}

/// The `controller_actor_id` of a run the rendezvous assembled.
fn rendezvous_controller(record: &RunRecord) -> Option<&str> {
    let controller = record.controller_actor_id();
    controller.starts_with(crate::decisions::record::CONTROLLER_PREFIX).then_some(controller)
}

impl Indexes {
    /// The indexes of the runs in `slots`, each set built from its keys in
    /// order.
    fn of(slots: &[Option<Arc<RunRecord>>]) -> Self {
        let mut runs: Vec<(Key, &RunRecord)> = (0u32..)
            .zip(slots)
            .filter_map(|(slot, run)| Some(((run.as_ref()?.start_time_ms, slot), &**run.as_ref()?)))
            .collect();
        runs.sort_unstable_by_key(|(key, _)| *key);
        let mut status: [Vec<Key>; RunStatus::ALL.len()] = Default::default();
        let mut health: [Vec<Key>; HealthState::ALL.len()] = Default::default();
        let [mut job, mut node_id, mut node_ip, mut cluster, mut rendezvous] =
            std::array::from_fn(|_| HashMap::<&str, Vec<Key>>::new());
        let mut names = names::Names::default();
        for &(key, record) in &runs {
            status[status_index(record.status)].push(key);
            if let Some(state) = record.health {
                health[health_index(state)].push(key);
            }
            job.entry(&record.job_id).or_default().push(key);
            for node in record.node_ids.iter() {
                node_id.entry(node).or_default().push(key);
            }
            for ip in record.node_ips.iter() {
                node_ip.entry(ip).or_default().push(key);
            }
            if let Some(name) = record.cluster.as_deref() {
                cluster.entry(name).or_default().push(key);
            }
            if let Some(controller) = rendezvous_controller(record) {
                rendezvous.entry(controller).or_default().push(key);
            }
            names.add(key, &record.name);
        }
        let sets = |map: HashMap<&str, Vec<Key>>| -> HashMap<Box<str>, Set> {
            map.into_iter().map(|(name, keys)| (name.into(), Set::from_iter(keys))).collect()
        };
        Self {
            status: status.map(Set::from_iter),
            health: health.map(Set::from_iter),
            job: sets(job),
            node_id: sets(node_id),
            node_ip: sets(node_ip),
            cluster: sets(cluster),
            rendezvous: sets(rendezvous),
            names,
        }
    }

    /// Adds `record` under `key`; its name only with `name`.
    fn add(&mut self, key: Key, record: &RunRecord, name: bool) {
        self.status[status_index(record.status)].insert(key);
        if let Some(state) = record.health {
            self.health[health_index(state)].insert(key);
        }
        insert_into(&mut self.job, &record.job_id, key);
        for node in record.node_ids.iter() {
            insert_into(&mut self.node_id, node, key);
        }
        for ip in record.node_ips.iter() {
            insert_into(&mut self.node_ip, ip, key);
        }
        if let Some(cluster) = record.cluster.as_deref() {
            insert_into(&mut self.cluster, cluster, key);
        }
        if let Some(controller) = rendezvous_controller(record) {
            insert_into(&mut self.rendezvous, controller, key);
        }
        if name {
            self.names.add(key, &record.name);
        }
    }

    /// Removes `record` from under `key`; its name only with `name`.
    fn remove(&mut self, key: Key, record: &RunRecord, name: bool) {
        self.status[status_index(record.status)].remove(&key);
        if let Some(state) = record.health {
            self.health[health_index(state)].remove(&key);
        }
        remove_from(&mut self.job, &record.job_id, key);
        for node in record.node_ids.iter() {
            remove_from(&mut self.node_id, node, key);
        }
        for ip in record.node_ips.iter() {
            remove_from(&mut self.node_ip, ip, key);
        }
        if let Some(cluster) = record.cluster.as_deref() {
            remove_from(&mut self.cluster, cluster, key);
        }
        if let Some(controller) = rendezvous_controller(record) {
            remove_from(&mut self.rendezvous, controller, key);
        }
        if name {
            self.names.remove(key);
        }
    }
}

/// The runs one filter can only be among: the union of some index sets
/// (disjoint: several only for statuses, one per matching status).
struct Source<'a> {
    sets: Vec<Keys<'a>>,
    /// Every run of the sets matches the filter (no check needed).
    exact: bool,
}

impl Source<'_> {
    fn len(&self) -> usize {
        self.sets.iter().map(|s| s.len()).sum()
    }
}

/// Keys in ascending order: an index set, or what a name search found.
#[derive(Clone, Copy)]
enum Keys<'a> {
    Set(&'a Set),
    Sorted(&'a [Key]),
}

impl<'a> Keys<'a> {
    fn len(self) -> usize {
        match self {
            Keys::Set(set) => set.len(),
            Keys::Sorted(keys) => keys.len(),
        }
    }

    fn iter(self) -> Box<dyn Iterator<Item = &'a Key> + 'a> {
        match self {
            Keys::Set(set) => Box::new(set.iter()),
            Keys::Sorted(keys) => Box::new(keys.iter()),
        }
    }

    /// The keys up to `upper` (included), largest first.
    fn down_from(self, upper: Key) -> Box<dyn Iterator<Item = &'a Key> + 'a> {
        match self {
            Keys::Set(set) => Box::new(set.range(..=upper).rev()),
            Keys::Sorted(keys) => {
                Box::new(keys[..keys.partition_point(|k| *k <= upper)].iter().rev())
            }
        }
    }
}

/// Committed runs in listing order, and the recent events.
pub(crate) struct View {
    /// Each run and its slot in `slots`.
    runs: HashMap<RunId, (u32, Arc<RunRecord>)>,
    /// The runs by slot, for the secondary indexes; `None` where free.
    slots: Vec<Option<Arc<RunRecord>>>,
    /// Slots free for the next new run.
    free: Vec<u32>,
    indexes: Indexes,
    /// The node ledger, keyed by slot: kept in step with the runs.
    ledger: NodeLedger,
    /// Each run's goodput, summarised, by slot: kept in step with the runs.
    summaries: goodput::Summaries,
    /// (start_time_ms, id), iterated in reverse for newest first.
    order: BTreeSet<(u64, RunId)>,
    last_seq: u64,
    /// The recent events, consecutive, oldest first; bounded by
    /// `backlog_cap` events and `backlog_max_bytes` (but always holds the
    /// newest event: followers read events from here).
    backlog: VecDeque<StateEvent>,
    backlog_cap: usize,
    backlog_bytes: usize,
    backlog_max_bytes: usize,
    /// The last sequence number, for followers waiting for the next event.
    notify: watch::Sender<u64>,
    /// The last snapshot taken, while the view has not changed since:
    /// every subscriber that starts before the next change shares it.
    snapshot: Mutex<Option<Snapshot>>,
}

impl View {
    pub(crate) fn new(backlog_cap: usize, backlog_max_bytes: usize) -> Self {
        let last_seq = new_stream();
        Self {
            runs: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            indexes: Indexes::default(),
            ledger: NodeLedger::default(),
            summaries: goodput::Summaries::default(),
            order: BTreeSet::new(),
            last_seq,
            backlog: VecDeque::new(),
            backlog_cap,
            backlog_bytes: 0,
            backlog_max_bytes,
            notify: watch::Sender::new(last_seq),
            snapshot: Mutex::new(None),
        }
    }

    /// Replaces every run (after loading the store). The runs may have
    /// changed without events (another head's changes after a reload, a
    /// store loaded again after an actor restart), so no event before this
    /// point can be resumed from: the backlog is forgotten and a new stream
    /// starts, which sends every follower a fresh snapshot.
    ///
    /// The ordered sets are built in bulk, each from its sorted keys (a
    /// load of 100,000 runs spent most of its last step inserting them
    /// one run at a time).
    pub(crate) fn replace_all(&mut self, records: &[Arc<RunRecord>]) {
        self.runs = HashMap::with_capacity(records.len());
        self.slots = Vec::with_capacity(records.len());
        self.free.clear();
        for record in records {
            match self.runs.get_mut(&record.id) {
                // The same run twice: the last one read is the run.
                Some((slot, old)) => {
                    *old = record.clone();
                    self.slots[*slot as usize] = Some(record.clone());
                }
                None => {
                    let slot = u32::try_from(self.slots.len()).expect("fewer than 2^32 runs");
                    self.runs.insert(record.id.clone(), (slot, record.clone()));
                    self.slots.push(Some(record.clone()));
                }
            }
        }
        self.order = self.slots.iter().flatten().map(|r| (r.start_time_ms, r.id.clone())).collect();
        self.indexes = Indexes::of(&self.slots);
        self.ledger = NodeLedger::of(
            (0u32..).zip(&self.slots).filter_map(|(slot, run)| Some((slot, &**run.as_ref()?))),
        );
        self.summaries = goodput::Summaries::of(&self.slots);
        self.start_stream();
        self.changed();
        self.notify.send_replace(self.last_seq);
    }

    /// Starts a new stream of event ids ([`new_stream`]): the events kept
    /// belong to the old one and are forgotten.
    fn start_stream(&mut self) {
        self.backlog.clear();
        self.backlog_bytes = 0;
        self.last_seq = new_stream();
    }

    /// The id of the next event: the next in this stream, or the first of
    /// a new stream once this one has counted all it can (2^26 events),
    /// which sends every follower a fresh snapshot.
    fn next_seq(&mut self) -> u64 {
        if (self.last_seq + 1) >> COUNTER_BITS == self.last_seq >> COUNTER_BITS {
            self.last_seq += 1;
        } else {
            self.start_stream();
            self.changed();
        }
        self.last_seq
    }

    /// Forgets the shared snapshot: the runs changed.
    fn changed(&mut self) {
        *self.snapshot.get_mut().unwrap_or_else(|e| e.into_inner()) = None;
    }

    pub(crate) fn apply(&mut self, op: &StoreOp) {
        if matches!(op, StoreOp::PutCapture(_) | StoreOp::DropCapture { .. }) {
            // Captures are read from the store, never from the view.
            return;
        }
        self.changed();
        match op {
            StoreOp::Put(record) => self.put(record.clone()),
            StoreOp::Delete(id) => {
                if let Some((slot, old)) = self.runs.remove(id) {
                    self.order.remove(&(old.start_time_ms, old.id.clone()));
                    self.indexes.remove((old.start_time_ms, slot), &old, true);
                    self.ledger.remove(slot, &nodes::contribution(&old));
                    self.summaries.set(slot, None);
                    self.slots[slot as usize] = None;
                    self.free.push(slot);
                }
            }
            StoreOp::PutCapture(_) | StoreOp::DropCapture { .. } => {}
        }
    }

    fn put(&mut self, record: Arc<RunRecord>) {
        let slot = match self.runs.get_mut(&record.id) {
            Some((slot, old)) => {
                let slot = *slot;
                let old = std::mem::replace(old, record.clone());
                if old.start_time_ms != record.start_time_ms {
                    self.order.remove(&(old.start_time_ms, old.id.clone()));
                    self.order.insert((record.start_time_ms, record.id.clone()));
                }
                let same_name =
                    old.name == record.name && old.start_time_ms == record.start_time_ms;
                self.indexes.remove((old.start_time_ms, slot), &old, !same_name);
                self.indexes.add((record.start_time_ms, slot), &record, !same_name);
                self.ledger.remove(slot, &nodes::contribution(&old));
                self.ledger.add(slot, &nodes::contribution(&record));
                slot
            }
            None => {
                let slot = match self.free.pop() {
                    Some(slot) => slot,
                    None => {
                        self.slots.push(None);
                        u32::try_from(self.slots.len() - 1).expect("fewer than 2^32 runs")
                    }
                };
                self.runs.insert(record.id.clone(), (slot, record.clone()));
                self.order.insert((record.start_time_ms, record.id.clone()));
                self.indexes.add((record.start_time_ms, slot), &record, true);
                self.ledger.add(slot, &nodes::contribution(&record));
                slot
            }
        };
        self.summaries.set(slot, Some(&record));
        self.slots[slot as usize] = Some(record);
    }

    /// Every committed run.
    pub(crate) fn records(&self) -> Vec<Arc<RunRecord>> {
        self.runs.values().map(|(_, r)| r.clone()).collect()
    }

    /// Every live run whose health is STALLED.
    #[cfg_attr(not(feature = "notify"), allow(dead_code))]
    pub(crate) fn stalled_live_runs(&self) -> Vec<Arc<RunRecord>> {
        self.runs
            .values()
            .map(|(_, record)| record)
            .filter(|r| r.status.is_live() && r.health == Some(HealthState::Stalled))
            .cloned()
            .collect()
    }

    pub(crate) fn get(&self, id: &RunId) -> Option<&Arc<RunRecord>> {
        self.runs.get(id).map(|(_, r)| r)
    }

    /// The newest run (by start time) whose `controller_actor_id` is
    /// `controller`, a rendezvous key's: an index lookup, whatever the
    /// number of runs.
    pub(crate) fn newest_of_rendezvous(&self, controller: &str) -> Option<&Arc<RunRecord>> {
        let (_, slot) = self.indexes.rendezvous.get(controller)?.last()?;
        Some(self.slot(*slot))
    }

    fn slot(&self, slot: u32) -> &Arc<RunRecord> {
        self.slots[slot as usize].as_ref().expect("an indexed slot holds its run")
    }

    pub(crate) fn len(&self) -> usize {
        self.runs.len()
    }

    /// The node ledger's answer for the window from `since_ms`.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn nodes(&self, since_ms: u64, cluster: Option<&str>) -> NodeListResponse {
        let retained_since_ms = self.ledger.oldest_ms();
        NodeListResponse {
            since_ms,
            retained_since_ms,
            beyond_retention: retained_since_ms.is_some_and(|oldest| since_ms < oldest),
            rule: nodes::RULE.to_owned(),
            nodes: self.ledger.summaries(since_ms, cluster),
        }
    }

    /// Node `node` (in each cluster, or only `cluster`) with the runs
    /// behind its counts; `None` when it was never seen under a retained run.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn node(
        &self,
        node: &str,
        cluster: Option<&str>,
        since_ms: u64,
    ) -> Option<NodeDetailResponse> {
        let counted = self.ledger.detail(node, cluster, since_ms);
        if counted.is_empty() {
            return None;
        }
        let id = |key: &nodes::RunKey| self.slot(*key).id.clone();
        let nodes = counted
            .into_iter()
            .map(|c| NodeDetail {
                summary: c.summary.unwrap_or_else(|| NodeSummary {
                    node: node.to_owned(),
                    cluster: cluster.map(str::to_owned),
                    attempts: 0,
                    failures: FailureCounts::default(),
                    stall_suspect: 0,
                    straggler: 0,
                    last_seen_ms: None,
                    suspect: false,
                    reason: None,
                }),
                runs: NodeRuns {
                    attempts: c.attempts.iter().map(id).collect(),
                    failures: c
                        .failures
                        .iter()
                        .map(|(key, kind, class, at_ms)| NodeFailure {
                            run_id: id(key),
                            kind: *kind,
                            class: *class,
                            at_ms: *at_ms,
                        })
                        .collect(),
                    stall_suspect: c.stall_suspect.iter().map(id).collect(),
                    straggler: c.straggler.iter().map(id).collect(),
                },
            })
            .collect();
        let retained_since_ms = self.ledger.oldest_ms();
        Some(NodeDetailResponse {
            since_ms,
            retained_since_ms,
            beyond_retention: retained_since_ms.is_some_and(|oldest| since_ms < oldest),
            nodes,
        })
    }

    /// Why node `node` of `cluster` is a suspect from `since_ms`, if it is.
    pub(crate) fn suspect_reason(
        &self,
        node: &str,
        cluster: Option<&str>,
        since_ms: u64,
    ) -> Option<String> {
        self.ledger.suspect_reason(node, cluster, since_ms)
    }

    /// The fleet's goodput from `since_ms` to `now_ms` (see
    /// [`goodput`](self::goodput) for the rules).
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn goodput(
        &self,
        since_ms: u64,
        now_ms: u64,
        by: trainstate_schema::api::GoodputBy,
        cluster: Option<&str>,
    ) -> trainstate_schema::api::GoodputResponse {
        let fleet = goodput::Fleet {
            summaries: &self.summaries,
            slots: &self.slots,
            ledger: &self.ledger,
            retained_since_ms: self.order.first().map(|(ms, _)| *ms),
        };
        fleet.goodput(since_ms, now_ms, by, cluster)
    }

    /// The answer to `query` at `now_ms`: its window (`since`, or the
    /// default window before now), what it sums by and its cluster, each
    /// checked (an error names the field).
    pub(crate) fn goodput_of(
        &self,
        query: &trainstate_schema::api::GoodputQuery,
        now_ms: u64,
    ) -> Result<trainstate_schema::api::GoodputResponse, trainstate_client::StateError> {
        use trainstate_client::StateError;
        let since_ms = match query.since.as_deref() {
            Some(text) => trainstate_schema::api::parse_time_ms(text)
                .map_err(|reason| StateError::invalid("since", reason))?,
            None => now_ms.saturating_sub(trainstate_schema::api::DEFAULT_GOODPUT_WINDOW_MS),
        };
        if let Some(cluster) = query.cluster.as_deref() {
            trainstate_schema::validate_name("cluster", cluster)
                .map_err(|e| StateError::invalid(e.field(), e.rule().to_string()))?;
        }
        let by = query.by.unwrap_or_default();
        Ok(self.goodput(since_ms, now_ms, by, query.cluster.as_deref()))
    }

    /// The goodput of every live run that has one, counted to `now_ms`.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn live_goodput(&self, now_ms: u64) -> Vec<crate::engine::stats::LiveGoodput> {
        RunStatus::ALL
            .iter()
            .zip(&self.indexes.status)
            .filter(|(status, _)| status.is_live())
            .flat_map(|(_, set)| set.iter())
            .filter_map(|(_, slot)| {
                let record = self.slot(*slot);
                let summary = self.summaries.get(*slot)?;
                Some(crate::engine::stats::LiveGoodput {
                    id: record.id.clone(),
                    name: record.name.clone(),
                    cluster: record.cluster.clone(),
                    goodput: summary.goodput_at(now_ms),
                })
            })
            .collect()
    }

    /// The bytes the goodput summaries hold.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn goodput_bytes(&self) -> usize {
        self.summaries.heap_bytes()
    }

    /// Counts of committed runs by status, in [`RunStatus::ALL`] order.
    pub(crate) fn count_by_status(&self) -> [usize; RunStatus::ALL.len()] {
        std::array::from_fn(|i| self.indexes.status[i].len())
    }

    /// Counts of committed runs by health, in [`HealthState::ALL`] order.
    pub(crate) fn count_by_health(&self) -> [usize; HealthState::ALL.len()] {
        std::array::from_fn(|i| self.indexes.health[i].len())
    }

    /// One page of runs, newest first. `heartbeat` gives a live run's last
    /// heartbeat time, kept outside the stored JSON.
    pub(crate) fn list(
        &self,
        query: &RunQuery,
        heartbeat: impl Fn(&RunRecord) -> Option<u64>,
    ) -> RunPage {
        let matches = |record: &RunRecord| {
            (query.statuses.is_empty() || query.statuses.iter().any(|s| s.matches(record.status)))
                && query.job_id.as_deref().is_none_or(|job| *record.job_id == *job)
                && query.name_contains.as_deref().is_none_or(|text| record.name.contains(text))
                && query.node_id.as_deref().is_none_or(|n| record.node_ids.contains(n))
                && query.node_ip.as_deref().is_none_or(|n| record.node_ips.contains(n))
                && query.cluster.as_deref().is_none_or(|c| record.cluster.as_deref() == Some(c))
                && query.health.is_none_or(|h| record.health == Some(h))
        };
        let unfiltered = query.statuses.is_empty()
            && query.job_id.is_none()
            && query.name_contains.is_none()
            && query.node_id.is_none()
            && query.node_ip.is_none()
            && query.cluster.is_none()
            && query.health.is_none();
        let limit = query.limit.unwrap_or(usize::MAX);
        let mut runs: Vec<&Arc<RunRecord>> = Vec::with_capacity(limit.min(self.runs.len()));
        let mut more = false;

        let found = query.name_contains.as_deref().map(|text| self.indexes.names.find(text));
        let (sources, filters) = self.sources(query, found.as_deref());
        let total = match sources.iter().min_by_key(|s| s.len()) {
            // Answered from the index of the most selective filter: a walk
            // of its runs from the cursor, each checked against every filter.
            Some(source) => {
                let upper = query.cursor.as_ref().map(|c| (c.start_time_ms(), c.id()));
                for record in self.walk(&source.sets, upper) {
                    if !matches(record) {
                        continue;
                    }
                    if runs.len() == limit {
                        more = true;
                        break;
                    }
                    runs.push(record);
                }
                if filters == 1 && source.exact {
                    source.len()
                } else {
                    // Several filters: every run of the smallest set is checked.
                    source
                        .sets
                        .iter()
                        .flat_map(|set| set.iter())
                        .filter(|(_, slot)| matches(self.slot(*slot)))
                        .count()
                }
            }
            // No filter: the walk of every run, newest first.
            None => {
                let after = query.cursor.as_ref().map(|c| (c.start_time_ms(), c.id().clone()));
                let newest_first = match &after {
                    Some(key) => Box::new(self.order.range(..key.clone()).rev())
                        as Box<dyn Iterator<Item = &(u64, RunId)>>,
                    None => Box::new(self.order.iter().rev()),
                };
                for (_, id) in newest_first {
                    let record = &self.runs[id].1;
                    if !matches(record) {
                        continue;
                    }
                    if runs.len() == limit {
                        more = true;
                        break;
                    }
                    runs.push(record);
                }
                if unfiltered {
                    self.runs.len()
                } else {
                    self.runs.values().filter(|(_, r)| matches(r)).count()
                }
            }
        };
        let next_cursor = match (more, runs.last()) {
            (true, Some(last)) => Some(Cursor::new(last.start_time_ms, last.id.clone())),
            _ => None,
        };
        let runs = runs.into_iter().map(|r| r.document(heartbeat(r))).collect();
        RunPage::new(runs, next_cursor, total)
    }

    /// The index sets each filter of `query` can be answered from, and how
    /// many filters the query has; `found` is what the search in names
    /// found for its name filter.
    fn sources<'a>(
        &'a self,
        query: &RunQuery,
        found: Option<&'a [Key]>,
    ) -> (Vec<Source<'a>>, usize) {
        let mut sources = Vec::new();
        let mut filters = 0;
        fn by_name<'a>(map: &'a HashMap<Box<str>, Set>, name: &str) -> Source<'a> {
            Source { sets: map.get(name).map(Keys::Set).into_iter().collect(), exact: true }
        }
        if !query.statuses.is_empty() {
            filters += 1;
            let sets = RunStatus::ALL
                .iter()
                .zip(&self.indexes.status)
                .filter(|(status, _)| query.statuses.iter().any(|s| s.matches(**status)))
                .map(|(_, set)| Keys::Set(set))
                .collect();
            sources.push(Source { sets, exact: true });
        }
        if let Some(job) = query.job_id.as_deref() {
            filters += 1;
            sources.push(by_name(&self.indexes.job, job));
        }
        if let Some(node) = query.node_id.as_deref() {
            filters += 1;
            sources.push(by_name(&self.indexes.node_id, node));
        }
        if let Some(ip) = query.node_ip.as_deref() {
            filters += 1;
            sources.push(by_name(&self.indexes.node_ip, ip));
        }
        if let Some(cluster) = query.cluster.as_deref() {
            filters += 1;
            sources.push(by_name(&self.indexes.cluster, cluster));
        }
        if let Some(state) = query.health {
            filters += 1;
            let set = &self.indexes.health[health_index(state)];
            sources.push(Source { sets: vec![Keys::Set(set)], exact: true });
        }
        if let Some(found) = found {
            filters += 1;
            sources.push(Source { sets: vec![Keys::Sorted(found)], exact: true });
        }
        (sources, filters)
    }

    /// The runs of `sets` (disjoint), newest first, from just below
    /// `upper` (a cursor's start time and id) or from the newest. The sets
    /// order runs of one millisecond by slot; each millisecond's runs are
    /// sorted by id here, as the listing orders them.
    fn walk<'a>(
        &'a self,
        sets: &[Keys<'a>],
        upper: Option<(u64, &'a RunId)>,
    ) -> impl Iterator<Item = &'a Arc<RunRecord>> + 'a {
        let bound = upper.map_or(u64::MAX, |(ms, _)| ms);
        let mut heads: Vec<_> =
            sets.iter().map(|set| set.down_from((bound, u32::MAX)).peekable()).collect();
        let mut group: Vec<&'a Arc<RunRecord>> = Vec::new();
        std::iter::from_fn(move || {
            loop {
                if let Some(record) = group.pop() {
                    return Some(record);
                }
                // The newest millisecond left in any set, and all its runs.
                let ms = heads.iter_mut().filter_map(|h| h.peek().map(|(ms, _)| *ms)).max()?;
                for head in &mut heads {
                    while let Some((_, slot)) = head.next_if(|(m, _)| *m == ms) {
                        let record = self.slot(*slot);
                        if upper.is_none_or(|(up_ms, up_id)| ms < up_ms || record.id < *up_id) {
                            group.push(record);
                        }
                    }
                }
                // Popped from the end: the largest id first.
                group.sort_unstable_by(|a, b| a.id.cmp(&b.id));
            }
        })
    }

    /// Announces one committed change.
    pub(crate) fn publish(
        &mut self,
        events: &broadcast::Sender<StateEvent>,
        kind: EventKind,
        run_id: RunId,
        record: Option<&Arc<RunRecord>>,
    ) {
        let seq = self.next_seq();
        let event = StateEvent::new(seq, kind, run_id, record.map(|r| r.document(None)));
        self.backlog_bytes += event_bytes(&event);
        self.backlog.push_back(event.clone());
        // The newest event always stays: followers read it from here.
        while self.backlog.len() > 1
            && (self.backlog.len() > self.backlog_cap
                || self.backlog_bytes > self.backlog_max_bytes)
        {
            if let Some(old) = self.backlog.pop_front() {
                self.backlog_bytes -= event_bytes(&old);
            }
        }
        // No receivers is fine: nobody is listening. A receiver holds each
        // event only until it has read it.
        let _ = events.send(event);
        self.notify.send_replace(self.last_seq);
    }

    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    /// The events kept for resuming, and the bytes they are counted for.
    pub(crate) fn backlog_usage(&self) -> (usize, usize) {
        (self.backlog.len(), self.backlog_bytes)
    }

    /// True when the events after `after` are all still kept (`after` is
    /// an id of this view's stream, not in the future).
    fn resumable(&self, after: u64) -> bool {
        if stream_of(after) != stream_of(self.last_seq) || after > self.last_seq {
            return false;
        }
        let oldest_kept = self.backlog.front().map_or(self.last_seq + 1, |e| e.seq);
        after + 1 >= oldest_kept
    }

    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    /// Every committed run now, shared with every caller until the next
    /// change. Building it takes one reference per run (under the read
    /// lock the caller holds); copying no JSON.
    pub(crate) fn snapshot(&self) -> Snapshot {
        let mut cached = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(snapshot) = cached.as_ref().filter(|s| s.seq == self.last_seq) {
            return snapshot.clone();
        }
        let runs: Arc<[Arc<RunRecord>]> =
            self.order.iter().rev().map(|(_, id)| self.runs[id].1.clone()).collect();
        let snapshot = Snapshot { seq: self.last_seq, runs };
        *cached = Some(snapshot.clone());
        snapshot
    }

    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    /// Where a follower that asks to resume after `after` starts, and the
    /// channel that tells it of the next events. Taken under the read lock,
    /// so nothing is published between the two.
    pub(crate) fn follow(&self, after: Option<u64>) -> (Start, watch::Receiver<u64>) {
        let start = match after {
            Some(after) if self.resumable(after) => Start::After(after),
            _ => Start::Snapshot(self.snapshot()),
        };
        (start, self.notify.subscribe())
    }

    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    /// Up to `max` events after `after`, oldest first (none when nothing
    /// is newer); [`Lagged`] when some of them are no longer kept.
    pub(crate) fn events_after(&self, after: u64, max: usize) -> Result<Vec<StateEvent>, Lagged> {
        if after == self.last_seq {
            return Ok(Vec::new());
        }
        if !self.resumable(after) {
            return Err(Lagged);
        }
        let oldest_kept = self.backlog.front().map_or(self.last_seq + 1, |e| e.seq);
        let skip = (after + 1 - oldest_kept) as usize;
        Ok(self.backlog.iter().skip(skip).take(max).cloned().collect())
    }

    /// A subscription that misses nothing: taken under the same lock the
    /// writer publishes under.
    pub(crate) fn subscribe(
        &self,
        events: &broadcast::Sender<StateEvent>,
        after_seq: Option<u64>,
    ) -> Subscription {
        let backlog = after_seq
            .filter(|after| self.resumable(*after))
            .map(|after| self.backlog.iter().filter(|e| e.seq > after).cloned().collect());
        Subscription::new(events.subscribe(), backlog, self.last_seq)
    }
}

#[cfg(test)]
mod tests;

impl StoredRuns for RwLock<View> {
    fn stored(&self, id: &RunId) -> Option<Arc<RunRecord>> {
        self.read().unwrap_or_else(|e| e.into_inner()).get(id).cloned()
    }

    fn newest_of_rendezvous(&self, controller: &str) -> Option<Arc<RunRecord>> {
        self.read().unwrap_or_else(|e| e.into_inner()).newest_of_rendezvous(controller).cloned()
    }

    fn suspect_reason(&self, node: &str, cluster: Option<&str>, since_ms: u64) -> Option<String> {
        self.read().unwrap_or_else(|e| e.into_inner()).suspect_reason(node, cluster, since_ms)
    }
}
