//! The documents of the rendezvous: how the ranks of a launch that has no
//! controller (torchrun, Slurm, a plain process) report one run together.
//!
//! Every rank joins the rendezvous by a key that all ranks of one launch
//! share ([`JoinRequest`]); the head assembles the worker group once all
//! `world_size` ranks have joined and registers the run, or a new attempt of
//! it for a relaunch. Each rank then heartbeats ([`RankHeartbeatRequest`])
//! and reports its own end ([`RankEndRequest`]); every answer is a
//! [`RendezvousResponse`].

use serde::{Deserialize, Serialize};

use crate::{CauseKind, FailureMode, RunId, RunStatus, TrainWorkerInfoDraft};

/// The pattern of a rendezvous key: 1 to 256 of `A-Z a-z 0-9 . _ : -`, safe
/// in a URL path.
pub const RENDEZVOUS_KEY_PATTERN: &str = "^[A-Za-z0-9._:-]{1,256}$";

/// The longest rendezvous key.
pub const MAX_RENDEZVOUS_KEY_LEN: usize = 256;

/// How long a group waits for its missing ranks when the first rank to join
/// does not say: 5 minutes.
pub const DEFAULT_JOIN_TIMEOUT_MS: u64 = 300_000;

/// The longest a group may wait for its missing ranks: one day.
pub const MAX_JOIN_TIMEOUT_MS: u64 = 86_400_000;

/// True when `key` matches [`RENDEZVOUS_KEY_PATTERN`].
///
/// ```
/// use trainstate_schema::api::is_rendezvous_key;
///
/// assert!(is_rendezvous_key("torchrun:4f1c2a.0"));
/// assert!(!is_rendezvous_key("a/b"));
/// assert!(!is_rendezvous_key(""));
/// ```
pub fn is_rendezvous_key(key: &str) -> bool {
    !key.is_empty()
        && key.len() <= MAX_RENDEZVOUS_KEY_LEN
        && key.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

/// Body of `POST /api/train/rendezvous/{key}/join`: one rank of a launch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct JoinRequest {
    /// How many ranks the group has (torchrun's `WORLD_SIZE`, Slurm's
    /// `SLURM_NTASKS`); every rank of a group must say the same. 1 to 65,536.
    #[cfg_attr(feature = "schemars", schemars(range(min = 1, max = 65536)))]
    pub world_size: u32,
    /// Which launch of the key this is: 0 for the first, then the launcher's
    /// restart count (`TORCHELASTIC_RESTART_COUNT`, `SLURM_RESTART_COUNT`).
    /// A later attempt of a live run becomes a new attempt of that run, with
    /// this number as its `attempt_id`.
    #[serde(default)]
    pub attempt: u32,
    /// This rank: its `world_rank` is the rank, below `world_size`.
    #[serde(deserialize_with = "crate::object::one")]
    pub worker: TrainWorkerInfoDraft,
    /// The run's name (world rank 0's is kept).
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 1024)))]
    pub name: String,
    /// The run's job id (world rank 0's is kept).
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 1024)))]
    pub job_id: String,
    /// How long, from the first join, the group waits for its missing
    /// ranks before the head gives up on it (the first rank's value
    /// counts); 5 minutes when absent. 1 ms to one day.
    #[serde(default)]
    #[cfg_attr(feature = "schemars", schemars(range(min = 1, max = 86_400_000_u64)))]
    pub join_timeout_ms: Option<u64>,
    /// The run id an earlier answer gave this rank, when it joins again
    /// because the head forgot the group (a head restart): the group keeps
    /// that id if no other run has it.
    #[serde(default)]
    pub run_id: Option<RunId>,
    /// When this rank's process started (Unix ms, by its machine's clock):
    /// the run, and each attempt, starts at the earliest of its ranks', not
    /// at the first join (which is late when the head was down). The time
    /// of the first join when absent. Between 946684800000 (2000-01-01) and
    /// 7258118400000 (2200-01-01): a time in seconds or nanoseconds is
    /// refused (422).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_start_ms: Option<u64>,
    /// The run's stall window, in ms: the run is STALLED when none of its
    /// ranks advanced for this long (see the heartbeat's `progress`).
    /// Overrides the window the run's pace would give it (10 times its
    /// slowest recent step, between a minute and the head's
    /// `--stall-after`); the first join that carries one sets it for the
    /// run. 1000 (1 s) to 604800000 (7 days).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(range(min = 1000, max = 604_800_000_u64)))]
    pub stall_after_ms: Option<u64>,
    /// What the head does when the run stalls: `DETECT` (the default) or
    /// `ABORT`, which also ends the ranks the stall names `abort_after_ms`
    /// after it, so that the launcher restarts the job from its
    /// checkpoint. The first join that carries one sets it for the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_stall: Option<crate::api::StallAction>,
    /// With `on_stall: ABORT`, how long after the stall its ranks are ended
    /// (ms); 60000 (`DEFAULT_ABORT_AFTER_MS`) when absent. 0 to 604800000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(range(max = 604_800_000_u64)))]
    pub abort_after_ms: Option<u64>,
}

impl JoinRequest {
    /// A join of `worker` into a group of `world_size`, attempt 0.
    pub fn new(
        world_size: u32,
        worker: TrainWorkerInfoDraft,
        name: impl Into<String>,
        job_id: impl Into<String>,
    ) -> Self {
        Self {
            world_size,
            attempt: 0,
            worker,
            name: name.into(),
            job_id: job_id.into(),
            join_timeout_ms: None,
            run_id: None,
            process_start_ms: None,
            stall_after_ms: None,
            on_stall: None,
            abort_after_ms: None,
        }
    }
}

