//! What is heard from live runs and their ranks: memory only, shared by
//! the actor and the connections' tasks.
//!
//! A heartbeat changes no stored document, so it needs neither the store
//! nor the actor's turn: the connection that receives it finds the run's
//! [`Beat`] (or the rank's [`RankBoard`]) here and stamps it, and the
//! actor's lease sweep and every reader see the stamp. The actor alone
//! adds and removes entries, as runs and rendezvous groups come and go in
//! its working state; a heartbeat it has no entry for (an unknown run, an
//! ended one, another cluster's, a group this head does not track) goes
//! through the actor's mailbox as before, which gives the answer its
//! error.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use trainstate_client::StateError;
use trainstate_client::api::RendezvousResponse;
use trainstate_schema::api::{MetricPoint, RankProgress, RankProgressServed};
use trainstate_schema::limits::MAX_METRIC_NAMES_PER_RUN;
use trainstate_schema::{Rule, RunId, RunStatus, ValidationError};

use crate::record::RunRecord;
use crate::store::metrics::{MetricBatch, NamedPoint};

/// The most metric points a rank board holds between two flushes to the
/// store (about a second): past it, points are dropped and counted, never
/// queued without bound.
const MAX_PENDING_POINTS: usize = 65_536;

/// A lease time no sweep ever reaches: a run this head never sweeps (a
/// run of another cluster, kept as forwarded).
pub(crate) const NEVER_SWEPT: u64 = u64::MAX;

/// The heartbeat tables of a head.
pub(crate) struct Liveness {
    runs: Shards<Arc<Beat>>,
    ranks: Shards<Arc<RankBoard>>,
    /// The metric points of boards removed before their points were
    /// flushed: the next flush takes them.
    retired: Mutex<Vec<MetricBatch>>,
    /// When the actor last took a turn: a head whose actor takes none for
    /// several sweep periods is wedged.
    pub(crate) actor_turns: Turns,
}

impl Default for Liveness {
    fn default() -> Self {
        Self {
            runs: Shards::new(),
            ranks: Shards::new(),
            retired: Mutex::default(),
            actor_turns: Turns::default(),
        }
    }
}

impl Liveness {
    /// The beat of a live run, if the actor has one for it (ended runs
    /// have none: nothing is heard from them).
    pub(crate) fn beat(&self, id: &RunId) -> Option<Arc<Beat>> {
        self.runs.get(id)
    }

    /// When a live run was last heard from, as readers show it
    /// (`last_heartbeat_ms`): `None` for an ended run, a run never heard
    /// from here, or a run this head does not know.
    pub(crate) fn heartbeat_of(&self, record: &RunRecord) -> Option<u64> {
        if record.status.is_terminal() {
            return None;
        }
        self.runs.read(&record.id, |beat| beat.heard_ms()).filter(|&t| t != NEVER_SWEPT)
    }

    /// The rank board of a run whose rendezvous group this head tracks.
    pub(crate) fn ranks(&self, id: &RunId) -> Option<Arc<RankBoard>> {
        self.ranks.get(id)
    }

    pub(crate) fn put_beat(&self, id: RunId, beat: Arc<Beat>) {
        self.runs.insert(id, beat);
    }

    pub(crate) fn remove_beat(&self, id: &RunId) {
        self.runs.remove(id);
    }

    /// Forgets every run's beat (the working state is rebuilt).
    pub(crate) fn clear_beats(&self) {
        self.runs.clear();
    }

    pub(crate) fn put_ranks(&self, id: RunId, board: Arc<RankBoard>) {
        let replaced = self.ranks.insert(id.clone(), board);
        self.retire(&id, replaced);
    }

    pub(crate) fn remove_ranks(&self, id: &RunId) {
        let removed = self.ranks.remove(id);
        self.retire(id, removed);
    }

    /// Forgets every rank board (the rendezvous state is rebuilt).
    pub(crate) fn clear_ranks(&self) {
        for (id, board) in self.ranks.clear() {
            self.retire(&id, Some(board));
        }
    }

