//! [`NewRun`]: a registration, normalised once.

use super::{RunAttempt, TrainRunInfo};
use crate::draft::TrainRunInfoDraft;
use crate::error::{Rule, ValidationError};
use crate::status::{AttemptStatus, RunStatus};

/// A run on its way to being registered: what the state actor accepts as
/// it is, normalised once.
///
/// Registering keeps a little more than the caller sends, and less:
///
/// - the run's first attempt is recorded, with id
///   [`NewRun::FIRST_ATTEMPT_ID`] and the run's start, unless the run lists
///   its attempts;
/// - the heartbeat time is dropped (the state actor keeps it in memory);
/// - the run heartbeats: a registration's `"heartbeats": false` is ignored,
///   since no client may opt out of its lease (only a run Ray Train V2
///   writes, [`NewRun::from_ray`], is ended by its reporter instead);
/// - a run registered as ended gets an end time if it has none (the time of
///   the registration, never before the run's start), and its current
///   attempt ends with it.
///
/// `NewRun` applies these to a run that is already valid, without checking
/// it again: each step keeps every rule. So a registration read from a
/// draft is validated exactly once ([`NewRun::try_from`]). Only the end
/// time of a run registered as ended without one needs the time of the
/// registration, which the state actor's clock gives: [`NewRun::into_run`]
/// takes it.
///
/// ```
/// use trainstate_schema::{NewRun, RunStatus, TrainRunInfoDraft};
///
/// let start = 1_760_000_000_000;
/// let draft = TrainRunInfoDraft {
///     run_status: RunStatus::Finished,
///     ..TrainRunInfoDraft::new("0192f0c5a4e27c3db1c1a2b3c4d5e6f7", "pretrain", "01000000", "c0ffee", start)
/// };
/// let registration = NewRun::try_from(draft).unwrap(); // validates once
/// let stored = registration.into_run(start + 60_000); // the actor's "now"
/// assert_eq!(stored.end_time_ms(), Some(start + 60_000));
/// let first = &stored.attempts()[0];
/// assert_eq!(first.attempt_id(), NewRun::FIRST_ATTEMPT_ID);
/// assert_eq!((first.start_time_ms(), first.end_time_ms()), (start, Some(start + 60_000)));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    run: TrainRunInfo,
}

impl NewRun {
    /// The id given to a run's first attempt when its registration lists no
    /// attempts.
    pub const FIRST_ATTEMPT_ID: &'static str = "0";

    /// Normalises a valid run for registration: records its first attempt
    /// if it lists none, and drops its heartbeat time.
    pub fn new(mut run: TrainRunInfo) -> Self {
        run.last_heartbeat_ms = None;
        run.heartbeats = true;
        // The head decides a run's health; a registration's is ignored.
        run.health = None;
        run.health_history = Vec::new();
        run.goodput = None;
        if run.attempts.is_empty() {
            // One attempt, a valid id, starting with the run, no workers of
            // its own, not ended: valid for any valid run.
            run.attempts.push(RunAttempt {
                attempt_id: Self::FIRST_ATTEMPT_ID.to_owned(),
                status: if run.status.is_terminal() || run.status == RunStatus::Running {
                    AttemptStatus::Running
                } else {
                    AttemptStatus::Pending
                },
                status_detail: String::new(),
                cause: None,
                start_time_ms: run.start_time_ms,
                end_time_ms: None,
                workers: None,
                dropped_workers: None,
            });
        }
        Self { run }
    }

    /// The same registration on cluster `name` (the head's `--cluster`),
    /// which replaces any cluster the caller named: a run belongs to the
    /// cluster of the head it is registered with. `name` follows the rule of
    /// [`validate_name`](crate::validate_name).
    pub fn in_cluster(mut self, name: &str) -> Result<Self, ValidationError> {
        crate::validate::name(|| "cluster".into(), name)?;
        self.run.cluster = Some(name.to_owned());
        Ok(self)
    }

