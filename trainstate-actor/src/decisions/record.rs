//! A stored run: its canonical JSON and the few fields the actor indexes.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use std::borrow::Cow;
use trainstate_client::{RunDocument, RunJson, StateError};

use std::hash::{DefaultHasher, Hash, Hasher};

use serde::Deserialize;
use trainstate_schema::limits::MAX_RUN_BYTES;
use trainstate_schema::{
    CauseKind, HealthState, Resources, Rule, RunCause, RunId, RunStatus, TrainRunInfo,
    ValidationError,
};

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
    /// The run's controller heartbeats (false for a run Ray Train V2
    /// writes, whose source renews its lease with each write instead).
    /// Every live run is swept either way; this only chooses the words of
    /// a lost-controller abort.
    pub(crate) leased: bool,
    pub(crate) job_id: Box<str>,
    pub(crate) name: Box<str>,
    /// Distinct node ids of every attempt's workers.
    pub(crate) node_ids: Names,
    /// Distinct node IPs of every attempt's workers.
    pub(crate) node_ips: Names,
    /// The run's static metadata beyond the fields above, to recognise a
    /// repeated registration without parsing the stored JSON.
    statics: Statics,
    json: RunJson,
    /// A live run's JSON as one text, from its serialization, until the
    /// store writes it (see [`RunRecord::stored_text`]).
    fresh_text: Mutex<Option<Box<str>>>,
    /// The cluster the run belongs to (`None` for runs registered without one).
    pub(crate) cluster: Option<Box<str>>,
    /// The state of the run's `health` (`None` for a run with none, and
    /// for an ended run whose stall ended with it).
    pub(crate) health: Option<HealthState>,
    /// Which version of the run this is: unique to this record, so a
    /// shared store can tell whether a change was decided on the version
    /// it holds (see [`versions`]).
    pub(crate) version: u64,
    /// The version this record replaced in the working state (0: none).
    pub(crate) base: AtomicU64,
}

impl RunRecord {
    /// The run's `controller_actor_id`.
    pub(crate) fn controller_actor_id(&self) -> &str {
        &self.statics.controller_actor_id
    }

    /// The record of a validated run. The stored JSON never carries
    /// `last_heartbeat_ms`: heartbeats live in memory only.
    ///
    /// Refuses a run whose JSON would take more than [`MAX_RUN_BYTES`],
    /// naming its largest member: nothing is changed.
    pub(crate) fn new(run: &TrainRunInfo) -> Result<Arc<Self>, StateError> {
        let (json, fresh_text) = RunJson::of_with_text(run);
        let size = json.approximate_len();
        if size > MAX_RUN_BYTES {
            let field = json.largest_member().unwrap_or_else(|| "body".into());
            let rule = Rule::RunTooLarge { max: MAX_RUN_BYTES, size };
            return Err(ValidationError::new(field, rule).into());
        }
        let attempts = run.attempts().iter().filter_map(|a| a.workers());
        let nodes = attempts.flatten().chain(run.workers()).map(|w| (w.node_id(), w.node_ip()));
        let (node_ids, node_ips) = distinct_nodes(nodes);
        Ok(Arc::new(Self {
            statics: Statics {
                controller_actor_id: run.controller_actor_id().into(),
                digests: Digests::known([Statics::datasets_of(run), Statics::workers_of(run)]),
            },
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
            fresh_text: Mutex::new(fresh_text.map(Into::into)),
            cluster: run.cluster().map(Into::into),
            health: listed_health(run.health().map(|health| health.state), run.status()),
            version: versions::next(),
            base: AtomicU64::new(0),
        }))
    }

    /// Reads a record back from the store's JSON, which this store wrote
    /// after validating it: only the indexed fields are parsed, so loading
    /// grows with the bytes stored and no more.
    pub(crate) fn from_stored(json: String) -> Result<Arc<Self>, String> {
        Self::from_stored_version(json, versions::next())
    }

    /// [`from_stored`](Self::from_stored), for a store that keeps each
    /// run's version beside its JSON.
    pub(crate) fn from_stored_version(json: String, version: u64) -> Result<Arc<Self>, String> {
        let json = RunJson::from_text(json, false).map_err(|e| e.to_string())?;
        let (id, columns, digests) = {
            let text = json.text();
            let index: StoredIndex<'_> = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            let id = RunId::parse(&index.id).map_err(|e| e.to_string())?;
            (id, index.columns(), index.digests())
        };
        // A live run is served with its heartbeat: kept as its members.
        let json = if columns.status.is_live() { json.into_members() } else { Ok(json) };
        let json = json.map_err(|e| e.to_string())?;
        Ok(Self::build(id, columns, json, Digests::known(digests), version))
    }

