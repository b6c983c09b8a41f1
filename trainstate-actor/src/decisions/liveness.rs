//! What is heard from live runs and their ranks: memory only, shared by
//! the actor and the connections' tasks.
//!
//! A heartbeat changes no stored document, so it needs neither the store
//! nor the actor's turn: the connection that receives it finds the run's
//! [`Beat`] (or the rank's [`RankBoard`], or the run's [`ProgressBoard`])
//! here and stamps it, and the actor's lease sweep and every reader see
//! the stamp. The actor alone adds and removes entries, as runs,
//! rendezvous groups and attempts come and go in its working state; a
//! heartbeat it has no entry for (an unknown run, an ended one, another
//! cluster's, a group this head does not track) goes through the actor's
//! mailbox as before, which gives the answer its error.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use trainstate_client::RunDocument;
use trainstate_client::api::{CaptureOrder, RendezvousResponse};
use trainstate_schema::{HealthState, RunId, RunStatus};

use crate::decisions::progress::{MetricBatch, ProgressBoard, Reporter};
use crate::decisions::record::RunRecord;
use crate::decisions::stall_abort::{EndOrder, EndOrders};

/// A lease time no sweep ever reaches: a run this head never sweeps (a
/// run of another cluster, kept as forwarded).
pub(crate) const NEVER_SWEPT: u64 = u64::MAX;

/// The heartbeat tables of a head.
pub(crate) struct Liveness {
    runs: Shards<Arc<Beat>>,
    ranks: Shards<Arc<RankBoard>>,
    /// The progress board of each run whose ranks report progress: a
    /// tracked rendezvous group's (its rank board's), or a controller's.
    progress: Shards<Arc<ProgressBoard>>,
    /// The metric points of progress boards removed before their points
    /// were flushed, with their ranks' last progress: the next flush takes
    /// them.
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
            progress: Shards::new(),
            retired: Mutex::default(),
            actor_turns: Turns::default(),
        }
    }
}

impl Liveness {
    /// The beat of a live run, if the actor has one for it (ended runs
    /// have none: nothing is heard from them).
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn beat(&self, id: &RunId) -> Option<Arc<Beat>> {
        self.runs.get(id)
    }

    /// When a live run was last heard from, as readers show it
    /// (`last_heartbeat_ms`): `None` for an ended run, a run never heard
    /// from here, or a run this head does not know.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
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

    /// Forgets a run's beat: it ended, or is gone. The last progress of its
    /// ranks (and their points not yet flushed) goes to the store with the
    /// next flush, so the ended run still serves it once its board is gone
    /// too, also after a restart.
    pub(crate) fn remove_beat(&self, id: &RunId) {
        if self.runs.remove(id).is_some() {
            self.retire(id, self.progress.get(id));
        }
    }

    /// Forgets every run's beat (the working state is rebuilt).
    pub(crate) fn clear_beats(&self) {
        self.runs.clear();
    }

    /// The progress board of a run whose ranks report progress.
    pub(crate) fn progress(&self, id: &RunId) -> Option<Arc<ProgressBoard>> {
        self.progress.get(id)
    }

    /// Every progress board, with its run.
    pub(crate) fn progress_boards(&self) -> Vec<(RunId, Arc<ProgressBoard>)> {
        self.progress.entries()
    }

    /// The progress boards `keep` says to, with their runs: one pass under
    /// the shards' read locks, copying only what it keeps.
    pub(crate) fn progress_boards_where(
        &self,
        keep: impl Fn(&ProgressBoard) -> bool,
    ) -> Vec<(RunId, Arc<ProgressBoard>)> {
        let mut kept = Vec::new();
        self.progress.for_each(|id, board| {
            if keep(board) {
                kept.push((id.clone(), board.clone()));
            }
        });
        kept
    }

    /// Publishes a tracked group's rank board, and its progress board.
    pub(crate) fn put_ranks(&self, id: RunId, board: Arc<RankBoard>) {
        self.put_progress(id.clone(), board.progress().clone());
        self.ranks.insert(id, board);
    }

    pub(crate) fn remove_ranks(&self, id: &RunId) {
        if self.ranks.remove(id).is_some() {
            self.remove_progress(id);
        }
    }

    /// Forgets every rank board and its progress board (the rendezvous
    /// state is rebuilt).
    pub(crate) fn clear_ranks(&self) {
        self.ranks.clear();
        self.remove_progress_where(|board| board.reporter() == Reporter::Ranks);
    }

    /// Publishes the progress board a run's controller reports to.
    pub(crate) fn put_progress(&self, id: RunId, board: Arc<ProgressBoard>) {
        let replaced = self.progress.insert(id.clone(), board);
        self.retire(&id, replaced);
    }

    pub(crate) fn remove_progress(&self, id: &RunId) {
        let removed = self.progress.remove(id);
        self.retire(id, removed);
    }

    /// Forgets every progress board a controller reports to (the working
    /// state is rebuilt).
    pub(crate) fn clear_controller_progress(&self) {
        self.remove_progress_where(|board| board.reporter() == Reporter::Controller);
    }