    /// The run as it will be registered, but for the end time of a run
    /// registered as ended without one. Its static metadata is final: it is
    /// what a repeated registration is compared by.
    /// A run first written by Ray Train V2: normalised like [`NewRun::new`],
    /// but no first attempt is recorded, since Ray writes its attempts
    /// itself, each under its own id.
    pub fn from_ray(mut run: TrainRunInfo) -> Self {
        run.last_heartbeat_ms = None;
        run.health = None;
        run.health_history = Vec::new();
        run.goodput = None;
        Self { run }
    }

    /// The rules on a run a client registers, beyond those of a stored run
    /// (which a head's own writes, and runs stored before these rules, may
    /// not follow): every time is plausible
    /// ([`validate_time`](crate::validate_time)); a cause only on an
    /// `ERRORED` or `ABORTED` run or attempt, never `LOST_CONTROLLER` (the
    /// head's lease sweep decides that), naming a `failed_world_rank` among
    /// the run's ranks; and an end not before the current attempt's start.
    pub fn check_client_rules(run: &TrainRunInfo) -> Result<(), ValidationError> {
        use crate::validate::{validate_client_cause, validate_time};
        validate_time("start_time_ms", run.start_time_ms)?;
        if let Some(end) = run.end_time_ms {
            validate_time("end_time_ms", end)?;
            if run.attempts.last().is_some_and(|current| end < current.start_time_ms) {
                return Err(ValidationError::new("end_time_ms", Rule::EndBeforeAttemptStart));
            }
        }
        let failed = matches!(run.status, RunStatus::Errored | RunStatus::Aborted);
        validate_client_cause("cause", run.cause.clone(), failed, run.workers.len())?;
        for (i, attempt) in run.attempts.iter().enumerate() {
            validate_time(&format!("attempts[{i}].start_time_ms"), attempt.start_time_ms)?;
            if let Some(end) = attempt.end_time_ms {
                validate_time(&format!("attempts[{i}].end_time_ms"), end)?;
            }
            let failed = matches!(attempt.status, AttemptStatus::Errored | AttemptStatus::Aborted);
            let workers = attempt.workers.as_ref().map_or(run.workers.len(), |w| w.len());
            validate_client_cause(
                &format!("attempts[{i}].cause"),
                attempt.cause.clone(),
                failed,
                workers,
            )?;
        }
        for (i, change) in run.status_history.iter().enumerate() {
            validate_time(&format!("status_history[{i}].at_ms"), change.at_ms)?;
        }
        Ok(())
    }

    /// The run to register.
    pub fn run(&self) -> &TrainRunInfo {
        &self.run
    }

    /// The run as the state actor stores it, registered at `now_ms` (Unix
    /// ms): a run registered as ended without an end time ends at `now_ms`,
    /// or at its start if `now_ms` is earlier; its current attempt, if not
    /// ended, ends then too (never before the attempt's start).
    pub fn into_run(self, now_ms: u64) -> TrainRunInfo {
        let mut run = self.run;
        if run.status.is_terminal() {
            // An ended run's end is not before its start (a given end was
            // checked); an ended run's current attempt may have an end,
            // here not before the attempt's start.
            let end = *run.end_time_ms.get_or_insert(now_ms.max(run.start_time_ms));
            run.end_current_attempt(end);
        }
        run
    }
}

impl From<TrainRunInfo> for NewRun {
    fn from(run: TrainRunInfo) -> Self {
        Self::new(run)
    }
}

impl TryFrom<TrainRunInfoDraft> for NewRun {
    type Error = ValidationError;

    /// Checks every rule of the run once, and the rules of what a client
    /// may write ([`NewRun::check_client_rules`]), then normalises it.
    fn try_from(draft: TrainRunInfoDraft) -> Result<Self, ValidationError> {
        let run = TrainRunInfo::try_from(draft)?;
        Self::check_client_rules(&run)?;
        Ok(Self::new(run))
    }
}