    /// Reads a record back from the columns a store keeps beside the run's
    /// JSON ([`RunRecord::columns`]), without parsing the JSON: it is only
    /// checked to be JSON (and a live run's split into its members). The
    /// store vouches that the columns describe the JSON; the digests a
    /// repeated registration is compared by are computed from the JSON
    /// when one first needs them.
    pub(crate) fn from_columns(
        id: RunId,
        columns: RunColumns<'_>,
        json: String,
        version: u64,
    ) -> Result<Arc<Self>, String> {
        let json = RunJson::from_text(json, columns.status.is_live()).map_err(|e| e.to_string())?;
        Ok(Self::build(id, columns, json, Digests::unknown(), version))
    }

    fn build(
        id: RunId,
        columns: RunColumns<'_>,
        json: RunJson,
        digests: Digests,
        version: u64,
    ) -> Arc<Self> {
        let boxed = |text: Cow<'_, str>| text.into_owned().into_boxed_str();
        let health = listed_health(json.health_state(), columns.status);
        Arc::new(Self {
            statics: Statics { controller_actor_id: boxed(columns.controller_actor_id), digests },
            id,
            start_time_ms: columns.start_time_ms,
            end_time_ms: columns.end_time_ms,
            status: columns.status,
            lost_controller: columns.lost_controller,
            leased: columns.leased,
            job_id: boxed(columns.job_id),
            name: boxed(columns.name),
            node_ids: Names(boxed(columns.node_ids)),
            node_ips: Names(boxed(columns.node_ips)),
            json,
            fresh_text: Mutex::new(None),
            cluster: columns.cluster.map(boxed),
            health,
            version,
            base: AtomicU64::new(0),
        })
    }