/// Body of `POST /api/train/runs/{id}/ranks/{rank}/heartbeat`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct RankHeartbeatRequest {
    /// The attempt the rank belongs to, as the join answered it.
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 1024)))]
    pub attempt_id: String,
    /// The rank's progress: its step, phase and latest metrics. A bad
    /// report is refused (422 naming the field) and nothing is recorded.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::object::option"
    )]
    pub progress: Option<crate::api::RankProgress>,
}

impl RankHeartbeatRequest {
    /// A heartbeat of a rank of `attempt_id`.
    pub fn new(attempt_id: impl Into<String>) -> Self {
        Self { attempt_id: attempt_id.into(), progress: None }
    }

    /// The same heartbeat, carrying `progress`.
    pub fn with_progress(mut self, progress: crate::api::RankProgress) -> Self {
        self.progress = Some(progress);
        self
    }
}

/// Body of `POST /api/train/runs/{id}/ranks/{rank}/end`: how one rank ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct RankEndRequest {
    /// The attempt the rank belongs to, as the join answered it.
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 1024)))]
    pub attempt_id: String,
    /// `FINISHED` (the rank ended cleanly), `ERRORED` (it raised) or
    /// `ABORTED` (it was interrupted). The run finishes when every rank of
    /// its current attempt has finished; it errors or aborts at the first
    /// rank that did, unless the launcher restarts the workers.
    pub status: RunStatus,
    /// For `ERRORED`, the error and its traceback; else a few words.
    #[serde(default)]
    #[cfg_attr(feature = "schemars", schemars(length(max = 50100)))]
    pub detail: String,
    /// The cause: `USER_ERROR` for `ERRORED` and `USER_INTERRUPT` for
    /// `ABORTED` when absent.
    #[serde(default)]
    pub cause: Option<CauseKind>,
    /// How many more times the launcher restarts the workers after this
    /// failure (`TORCHELASTIC_MAX_RESTARTS` less the restart count). Above
    /// 0, a failure does not end the run: its next attempt joins.
    #[serde(default)]
    pub restarts_remaining: u32,
    /// When the rank ended (Unix ms, by its machine's clock): the head names
    /// the rank that failed first in time as the run's cause, whatever order
    /// the ends arrive in. The time the head received the end when absent.
    /// Between 946684800000 (2000-01-01) and 7258118400000 (2200-01-01).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at_ms: Option<u64>,
    /// How a failed rank is known to have failed: `RAISED` when the rank
    /// reports its own error, else `EXITED`, `KILLED` or `VANISHED` when the
    /// rank's watcher reports a process that died without reporting (its
    /// `detail` then says how: `killed by SIGKILL`, `exited with status 3`).
    /// `RAISED` for a failure when absent; ignored for `FINISHED`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub how: Option<FailureMode>,
}

impl RankEndRequest {
    /// A rank's end with `status`, no detail, no restart to come.
    pub fn new(attempt_id: impl Into<String>, status: RunStatus) -> Self {
        Self {
            attempt_id: attempt_id.into(),
            status,
            detail: String::new(),
            cause: None,
            restarts_remaining: 0,
            ended_at_ms: None,
            how: None,
        }
    }
}

/// The answer of every rendezvous route: where the rank's group stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct RendezvousResponse {
    /// The run the group reports, assigned at the first join.
    pub run_id: RunId,
    /// The group's attempt of the run.
    pub attempt_id: String,
    /// How many ranks the group has.
    pub world_size: u32,
    /// How many ranks have joined (`world_size` once the group is complete).
    pub joined: u32,
    /// How many ranks of the group have reported their end.
    pub ranks_ended: u32,
    /// The run's status; null while the group waits for ranks and the run
    /// is not registered yet.
    pub run_status: Option<RunStatus>,
    /// The run's lease, in milliseconds: heartbeat well within it.
    pub lease_ms: u64,
    /// A warning for the rank, when there is one: its node is a suspect of
    /// the node ledger (`GET /api/train/nodes/{node}`). The join succeeded
    /// all the same. Absent when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// A capture of the rank's stacks the head asks for (the run stalled,
    /// or someone asked): the rank's watcher captures them and posts them
    /// to `POST /api/train/runs/{id}/stacks` with this `capture_id`.
    /// Absent when none is asked of this rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<crate::api::CaptureOrder>,
    /// Present when the head asks the rank's watcher to end its rank (the
    /// run stalled under `on_stall: ABORT`): the words the watcher reports
    /// as the rank's end (`cause: NO_PROGRESS`), naming the stall and its
    /// capture.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_rank: Option<String>,
}

impl RendezvousResponse {
    /// An answer for the group of `attempt_id` of run `run_id`.
    pub fn new(
        run_id: RunId,
        attempt_id: impl Into<String>,
        world_size: u32,
        joined: u32,
        ranks_ended: u32,
        run_status: Option<RunStatus>,
        lease_ms: u64,
    ) -> Self {
        Self {
            run_id,
            attempt_id: attempt_id.into(),
            world_size,
            joined,
            ranks_ended,
            run_status,
            lease_ms,
            warning: None,
            capture: None,
            end_rank: None,
        }
    }

    /// The same answer, carrying `warning`.
    pub fn with_warning(mut self, warning: Option<String>) -> Self {
        self.warning = warning;
        self
    }
}
