//! The rendezvous: the protocol for launches that have no controller.
//!
//! Launchers like torchrun and Slurm start every rank on its own; no
//! process knows the whole worker group. Each rank joins the rendezvous
//! with its own worker info and the world size, under a key that every
//! rank of the launch shares. The state actor assembles the group when all
//! ranks have joined and registers the run (or, for a relaunch of a live
//! run, a new attempt of it). Each rank then heartbeats and reports its own
//! end; the run finishes when every rank has finished, and errors or aborts
//! at the first rank that did (unless the launcher restarts the workers).
//!
//! ```no_run
//! # async fn example(state: trainstate_client::StateHandle, worker: trainstate_schema::TrainWorkerInfo) -> Result<(), trainstate_client::StateError> {
//! use trainstate_client::{Join, RankEnd};
//!
//! let joined = state.join_rendezvous(Join::new("slurm:4242.0", 2, worker, "pretrain", "4242")?).await?;
//! let rank = 0;
//! state.heartbeat_rank(joined.run_id.clone(), rank, joined.attempt_id.clone()).await?;
//! state.end_rank(joined.run_id, rank, RankEnd::finished(joined.attempt_id)).await?;
//! # Ok(()) }
//! ```
//!
//! The rules (deadlines, restarts of the head, relaunches) are written down
//! in `docs/rendezvous.md`.

use std::time::Duration;

use trainstate_schema::api::{
    DEFAULT_JOIN_TIMEOUT_MS, JoinRequest, MAX_JOIN_TIMEOUT_MS, RENDEZVOUS_KEY_PATTERN,
    RankEndRequest, RankProgress, RendezvousResponse, StallAction, is_rendezvous_key,
};
use trainstate_schema::limits::{
    MAX_STALL_WINDOW_MS, MAX_STATUS_DETAIL_LEN, MAX_WORKERS, MIN_STALL_WINDOW_MS,
};
use trainstate_schema::{
    CauseKind, FailureMode, RunId, RunStatus, TrainWorkerInfo, validate_name, validate_time,
};

use crate::error::{Reply, StateError};

/// The longest grace a run may ask for between its stall and the end of
/// its ranks under `on_stall: ABORT` (`abort_after_ms`): 7 days, in ms.
pub const MAX_ABORT_AFTER_MS: u64 = 604_800_000;

/// One rank joining the rendezvous, checked: see [`StateHandle::join_rendezvous`](crate::StateHandle::join_rendezvous).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Join {
    /// The key every rank of the launch shares ([`RENDEZVOUS_KEY_PATTERN`]).
    pub key: String,
    /// How many ranks the group has.
    pub world_size: u32,
    /// Which launch of the key this is: 0, then the launcher's restart count.
    pub attempt: u32,
    /// This rank; its world rank is below `world_size`.
    pub worker: TrainWorkerInfo,
    /// The run's name (world rank 0's is kept).
    pub name: String,
    /// The run's job id (world rank 0's is kept).
    pub job_id: String,
    /// How long the group waits for missing ranks, from its first join.
    pub join_timeout: Duration,
    /// The run id an earlier answer gave, when joining again after the head
    /// forgot the group.
    pub run_id: Option<RunId>,
    /// When the rank's process started (Unix ms), if the rank said.
    pub process_start_ms: Option<u64>,
    /// The run's stall window, if the rank asks for one (1 s to 7 days).
    pub stall_after_ms: Option<u64>,
    /// What the head does when the run stalls, if the rank says.
    pub on_stall: Option<StallAction>,
    /// Under `on_stall: ABORT`, how long after the stall its ranks are
    /// ended (ms), if the rank says (0 to 7 days).
    pub abort_after_ms: Option<u64>,
}