    /// The indexed fields as a store keeps them in columns beside the JSON.
    pub(crate) fn columns(&self) -> RunColumns<'_> {
        RunColumns {
            start_time_ms: self.start_time_ms,
            end_time_ms: self.end_time_ms,
            status: self.status,
            lost_controller: self.lost_controller,
            leased: self.leased,
            job_id: Cow::Borrowed(&self.job_id),
            name: Cow::Borrowed(&self.name),
            controller_actor_id: Cow::Borrowed(&self.statics.controller_actor_id),
            cluster: self.cluster.as_deref().map(Cow::Borrowed),
            node_ids: Cow::Borrowed(self.node_ids.as_text()),
            node_ips: Cow::Borrowed(self.node_ips.as_text()),
        }
    }

    /// The run's JSON.
    pub(crate) fn json(&self) -> &RunJson {
        &self.json
    }

    /// The run's JSON as the one text a store writes. A live run's text
    /// from its serialization is handed over once (the first store write
    /// takes it, and its memory goes with it); after that, and for records
    /// read back, the members are joined again.
    pub(crate) fn stored_text(&self) -> Cow<'_, str> {
        match self.fresh_text.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(text) => Cow::Owned(text.into()),
            None => self.json.text(),
        }
    }

    /// The first field of static metadata in which `run` differs from this
    /// record's run, in the order and with the names of
    /// [`TrainRunInfo::static_difference`], or `None` when they agree.
    /// Linear in `run`'s first worker group; the stored JSON is not parsed,
    /// but for a record read from columns the first time it is asked.
    pub(crate) fn static_difference(&self, run: &TrainRunInfo) -> Option<&'static str> {
        if *self.name != *run.name() {
            return Some("name");
        } else if self.id != *run.id() {
            return Some("id");
        } else if *self.job_id != *run.job_id() {
            return Some("job_id");
        } else if *self.statics.controller_actor_id != *run.controller_actor_id() {
            return Some("controller_actor_id");
        }
        // A stored document that no longer parses matches no registration.
        let Some([datasets, workers]) = self.digests() else { return Some("datasets") };
        if datasets != Statics::datasets_of(run) {
            Some("datasets")
        } else if self.start_time_ms != run.start_time_ms() {
            Some("start_time_ms")
        } else if workers != Statics::workers_of(run) {
            Some("workers")
        } else {
            None
        }
    }

    /// The digests of the datasets and of the first attempt's workers:
    /// kept, or computed from the JSON once (a record read from columns).
    fn digests(&self) -> Option<[Digest; 2]> {
        if let Some(digests) = self.statics.digests.get() {
            return Some(digests);
        }
        let text = self.json.text();
        let digests = serde_json::from_str::<StoredIndex<'_>>(&text).ok()?.digests();
        self.statics.digests.set(digests);
        Some(digests)
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

/// What a repeated registration must match besides the indexed fields:
/// the controller's id, and 128-bit digests of the datasets and of the
/// first attempt's workers (their identity, whatever their `status`; see
/// [`TrainWorkerInfo::same_identity`](trainstate_schema::TrainWorkerInfo::same_identity)).
#[derive(Debug)]
struct Statics {
    controller_actor_id: Box<str>,
    digests: Digests,
}

/// The digests of the datasets and of the first attempt's workers, in the
/// space of the digests themselves: a record read from columns has none
/// until a repeated registration asks ([`RunRecord::digests`]). Every half
/// 0 means not known yet; a digest with a half that is really 0 is only
/// computed again when asked, so a value read is always right.
#[derive(Debug)]
struct Digests([AtomicU64; 4]);

impl Digests {
    fn unknown() -> Self {
        Self(Default::default())
    }

    fn known(digests: [Digest; 2]) -> Self {
        let known = Self::unknown();
        known.set(digests);
        known
    }

    fn get(&self) -> Option<[Digest; 2]> {
        let [a, b, c, d] = self.0.each_ref().map(|half| half.load(Ordering::Relaxed));
        [a, b, c, d].iter().all(|&half| half != 0).then_some([(a, b), (c, d)])
    }

    fn set(&self, [(a, b), (c, d)]: [Digest; 2]) {
        for (half, value) in self.0.iter().zip([a, b, c, d]) {
            half.store(value, Ordering::Relaxed);
        }
    }
}

impl Statics {
    fn datasets_of(run: &TrainRunInfo) -> Digest {
        digest(|h| {
            h.write_usize(run.datasets().len());
            for d in run.datasets() {
                (d.name(), d.dataset_uuid(), d.dataset_name()).hash(h);
            }
        })
    }

    fn workers_of(run: &TrainRunInfo) -> Digest {
        let workers = run.first_attempt_workers();
        digest(|h| {
            h.write_usize(workers.len());
            for w in workers {
                hash_worker(
                    h,
                    &Identity {
                        actor_id: w.actor_id(),
                        ranks: [w.world_rank(), w.local_rank(), w.node_rank(), w.pid()],
                        node_id: w.node_id(),
                        node_ip: w.node_ip(),
                        gpu_ids: w.gpu_ids(),
                        resources: w.resources(),
                        log: w.worker_log_file_path(),
                    },
                );
            }
        })
    }
}

/// Two independent 64-bit hashes of the same fields.
type Digest = (u64, u64);

/// The health a run is listed and counted by: its state, but none for an
/// ended run whose health is STALLED (its stall ended with it: no STALLED
/// run that listings, gauges or notifications count).
fn listed_health(state: Option<HealthState>, status: RunStatus) -> Option<HealthState> {
    state.filter(|&state| !(state == HealthState::Stalled && status.is_terminal()))
}

fn digest(feed: impl Fn(&mut DefaultHasher)) -> Digest {
    let mut halves = [0u64; 2];
    for (seed, half) in halves.iter_mut().enumerate() {
        let mut h = DefaultHasher::new();
        h.write_usize(seed);
        feed(&mut h);
        *half = h.finish();
    }
    (halves[0], halves[1])
}

/// What identifies a worker: every field but its `status`.
struct Identity<'a> {
    actor_id: &'a str,
    /// World, local and node rank, and the process id.
    ranks: [u32; 4],
    node_id: &'a str,
    node_ip: &'a str,
    gpu_ids: &'a [u32],
    resources: &'a Resources,
    log: Option<&'a str>,
}

fn hash_worker(h: &mut DefaultHasher, w: &Identity<'_>) {
    (w.actor_id, w.ranks, w.node_id, w.node_ip, w.gpu_ids, w.log).hash(h);
    h.write_usize(w.resources.len());
    for (name, amount) in w.resources.iter() {
        name.hash(h);
        // Equal amounts hash equally: 0.0 and -0.0 compare equal.
        h.write_u64(if amount == 0.0 { 0 } else { amount.to_bits() });
    }
}