    /// Keeps the metric points a board leaves pending for the next flush.
    fn retire(&self, id: &RunId, board: Option<Arc<RankBoard>>) {
        if let Some(batch) = board.and_then(|board| board.take_points(id)) {
            self.retired.lock().unwrap_or_else(|e| e.into_inner()).push(batch);
        }
    }

    /// Takes the metric points reported since the last call, a batch per
    /// run, for the store.
    pub(crate) fn take_metric_points(&self) -> Vec<MetricBatch> {
        let mut batches =
            std::mem::take(&mut *self.retired.lock().unwrap_or_else(|e| e.into_inner()));
        self.ranks.for_each(|id, board| batches.extend(board.take_points(id)));
        batches
    }

    /// Takes the count of metric points dropped because a board's pending
    /// points were full, since the last call.
    pub(crate) fn take_points_dropped(&self) -> u64 {
        let mut dropped = 0;
        self.ranks.for_each(|_, board| dropped += board.take_dropped());
        dropped
    }
}

/// What is heard from one live run: when (on the wall clock, shown),
/// when its lease began (on the monotonic clock, swept), and its status in
/// the actor's working state (whether a heartbeat may be taken here).
pub(crate) struct Beat {
    heard_ms: AtomicU64,
    lease_from_ms: AtomicU64,
    status: AtomicU8,
}

impl Beat {
    pub(crate) fn new(heard_ms: u64, lease_from_ms: u64, status: RunStatus) -> Self {
        Self {
            heard_ms: AtomicU64::new(heard_ms),
            lease_from_ms: AtomicU64::new(lease_from_ms),
            status: AtomicU8::new(status_code(status)),
        }
    }

    pub(crate) fn heard_ms(&self) -> u64 {
        self.heard_ms.load(Ordering::Relaxed)
    }

    pub(crate) fn lease_from_ms(&self) -> u64 {
        self.lease_from_ms.load(Ordering::Relaxed)
    }

    pub(crate) fn status(&self) -> RunStatus {
        RunStatus::ALL[usize::from(self.status.load(Ordering::Relaxed))]
    }

    /// Sets every field (the actor, as the run changes).
    pub(crate) fn set(&self, heard_ms: u64, lease_from_ms: u64, status: RunStatus) {
        self.heard_ms.store(heard_ms, Ordering::Relaxed);
        self.lease_from_ms.store(lease_from_ms, Ordering::Relaxed);
        self.status.store(status_code(status), Ordering::Relaxed);
    }

    pub(crate) fn set_heard(&self, heard_ms: u64, lease_from_ms: u64) {
        self.heard_ms.store(heard_ms, Ordering::Relaxed);
        self.lease_from_ms.store(lease_from_ms, Ordering::Relaxed);
    }

    /// A sign of life at `heard_ms` (wall) and `lease_from_ms`
    /// (monotonic): neither time goes back, whichever stamp lands last.
    pub(crate) fn raise(&self, heard_ms: u64, lease_from_ms: u64) {
        self.heard_ms.fetch_max(heard_ms, Ordering::Relaxed);
        self.lease_from_ms.fetch_max(lease_from_ms, Ordering::Relaxed);
    }

    /// True when a heartbeat may be taken without the actor: the run is
    /// live and swept by this head (not another cluster's).
    pub(crate) fn takes_heartbeats(&self) -> bool {
        !self.status().is_terminal() && self.lease_from_ms() != NEVER_SWEPT
    }
}

fn status_code(status: RunStatus) -> u8 {
    RunStatus::ALL.iter().position(|s| *s == status).expect("every status is in ALL") as u8
}

/// The ranks of a rendezvous run's current attempt: when each was last
/// heard from, how many have ended, and each rank's latest progress.
pub(crate) struct RankBoard {
    attempt_id: Box<str>,
    /// Wall ms by world rank; 0: not heard from.
    heard: Box<[AtomicU64]>,
    ended: AtomicU32,
    /// Each rank's latest progress report (one report per rank per
    /// heartbeat: a lock per board is enough).
    progress: Mutex<ProgressTable>,
}