    /// Removes the progress boards `remove` says to, keeping their points.
    fn remove_progress_where(&self, remove: impl Fn(&ProgressBoard) -> bool) {
        for (id, board) in self.progress.entries() {
            if remove(&board) {
                self.remove_progress(&id);
            }
        }
    }

    /// Keeps the metric points a board leaves pending for the next flush.
    fn retire(&self, id: &RunId, board: Option<Arc<ProgressBoard>>) {
        if let Some(batch) = board.and_then(|board| board.take_last(id)) {
            self.retired.lock().unwrap_or_else(|e| e.into_inner()).push(batch);
        }
    }

    /// The last progress of run `id`'s ranks whose board went away and is
    /// not yet flushed to the store: the attempt and `rank_progress` in
    /// JSON.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn retired_progress(&self, id: &RunId) -> Option<(Box<str>, Arc<str>)> {
        let retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        retired
            .iter()
            .rev()
            .find(|batch| batch.run_id == *id)
            .and_then(|batch| Some((batch.attempt_id.clone(), batch.last_progress.clone()?)))
    }

    /// Takes the metric points reported since the last call, a batch per
    /// run, for the store, and how many of them are of boards gone: the
    /// first ones, which stay here (readers serve their last progress)
    /// until [`Liveness::flushed_retired`] says the store has them.
    pub(crate) fn take_metric_points(&self) -> (Vec<MetricBatch>, usize) {
        let mut batches = self.retired.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let retired = batches.len();
        self.progress.for_each(|id, board| batches.extend(board.take_points(id)));
        (batches, retired)
    }

    /// The first `count` batches of boards gone were handed to the store
    /// (kept or lost): forgets them.
    pub(crate) fn flushed_retired(&self, count: usize) {
        let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        let count = count.min(retired.len());
        retired.drain(..count);
    }

    /// Takes the count of metric points dropped because a board's pending
    /// points were full, since the last call.
    pub(crate) fn take_points_dropped(&self) -> u64 {
        let mut dropped = 0;
        self.progress.for_each(|_, board| dropped += board.take_dropped());
        dropped
    }

    /// `document` of run `record` with what the liveness tables hold of
    /// its run: when each rank of a tracked rendezvous group was last heard
    /// from, once a rank reported, each rank's progress and, for a live
    /// run, its goodput counted to `now_ms` (see
    /// [`crate::decisions::goodput::served`]).
    pub(crate) fn decorate(
        &self,
        record: &RunRecord,
        document: RunDocument,
        now_ms: u64,
    ) -> RunDocument {
        let id = &record.id;
        let document = match self.ranks(id) {
            Some(board) if board.world_size() > 0 => document.with_rank_heartbeats(board.by_rank()),
            _ => document,
        };
        let board = self.progress(id);
        let document = match board.as_ref().and_then(|board| board.served_progress()) {
            Some(progress) => document.with_rank_progress(progress),
            None => document,
        };
        self.with_live_goodput(record, document, now_ms)
    }

    /// `document` of run `record`, with its goodput counted to `now_ms`
    /// while the run is live (see [`crate::decisions::goodput::served`]);
    /// an ended run's as stored.
    pub(crate) fn with_live_goodput(
        &self,
        record: &RunRecord,
        document: RunDocument,
        now_ms: u64,
    ) -> RunDocument {
        if record.status.is_terminal() {
            return document;
        }
        let Some(stored) = document.stored_goodput() else { return document };
        let count = self.progress(&record.id).map(|board| board.peek_goodput()).unwrap_or_default();
        // Parsed only for a stalled run: is the stall of its current attempt?
        let stalled = record.health == Some(HealthState::Stalled)
            && record.run().is_ok_and(|run| crate::decisions::goodput::live_stall(&run));
        let goodput =
            crate::decisions::goodput::served(&stored, record.status, stalled, now_ms, &count);
        document.with_goodput(goodput)
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

    #[cfg_attr(not(feature = "server"), allow(dead_code))]
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
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn takes_heartbeats(&self) -> bool {
        !self.status().is_terminal() && self.lease_from_ms() != NEVER_SWEPT
    }
}

fn status_code(status: RunStatus) -> u8 {
    RunStatus::ALL.iter().position(|s| *s == status).expect("every status is in ALL") as u8
}

/// The ranks of a rendezvous run's current attempt: when each was last
/// heard from, how many have ended, and each rank's latest progress (its
/// progress board, published beside it).
pub(crate) struct RankBoard {
    attempt_id: Box<str>,
    /// Wall ms by world rank; 0: not heard from.
    heard: Box<[AtomicU64]>,
    ended: AtomicU32,
    /// Each rank's latest progress report, and each metric's history.
    progress: Arc<ProgressBoard>,
    /// The stack capture the ranks are asked for, if one is pending.
    capture: CaptureOrders,
    /// The ranks to end, when the run stalled under `on_stall: ABORT`.
    ends: EndOrders,
}

