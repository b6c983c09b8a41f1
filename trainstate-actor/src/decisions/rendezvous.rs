//! The rendezvous: where the ranks of a launch without a controller
//! (torchrun, Slurm, a plain process) assemble their worker group, and how
//! each rank's heartbeats and end become the run's lifecycle.
//!
//! Everything here lives in the actor's memory: the groups still waiting
//! for ranks, and for each run assembled here the state of each rank of
//! its current attempt (when it was last heard from, whether it ended).
//! What a run becomes (registered, a new attempt, its end) goes through the
//! state machine ([`Runs`]) and is committed like any other write. A run
//! assembled here has `controller_actor_id` `rendezvous:<key>`, which is
//! how the head finds the run of a key again after a restart.
//!
//! The rules, including what a restart of the head does to a half-assembled
//! group, are written down in `docs/rendezvous.md`.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::Hasher;
use std::sync::Arc;

use trainstate_client::api::RendezvousResponse;
use trainstate_client::{
    Join, NewAttempt, RankEnd, RendezvousMessage, Reply, StateError, StatusUpdate,
};
use trainstate_schema::api::{RankProgress, StallAction};
use trainstate_schema::text::{last_chars, one_line};
use trainstate_schema::{
    CauseKind, FailureMode, NewRun, RunAttemptDraft, RunCause, RunId, RunStatus, TrainRunInfoDraft,
    TrainWorkerInfo,
};

use crate::decisions::liveness::{Liveness, RankBoard};
use crate::decisions::record::{CONTROLLER_PREFIX, RunRecord};
use crate::decisions::stall_abort::{AbortRule, end_order};
use crate::decisions::state::{Change, Outcome, Runs, failure_detail};
use crate::decisions::time_text::{iso_ms, seconds};

/// What the rendezvous reads of the committed runs (the engine's
/// committed view answers it): a group is found, or rebuilt after a
/// restart, from the run the store holds.
pub(crate) trait StoredRuns {
    /// The committed run `id`, if it is stored.
    fn stored(&self, id: &RunId) -> Option<Arc<RunRecord>>;

    /// True when a committed run has `id`.
    fn is_stored(&self, id: &RunId) -> bool {
        self.stored(id).is_some()
    }

    /// The newest committed run whose controller is the rendezvous
    /// `controller`.
    fn newest_of_rendezvous(&self, controller: &str) -> Option<Arc<RunRecord>>;

    /// Why the node ledger calls node `node` of `cluster` a suspect from
    /// `since_ms`, if it does.
    fn suspect_reason(&self, node: &str, cluster: Option<&str>, since_ms: u64) -> Option<String> {
        let _ = (node, cluster, since_ms);
        None
    }
}

/// The most suspect nodes a run's note names.
const MAX_NOTED_SUSPECTS: usize = 8;

/// The note a run's status detail carries when ranks joined from suspect
/// nodes: kept in its `status_history` once its status changes.
fn suspects_note(suspects: &[String]) -> String {
    format!("ranks joined from suspect nodes: {} (see /api/train/nodes)", suspects.join(", "))
}

/// The warning a rank joining from `node` gets when the ledger calls the
/// node a suspect over the default window before `now_ms`.
fn node_warning(
    view: &dyn StoredRuns,
    node: &str,
    cluster: Option<&str>,
    now_ms: u64,
) -> Option<String> {
    let since_ms = now_ms.saturating_sub(trainstate_schema::api::DEFAULT_NODE_WINDOW_MS);
    let reason = view.suspect_reason(node, cluster, since_ms)?;
    Some(format!("node {node} is a suspect: {reason}; see /api/train/nodes/{node}"))
}

/// Who sent a join, for the bounds on waiting groups: the client address
/// the head saw (an IPv4 address, or an IPv6 /64), or `None` for joins
/// made in the head's process.
type Client = Option<String>;

/// How long a tracked group whose run is not (yet) in the committed view is
/// kept: past this, its run was deleted or evicted.
const UNCOMMITTED_GRACE_MS: u64 = 60_000;

/// The most groups that may wait for ranks at once: past it, a join that
/// would open another closes the oldest group of the client that opened
/// the most, or, when its own client opened as many, is refused, 503
/// `unavailable` naming the bound.
pub(crate) const MAX_PENDING_GROUPS: usize = 10_000;

/// The most bytes of workers (as JSON) that waiting groups may hold, all
/// groups together: past it, a join that would add one makes room as for
/// [`MAX_PENDING_GROUPS`], or is refused, 503 `unavailable` naming the
/// bound. 64 MiB holds 65,536 ranks of 1 KiB.
pub(crate) const MAX_PENDING_BYTES: usize = 64 << 20;

/// How long after the first failure of an attempt is reported the head
/// waits for its peers' before it decides the cause, unless every rank has
/// ended before: a peer that failed earlier (a rank killed outright, whose
/// watcher's report raced its peer's "connection reset") may arrive a
/// little later than one that failed because of it.
pub const FAILURE_WINDOW_MS: u64 = 3_000;

/// What a rank raises when a peer it talks to is gone: the words of the
/// communication errors that follow a rank's death (gloo's, NCCL's), looked
/// for, without regard to case, at the end of a raised error's detail. A
/// failure with one of them is an *echo*: it is not the cause of an attempt
/// when another rank failed otherwise within [`ECHO_TIE_MS`] of it (see
/// `docs/rendezvous.md`). The one list: the docs name these.
pub const ECHO_MESSAGES: &[&str] = &[
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "remote process exited or there was a network error",
    "ncclRemoteError",
    "NCCL communicator was aborted",
];

/// What a device fault reads like in the error a rank raised (CUDA's and
/// the NVIDIA driver's words), looked for, without regard to case, at the
/// end of a raised error's detail: a rank that raised one failed of
/// `HARDWARE`, not of its code. The one list: `docs/causes.md` names these.
pub const HARDWARE_MESSAGES: &[&str] = &[
    "uncorrectable ECC error",
    "uncorrectable NVLink error",
    "has fallen off the bus",
    "NVRM: Xid",
    "ECC page retirement or row remapping",
];

/// How close in time, either side, a rank's death must be to a peer's echo
/// for the echo not to be the cause. The times compared are each
/// observer's: a peer's error is stamped as it is raised, a death when its
/// watcher sees it, which a busy machine delays by tens of milliseconds
/// (a few hundred at worst, when the watcher only notices at its next poll
/// of its parent); and a gloo or NCCL peer raises within a second of the
/// death. Two seconds cover both with room, and are short enough that a
/// rank dying of its own accord well after a real network error does not
/// excuse it.
pub const ECHO_TIE_MS: u64 = 2_000;

/// How long, at most, the failure window stays open after its first
/// failure while every failure collected is an echo and some rank of the
/// attempt has not ended: the rank whose death the echoes follow may be
/// reported late (its watcher was starved of CPU).
pub const ECHO_WINDOW_MS: u64 = 10_000;

/// How much earlier than its group's first join a rank's process may have
/// started and still count as the run's start: a process that started
/// longer before (a notebook's kernel) starts the run at the first join.
const MAX_START_LEAD_MS: u64 = 86_400_000;

/// How many of the failures that followed the first are named in a run's
/// detail.
const MAX_SECONDARY_FAILURES: usize = 8;

/// The `controller_actor_id` of the run of `key`.
fn controller_of(key: &str) -> String {
    format!("{CONTROLLER_PREFIX}{key}")
}

/// What the actor does with a rendezvous request.
pub(crate) enum Reaction {
    /// Answer now: nothing to commit.
    Answer(Reply<RendezvousResponse>, Result<RendezvousResponse, StateError>),
    /// Commit, then answer.
    Write(Reply<RendezvousResponse>, Result<Outcome<RendezvousResponse>, StateError>),
}

/// The answer of one request before it is committed or sent.
enum Step {
    Answer(RendezvousResponse),
    Write(Outcome<RendezvousResponse>),
}

/// A group waits for its ranks under (key, attempt).
type GroupKey = (String, u32);

/// Why a waiting group is closed.
#[derive(Clone, Copy)]
enum Expiry {
    /// Its join deadline passed.
    Deadline,
    /// None of its ranks was heard from for the lease, in ms.
    Silent(u64),
}

/// The actor's rendezvous state.
pub(crate) struct Rendezvous {
    /// Groups still waiting for ranks.
    pending: HashMap<GroupKey, Pending>,
    /// The waiting group of each (run, attempt id).
    pending_runs: HashMap<(RunId, String), GroupKey>,
    /// The current attempt's ranks of each run assembled here.
    groups: Groups,
    /// The run of each key, as far as this actor has seen (a cache: the
    /// stored runs' `controller_actor_id` is the truth).
    keys: HashMap<String, RunId>,
    /// The monotonic reading of the current turn ([`Runs::lease_now`]):
    /// join deadlines and graces are measured on it, never on the wall
    /// clock, which is what start times are stamped with.
    mono_ms: u64,
    /// Set when a failure window opened: the actor sweeps again after it.
    wakeup: bool,
    /// The bytes of the workers that waiting groups hold.
    pending_bytes: usize,
    /// How many waiting groups each client opened.
    held_by_client: HashMap<Client, usize>,
    /// The client of the join being handled.
    joining: Client,
    /// The head's cluster, stamped on the runs the rendezvous registers as
    /// on every other registration.
    cluster: Option<String>,
}

impl Rendezvous {
    /// No group yet; `liveness` is where the tracked groups' rank boards
    /// are published (every board it held is forgotten); `cluster` is the
    /// head's cluster, if it has one.
    pub(crate) fn new(liveness: Arc<Liveness>, cluster: Option<String>) -> Self {
        liveness.clear_ranks();
        Self {
            cluster,
            pending: HashMap::new(),
            pending_runs: HashMap::new(),
            groups: Groups { groups: HashMap::new(), liveness },
            keys: HashMap::new(),
            mono_ms: 0,
            wakeup: false,
            pending_bytes: 0,
            held_by_client: HashMap::new(),
            joining: None,
        }
    }
}

/// Opens the part of an attempt's failure detail that tells of the ranks
/// that failed after the first: what follows it is not the cause.
pub(crate) const NOT_THE_CAUSE: &str = "Then, not the cause:";

/// The tracked groups, each group's rank board published in the liveness
/// tables while it is tracked.
struct Groups {
    groups: HashMap<RunId, Group>,
    liveness: Arc<Liveness>,
}