impl Join {
    /// A join of `worker` into the group of `key`, attempt 0, with the
    /// default join timeout. Checks every rule.
    pub fn new(
        key: impl Into<String>,
        world_size: u32,
        worker: TrainWorkerInfo,
        name: impl Into<String>,
        job_id: impl Into<String>,
    ) -> Result<Self, StateError> {
        let join = Self {
            key: key.into(),
            world_size,
            attempt: 0,
            worker,
            name: name.into(),
            job_id: job_id.into(),
            join_timeout: Duration::from_millis(DEFAULT_JOIN_TIMEOUT_MS),
            run_id: None,
            process_start_ms: None,
            stall_after_ms: None,
            on_stall: None,
            abort_after_ms: None,
        };
        join.check()?;
        Ok(join)
    }

    /// The same join, asking for a stall window of `stall_after_ms` for the
    /// run (1 s to 7 days); the first join that asks sets it.
    pub fn with_stall_after(mut self, stall_after_ms: u64) -> Result<Self, StateError> {
        self.stall_after_ms = Some(stall_after_ms);
        self.check()?;
        Ok(self)
    }

    /// The same join, asking the head to do `action` when the run stalls
    /// and, for `ABORT`, to end its ranks `abort_after_ms` after the stall
    /// (0 to 7 days; `DEFAULT_ABORT_AFTER_MS` when `None`); the first join
    /// that asks sets it.
    pub fn with_on_stall(
        mut self,
        action: StallAction,
        abort_after_ms: Option<u64>,
    ) -> Result<Self, StateError> {
        self.on_stall = Some(action);
        self.abort_after_ms = abort_after_ms;
        self.check()?;
        Ok(self)
    }

    /// The same join, for attempt `attempt` (the launcher's restart count).
    pub fn with_attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// The same join, waiting `timeout` for missing ranks (1 ms to a day).
    pub fn with_join_timeout(mut self, timeout: Duration) -> Result<Self, StateError> {
        self.join_timeout = timeout;
        self.check()?;
        Ok(self)
    }

    /// The same join, saying when the rank's process started (Unix ms).
    pub fn with_process_start(mut self, process_start_ms: u64) -> Result<Self, StateError> {
        self.process_start_ms = Some(process_start_ms);
        self.check()?;
        Ok(self)
    }

    /// The same join, asking to keep `run_id` if the head forgot the group.
    pub fn with_run_id(mut self, run_id: RunId) -> Self {
        self.run_id = Some(run_id);
        self
    }

    /// A join read from the HTTP API: `key` from the path, the rest from
    /// the body. A broken rule names its field (`worker.pid`).
    pub fn from_request(key: &str, request: JoinRequest) -> Result<Self, StateError> {
        let worker = request.worker.validate().map_err(|err| {
            StateError::invalid(format!("worker.{}", err.field()), err.rule().to_string())
        })?;
        let timeout_ms = request.join_timeout_ms.unwrap_or(DEFAULT_JOIN_TIMEOUT_MS);
        if !(1..=MAX_JOIN_TIMEOUT_MS).contains(&timeout_ms) {
            return Err(StateError::invalid(
                "join_timeout_ms",
                format!("must be 1 to {MAX_JOIN_TIMEOUT_MS} (one day)"),
            ));
        }
        let join = Self {
            key: key.to_owned(),
            world_size: request.world_size,
            attempt: request.attempt,
            worker,
            name: request.name,
            job_id: request.job_id,
            join_timeout: Duration::from_millis(timeout_ms),
            run_id: request.run_id,
            process_start_ms: request.process_start_ms,
            stall_after_ms: request.stall_after_ms,
            on_stall: request.on_stall,
            abort_after_ms: request.abort_after_ms,
        };
        join.check()?;
        Ok(join)
    }

    /// The body of the join over HTTP.
    pub fn to_request(&self) -> JoinRequest {
        let mut request = JoinRequest::new(
            self.world_size,
            self.worker.clone().into_draft(),
            self.name.clone(),
            self.job_id.clone(),
        );
        request.attempt = self.attempt;
        request.join_timeout_ms = Some(self.join_timeout.as_millis() as u64);
        request.run_id = self.run_id.clone();
        request.process_start_ms = self.process_start_ms;
        request.stall_after_ms = self.stall_after_ms;
        request.on_stall = self.on_stall;
        request.abort_after_ms = self.abort_after_ms;
        request
    }