/// The stack capture a rank board's ranks are asked for: which capture,
/// and when each rank was handed the order. Connections hand it out with
/// the heartbeat's answer; only the actor opens and closes it. While none
/// is pending, a heartbeat pays one atomic read.
struct CaptureOrders {
    /// The pending capture's id; 0: none.
    capture_id: AtomicU64,
    /// Wall ms when each rank was last handed the order, by world rank;
    /// 0: not yet, [`ANSWERED`]: it answered.
    asked_ms: Box<[AtomicU64]>,
}

/// A rank that answered the pending capture (see [`CaptureOrders`]).
const ANSWERED: u64 = u64::MAX;

/// How long a rank's watcher may take to capture its rank's stacks before
/// it answers that the rank did not (the heartbeat's order says so).
pub(crate) const ANSWER_WITHIN_MS: u64 = 5_000;

/// A rank handed a capture's order is handed it again only if it has not
/// answered this long after (the answer may have been lost).
pub(crate) const ASK_AGAIN_AFTER_MS: u64 = 8_000;

impl RankBoard {
    /// The board of attempt `attempt_id`, with when each rank was last
    /// heard from; `stall_after_ms` is the run's own stall window, if its
    /// joins asked for one.
    pub(crate) fn new(
        attempt_id: &str,
        heard: impl IntoIterator<Item = Option<u64>>,
        stall_after_ms: Option<u64>,
    ) -> Self {
        let heard: Box<[AtomicU64]> =
            heard.into_iter().map(|t| AtomicU64::new(t.unwrap_or(0))).collect();
        let world_size = heard.len() as u32;
        Self {
            progress: Arc::new(ProgressBoard::new(
                attempt_id,
                world_size,
                Reporter::Ranks,
                stall_after_ms,
            )),
            attempt_id: attempt_id.into(),
            capture: CaptureOrders {
                capture_id: AtomicU64::new(0),
                asked_ms: (0..heard.len()).map(|_| AtomicU64::new(0)).collect(),
            },
            heard,
            ended: AtomicU32::new(0),
            ends: EndOrders::default(),
        }
    }

    /// Publishes which ranks are to be ended, and from when (`None`: none;
    /// see [`crate::decisions::stall_abort`]).
    pub(crate) fn set_end_order(&self, order: Option<EndOrder>) {
        self.ends.set(order);
    }

    /// The words rank `rank`'s heartbeat answer at `now_ms` carries as
    /// `end_rank`, if the published order names it, its time has come, and
    /// no rank advanced since the stall (an advance cancels it before the
    /// actor withdraws the order). One atomic read while there is none.
    pub(crate) fn end_rank(&self, rank: u32, now_ms: u64) -> Option<String> {
        let words = self.ends.for_rank(rank, now_ms)?;
        self.progress.resumed_ms().is_none().then_some(words)
    }

    /// Asks every rank for capture `capture_id` (none answered yet).
    pub(crate) fn open_capture(&self, capture_id: u64) {
        for slot in &self.capture.asked_ms {
            slot.store(0, Ordering::Relaxed);
        }
        self.capture.capture_id.store(capture_id, Ordering::Release);
    }

    /// Rank `rank` answered the pending capture: it is not asked again.
    pub(crate) fn capture_answered(&self, rank: u32) {
        if let Some(slot) = self.capture.asked_ms.get(rank as usize) {
            slot.store(ANSWERED, Ordering::Relaxed);
        }
    }

    /// No capture is pending any more.
    pub(crate) fn close_capture(&self) {
        self.capture.capture_id.store(0, Ordering::Release);
    }

    /// The capture order for rank `rank`'s heartbeat at `now_ms`, if one
    /// is pending that it has not answered: handed once, and again only
    /// [`ASK_AGAIN_AFTER_MS`] after, if no answer came.
    pub(crate) fn capture_order(&self, rank: u32, now_ms: u64) -> Option<CaptureOrder> {
        let capture_id = self.capture.capture_id.load(Ordering::Acquire);
        if capture_id == 0 {
            return None;
        }
        let slot = self.capture.asked_ms.get(rank as usize)?;
        let asked = slot.load(Ordering::Relaxed);
        let due =
            asked == 0 || (asked != ANSWERED && now_ms.saturating_sub(asked) >= ASK_AGAIN_AFTER_MS);
        (due && slot
            .compare_exchange(asked, now_ms.max(1), Ordering::Relaxed, Ordering::Relaxed)
            .is_ok())
        .then(|| CaptureOrder::new(capture_id, ANSWER_WITHIN_MS))
    }

    /// The ranks' progress board.
    pub(crate) fn progress(&self) -> &Arc<ProgressBoard> {
        &self.progress
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

    /// Every entry, one shard at a time.
    fn entries(&self) -> Vec<(RunId, V)> {
        let mut entries = Vec::new();
        for map in &self.maps {
            let map = map.read().unwrap_or_else(|e| e.into_inner());
            entries.extend(map.iter().map(|(id, value)| (id.clone(), value.clone())));
        }
        entries
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
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    pub(crate) fn since_last(&self) -> Duration {
        let last = self.last_ms.load(Ordering::Relaxed);
        let now = self.origin.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(last))
    }
}