/// A short list of distinct names.
/// A run's distinct node ids (or IPs) in one allocation, one per line:
/// a node id has no control characters (the name rule) and an IP none at
/// all, so a line break cannot be part of one. Two allocations a run
/// instead of one per node and one for the list.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Names(Box<str>);

impl Names {
    /// The names, in order of first appearance.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.split('\n').filter(|name| !name.is_empty())
    }

    /// The names as one text, one per line.
    pub(crate) fn as_text(&self) -> &str {
        &self.0
    }

    /// Whether `name` is one of them.
    pub(crate) fn contains(&self, name: &str) -> bool {
        self.iter().any(|n| n == name)
    }
}

/// The fields of a run a store keeps in columns of their own beside its
/// JSON: what a record takes out of the JSON, so that a load builds records
/// from them without parsing the JSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunColumns<'a> {
    pub(crate) start_time_ms: u64,
    pub(crate) end_time_ms: Option<u64>,
    pub(crate) status: RunStatus,
    pub(crate) lost_controller: bool,
    pub(crate) leased: bool,
    pub(crate) job_id: Cow<'a, str>,
    pub(crate) name: Cow<'a, str>,
    pub(crate) controller_actor_id: Cow<'a, str>,
    pub(crate) cluster: Option<Cow<'a, str>>,
    /// The distinct node ids of every attempt's workers, one per line, in
    /// order of first appearance (as [`Names`] keeps them).
    pub(crate) node_ids: Cow<'a, str>,
    /// The distinct node IPs, in the same form.
    pub(crate) node_ips: Cow<'a, str>,
}

/// Distinct node ids and node IPs, in order of first appearance: one
/// pass, each name looked up in a hash set (linear in the workers).
fn distinct_nodes<'a>(nodes: impl Iterator<Item = (&'a str, &'a str)>) -> (Names, Names) {
    let mut seen_ids: HashSet<&'a str> = HashSet::new();
    let mut seen_ips: HashSet<&'a str> = HashSet::new();
    let mut ids: Vec<&str> = Vec::new();
    let mut ips: Vec<&str> = Vec::new();
    for (id, ip) in nodes {
        if seen_ids.insert(id) {
            ids.push(id);
        }
        if seen_ips.insert(ip) {
            ips.push(ip);
        }
    }
    (Names(ids.join("\n").into()), Names(ips.join("\n").into()))
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
    controller_actor_id: Cow<'a, str>,
    #[serde(borrow)]
    datasets: Vec<StoredDataset<'a>>,
    #[serde(borrow)]
    workers: Vec<StoredNode<'a>>,
    #[serde(default, borrow)]
    attempts: Vec<StoredAttempt<'a>>,
    #[serde(default, borrow)]
    cluster: Option<Cow<'a, str>>,
}

impl StoredIndex<'_> {
    /// The indexed fields, as a store keeps them in columns.
    fn columns(&self) -> RunColumns<'static> {
        let attempts = self.attempts.iter().filter_map(|a| a.workers.as_deref());
        let nodes = attempts
            .flatten()
            .chain(&self.workers)
            .map(|w| (w.node_id.as_ref(), w.node_ip.as_ref()));
        let (node_ids, node_ips) = distinct_nodes(nodes);
        let owned = |text: &str| Cow::Owned(text.to_owned());
        RunColumns {
            start_time_ms: self.start_time_ms,
            end_time_ms: self.end_time_ms,
            // Stores written before V2 statuses have only `run_status`.
            status: self.status.unwrap_or(self.run_status),
            lost_controller: self
                .cause
                .as_ref()
                .is_some_and(|c| c.kind == CauseKind::LostController),
            leased: self.heartbeats.unwrap_or(true),
            job_id: owned(&self.job_id),
            name: owned(&self.name),
            controller_actor_id: owned(&self.controller_actor_id),
            cluster: self.cluster.as_deref().map(owned),
            node_ids: Cow::Owned(node_ids.0.into_string()),
            node_ips: Cow::Owned(node_ips.0.into_string()),
        }
    }

    /// The digests of the datasets and of the first attempt's workers.
    fn digests(&self) -> [Digest; 2] {
        let first_workers = match self.attempts.first().and_then(|a| a.workers.as_deref()) {
            Some(workers) => workers,
            None => &self.workers,
        };
        let datasets = digest(|h| {
            h.write_usize(self.datasets.len());
            for d in &self.datasets {
                (d.name.as_ref(), d.dataset_uuid.as_ref(), d.dataset_name.as_deref()).hash(h);
            }
        });
        let workers = digest(|h| {
            h.write_usize(first_workers.len());
            for w in first_workers {
                hash_worker(h, &w.identity());
            }
        });
        [datasets, workers]
    }
}