    fn check(&self) -> Result<(), StateError> {
        if !is_rendezvous_key(&self.key) {
            return Err(StateError::invalid("key", format!("must match {RENDEZVOUS_KEY_PATTERN}")));
        }
        if self.world_size == 0 || self.world_size as usize > MAX_WORKERS {
            return Err(StateError::invalid("world_size", format!("must be 1 to {MAX_WORKERS}")));
        }
        if self.worker.world_rank() >= self.world_size {
            return Err(StateError::invalid(
                "worker.world_rank",
                format!("must be below world_size ({})", self.world_size),
            ));
        }
        validate_name("name", &self.name)?;
        validate_name("job_id", &self.job_id)?;
        let timeout_ms = self.join_timeout.as_millis();
        if timeout_ms == 0 || timeout_ms > u128::from(MAX_JOIN_TIMEOUT_MS) {
            return Err(StateError::invalid(
                "join_timeout_ms",
                format!("must be 1 to {MAX_JOIN_TIMEOUT_MS} (one day)"),
            ));
        }
        if let Some(start) = self.process_start_ms {
            validate_time("process_start_ms", start)?;
        }
        if let Some(window) = self.stall_after_ms
            && !(MIN_STALL_WINDOW_MS..=MAX_STALL_WINDOW_MS).contains(&window)
        {
            return Err(StateError::invalid(
                "stall_after_ms",
                format!("must be {MIN_STALL_WINDOW_MS} to {MAX_STALL_WINDOW_MS} (1 s to 7 days)"),
            ));
        }
        if let Some(grace) = self.abort_after_ms
            && grace > MAX_ABORT_AFTER_MS
        {
            return Err(StateError::invalid(
                "abort_after_ms",
                format!("must be 0 to {MAX_ABORT_AFTER_MS} (7 days)"),
            ));
        }
        Ok(())
    }
}

/// How one rank ended: see [`StateHandle::end_rank`](crate::StateHandle::end_rank).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RankEnd {
    /// The attempt the rank belongs to.
    pub attempt_id: String,
    /// `FINISHED`, `ERRORED` or `ABORTED`.
    pub status: RunStatus,
    /// For `ERRORED`, the error and its traceback.
    pub detail: String,
    /// The cause of an `ERRORED` or `ABORTED` end.
    pub cause: Option<CauseKind>,
    /// How many more times the launcher restarts the workers; above 0, a
    /// failure does not end the run.
    pub restarts_remaining: u32,
    /// When the rank ended (Unix ms, by its machine's clock), if it said.
    pub ended_at_ms: Option<u64>,
    /// How a failed rank is known to have failed, if it said.
    pub how: Option<FailureMode>,
}

impl RankEnd {
    /// The rank ended cleanly.
    pub fn finished(attempt_id: impl Into<String>) -> Self {
        Self {
            attempt_id: attempt_id.into(),
            status: RunStatus::Finished,
            detail: String::new(),
            cause: None,
            restarts_remaining: 0,
            ended_at_ms: None,
            how: None,
        }
    }

    /// The rank raised an error; `trace` is the error and its traceback.
    pub fn errored(attempt_id: impl Into<String>, trace: impl Into<String>) -> Self {
        Self {
            status: RunStatus::Errored,
            detail: trace.into(),
            cause: Some(CauseKind::UserError),
            ..Self::finished(attempt_id)
        }
    }