/// One rank's progress as the head keeps it.
#[derive(Debug, Clone)]
pub(crate) struct Progress {
    pub(crate) step: Option<u64>,
    pub(crate) total_steps: Option<u64>,
    pub(crate) phase: Option<Box<str>>,
    pub(crate) metrics: BTreeMap<String, f64>,
    /// When the rank's step last grew (wall ms), or, before it grew on
    /// this head, when this head first heard its progress: after a
    /// restart, the stall window starts again.
    pub(crate) last_advance_ms: u64,
    /// The step grew on this head at least once.
    pub(crate) advanced: bool,
    /// Until when (wall ms) the rank's announced pause
    /// (`expect_next_within_ms`) covers it; 0: none.
    pub(crate) expect_until_ms: u64,
    /// The rank's smoothed time per step (ms): an exponentially weighted
    /// mean of the `step_time_ms` its reports carried with a new step,
    /// each weighing [`STEP_TIME_WEIGHT`]; `None` until one did.
    pub(crate) step_time_ms: Option<f64>,
}

/// How much a rank's newest step time weighs in its smoothed step time:
/// with a report about once a second, a change of pace shows within a few
/// seconds and one odd interval (a data loader's hiccup) moves it by a
/// quarter.
pub(crate) const STEP_TIME_WEIGHT: f64 = 0.25;

/// The progress of every rank of a board, every metric name its ranks
/// reported, and the metric points not yet handed to the store.
#[derive(Default)]
struct ProgressTable {
    /// By world rank; empty until a rank reports.
    ranks: Vec<Option<Progress>>,
    names: BTreeSet<Arc<str>>,
    /// Points reported with a step since the last flush, in order; at most
    /// [`MAX_PENDING_POINTS`].
    pending: Vec<NamedPoint>,
    /// Points dropped because `pending` was full, since the last flush.
    dropped: u64,
}

impl RankBoard {
    pub(crate) fn new(attempt_id: &str, heard: impl IntoIterator<Item = Option<u64>>) -> Self {
        Self {
            attempt_id: attempt_id.into(),
            heard: heard.into_iter().map(|t| AtomicU64::new(t.unwrap_or(0))).collect(),
            ended: AtomicU32::new(0),
            progress: Mutex::default(),
        }
    }