impl Groups {
    fn insert(&mut self, id: RunId, group: Group) {
        self.liveness.put_ranks(id.clone(), group.board.clone());
        self.groups.insert(id, group);
    }

    fn remove(&mut self, id: &RunId) {
        self.liveness.remove_ranks(id);
        self.groups.remove(id);
    }

    fn retain(&mut self, mut keep: impl FnMut(&RunId, &mut Group) -> bool) {
        let liveness = &self.liveness;
        self.groups.retain(|id, group| {
            let kept = keep(id, group);
            if !kept {
                liveness.remove_ranks(id);
            }
            kept
        });
    }

    fn contains_key(&self, id: &RunId) -> bool {
        self.groups.contains_key(id)
    }

    fn get_mut(&mut self, id: &RunId) -> Option<&mut Group> {
        self.groups.get_mut(id)
    }

    fn values_mut(&mut self) -> impl Iterator<Item = &mut Group> {
        self.groups.values_mut()
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = (&RunId, &mut Group)> {
        self.groups.iter_mut()
    }
}

/// Takes a rank's heartbeat without the actor, when the head tracks the
/// rank's group and the run is live here: the answer the actor would give
/// (see `Rendezvous::heartbeat`). `None` when the actor must decide it (a
/// waiting group, a group not tracked, a replaced attempt, a rank out of
/// range, an unknown or foreign run): its answer carries the error.
///
/// A progress report (checked on the connection's task before) is
/// recorded on the rank's board while the run is RUNNING; a report the
/// board refuses (a step that goes back, too many metric names) is the
/// answer, and the heartbeat is not taken.
#[allow(clippy::too_many_arguments)]
#[cfg_attr(not(feature = "server"), allow(dead_code))]
pub(crate) fn heartbeat_rank_here(
    liveness: &Liveness,
    id: &RunId,
    rank: u32,
    attempt_id: &str,
    progress: Option<&RankProgress>,
    lease_ms: u64,
    now_ms: u64,
    monotonic_ms: u64,
) -> Option<Result<RendezvousResponse, StateError>> {
    let board = liveness.ranks(id)?;
    if board.attempt_id() != attempt_id || rank >= board.world_size() {
        return None;
    }
    let beat = liveness.beat(id)?;
    if beat.lease_from_ms() == crate::decisions::liveness::NEVER_SWEPT {
        return None;
    }
    let status = beat.status();
    if let Some(report) = progress.filter(|_| status == RunStatus::Running)
        && let Err(err) = board.progress().report(id, rank, report, now_ms)
    {
        return Some(Err(err));
    }
    if !status.is_terminal() {
        beat.raise(now_ms, monotonic_ms);
    }
    if status == RunStatus::Running {
        board.heard(rank as usize, now_ms);
    }
    let mut answer = board.response(id, status, lease_ms);
    answer.capture = board.capture_order(rank, now_ms);
    if status == RunStatus::Running {
        answer.end_rank = board.end_rank(rank, now_ms);
    }
    Some(Ok(answer))
}

/// A group waiting for its ranks.
struct Pending {
    run_id: RunId,
    /// True for a later attempt of a registered run.
    existing: bool,
    world_size: u32,
    name: String,
    job_id: String,
    started_ms: u64,
    /// When the join deadline began, on the monotonic clock.
    deadline_from_ms: u64,
    /// When a rank of the group was last heard from, on the monotonic
    /// clock: a group none of whose ranks is heard from for a lease is
    /// closed before its join deadline.
    heard_mono_ms: u64,
    /// The bytes of its members' workers, as JSON.
    bytes: usize,
    timeout_ms: u64,
    /// The stall window the first join that asked for one gave.
    stall_after_ms: Option<u64>,
    /// What to do when the run stalls, as the first join that said gave.
    on_stall: Option<StallAction>,
    /// The grace before ending a stalled run's ranks, as the first join
    /// that gave one gave.
    abort_after_ms: Option<u64>,
    members: BTreeMap<u32, Member>,
    placement: Placement,
    /// The suspect nodes ranks joined from (at most [`MAX_NOTED_SUSPECTS`]),
    /// which the run's status detail notes when the group completes.
    suspects: Vec<String>,
    /// The client (address) whose join opened the group.
    client: Client,
}

struct Member {
    worker: TrainWorkerInfo,
    identity: u64,
    /// When the rank's process started, as it said.
    process_start_ms: Option<u64>,
    last_heard_ms: u64,
    /// How the rank ended, and when, if it did before the group completed.
    end: Option<(u64, RankEnd)>,
}

/// The placement rules across a group's workers, checked one join at a time
/// (the same rules a worker list checks at once).
#[derive(Default)]
struct Placement {
    node_rank_of: HashMap<String, u32>,
    node_of_rank: HashMap<u32, String>,
    local_ranks: HashSet<(String, u32)>,
}

impl Placement {
    fn check(&self, worker: &TrainWorkerInfo) -> Result<(), StateError> {
        let node = worker.node_id();
        if let Some(&rank) = self.node_rank_of.get(node) {
            if rank != worker.node_rank() {
                return Err(StateError::invalid(
                    "worker.node_rank",
                    format!(
                        "node {node:?} already joined with node rank {rank}: one node rank per node"
                    ),
                ));
            }
        } else if let Some(other) = self.node_of_rank.get(&worker.node_rank()) {
            return Err(StateError::invalid(
                "worker.node_rank",
                format!(
                    "node rank {} is already node {other:?}'s: distinct nodes have distinct node ranks",
                    worker.node_rank()
                ),
            ));
        }
        if self.local_ranks.contains(&(node.to_owned(), worker.local_rank())) {
            return Err(StateError::invalid(
                "worker.local_rank",
                format!(
                    "local rank {} already joined on node {node:?}: local ranks are unique per node",
                    worker.local_rank()
                ),
            ));
        }
        Ok(())
    }

    fn add(&mut self, worker: &TrainWorkerInfo) {
        self.node_rank_of.insert(worker.node_id().to_owned(), worker.node_rank());
        self.node_of_rank.insert(worker.node_rank(), worker.node_id().to_owned());
        self.local_ranks.insert((worker.node_id().to_owned(), worker.local_rank()));
    }
}

/// The ranks of a run's current attempt.
struct Group {
    attempt_id: String,
    slots: Vec<Slot>,
    /// When each rank was last heard from and how many ended, shared with
    /// the connections that take rank heartbeats (see [`crate::decisions::liveness`]).
    board: Arc<RankBoard>,
    /// When the group was tracked, on the monotonic clock.
    since_ms: u64,
    /// The failures of this attempt's ranks, in the order they arrived,
    /// while the cause is not decided.
    failures: Vec<Failure>,
    /// When the first of them arrived, on the monotonic clock.
    window_from_ms: Option<u64>,
    /// The attempt's failure was decided: the run ended or restarts.
    decided: bool,
    /// When the attempt began to be tracked (wall ms): a stall written
    /// before it is an earlier attempt's.
    from_wall_ms: u64,
    /// The end of a stalled run's ranks its joins asked for
    /// (`on_stall: ABORT`), if they did.
    abort: Option<AbortRule>,
    /// The version of the run whose health the published end order was
    /// decided from (0: none yet).
    ordered_version: u64,
}

#[derive(Clone)]
struct Slot {
    identity: u64,
    /// Who the rank is, for reasons: `pid 4242 on node host-1 (10.0.0.2)`.
    who: Arc<str>,
    end: SlotEnd,
}

/// A rank's failure, at the time it happened by its own account.
struct Failure {
    rank: u32,
    at_ms: u64,
    end: RankEnd,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum SlotEnd {
    Running,
    Finished,
    Failed,
}

impl Group {
    fn new(
        attempt_id: String,
        slots: Vec<Slot>,
        heard: Vec<Option<u64>>,
        ended: u32,
        since_ms: u64,
        stall_after_ms: Option<u64>,
        from_wall_ms: u64,
    ) -> Self {
        let board = RankBoard::new(&attempt_id, heard, stall_after_ms);
        board.set_ended(ended);
        Self {
            attempt_id,
            slots,
            board: Arc::new(board),
            since_ms,
            failures: Vec::new(),
            window_from_ms: None,
            decided: false,
            from_wall_ms,
            abort: None,
            ordered_version: 0,
        }
    }

    /// Publishes on the board which ranks are to be ended (see
    /// [`crate::decisions::stall_abort`]), decided from the run's health
    /// whenever its record changed since the last decision: a run that is
    /// not RUNNING and STALLED is not parsed.
    fn order_ends(&mut self, id: &RunId, runs: &Runs) {
        let Some(rule) = self.abort else { return };
        let Some(record) = runs.record(id) else {
            self.board.set_end_order(None);
            return;
        };
        if record.version == self.ordered_version {
            return;
        }
        self.ordered_version = record.version;
        let stalled = record.status == RunStatus::Running
            && record.health == Some(trainstate_schema::HealthState::Stalled);
        let order = if stalled {
            end_order(id, rule, record.status, runs.health_of(id).as_ref())
        } else {
            None
        };
        self.board.set_end_order(order);
    }

    fn response(&self, id: &RunId, status: RunStatus, lease_ms: u64) -> RendezvousResponse {
        self.board.response(id, status, lease_ms)
    }

    fn end(&mut self, rank: usize, end: SlotEnd) {
        let slot = &mut self.slots[rank];
        if slot.end == SlotEnd::Running {
            self.board.set_ended(self.board.ended() + 1);
        }
        if slot.end != SlotEnd::Finished {
            slot.end = end;
        }
    }
}

impl Pending {
    fn response(&self, key: &GroupKey, lease_ms: u64) -> RendezvousResponse {
        let ended = self.members.values().filter(|m| m.end.is_some()).count() as u32;
        RendezvousResponse::new(
            self.run_id.clone(),
            key.1.to_string(),
            self.world_size,
            self.members.len() as u32,
            ended,
            None,
            lease_ms,
        )
    }