    /// The rank was interrupted (SIGTERM, SIGINT).
    pub fn aborted(attempt_id: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            status: RunStatus::Aborted,
            detail: detail.into(),
            cause: Some(CauseKind::UserInterrupt),
            ..Self::finished(attempt_id)
        }
    }

    /// The same end, at `ended_at_ms` (Unix ms) and, for a failure, known
    /// to have happened `how`.
    pub fn at(mut self, ended_at_ms: u64, how: Option<FailureMode>) -> Self {
        self.ended_at_ms = Some(ended_at_ms);
        self.how = how;
        self
    }

    /// How this end's rank failed, for a failure: `RAISED` unless it says.
    pub fn failure_mode(&self) -> Option<FailureMode> {
        match self.status {
            RunStatus::Finished => None,
            _ => Some(self.how.unwrap_or(FailureMode::Raised)),
        }
    }

    /// The same end, with `n` restarts of the launcher to come.
    pub fn with_restarts_remaining(mut self, n: u32) -> Self {
        self.restarts_remaining = n;
        self
    }

    /// The cause the run gets if this end ends it.
    pub fn cause_kind(&self) -> Option<CauseKind> {
        match self.status {
            RunStatus::Errored => Some(self.cause.unwrap_or(CauseKind::UserError)),
            RunStatus::Aborted => Some(self.cause.unwrap_or(CauseKind::UserInterrupt)),
            _ => None,
        }
    }
}

impl TryFrom<RankEndRequest> for RankEnd {
    type Error = StateError;

    fn try_from(request: RankEndRequest) -> Result<Self, StateError> {
        if request.status == RunStatus::Running {
            return Err(StateError::invalid("status", "must be FINISHED, ERRORED or ABORTED"));
        }
        if request.status == RunStatus::Finished && request.cause.is_some() {
            return Err(StateError::invalid("cause", "only an ERRORED or ABORTED end has a cause"));
        }
        if request.detail.chars().count() > MAX_STATUS_DETAIL_LEN {
            return Err(StateError::invalid(
                "detail",
                format!("must be at most {MAX_STATUS_DETAIL_LEN} characters"),
            ));
        }
        validate_name("attempt_id", &request.attempt_id)?;
        if let Some(at) = request.ended_at_ms {
            validate_time("ended_at_ms", at)?;
        }
        Ok(Self {
            attempt_id: request.attempt_id,
            status: request.status,
            detail: request.detail,
            cause: request.cause,
            restarts_remaining: request.restarts_remaining,
            ended_at_ms: request.ended_at_ms,
            how: request.how.filter(|_| request.status != RunStatus::Finished),
        })
    }
}

impl From<RankEnd> for RankEndRequest {
    fn from(end: RankEnd) -> Self {
        let mut request = RankEndRequest::new(end.attempt_id, end.status);
        request.detail = end.detail;
        request.cause = end.cause;
        request.restarts_remaining = end.restarts_remaining;
        request.ended_at_ms = end.ended_at_ms;
        request.how = end.how;
        request
    }
}

/// A request to the rendezvous of the state actor: the one
/// `StateMessage::Rendezvous` carries.
///
/// Exhaustive on purpose, like `StateMessage`: the actor matches every
/// variant.
#[derive(Debug)]
pub enum RendezvousMessage {
    /// One rank joins its group.
    Join {
        /// The join.
        join: Box<Join>,
        /// The client address the join came from, as the head saw it (an
        /// IPv4 address, or an IPv6 /64), or `None` for a join made in the
        /// head's process: no client's joins keep another's groups out.
        client: Option<String>,
        /// Where the group stands.
        reply: Reply<RendezvousResponse>,
    },
    /// One rank is alive.
    Heartbeat {
        /// The run.
        id: RunId,
        /// The rank's world rank.
        rank: u32,
        /// The rank's attempt.
        attempt_id: String,
        /// The rank's progress, checked, if the heartbeat carries it.
        progress: Option<Box<RankProgress>>,
        /// Where the group stands.
        reply: Reply<RendezvousResponse>,
    },
    /// One rank ended.
    End {
        /// The run.
        id: RunId,
        /// The rank's world rank.
        rank: u32,
        /// How it ended.
        end: RankEnd,
        /// Where the group stands.
        reply: Reply<RendezvousResponse>,
    },
}