    /// Records rank `rank`'s progress report `report`, received at
    /// `now_ms` (wall), for run `id`. Refuses, changing nothing, a step
    /// below the rank's previous one (409) and a report that would bring
    /// the run past [`MAX_METRIC_NAMES_PER_RUN`] metric names (422, naming
    /// the first new name). A rank out of range is ignored.
    pub(crate) fn report(
        &self,
        id: &RunId,
        rank: u32,
        report: &RankProgress,
        now_ms: u64,
    ) -> Result<(), StateError> {
        let slot = rank as usize;
        if slot >= self.heard.len() {
            return Ok(());
        }
        let mut table = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        let previous = table.ranks.get(slot).and_then(Option::as_ref);
        if let (Some(step), Some(before)) = (report.step, previous.and_then(|p| p.step))
            && step < before
        {
            return Err(StateError::Conflict {
                id: id.clone(),
                reason: format!(
                    "rank {rank} reported step {step} after step {before} in attempt {:?}: steps never go back",
                    self.attempt_id
                ),
            });
        }
        let new_names: Vec<&String> =
            report.metrics.keys().filter(|name| !table.names.contains(name.as_str())).collect();
        if let Some(first) = new_names.first()
            && table.names.len() + new_names.len() > MAX_METRIC_NAMES_PER_RUN
        {
            let rule = Rule::TooManyMetricNames { max: MAX_METRIC_NAMES_PER_RUN };
            return Err(ValidationError::new(format!("progress.metrics[{first:?}]"), rule).into());
        }
        let advanced = match (report.step, previous.and_then(|p| p.step)) {
            (Some(step), Some(before)) => step > before,
            _ => false,
        };
        let expect_until_ms =
            report.expect_next_within_ms.map_or(0, |ms| now_ms.saturating_add(ms));
        // A step time describes the steps since the rank's previous report:
        // only a report with a new step brings one (a heartbeat that repeats
        // the rank's latest state counts nothing twice).
        let new_step =
            report.step.is_some() && (advanced || previous.is_none_or(|p| p.step.is_none()));
        let new_step_time = report.step_time_ms.filter(|_| new_step);
        let step_time_ms = match (new_step_time, previous.and_then(|p| p.step_time_ms)) {
            (Some(new), Some(smoothed)) => Some(smoothed + STEP_TIME_WEIGHT * (new - smoothed)),
            (new, smoothed) => new.or(smoothed),
        };
        let progress = match previous {
            Some(before) => Progress {
                step: report.step.or(before.step),
                total_steps: report.total_steps.or(before.total_steps),
                phase: report.phase.as_deref().map(Into::into).or_else(|| before.phase.clone()),
                metrics: if report.metrics.is_empty() {
                    before.metrics.clone()
                } else {
                    report.metrics.clone()
                },
                last_advance_ms: if advanced { now_ms } else { before.last_advance_ms },
                advanced: advanced || before.advanced,
                expect_until_ms: expect_until_ms.max(before.expect_until_ms),
                step_time_ms,
            },
            None => Progress {
                step: report.step,
                total_steps: report.total_steps,
                phase: report.phase.as_deref().map(Into::into),
                metrics: report.metrics.clone(),
                last_advance_ms: now_ms,
                advanced: false,
                expect_until_ms,
                step_time_ms,
            },
        };
        let names: Vec<Arc<str>> = new_names.into_iter().map(|n| Arc::from(n.as_str())).collect();
        table.names.extend(names);
        if let Some(step) = report.step {
            for (name, value) in &report.metrics {
                if table.pending.len() >= MAX_PENDING_POINTS {
                    table.dropped += 1;
                    continue;
                }
                let name =
                    table.names.get(name.as_str()).cloned().unwrap_or_else(|| name.as_str().into());
                let point = MetricPoint::new(rank, step, *value);
                table.pending.push(NamedPoint { name, point });
            }
        }
        if table.ranks.is_empty() {
            table.ranks = vec![None; self.heard.len()];
        }
        table.ranks[slot] = Some(progress);
        Ok(())
    }

    /// Takes the metric points reported since the last call, as run `id`'s
    /// batch for the store; `None` when there are none.
    pub(crate) fn take_points(&self, id: &RunId) -> Option<MetricBatch> {
        let mut table = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        if table.pending.is_empty() {
            return None;
        }
        let points = std::mem::take(&mut table.pending);
        Some(MetricBatch { run_id: id.clone(), attempt_id: self.attempt_id.clone(), points })
    }

    /// Takes the count of points dropped since the last call.
    fn take_dropped(&self) -> u64 {
        std::mem::take(&mut self.progress.lock().unwrap_or_else(|e| e.into_inner()).dropped)
    }

    /// Each rank's progress, by world rank; `None` when no rank reported.
    pub(crate) fn progress(&self) -> Option<Vec<Option<Progress>>> {
        let table = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        (!table.ranks.is_empty()).then(|| table.ranks.clone())
    }

    /// Each rank's progress as a run serves it (`rank_progress`); `None`
    /// when no rank reported.
    pub(crate) fn served_progress(&self) -> Option<Arc<[Option<RankProgressServed>]>> {
        let table = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        if table.ranks.is_empty() {
            return None;
        }
        let served = table.ranks.iter().map(|rank| {
            rank.as_ref().map(|p| {
                RankProgressServed::new(
                    p.step,
                    p.total_steps,
                    p.phase.as_deref().map(str::to_owned),
                    Some(p.last_advance_ms),
                    p.metrics.clone(),
                )
            })
        });
        Some(served.collect())
    }

    pub(crate) fn attempt_id(&self) -> &str {
        &self.attempt_id
    }

    /// The world size: how many ranks the attempt has.
    pub(crate) fn world_size(&self) -> u32 {
        self.heard.len() as u32
    }