    /// The update that ends the run for the first failure in time with no
    /// restart to come, with the failures that followed it as detail.
    fn final_failure(&self) -> Option<StatusUpdate> {
        let failures: Vec<Failure> = self
            .members
            .iter()
            .filter_map(|(rank, m)| m.end.as_ref().map(|(at, end)| (*rank, *at, end)))
            .filter(|(_, _, end)| end.status != RunStatus::Finished && end.restarts_remaining == 0)
            .map(|(rank, at, end)| Failure {
                rank,
                at_ms: end.ended_at_ms.unwrap_or(at),
                end: end.clone(),
            })
            .collect();
        let who = |rank: u32| self.members.get(&rank).map(|m| who_of(&m.worker));
        let world_size = self.world_size as usize;
        cause_of(&failures, world_size).map(|verdict| failure_update(verdict, &failures, who))
    }

    /// When the run (or the attempt) starts: its earliest rank's process
    /// start, not after the first join, nor more than a day before it.
    fn start_ms(&self) -> u64 {
        self.members
            .values()
            .filter_map(|m| m.process_start_ms)
            .filter(|&start| self.started_ms.saturating_sub(start) <= MAX_START_LEAD_MS)
            .min()
            .map_or(self.started_ms, |start| start.min(self.started_ms))
    }
}

/// Who a worker is, for reasons: `pid 4242 on node gpu-7 (3f2a…, 10.0.0.2)`
/// with its host name, else `pid 4242 on node 3f2a… (10.0.0.2)`.
fn who_of(worker: &TrainWorkerInfo) -> Arc<str> {
    match worker.node_name() {
        Some(host) => format!(
            "pid {} on node {host} ({}, {})",
            worker.pid(),
            worker.node_id(),
            worker.node_ip()
        ),
        None => format!("pid {} on node {} ({})", worker.pid(), worker.node_id(), worker.node_ip()),
    }
    .into()
}

/// True when `end` is a communication error that a peer's death causes
/// (one of [`ECHO_MESSAGES`] in the error a rank raised).
fn is_echo(end: &RankEnd) -> bool {
    if end.status != RunStatus::Errored || end.failure_mode() != Some(FailureMode::Raised) {
        return false;
    }
    let tail = last_chars(&end.detail, 2_000).to_ascii_lowercase();
    ECHO_MESSAGES.iter().any(|m| tail.contains(&m.to_ascii_lowercase()))
}

/// True when `end` is an error a rank raised because its device failed
/// (one of [`HARDWARE_MESSAGES`] in it).
fn is_device_fault(end: &RankEnd) -> bool {
    if end.status != RunStatus::Errored || end.failure_mode() != Some(FailureMode::Raised) {
        return false;
    }
    let tail = last_chars(&end.detail, 2_000).to_ascii_lowercase();
    HARDWARE_MESSAGES.iter().any(|m| tail.contains(&m.to_ascii_lowercase()))
}

/// True when `end` is an interrupt: killed by SIGTERM, SIGINT or SIGHUP, or
/// a `KeyboardInterrupt` (what a launcher, a scheduler or a person does).
fn is_interrupt(end: &RankEnd) -> bool {
    end.status == RunStatus::Aborted
}

/// What an attempt's failures say its cause is.
enum Verdict<'a> {
    /// This rank's failure came first.
    Rank(&'a Failure),
    /// Every rank was stopped by a signal to the whole job, none first;
    /// the earliest of them.
    AllInterrupted(&'a Failure),
}

impl<'a> Verdict<'a> {
    fn first(&self) -> &'a Failure {
        match self {
            Verdict::Rank(f) | Verdict::AllInterrupted(f) => f,
        }
    }
}

/// The cause of an attempt of `world_size` ranks from its failures (one per
/// rank): every rank interrupted by a signal, with nothing else before
/// (echoes aside), is the whole job stopped; else the earliest failure that
/// is not an echo excused by another rank's death within [`ECHO_TIE_MS`]
/// (ties: the first to arrive). When every failure is an echo, the earliest
/// is named.
fn cause_of(failures: &[Failure], world_size: usize) -> Option<Verdict<'_>> {
    let earliest = failures.iter().min_by_key(|f| f.at_ms)?;
    let first_interrupt = failures.iter().filter(|f| is_interrupt(&f.end)).min_by_key(|f| f.at_ms);
    if let Some(first_interrupt) = first_interrupt {
        let ranks: HashSet<u32> = failures.iter().map(|f| f.rank).collect();
        // A single rank interrupted is named, as any rank that failed alone.
        let stopped = world_size > 1
            && ranks.len() == world_size
            && failures.iter().all(|f| {
                // An echo after the first interrupt: a peer of a rank the
                // signal ended first.
                is_interrupt(&f.end) || (is_echo(&f.end) && f.at_ms >= first_interrupt.at_ms)
            });
        if stopped {
            return Some(Verdict::AllInterrupted(first_interrupt));
        }
    }
    let excused = |echo: &Failure| {
        is_echo(&echo.end)
            && failures.iter().any(|other| {
                other.rank != echo.rank
                    && !is_echo(&other.end)
                    && other.at_ms.abs_diff(echo.at_ms) <= ECHO_TIE_MS
                    // An interrupt after the echo is the launcher stopping
                    // the survivors because of it, not what caused it.
                    && (!is_interrupt(&other.end) || other.at_ms <= echo.at_ms)
            })
    };
    Some(Verdict::Rank(
        failures.iter().filter(|f| !excused(f)).min_by_key(|f| f.at_ms).unwrap_or(earliest),
    ))
}

/// The status update of an attempt's cause (`verdict`), which ends the run
/// (or its attempt): its cause names the rank, how it failed and when; its
/// detail says so in words, then names the other failures (`all` holds
/// them, and the cause's) as what they are, consequences. A whole job
/// stopped by a signal names no rank.
fn failure_update(
    verdict: Verdict<'_>,
    all: &[Failure],
    who: impl Fn(u32) -> Option<Arc<str>>,
) -> StatusUpdate {
    let first = verdict.first();
    if let Verdict::AllInterrupted(first) = verdict {
        return all_interrupted_update(first, all);
    }
    let end = &first.end;
    let rank = first.rank;
    let how = end.failure_mode().unwrap_or(FailureMode::Raised);
    let kind = match end.cause_kind().unwrap_or(CauseKind::UserError) {
        CauseKind::UserError if is_device_fault(end) => CauseKind::Hardware,
        kind => kind,
    };
    let mut detail = if how.died_unreported() {
        let who = who(rank).map(|w| format!(" ({w})")).unwrap_or_default();
        let at = iso_ms(first.at_ms);
        match (how, end.detail.trim()) {
            // Its watcher ended it because the run stalled and asked for
            // that: the detail is the head's own words of why.
            (_, why) if kind == CauseKind::NoProgress && !why.is_empty() => {
                format!("Rank {rank}{who} was ended at {at}: {why}")
            }
            (FailureMode::Vanished, _) | (_, "") => format!(
                "Rank {rank}{who} died without reporting, at {at}; how it died is not known."
            ),
            (_, how_text) => {
                format!("Rank {rank}{who} died without reporting: {how_text}, at {at}.")
            }
        }
    } else if end.status == RunStatus::Errored {
        end.detail.clone()
    } else {
        aborted_detail(rank, end)
    };
    let own_report = detail.clone();
    let mut others: Vec<&Failure> =
        all.iter().filter(|f| !std::ptr::eq(*f, first) && f.rank != rank).collect();
    others.sort_by_key(|f| (f.at_ms, f.rank));
    if !others.is_empty() {
        detail.push_str("\n\n");
        detail.push_str(NOT_THE_CAUSE);
        for f in others.iter().take(MAX_SECONDARY_FAILURES) {
            let when = if f.at_ms < first.at_ms {
                format!("{} earlier", seconds(first.at_ms - f.at_ms))
            } else {
                format!("{} later", seconds(f.at_ms - first.at_ms))
            };
            let what = f.end.detail.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
            let what = last_chars(what.trim(), 300);
            let status = f.end.status.as_str();
            let mode = f.end.failure_mode().map_or("", FailureMode::as_str);
            let echo = if is_echo(&f.end) { " (a peer was gone)" } else { "" };
            detail.push_str(&format!("\n- rank {} {when}: {status} ({mode}){echo} {what}", f.rank));
        }
        if others.len() > MAX_SECONDARY_FAILURES {
            detail.push_str(&format!("\n- and {} more", others.len() - MAX_SECONDARY_FAILURES));
        }
    }
    let mut cause = RunCause::new(kind, Some(rank)).with_failure(Some(how), Some(first.at_ms));
    let mut update = match end.status {
        RunStatus::Aborted => StatusUpdate::aborted(kind, detail),
        _ => StatusUpdate::errored(Some(rank), kind, detail),
    };
    // What the failed rank itself said, as the run's detail will begin,
    // without what the others said after it.
    cause.report = Some(one_line(&failure_detail(update.status, Some(&cause), &own_report)));
    update.cause = Some(cause);
    update
}

/// The update of a job stopped by a signal to all its ranks: ABORTED, no
/// rank named; the detail says how each rank ended. Its kind is the one
/// every interrupted rank gave when they agree (their watchers read from
/// the scheduler that the job's time ran out, or that it was preempted),
/// else `USER_INTERRUPT`.
fn all_interrupted_update(first: &Failure, all: &[Failure]) -> StatusUpdate {
    let kind = agreed_interrupt_kind(all);
    let mut detail = format!(
        "All {} ranks were stopped by a signal to the whole job (from its launcher, the scheduler or a person), the first at {}; no rank failed first.",
        all.len(),
        iso_ms(first.at_ms)
    );
    match kind {
        CauseKind::Timeout => detail.push_str(" The job's time limit ran out."),
        CauseKind::Preempted => detail.push_str(" The scheduler preempted the job."),
        CauseKind::NodeLost => detail.push_str(" The scheduler lost the job's node."),
        _ => {}
    }
    detail.push_str("\n\nHow each rank ended:");
    let mut ranks: Vec<&Failure> = all.iter().collect();
    ranks.sort_by_key(|f| (f.at_ms, f.rank));
    if ranks.is_empty() {
        return StatusUpdate::aborted(kind, detail);
    }
    for f in ranks.iter().take(MAX_SECONDARY_FAILURES) {
        let what = f.end.detail.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
        let what = match last_chars(what.trim(), 300) {
            "" => "interrupted",
            text => text,
        };
        let after = seconds(f.at_ms.saturating_sub(ranks[0].at_ms));
        detail.push_str(&format!("\n- rank {} (+{after}): {what}", f.rank));
    }
    if ranks.len() > MAX_SECONDARY_FAILURES {
        detail.push_str(&format!("\n- and {} more", ranks.len() - MAX_SECONDARY_FAILURES));
    }
    StatusUpdate::aborted(kind, detail)
}

/// The cause kind every interrupted rank of `all` gave, when they all gave
/// the same; `USER_INTERRUPT` when they differ or there are none. Echoes
/// (errors a peer's death raised) have no say.
fn agreed_interrupt_kind(all: &[Failure]) -> CauseKind {
    let mut kinds = all.iter().filter(|f| is_interrupt(&f.end)).filter_map(|f| f.end.cause_kind());
    match kinds.next() {
        Some(kind) if kinds.all(|other| other == kind) => kind,
        _ => CauseKind::UserInterrupt,
    }
}

/// Ends `group`'s attempt for its first failure in time: the run ends with
/// it, or, when the launcher restarts the workers, the attempt keeps it and
/// the run is RESTARTING. Decided once.
fn decide(
    id: &RunId,
    group: &mut Group,
    status: RunStatus,
    runs: &mut Runs,
    now_ms: u64,
) -> Result<Outcome<()>, StateError> {
    let failures = std::mem::take(&mut group.failures);
    group.decided = true;
    let Some(verdict) = cause_of(&failures, group.slots.len()) else {
        return Ok(Outcome::Unchanged(()));
    };
    let restarts = verdict.first().end.restarts_remaining > 0 && status.is_live();
    let slots = &group.slots;
    let update =
        failure_update(verdict, &failures, |rank| slots.get(rank as usize).map(|s| s.who.clone()));
    let outcome = if restarts {
        runs.fail_attempt(id, update, now_ms)
    } else {
        runs.set_status(id, update, now_ms)
    };
    match outcome {
        Ok(outcome) => Ok(answered(outcome, ())),
        // The run had ended already: the failure changes nothing.
        Err(StateError::IllegalTransition { .. }) => Ok(Outcome::Unchanged(())),
        Err(err) => Err(err),
    }
}

/// A fingerprint of a worker's identity: what a repeated join must match.
fn identity_of(worker: &TrainWorkerInfo) -> u64 {
    identity_and_size(worker).0
}

/// A worker's identity ([`identity_of`]) and its size as JSON, in bytes.
fn identity_and_size(worker: &TrainWorkerInfo) -> (u64, usize) {
    let mut draft = worker.clone().into_draft();
    draft.status = trainstate_schema::ActorStatus::Alive;
    let text = serde_json::to_string(&draft).expect("a worker serializes");
    let mut hasher = DefaultHasher::new();
    hasher.write(text.as_bytes());
    (hasher.finish(), text.len())
}

/// The status of a run in the working state; a live run's lease is renewed,
/// as by a heartbeat: every request of a rank is a sign of life.
fn touch(runs: &mut Runs, id: &RunId, now_ms: u64) -> Result<RunStatus, StateError> {
    match runs.heartbeat(id, now_ms) {
        Ok(_) => Ok(runs.status_of(id).unwrap_or(RunStatus::Running)),
        Err(StateError::IllegalTransition { from, .. }) => Ok(from),
        Err(err) => Err(err),
    }
}

/// `first`'s writes, then `second`'s, answered as `second`.
fn chain<A, B>(first: Outcome<A>, second: Outcome<B>) -> Outcome<B> {
    let (mut ops, mut events) = match first {
        Outcome::Unchanged(_) => (Vec::new(), Vec::new()),
        Outcome::Changed(change) => (change.ops, change.events),
    };
    match second {
        Outcome::Unchanged(answer) if ops.is_empty() => Outcome::Unchanged(answer),
        Outcome::Unchanged(answer) => Outcome::Changed(Change { ops, events, answer }),
        Outcome::Changed(change) => {
            ops.extend(change.ops);
            events.extend(change.events);
            Outcome::Changed(Change { ops, events, answer: change.answer })
        }
    }
}

fn answered<A, B>(outcome: Outcome<A>, answer: B) -> Outcome<B> {
    match outcome {
        Outcome::Unchanged(_) => Outcome::Unchanged(answer),
        Outcome::Changed(change) => {
            Outcome::Changed(Change { ops: change.ops, events: change.events, answer })
        }
    }
}

fn aborted_detail(rank: u32, end: &RankEnd) -> String {
    if end.detail.is_empty() {
        format!("Rank {rank} was interrupted.")
    } else {
        format!("Rank {rank}: {}", end.detail)
    }
}

/// `1, 3-5, 9`, at most 20 ranges.
fn ranks_text(ranks: impl Iterator<Item = u32>) -> String {
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for rank in ranks {
        match ranges.last_mut() {
            Some((_, end)) if *end + 1 == rank => *end = rank,
            _ => ranges.push((rank, rank)),
        }
    }
    let mut parts: Vec<String> = ranges
        .iter()
        .take(20)
        .map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") })
        .collect();
    if ranges.len() > 20 {
        parts.push("...".into());
    }
    parts.join(", ")
}

impl Rendezvous {
    /// Handles one request. `admitted` says whether a write may be queued
    /// now (it is checked only when the request writes).
    pub(crate) fn handle(
        &mut self,
        message: RendezvousMessage,
        runs: &mut Runs,
        view: &dyn StoredRuns,
        admitted: Result<(), StateError>,
        lease_ms: u64,
        now_ms: u64,
    ) -> Reaction {
        self.mono_ms = runs.lease_now(now_ms);
        let (reply, step) = match message {
            RendezvousMessage::Join { join, client, reply } => {
                self.joining = client;
                (reply, self.join(*join, runs, view, admitted, lease_ms, now_ms))
            }
            RendezvousMessage::Heartbeat { id, rank, attempt_id, progress, reply } => {
                let progress = progress.as_deref();
                let step =
                    self.heartbeat(&id, rank, &attempt_id, progress, runs, view, lease_ms, now_ms);
                (reply, step)
            }
            RendezvousMessage::End { id, rank, end, reply } => {
                (reply, self.end(&id, rank, end, runs, view, admitted, lease_ms, now_ms))
            }
        };
        match step {
            Ok(Step::Answer(answer)) => Reaction::Answer(reply, Ok(answer)),
            Ok(Step::Write(outcome)) => Reaction::Write(reply, Ok(outcome)),
            Err(err) => Reaction::Answer(reply, Err(err)),
        }
    }