/// A stored worker: every field of its identity (not its `status`).
#[derive(Deserialize)]
struct StoredNode<'a> {
    #[serde(borrow)]
    actor_id: Cow<'a, str>,
    world_rank: u32,
    local_rank: u32,
    node_rank: u32,
    #[serde(borrow)]
    node_id: Cow<'a, str>,
    #[serde(borrow)]
    node_ip: Cow<'a, str>,
    pid: u32,
    gpu_ids: Vec<u32>,
    resources: Resources,
    #[serde(default, borrow)]
    worker_log_file_path: Option<Cow<'a, str>>,
}

impl StoredNode<'_> {
    fn identity(&self) -> Identity<'_> {
        Identity {
            actor_id: &self.actor_id,
            ranks: [self.world_rank, self.local_rank, self.node_rank, self.pid],
            node_id: &self.node_id,
            node_ip: &self.node_ip,
            gpu_ids: &self.gpu_ids,
            resources: &self.resources,
            log: self.worker_log_file_path.as_deref(),
        }
    }
}

/// A stored dataset.
#[derive(Deserialize)]
struct StoredDataset<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow)]
    dataset_uuid: Cow<'a, str>,
    #[serde(default, borrow)]
    dataset_name: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct StoredAttempt<'a> {
    #[serde(default, borrow)]
    workers: Option<Vec<StoredNode<'a>>>,
}

/// The prefix of `controller_actor_id` of a run assembled by the rendezvous.
pub(crate) const CONTROLLER_PREFIX: &str = "rendezvous:";

/// Versions of runs: 64-bit values unique to each record, random across
/// processes, so two heads never give two records the same version.
pub(crate) mod versions {
    use std::hash::BuildHasher;
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A fresh version, never 0 (0 means "no version").
    pub(crate) fn next() -> u64 {
        static KEYS: OnceLock<std::collections::hash_map::RandomState> = OnceLock::new();
        static COUNTER: AtomicU64 = AtomicU64::new(1);
        let keys = KEYS.get_or_init(Default::default);
        let version = keys.hash_one(COUNTER.fetch_add(1, Ordering::Relaxed));
        version.max(1)
    }
}

#[cfg(test)]
mod tests {
    use trainstate_schema::{
        ActorStatus, NewRun, Resources, TrainDatasetInfoDraft, TrainRunInfoDraft,
        TrainWorkerInfoDraft,
    };

    use super::*;

    fn worker(rank: u32) -> TrainWorkerInfoDraft {
        TrainWorkerInfoDraft {
            actor_id: format!("actor{rank}"),
            world_rank: rank,
            local_rank: rank % 2,
            node_rank: rank / 2,
            node_id: format!("node{}", rank / 2),
            node_ip: format!("10.0.0.{}", rank / 2 + 1),
            pid: 100 + rank,
            gpu_ids: vec![rank % 2],
            status: ActorStatus::Alive,
            resources: Resources::from_iter([("GPU", 1.0), ("CPU", 0.0)]),
            worker_log_file_path: Some(format!("/logs/{rank}")),
            node_name: None,
        }
    }

    fn draft() -> TrainRunInfoDraft {
        TrainRunInfoDraft {
            workers: (0..4).map(worker).collect(),
            datasets: vec![TrainDatasetInfoDraft {
                name: "train".into(),
                dataset_uuid: "u1".into(),
                dataset_name: None,
            }],
            ..TrainRunInfoDraft::new("r1", "pretrain", "job", "ctrl", 1_760_000_000_000)
        }
    }

    /// The same run as registered, as read back from the store's JSON and
    /// as read back from the store's columns.
    fn records(draft: TrainRunInfoDraft) -> [Arc<RunRecord>; 3] {
        let run = NewRun::new(draft.validate().unwrap()).into_run(1_760_000_000_000);
        let new = RunRecord::new(&run).unwrap();
        let text = new.json().text().into_owned();
        let stored = RunRecord::from_stored(text.clone()).unwrap();
        let columns = new.columns();
        let from_columns = RunRecord::from_columns(new.id.clone(), columns, text, 7).unwrap();
        [new, stored, from_columns]
    }