    pub(crate) fn ended(&self) -> u32 {
        self.ended.load(Ordering::Relaxed)
    }

    /// What a rank's request is answered while the group is tracked: the
    /// attempt, the world size (every rank joined), the ranks ended, the
    /// run's status and the lease.
    pub(crate) fn response(
        &self,
        id: &RunId,
        status: RunStatus,
        lease_ms: u64,
    ) -> RendezvousResponse {
        let n = self.world_size();
        RendezvousResponse::new(
            id.clone(),
            self.attempt_id(),
            n,
            n,
            self.ended(),
            Some(status),
            lease_ms,
        )
    }

    pub(crate) fn set_ended(&self, ended: u32) {
        self.ended.store(ended, Ordering::Relaxed);
    }

    /// Rank `rank` was heard from at `at_ms` (wall); a rank out of range
    /// is ignored.
    pub(crate) fn heard(&self, rank: usize, at_ms: u64) {
        if let Some(slot) = self.heard.get(rank) {
            slot.fetch_max(at_ms, Ordering::Relaxed);
        }
    }

    /// When each rank was last heard from, by world rank.
    pub(crate) fn by_rank(&self) -> Arc<[Option<u64>]> {
        self.heard.iter().map(|t| Some(t.load(Ordering::Relaxed)).filter(|&t| t != 0)).collect()
    }
}

/// How many locks the tables are split over: a heartbeat takes one read
/// lock, and only the actor ever takes a write lock.
const SHARDS: usize = 16;

/// A map by run id split over [`SHARDS`] locks.
struct Shards<V> {
    maps: Box<[RwLock<HashMap<RunId, V>>]>,
    hasher: std::collections::hash_map::RandomState,
}

impl<V: Clone> Shards<V> {
    fn new() -> Self {
        Self {
            maps: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
            hasher: std::collections::hash_map::RandomState::new(),
        }
    }

    fn shard(&self, id: &RunId) -> &RwLock<HashMap<RunId, V>> {
        &self.maps[self.hasher.hash_one(id) as usize % SHARDS]
    }

    fn get(&self, id: &RunId) -> Option<V> {
        self.read(id, V::clone)
    }

    fn read<T>(&self, id: &RunId, f: impl FnOnce(&V) -> T) -> Option<T> {
        self.shard(id).read().unwrap_or_else(|e| e.into_inner()).get(id).map(f)
    }

    fn insert(&self, id: RunId, value: V) -> Option<V> {
        self.shard(&id).write().unwrap_or_else(|e| e.into_inner()).insert(id, value)
    }

    fn remove(&self, id: &RunId) -> Option<V> {
        self.shard(id).write().unwrap_or_else(|e| e.into_inner()).remove(id)
    }

    /// Empties every shard; answers what they held.
    fn clear(&self) -> Vec<(RunId, V)> {
        let mut all = Vec::new();
        for map in &self.maps {
            all.extend(map.write().unwrap_or_else(|e| e.into_inner()).drain());
        }
        all
    }

    /// Calls `f` with every entry, one shard's read lock at a time.
    fn for_each(&self, mut f: impl FnMut(&RunId, &V)) {
        for map in &self.maps {
            for (id, value) in map.read().unwrap_or_else(|e| e.into_inner()).iter() {
                f(id, value);
            }
        }
    }
}

/// When the actor last took a turn, as time since a fixed instant.
pub(crate) struct Turns {
    origin: Instant,
    last_ms: AtomicU64,
}

impl Default for Turns {
    fn default() -> Self {
        Self { origin: Instant::now(), last_ms: AtomicU64::new(0) }
    }
}

impl Turns {
    /// The actor takes a turn now.
    pub(crate) fn turn(&self) {
        let ms = self.origin.elapsed().as_millis() as u64;
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// How long ago the actor last took a turn.
    pub(crate) fn since_last(&self) -> Duration {
        let last = self.last_ms.load(Ordering::Relaxed);
        let now = self.origin.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(last))
    }
}