    fn join(
        &mut self,
        join: Join,
        runs: &mut Runs,
        view: &dyn StoredRuns,
        admitted: Result<(), StateError>,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Step, StateError> {
        // The join goes on as usual from a suspect node; its answer warns.
        let node = join.worker.node_name().unwrap_or(join.worker.node_id()).to_owned();
        let warning = node_warning(view, &node, self.cluster.as_deref(), now_ms);
        let warn = |step: Step| match step {
            Step::Answer(answer) => Step::Answer(answer.with_warning(warning.clone())),
            Step::Write(outcome) => {
                Step::Write(outcome.map(|answer| answer.with_warning(warning.clone())))
            }
        };
        let key: GroupKey = (join.key.clone(), join.attempt);
        if !self.pending.contains_key(&key)
            && let Some(step) = self.join_run(&join, &key, runs, view, lease_ms, now_ms)?
        {
            return Ok(warn(step));
        }
        if warning.is_some()
            && let Some(pending) = self.pending.get_mut(&key)
            && pending.suspects.len() < MAX_NOTED_SUSPECTS
            && !pending.suspects.contains(&node)
        {
            pending.suspects.push(node);
        }
        let joined = self.join_pending(join, &key, runs, admitted, lease_ms, now_ms);
        if joined.is_err() && self.pending.get(&key).is_some_and(|p| p.members.is_empty()) {
            // A group opened for a join that was refused does not wait.
            self.remove_pending(&key);
        }
        joined.map(warn)
    }

    /// A join into the group waiting under `key`.
    fn join_pending(
        &mut self,
        join: Join,
        key: &GroupKey,
        runs: &mut Runs,
        admitted: Result<(), StateError>,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Step, StateError> {
        let key = key.clone();
        let (identity, bytes) = identity_and_size(&join.worker);
        let rank = join.worker.world_rank();
        let mono_ms = self.mono_ms;
        let held = self.pending_bytes;
        let pending = self.pending.get_mut(&key).expect("a group waits under the key");
        pending.heard_mono_ms = mono_ms;
        if pending.world_size != join.world_size {
            return Err(StateError::Refused {
                reason: format!(
                    "world_size {} disagrees with the group's {} (key {:?}, attempt {}): every rank of a launch must give the same",
                    join.world_size, pending.world_size, key.0, key.1
                ),
            });
        }
        if let Some(member) = pending.members.get_mut(&rank) {
            if member.identity != identity {
                return Err(StateError::Refused {
                    reason: format!(
                        "rank {rank} of key {:?} (attempt {}) has already joined, as pid {} on node {:?}: a rank joins once",
                        key.0,
                        key.1,
                        member.worker.pid(),
                        member.worker.node_id()
                    ),
                });
            }
            member.last_heard_ms = now_ms;
            return Ok(Step::Answer(pending.response(&key, lease_ms)));
        }
        pending.placement.check(&join.worker)?;
        if held + bytes > MAX_PENDING_BYTES {
            self.make_room(Some((&key, bytes)))?;
        }
        let pending = self.pending.get_mut(&key).expect("a group waits under the key");
        if (pending.members.len() as u32) + 1 == pending.world_size {
            // This join completes the group: it will write.
            admitted?;
        }
        pending.placement.add(&join.worker);
        pending.stall_after_ms = pending.stall_after_ms.or(join.stall_after_ms);
        pending.on_stall = pending.on_stall.or(join.on_stall);
        pending.abort_after_ms = pending.abort_after_ms.or(join.abort_after_ms);
        pending.bytes += bytes;
        self.pending_bytes += bytes;
        if rank == 0 {
            pending.name = join.name;
            pending.job_id = join.job_id;
        }
        pending.members.insert(
            rank,
            Member {
                worker: join.worker,
                identity,
                process_start_ms: join.process_start_ms,
                last_heard_ms: now_ms,
                end: None,
            },
        );
        if (pending.members.len() as u32) < pending.world_size {
            return Ok(Step::Answer(pending.response(&key, lease_ms)));
        }
        let pending = self.remove_pending(&key).expect("the group is waiting");
        self.complete(key, pending, runs, lease_ms, now_ms).map(Step::Write)
    }

    /// A join when no group waits under its key: into the run of the key if
    /// there is one (answered here), else a new group is opened (`None`).
    fn join_run(
        &mut self,
        join: &Join,
        key: &GroupKey,
        runs: &mut Runs,
        view: &dyn StoredRuns,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Option<Step>, StateError> {
        let found = match self.run_of_key(&join.key, view) {
            Some(id) => match touch(runs, &id, now_ms) {
                Ok(status) => Some((id, status)),
                Err(StateError::NotFound { .. }) => {
                    self.keys.remove(&join.key);
                    self.groups.remove(&id);
                    None
                }
                Err(err) => return Err(err),
            },
            None => None,
        };
        let Some((id, status)) = found else {
            self.make_room(None)?;
            let run_id = join
                .run_id
                .clone()
                .filter(|hint| self.id_is_free(hint, view))
                .unwrap_or_else(RunId::new_v7);
            self.open(key.clone(), run_id, false, join, now_ms);
            return Ok(None);
        };
        let group = self.group(&id, view)?;
        let refused = |reason: String| Err(StateError::Refused { reason });
        let current = group.attempt_id.parse::<u32>().ok();
        match current.map(|c| join.attempt.cmp(&c)) {
            Some(std::cmp::Ordering::Equal) => {
                let rank = join.worker.world_rank() as usize;
                let same = group.slots.len() == join.world_size as usize
                    && group
                        .slots
                        .get(rank)
                        .is_some_and(|s| s.identity == identity_of(&join.worker));
                if same {
                    // A group rebuilt after a restart of the head learns
                    // again what its run asked for when it stalls.
                    if group.abort.is_none() {
                        group.abort =
                            AbortRule::of(join.on_stall, join.abort_after_ms, group.from_wall_ms);
                    }
                    return Ok(Some(Step::Answer(group.response(&id, status, lease_ms))));
                }
                if status.is_terminal() && join.attempt == 0 && !group.slots.is_empty() {
                    // A launcher that gives every launch the same key (a
                    // multi-node torchrun without --rdzv-id): a process
                    // that is none of an ended run's ranks is a new launch.
                    self.make_room(None)?;
                    self.keys.remove(&join.key);
                    let run_id = join
                        .run_id
                        .clone()
                        .filter(|hint| self.id_is_free(hint, view))
                        .unwrap_or_else(RunId::new_v7);
                    self.open(key.clone(), run_id, false, join, now_ms);
                    return Ok(None);
                }
                refused(format!(
                    "the group of key {:?} (attempt {}) closed when its {} ranks had joined, and this is not one of them: run {id} is {status}",
                    join.key,
                    join.attempt,
                    group.slots.len()
                ))
            }
            Some(std::cmp::Ordering::Less) => refused(format!(
                "attempt {} of key {:?} was replaced by attempt {}",
                join.attempt, join.key, group.attempt_id
            )),
            None => refused(format!(
                "run {id} of key {:?} has attempt {:?}, which the rendezvous did not start",
                join.key, group.attempt_id
            )),
            Some(std::cmp::Ordering::Greater) if status.is_terminal() => refused(format!(
                "run {id} of key {:?} has ended ({status}): a relaunch cannot join it; launch with a new key",
                join.key
            )),
            Some(std::cmp::Ordering::Greater) => {
                self.make_room(None)?;
                self.open(key.clone(), id, true, join, now_ms);
                Ok(None)
            }
        }
    }

    /// Makes room for the joining client's group past the bounds on
    /// waiting groups ([`MAX_PENDING_GROUPS`], or with `bytes` more,
    /// [`MAX_PENDING_BYTES`]): while a bound would be passed, the waiting
    /// group opened longest ago by the client holding the most is closed,
    /// never the group `except` (the one being joined). When the joining
    /// client holds as many as any other, nothing is closed and the join
    /// is refused, 503 `unavailable` naming the bound: so no client, from
    /// however many joins, keeps another's launch out.
    fn make_room(&mut self, join: Option<(&GroupKey, usize)>) -> Result<(), StateError> {
        let bytes = join.map_or(0, |(_, bytes)| bytes);
        loop {
            let groups_full = join.is_none() && self.pending.len() >= MAX_PENDING_GROUPS;
            let bytes_full = self.pending_bytes + bytes > MAX_PENDING_BYTES;
            if !groups_full && !bytes_full {
                return Ok(());
            }
            if !self.close_for_room(join.map(|(key, _)| key)) {
                let held = self.held_by_client.get(&self.joining).copied().unwrap_or(0);
                return Err(StateError::unavailable(if groups_full {
                    format!(
                        "{MAX_PENDING_GROUPS} groups are waiting for ranks, the rendezvous's bound, and this client opened {held} of them, as many as any other: no new group opens for it until one completes or closes (a group none of whose ranks is heard from for a lease closes); retry"
                    )
                } else {
                    format!(
                        "groups waiting for ranks hold {} MiB of workers, the rendezvous's bound of {} MiB, and this client opened {held} of them, as many as any other: no rank joins until groups complete or close; retry",
                        self.pending_bytes >> 20,
                        MAX_PENDING_BYTES >> 20
                    )
                }));
            }
        }
    }

    /// Closes the waiting group opened longest ago by the client that
    /// opened the most, unless the joining client opened as many (or the
    /// only candidate is `except`). Returns whether one was closed.
    fn close_for_room(&mut self, except: Option<&GroupKey>) -> bool {
        let joining = self.held_by_client.get(&self.joining).copied().unwrap_or(0);
        let Some((biggest, held)) = self
            .held_by_client
            .iter()
            .filter(|(client, _)| **client != self.joining)
            .max_by_key(|(client, held)| (**held, std::cmp::Reverse((*client).clone())))
            .map(|(client, held)| (client.clone(), *held))
        else {
            return false;
        };
        if held <= joining {
            return false;
        }
        let oldest = self
            .pending
            .iter()
            .filter(|(key, p)| p.client == biggest && Some(*key) != except)
            .min_by_key(|(key, p)| (p.deadline_from_ms, p.started_ms, (*key).clone()))
            .map(|(key, _)| key.clone());
        let Some(key) = oldest else {
            return false;
        };
        tracing::debug!(
            key = %key.0,
            client = biggest.as_deref().unwrap_or("in-process"),
            "closed a waiting rendezvous group to make room for another client's"
        );
        self.remove_pending(&key);
        true
    }

    /// Opens a group under `key` for run `run_id`.
    fn open(&mut self, key: GroupKey, run_id: RunId, existing: bool, join: &Join, now_ms: u64) {
        self.pending_runs.insert((run_id.clone(), key.1.to_string()), key.clone());
        self.pending.insert(
            key,
            Pending {
                run_id,
                existing,
                world_size: join.world_size,
                name: join.name.clone(),
                job_id: join.job_id.clone(),
                started_ms: now_ms,
                deadline_from_ms: self.mono_ms,
                heard_mono_ms: self.mono_ms,
                bytes: 0,
                timeout_ms: join.join_timeout.as_millis() as u64,
                stall_after_ms: join.stall_after_ms,
                on_stall: join.on_stall,
                abort_after_ms: join.abort_after_ms,
                members: BTreeMap::new(),
                placement: Placement::default(),
                suspects: Vec::new(),
                client: self.joining.clone(),
            },
        );
        *self.held_by_client.entry(self.joining.clone()).or_insert(0) += 1;
    }

    fn remove_pending(&mut self, key: &GroupKey) -> Option<Pending> {
        let pending = self.pending.remove(key)?;
        self.pending_bytes -= pending.bytes;
        if let Some(held) = self.held_by_client.get_mut(&pending.client) {
            *held -= 1;
            if *held == 0 {
                self.held_by_client.remove(&pending.client);
            }
        }
        self.pending_runs.remove(&(pending.run_id.clone(), key.1.to_string()));
        Some(pending)
    }

    /// True when no run, stored or assembling, has `id`.
    fn id_is_free(&self, id: &RunId, view: &dyn StoredRuns) -> bool {
        !view.is_stored(id)
            && !self.groups.contains_key(id)
            && !self.pending.values().any(|p| p.run_id == *id)
            && !self.keys.values().any(|k| k == id)
    }

    /// The run of `key`: the one this actor assembled, else the newest
    /// stored run whose controller is the key's rendezvous.
    fn run_of_key(&mut self, key: &str, view: &dyn StoredRuns) -> Option<RunId> {
        if let Some(id) = self.keys.get(key) {
            return Some(id.clone());
        }
        let id = view.newest_of_rendezvous(&controller_of(key))?.id.clone();
        self.keys.insert(key.to_owned(), id.clone());
        Some(id)
    }

    /// The group of run `id`, rebuilt from the stored run if this actor has
    /// not tracked it (after a restart).
    fn group(&mut self, id: &RunId, view: &dyn StoredRuns) -> Result<&mut Group, StateError> {
        if !self.groups.contains_key(id) {
            let record = view.stored(id).ok_or_else(|| StateError::NotFound { id: id.clone() })?;
            let run = record.run()?;
            let attempt_id = run
                .attempts()
                .last()
                .map_or(NewRun::FIRST_ATTEMPT_ID, |a| a.attempt_id())
                .to_owned();
            let slots = run
                .workers()
                .iter()
                .map(|w| Slot { identity: identity_of(w), who: who_of(w), end: SlotEnd::Running })
                .collect::<Vec<_>>();
            let heard = vec![None; slots.len()];
            // A stall written before the attempt began is an earlier
            // attempt's.
            let from_wall_ms =
                run.attempts().last().map_or(run.start_time_ms(), |a| a.start_time_ms());
            let group = Group::new(attempt_id, slots, heard, 0, self.mono_ms, None, from_wall_ms);
            self.groups.insert(id.clone(), group);
        }
        Ok(self.groups.get_mut(id).expect("tracked above"))
    }

    /// Registers the run of a complete group, or its new attempt, with the
    /// ends its ranks reported while it waited.
    fn complete(
        &mut self,
        key: GroupKey,
        pending: Pending,
        runs: &mut Runs,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Outcome<RendezvousResponse>, StateError> {
        let attempt_id = key.1.to_string();
        let start_ms = pending.start_ms();
        let workers: Vec<TrainWorkerInfo> =
            pending.members.values().map(|m| m.worker.clone()).collect();
        let failure = pending.final_failure();
        let decided = failure.is_some();
        let all_finished = pending
            .members
            .values()
            .all(|m| m.end.as_ref().is_some_and(|(_, e)| e.status == RunStatus::Finished));
        let mut ended = 0;
        let slots: Vec<Slot> = pending
            .members
            .values()
            .map(|m| {
                let end = match &m.end {
                    None => SlotEnd::Running,
                    Some((_, e)) if e.status == RunStatus::Finished => SlotEnd::Finished,
                    Some(_) => SlotEnd::Failed,
                };
                ended += u32::from(end != SlotEnd::Running);
                Slot { identity: m.identity, who: who_of(&m.worker), end }
            })
            .collect();
        let heard: Vec<Option<u64>> =
            pending.members.values().map(|m| Some(m.last_heard_ms)).collect();
        let status = match (&failure, all_finished) {
            (Some(update), _) => update.status,
            (None, true) => RunStatus::Finished,
            (None, false) => RunStatus::Running,
        };
        let id = pending.run_id.clone();
        let world_size = pending.world_size;
        let stall_after_ms = pending.stall_after_ms;
        let abort = AbortRule::of(pending.on_stall, pending.abort_after_ms, now_ms);
        let note = (!pending.suspects.is_empty()).then(|| suspects_note(&pending.suspects));
        let outcome = if pending.existing {
            let attempt = NewAttempt::new(&attempt_id, start_ms, workers);
            let started = answered(runs.start_attempt(&id, attempt, now_ms)?, ());
            // The failure the previous attempt ended with is kept there;
            // the run trains again.
            let started = if runs.status_of(&id) == Some(RunStatus::Restarting) {
                let running = StatusUpdate::live(RunStatus::Running, note.unwrap_or_default());
                answered(chain(started, runs.set_status(&id, running, now_ms)?), ())
            } else {
                started
            };
            match (failure, all_finished) {
                (Some(update), _) => {
                    answered(chain(started, runs.set_status(&id, update, now_ms)?), ())
                }
                (None, true) => answered(
                    chain(started, runs.set_status(&id, StatusUpdate::finished(), now_ms)?),
                    (),
                ),
                (None, false) => answered(started, ()),
            }
        } else {
            let mut draft = TrainRunInfoDraft {
                workers: workers.into_iter().map(TrainWorkerInfo::into_draft).collect(),
                attempts: vec![RunAttemptDraft::new(attempt_id.clone(), start_ms)],
                cluster: self.cluster.clone(),
                ..TrainRunInfoDraft::new(
                    id.to_string(),
                    &pending.name,
                    &pending.job_id,
                    controller_of(&key.0),
                    start_ms,
                )
            };
            draft.run_status = status;
            if let Some(update) = &failure {
                draft.status_detail =
                    failure_detail(update.status, update.cause.as_ref(), &update.detail);
                draft.cause = update.cause.clone();
            } else if let Some(note) = note {
                draft.status_detail = note;
            }
            let run = NewRun::try_from(draft)?;
            answered(runs.register(run, now_ms)?, ())
        };
        self.keys.insert(key.0, id.clone());
        let mut group = Group::new(
            attempt_id.clone(),
            slots,
            heard,
            ended,
            self.mono_ms,
            stall_after_ms,
            now_ms,
        );
        group.decided = decided;
        group.abort = abort;
        self.groups.insert(id.clone(), group);
        let answer = RendezvousResponse::new(
            id,
            attempt_id,
            world_size,
            world_size,
            ended,
            Some(status),
            lease_ms,
        );
        Ok(answered(outcome, answer))
    }

    #[allow(clippy::too_many_arguments)]
    fn heartbeat(
        &mut self,
        id: &RunId,
        rank: u32,
        attempt_id: &str,
        progress: Option<&RankProgress>,
        runs: &mut Runs,
        view: &dyn StoredRuns,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Step, StateError> {
        if let Some(key) = self.pending_runs.get(&(id.clone(), attempt_id.to_owned())) {
            let key = key.clone();
            let pending = self.pending.get_mut(&key).expect("indexed groups wait");
            let member = pending
                .members
                .get_mut(&rank)
                .ok_or_else(|| StateError::NotFound { id: id.clone() })?;
            member.last_heard_ms = now_ms;
            pending.heard_mono_ms = self.mono_ms;
            return Ok(Step::Answer(pending.response(&key, lease_ms)));
        }
        let group = self.group_of(id, rank, attempt_id, view)?;
        if let Some(report) = progress.filter(|_| runs.status_of(id) == Some(RunStatus::Running)) {
            group.board.progress().report(id, rank, report, now_ms)?;
        }
        let status = touch(runs, id, now_ms)?;
        let group = self.groups.get_mut(id).expect("tracked above");
        if status == RunStatus::Running {
            group.board.heard(rank as usize, now_ms);
        }
        let mut answer = group.response(id, status, lease_ms);
        answer.capture = group.board.capture_order(rank, now_ms);
        if status == RunStatus::Running {
            answer.end_rank = group.board.end_rank(rank, now_ms);
        }
        Ok(Step::Answer(answer))
    }

    /// The tracked group of a rank of a registered run, checked against the
    /// rank's attempt and world rank.
    fn group_of(
        &mut self,
        id: &RunId,
        rank: u32,
        attempt_id: &str,
        view: &dyn StoredRuns,
    ) -> Result<&mut Group, StateError> {
        let group = self.group(id, view)?;
        if group.attempt_id != attempt_id {
            return Err(StateError::Conflict {
                id: id.clone(),
                reason: format!(
                    "attempt {attempt_id:?} is not the run's current attempt {:?}: it was replaced",
                    group.attempt_id
                ),
            });
        }
        if rank as usize >= group.slots.len() {
            return Err(StateError::invalid(
                "rank",
                format!("must be below the group's world size ({})", group.slots.len()),
            ));
        }
        Ok(group)
    }

    #[allow(clippy::too_many_arguments)]
    fn end(
        &mut self,
        id: &RunId,
        rank: u32,
        end: RankEnd,
        runs: &mut Runs,
        view: &dyn StoredRuns,
        admitted: Result<(), StateError>,
        lease_ms: u64,
        now_ms: u64,
    ) -> Result<Step, StateError> {
        if let Some(key) = self.pending_runs.get(&(id.clone(), end.attempt_id.clone())) {
            let key = key.clone();
            let pending = self.pending.get_mut(&key).expect("indexed groups wait");
            let member = pending
                .members
                .get_mut(&rank)
                .ok_or_else(|| StateError::NotFound { id: id.clone() })?;
            member.last_heard_ms = now_ms;
            if member.end.is_none() {
                member.end = Some((now_ms, end));
            }
            pending.heard_mono_ms = self.mono_ms;
            return Ok(Step::Answer(pending.response(&key, lease_ms)));
        }
        let status = touch(runs, id, now_ms)?;
        let mono_ms = self.mono_ms;
        let group = self.group_of(id, rank, &end.attempt_id, view)?;
        let slot = rank as usize;
        group.board.heard(slot, now_ms);
        let failed = end.status != RunStatus::Finished;
        if failed && group.slots[slot].end == SlotEnd::Running && !group.decided {
            let at_ms = end.ended_at_ms.unwrap_or(now_ms);
            group.failures.push(Failure { rank, at_ms, end: end.clone() });
            if group.window_from_ms.is_none() {
                group.window_from_ms = Some(mono_ms);
                self.wakeup = true;
            }
        }
        let group = self.groups.get_mut(id).expect("tracked above");
        group.end(slot, if failed { SlotEnd::Failed } else { SlotEnd::Finished });
        let answer = group.response(id, status, lease_ms);
        let all_ended = group.slots.iter().all(|s| s.end != SlotEnd::Running);
        let all_finished = group.slots.iter().all(|s| s.end == SlotEnd::Finished);
        // A lost-controller abort is replaced by the first report after it.
        let decide_now = !group.failures.is_empty() && (all_ended || status.is_terminal());
        if !decide_now && !all_finished {
            return Ok(Step::Answer(answer));
        }
        admitted?;
        let outcome = if decide_now {
            decide(id, group, status, runs, now_ms)?
        } else {
            match runs.set_status(id, StatusUpdate::finished(), now_ms) {
                Ok(outcome) => answered(outcome, ()),
                // The run had ended already: the end changes nothing.
                Err(StateError::IllegalTransition { .. }) => Outcome::Unchanged(()),
                Err(err) => return Err(err),
            }
        };
        let mut answer = answer;
        answer.run_status = runs.status_of(id).or(answer.run_status);
        Ok(match outcome {
            Outcome::Unchanged(()) => Step::Answer(answer),
            changed => Step::Write(answered(changed, answer)),
        })
    }

    /// Publishes, on the rank board of each tracked group whose run asked
    /// for `on_stall: ABORT` (only run `only`'s, when given), which of its
    /// ranks are to be ended and from when, as the run's health now says
    /// (see [`crate::decisions::stall_abort`]). The actor calls it after
    /// every decision that may change a run's health or its stall's
    /// capture.
    pub(crate) fn order_ends(&mut self, runs: &Runs, only: Option<&RunId>) {
        match only {
            Some(id) => {
                if let Some(group) = self.groups.get_mut(id) {
                    group.order_ends(id, runs);
                }
            }
            None => {
                for (id, group) in self.groups.iter_mut() {
                    group.order_ends(id, runs);
                }
            }
        }
    }

    /// True once after a failure window opened: the actor should sweep
    /// again when it has passed ([`FAILURE_WINDOW_MS`]), and when the
    /// longer window of echoes has ([`ECHO_WINDOW_MS`]).
    pub(crate) fn take_wakeup(&mut self) -> bool {
        std::mem::take(&mut self.wakeup)
    }

    /// Decides the cause of every attempt whose failure window has passed.
    fn decide_due(&mut self, runs: &mut Runs, now_ms: u64, change: &mut Change<Vec<RunId>>) {
        let mono_ms = self.mono_ms;
        for (id, group) in self.groups.iter_mut() {
            let open_for = group.window_from_ms.map(|from| mono_ms.saturating_sub(from));
            // While only echoes are in and some rank has not ended, the
            // death they echo may still be on its way: wait a little longer.
            let window = if group.failures.iter().all(|f| is_echo(&f.end))
                && group.slots.iter().any(|s| s.end == SlotEnd::Running)
            {
                ECHO_WINDOW_MS
            } else {
                FAILURE_WINDOW_MS
            };
            let due = !group.decided
                && !group.failures.is_empty()
                && open_for.is_some_and(|open_for| open_for >= window);
            if !due {
                continue;
            }
            let status = runs.status_of(id).unwrap_or(RunStatus::Running);
            match decide(id, group, status, runs, now_ms) {
                Ok(Outcome::Changed(decided)) => {
                    change.ops.extend(decided.ops);
                    change.events.extend(decided.events);
                }
                Ok(Outcome::Unchanged(())) => {}
                Err(err) => {
                    tracing::error!(run = %id, error = %err, "cannot end a run for its first failure")
                }
            }
        }
    }

    /// Gives every group still assembling a fresh join deadline from
    /// `mono_ms`, and every tracked group a fresh grace: for when the head
    /// was not running, so ranks could not reach it. Returns how many
    /// groups were assembling.
    pub(crate) fn renew_deadlines(&mut self, mono_ms: u64) -> usize {
        for pending in self.pending.values_mut() {
            pending.deadline_from_ms = pending.deadline_from_ms.max(mono_ms);
            pending.heard_mono_ms = pending.heard_mono_ms.max(mono_ms);
        }
        for group in self.groups.values_mut() {
            group.since_ms = group.since_ms.max(mono_ms);
        }
        self.pending.len()
    }

    /// Closes the groups whose ranks did not all join in time, registering
    /// each as ended; forgets the groups of runs that ended or are gone.
    pub(crate) fn sweep(
        &mut self,
        runs: &mut Runs,
        view: &dyn StoredRuns,
        now_ms: u64,
        change: &mut Change<Vec<RunId>>,
    ) {
        self.mono_ms = runs.lease_now(now_ms);
        let mono_ms = self.mono_ms;
        let lease_ms = runs.lease_ms();
        let expired: Vec<(GroupKey, Expiry)> = self
            .pending
            .iter()
            .filter_map(|(key, p)| {
                if mono_ms.saturating_sub(p.deadline_from_ms) >= p.timeout_ms {
                    Some((key.clone(), Expiry::Deadline))
                } else if mono_ms.saturating_sub(p.heard_mono_ms) >= lease_ms {
                    Some((key.clone(), Expiry::Silent(lease_ms)))
                } else {
                    None
                }
            })
            .collect();
        self.decide_due(runs, now_ms, change);
        for (key, expiry) in expired {
            let Some(pending) = self.remove_pending(&key) else { continue };
            let id = pending.run_id.clone();
            match self.close_incomplete(&key, pending, expiry, runs, now_ms) {
                Ok(Outcome::Changed(closed)) => {
                    tracing::warn!(run = %id, key = %key.0, "closed a rendezvous group whose ranks did not all join in time");
                    change.ops.extend(closed.ops);
                    change.events.extend(closed.events);
                }
                Ok(Outcome::Unchanged(())) => {}
                Err(err) => {
                    tracing::error!(run = %id, key = %key.0, error = %err, "cannot close an incomplete rendezvous group")
                }
            }
        }
        self.groups.retain(|id, group| match view.stored(id) {
            Some(record) => !record.status.is_terminal() || record.lost_controller,
            None => mono_ms.saturating_sub(group.since_ms) < UNCOMMITTED_GRACE_MS,
        });
        let groups = &self.groups;
        self.keys.retain(|_, id| groups.contains_key(id));
    }

    /// Ends the run of a group that did not assemble in time: ERRORED if a
    /// rank reported an error, else ABORTED (`SYSTEM_ERROR`, or
    /// `USER_INTERRUPT` if a rank was interrupted), with a detail naming the
    /// ranks that joined and those missing. A new run is registered with no
    /// workers: a partial group is not a worker group.
    fn close_incomplete(
        &mut self,
        key: &GroupKey,
        pending: Pending,
        expiry: Expiry,
        runs: &mut Runs,
        now_ms: u64,
    ) -> Result<Outcome<()>, StateError> {
        let start_ms = pending.start_ms();
        let joined = ranks_text(pending.members.keys().copied());
        let missing =
            ranks_text((0..pending.world_size).filter(|r| !pending.members.contains_key(r)));
        let why = match expiry {
            Expiry::Deadline => format!("within {}", seconds(pending.timeout_ms)),
            Expiry::Silent(lease_ms) => format!(
                "and none of its ranks has been heard from for {} (the lease)",
                seconds(lease_ms)
            ),
        };
        let mut detail = format!(
            "The worker group of rendezvous key {:?} (attempt {}) did not assemble {why}: {} of {} ranks joined ({joined}); missing ranks: {missing}.",
            key.0,
            key.1,
            pending.members.len(),
            pending.world_size,
        );
        let (update, cause) = match pending.final_failure() {
            Some(mut update) => {
                detail.push('\n');
                detail.push_str(&update.detail);
                update.detail = detail;
                let cause = update.cause.clone().expect("a failure has a cause");
                (update, cause)
            }
            None => (
                StatusUpdate::aborted(CauseKind::SystemError, detail.clone()),
                RunCause::new(CauseKind::SystemError, None),
            ),
        };
        let outcome = if pending.existing {
            answered(runs.set_status(&pending.run_id, update.clone(), now_ms)?, ())
        } else {
            let status_detail =
                failure_detail(update.status, update.cause.as_ref(), &update.detail);
            let draft = TrainRunInfoDraft {
                run_status: update.status,
                status_detail,
                cause: Some(cause),
                attempts: vec![RunAttemptDraft::new(key.1.to_string(), start_ms)],
                cluster: self.cluster.clone(),
                ..TrainRunInfoDraft::new(
                    pending.run_id.to_string(),
                    &pending.name,
                    &pending.job_id,
                    controller_of(&key.0),
                    start_ms,
                )
            };
            answered(runs.register(NewRun::try_from(draft)?, now_ms)?, ())
        };
        self.keys.insert(key.0.clone(), pending.run_id.clone());
        let mut group =
            Group::new(key.1.to_string(), Vec::new(), Vec::new(), 0, self.mono_ms, None, now_ms);
        group.decided = true;
        self.groups.insert(pending.run_id, group);
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 1_780_000_000_000;
    const RESET: &str = "Traceback (most recent call last):\n  File \"train.py\", line 30, in <module>\n    dist.all_reduce(p.grad)\nRuntimeError: [/build/gloo/transport/tcp/pair.cc:598] Connection reset by peer [127.0.0.1]:41005";
    const CLOSED: &str = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation to complete\nRuntimeError: [pair.cc:598] Connection closed by peer [127.0.0.1]:5678";
    const NCCL: &str = "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275, remote process exited or there was a network error, NCCL version 2.19.3\nncclRemoteError: A call failed possibly due to a network error or a remote process exiting prematurely.";

    /// How a rank ended, in a test's table.
    #[derive(Clone, Copy)]
    enum How {
        /// Raised an error with this detail.
        Raised(&'static str),
        /// Killed by this signal (`SIGKILL`: ERRORED; `SIGTERM`: ABORTED).
        Killed(&'static str),
        /// Exited with status 1.
        Exited,
        /// Reaped before its watcher could read it.
        Vanished,
        /// `KeyboardInterrupt`.
        KeyboardInterrupt,
    }

    fn failure(rank: u32, at_ms: u64, how: How) -> Failure {
        let end = match how {
            How::Raised(detail) => {
                RankEnd::errored("0", detail).at(at_ms, Some(FailureMode::Raised))
            }
            How::Killed(signal @ ("SIGTERM" | "SIGINT" | "SIGHUP")) => {
                RankEnd::aborted("0", format!("terminated by {signal}"))
                    .at(at_ms, Some(FailureMode::Killed))
            }
            How::Killed(signal) => {
                let mut end = RankEnd::errored("0", format!("killed by {signal}"))
                    .at(at_ms, Some(FailureMode::Killed));
                end.cause = Some(CauseKind::SystemError);
                end
            }
            How::Exited => {
                RankEnd::errored("0", "exited with status 1").at(at_ms, Some(FailureMode::Exited))
            }
            How::Vanished => {
                let mut end = RankEnd::errored("0", "").at(at_ms, Some(FailureMode::Vanished));
                end.cause = Some(CauseKind::SystemError);
                end
            }
            How::KeyboardInterrupt => {
                RankEnd::aborted("0", "KeyboardInterrupt").at(at_ms, Some(FailureMode::Raised))
            }
        };
        Failure { rank, at_ms, end }
    }

    /// A case of a table: what it shows, the world size, the failures in
    /// arrival order (rank, ms after `T`, how), and the cause.
    type Case = (&'static str, usize, &'static [(u32, u64, How)], Option<u32>);

    /// What `cause_of` decides: `Some(rank)` for a rank named, `None` for
    /// a whole job stopped by a signal.
    fn verdict_of(world_size: usize, failures: &[(u32, u64, How)]) -> Option<u32> {
        let failures: Vec<Failure> =
            failures.iter().map(|&(rank, at, how)| failure(rank, T + at, how)).collect();
        match cause_of(&failures, world_size).expect("failures have a cause") {
            Verdict::Rank(f) => Some(f.rank),
            Verdict::AllInterrupted(_) => None,
        }
    }

    #[test]
    fn an_echo_is_never_the_cause_when_a_rank_died_within_the_tie_window() {
        use How::*;
        // (what it shows, world size, failures in arrival order: rank, ms after T, how; the cause)
        let cases: &[Case] = &[
            (
                "a killed rank's watcher dated the death after its peer's reset",
                2,
                &[(0, 753, Raised(RESET)), (1, 760, Killed("SIGKILL"))],
                Some(1),
            ),
            (
                "the same, arriving the other way round",
                2,
                &[(1, 760, Killed("SIGKILL")), (0, 753, Raised(RESET))],
                Some(1),
            ),
            (
                "a death 1.9 s after the echo is still its cause",
                2,
                &[(0, 100, Raised(CLOSED)), (1, 2_000, Killed("SIGKILL"))],
                Some(1),
            ),
            (
                "a death before the echo is its cause",
                2,
                &[(0, 1_500, Raised(RESET)), (1, 100, Exited)],
                Some(1),
            ),
            (
                "a vanished rank excuses the echo",
                2,
                &[(0, 10, Raised(NCCL)), (1, 300, Vanished)],
                Some(1),
            ),
            (
                "an error of its own excuses an echo",
                3,
                &[(0, 10, Raised(RESET)), (2, 50, Raised("ValueError: loss diverged"))],
                Some(2),
            ),
            (
                "a death 2.5 s after a real network error does not excuse it",
                2,
                &[(0, 100, Raised(RESET)), (1, 2_600, Killed("SIGKILL"))],
                Some(0),
            ),
            (
                "every failure an echo: the earliest is named",
                3,
                &[(2, 400, Raised(CLOSED)), (0, 300, Raised(RESET))],
                Some(0),
            ),
            (
                "torchrun's SIGTERM after a network error does not excuse it",
                2,
                &[(0, 100, Raised(RESET)), (1, 400, Killed("SIGTERM"))],
                Some(0),
            ),
            (
                "an interrupt before the echo is its cause",
                3,
                &[(0, 500, Raised(RESET)), (1, 100, KeyboardInterrupt)],
                Some(1),
            ),
            (
                "a death among echoes of several peers",
                4,
                &[
                    (0, 20, Raised(RESET)),
                    (2, 25, Raised(CLOSED)),
                    (3, 30, Raised(RESET)),
                    (1, 90, Killed("SIGKILL")),
                ],
                Some(1),
            ),
            (
                "no echo: the earliest in time, as before",
                3,
                &[(0, 40, Raised("ValueError: x")), (1, 10, Killed("SIGKILL"))],
                Some(1),
            ),
            (
                "a tie in time goes to the first to arrive",
                2,
                &[(1, 10, Killed("SIGSEGV")), (0, 10, Exited)],
                Some(1),
            ),
        ];
        for (what, world_size, failures, cause) in cases {
            assert_eq!(verdict_of(*world_size, failures), *cause, "{what}");
        }
    }

    #[test]
    fn every_rank_interrupted_is_the_whole_job_stopped_and_names_no_rank() {
        use How::*;
        let cases: &[Case] = &[
            (
                "every rank terminated by SIGTERM",
                2,
                &[(0, 5, Killed("SIGTERM")), (1, 3, Killed("SIGTERM"))],
                None,
            ),
            ("a job of one rank: the rank is named", 1, &[(0, 5, Killed("SIGTERM"))], Some(0)),
            (
                "SIGINT, SIGHUP and KeyboardInterrupt",
                3,
                &[(0, 5, Killed("SIGINT")), (1, 9, Killed("SIGHUP")), (2, 7, KeyboardInterrupt)],
                None,
            ),
            (
                "a peer's echo after the signal does not make it a failure",
                3,
                &[(0, 5, Killed("SIGTERM")), (1, 30, Raised(RESET)), (2, 7, Killed("SIGTERM"))],
                None,
            ),
            (
                "a rank that has not ended: the first interrupt is named",
                3,
                &[(0, 5, Killed("SIGTERM")), (1, 3, Killed("SIGTERM"))],
                Some(1),
            ),
            (
                "torchrun's SIGTERM to the survivors of a real failure",
                3,
                &[
                    (1, 10, Killed("SIGKILL")),
                    (0, 300, Killed("SIGTERM")),
                    (2, 310, Killed("SIGTERM")),
                ],
                Some(1),
            ),
            (
                "a rank that raised before the signal is the cause",
                2,
                &[(0, 10, Raised("ValueError: x")), (1, 300, Killed("SIGTERM"))],
                Some(0),
            ),
            (
                "an echo long before the signal is not part of the stop",
                2,
                &[(0, 10, Raised(RESET)), (1, 5_000, Killed("SIGTERM"))],
                Some(0),
            ),
        ];
        for (what, world_size, failures, cause) in cases {
            assert_eq!(verdict_of(*world_size, failures), *cause, "{what}");
        }
    }

    #[test]
    fn the_detail_of_a_stopped_job_and_of_an_excused_echo_say_what_happened() {
        let all = vec![
            failure(0, T + 5, How::Killed("SIGTERM")),
            failure(1, T + 3, How::Killed("SIGTERM")),
        ];
        let update = failure_update(cause_of(&all, 2).unwrap(), &all, |_| None);
        let cause = update.cause.unwrap();
        assert_eq!(
            (update.status, cause.kind, cause.failed_world_rank),
            (RunStatus::Aborted, CauseKind::UserInterrupt, None)
        );
        assert!(
            update.detail.starts_with("All 2 ranks were stopped by a signal to the whole job"),
            "{}",
            update.detail
        );
        assert!(
            update.detail.contains(
                "\n- rank 1 (+0 s): terminated by SIGTERM\n- rank 0 (+0.0 s): terminated by SIGTERM"
            ),
            "{}",
            update.detail
        );

        let all = vec![
            failure(0, T + 753, How::Raised(RESET)),
            failure(1, T + 1_000, How::Killed("SIGKILL")),
        ];
        let update = failure_update(cause_of(&all, 2).unwrap(), &all, |_| None);
        let cause = update.cause.clone().unwrap();
        assert_eq!((cause.failed_world_rank, cause.how), (Some(1), Some(FailureMode::Killed)));
        // The cause's report is the killed rank's alone: not the echo after it.
        let report = cause.report.expect("a judged cause has a report");
        assert!(report.starts_with("Rank 1 died without reporting: killed by SIGKILL"), "{report}");
        assert!(!report.contains("RuntimeError"), "{report}");
        assert!(
            update.detail.starts_with("Rank 1 died without reporting: killed by SIGKILL"),
            "{}",
            update.detail
        );
        assert!(
            update.detail.contains(&format!("{NOT_THE_CAUSE}\n- rank 0 0.2 s earlier: ERRORED (RAISED) (a peer was gone) RuntimeError:")),
            "{}",
            update.detail
        );
    }

    #[test]
    fn a_whole_job_stopped_keeps_the_kind_its_ranks_agree_on() {
        use trainstate_schema::CauseClass;
        let stopped = |rank: u32, at: u64, kind: CauseKind| {
            let mut f = failure(rank, T + at, How::Killed("SIGTERM"));
            f.end.cause = Some(kind);
            f
        };
        let cases: &[(&str, Vec<Failure>, CauseKind)] = &[
            (
                "every rank says the job's time ran out",
                vec![stopped(0, 5, CauseKind::Timeout), stopped(1, 3, CauseKind::Timeout)],
                CauseKind::Timeout,
            ),
            (
                "every rank says it was preempted, a peer's echo aside",
                vec![
                    stopped(0, 5, CauseKind::Preempted),
                    failure(1, T + 30, How::Raised(RESET)),
                    stopped(2, 7, CauseKind::Preempted),
                ],
                CauseKind::Preempted,
            ),
            (
                "ranks that disagree are a person's interrupt",
                vec![stopped(0, 5, CauseKind::Timeout), stopped(1, 3, CauseKind::UserInterrupt)],
                CauseKind::UserInterrupt,
            ),
            (
                "ranks that say nothing more are a person's interrupt",
                vec![
                    failure(0, T + 5, How::Killed("SIGTERM")),
                    failure(1, T + 3, How::Killed("SIGTERM")),
                ],
                CauseKind::UserInterrupt,
            ),
        ];
        for (what, all, kind) in cases {
            let update = failure_update(cause_of(all, all.len()).unwrap(), all, |_| None);
            let cause = update.cause.unwrap();
            assert_eq!(
                (update.status, cause.kind, cause.class, cause.failed_world_rank),
                (RunStatus::Aborted, *kind, CauseClass::Interrupted, None),
                "{what}"
            );
            assert!(
                update.detail.starts_with("All ") && update.detail.contains("How each rank ended:"),
                "{what}: {}",
                update.detail
            );
        }
        let all = vec![stopped(0, 5, CauseKind::Timeout), stopped(1, 3, CauseKind::Timeout)];
        let update = failure_update(cause_of(&all, 2).unwrap(), &all, |_| None);
        assert!(update.detail.contains("The job's time limit ran out."), "{}", update.detail);
    }

    #[test]
    fn a_chained_tracebacks_report_ends_with_the_last_exception_raised() {
        const CHAINED: &str = "Traceback (most recent call last):\nKeyError: 'x'\n\n\
            During handling of the above exception, another exception occurred:\n\n\
            Traceback (most recent call last):\nValueError: bad batch";
        let all =
            vec![failure(1, T, How::Raised(CHAINED)), failure(0, T + 300, How::Raised(RESET))];
        let update = failure_update(cause_of(&all, 2).unwrap(), &all, |_| None);
        let report = update.cause.and_then(|cause| cause.report).expect("a report");
        assert_eq!(report, "Rank 1 worker raised an error. … ValueError: bad batch");
    }

    #[test]
    fn the_echo_list_is_matched_without_regard_to_case_at_the_end_of_the_error() {
        for message in ECHO_MESSAGES {
            let end = RankEnd::errored("0", format!("RuntimeError: {}", message.to_uppercase()));
            assert!(is_echo(&end), "{message}");
        }
        assert!(!is_echo(&RankEnd::errored("0", "ValueError: loss diverged")));
        let mut killed = RankEnd::errored("0", "Connection reset by peer");
        killed.how = Some(FailureMode::Killed);
        assert!(!is_echo(&killed), "only an error a rank raised is an echo");
    }

    #[test]
    fn a_rank_that_raised_a_device_fault_failed_of_hardware_and_its_class_is_the_machines() {
        use trainstate_schema::CauseClass;
        for message in HARDWARE_MESSAGES {
            let detail = format!("Traceback:\nRuntimeError: CUDA error: {message}");
            let end = RankEnd::errored("0", detail).at(T, Some(FailureMode::Raised));
            let all = vec![Failure { rank: 1, at_ms: T, end }];
            let cause = failure_update(cause_of(&all, 2).unwrap(), &all, |_| None).cause.unwrap();
            assert_eq!(
                (cause.kind, cause.class, cause.failed_world_rank),
                (CauseKind::Hardware, CauseClass::Infrastructure, Some(1)),
                "{message}"
            );
        }
        let all = vec![failure(1, T, How::Raised("ValueError: loss diverged"))];
        let cause = failure_update(cause_of(&all, 2).unwrap(), &all, |_| None).cause.unwrap();
        assert_eq!((cause.kind, cause.class), (CauseKind::UserError, CauseClass::Application));
    }
}