    #[test]
    fn a_record_read_from_columns_indexes_what_one_parsed_from_its_json_does() {
        let mut draft = draft();
        draft.cluster = Some("west".into());
        for worker in &mut draft.workers[2..] {
            worker.node_id = "node9".into();
        }
        let [new, stored, from_columns] = records(draft);
        assert_eq!(stored.columns(), new.columns());
        assert_eq!(from_columns.columns(), new.columns());
        assert_eq!(from_columns.node_ids.iter().collect::<Vec<_>>(), ["node0", "node9"]);
        assert_eq!(from_columns.cluster.as_deref(), Some("west"));
        assert_eq!(from_columns.controller_actor_id(), "ctrl");
        assert_eq!(from_columns.version, 7);
        assert_eq!(from_columns.json().text(), new.json().text());
        assert!(from_columns.status.is_live());
        assert!(from_columns.statics.digests.get().is_none(), "no digest until one is asked for");
        assert_eq!(from_columns.static_difference(&new.run().unwrap()), None);
        assert_eq!(from_columns.statics.digests.get(), new.statics.digests.get());
    }

    #[test]
    fn a_record_is_not_read_from_columns_with_text_that_is_not_json() {
        let [new, ..] = records(draft());
        let columns = new.columns();
        assert!(RunRecord::from_columns(new.id.clone(), columns, "{\"id\":".into(), 1).is_err());
    }

    type Change = fn(&mut TrainRunInfoDraft);

    #[test]
    fn a_live_runs_text_is_written_without_a_second_serialization_and_matches_its_members() {
        let run = NewRun::new(draft().validate().unwrap()).into_run(1_760_000_000_000);
        assert!(run.status().is_live());
        let record = RunRecord::new(&run).unwrap();
        let joined = record.json().text().into_owned();
        let handed = record.stored_text();
        assert!(matches!(handed, Cow::Owned(_)), "the serialization's text is handed over");
        assert_eq!(handed, joined);
        assert!(record.fresh_text.lock().unwrap().is_none(), "and its memory with it");
        assert_eq!(record.stored_text(), joined, "the members are joined after that");
        let [_, stored, from_columns] = records(draft());
        assert!(stored.fresh_text.lock().unwrap().is_none());
        assert!(from_columns.fresh_text.lock().unwrap().is_none());
    }

    #[test]
    fn a_record_tells_static_differences_without_parsing_its_json() {
        let same = draft().validate().unwrap();
        let changed = |change: Change| {
            let mut d = draft();
            change(&mut d);
            d.validate().unwrap()
        };
        let cases: [(Change, Option<&str>); 8] = [
            (|d| d.name = "other".into(), Some("name")),
            (|d| d.controller_actor_id = "other".into(), Some("controller_actor_id")),
            (|d| d.datasets[0].dataset_name = Some("x".into()), Some("datasets")),
            (|d| d.start_time_ms += 1, Some("start_time_ms")),
            (|d| d.workers[3].pid = 7, Some("workers")),
            (|d| d.workers[1].resources = Resources::from_iter([("GPU", 2.0)]), Some("workers")),
            // Not static: a worker's status, the run's status detail; -0.0 is 0.0.
            (|d| d.workers[0].status = ActorStatus::Dead, None),
            (
                |d| {
                    d.status_detail = "busy".into();
                    d.workers[2].resources = Resources::from_iter([("GPU", 1.0), ("CPU", -0.0)]);
                },
                None,
            ),
        ];
        for record in records(draft()) {
            assert_eq!(record.static_difference(&same), None);
            for (change, expected) in &cases {
                assert_eq!(record.static_difference(&changed(*change)), *expected);
            }
        }
    }

    #[test]
    fn distinct_nodes_keep_the_order_of_first_appearance() {
        let nodes = [("b", "2"), ("a", "1"), ("b", "2"), ("c", "1")];
        let (ids, ips) = distinct_nodes(nodes.into_iter());
        assert_eq!(ids.iter().collect::<Vec<_>>(), ["b", "a", "c"]);
        assert_eq!(ips.iter().collect::<Vec<_>>(), ["2", "1"]);
        assert!(ids.contains("a") && !ids.contains("d") && !ids.contains(""));
        assert_eq!(distinct_nodes(std::iter::empty()).0.iter().count(), 0);
    }
}
