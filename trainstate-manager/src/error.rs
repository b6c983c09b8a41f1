//! The errors of trainstate-manager.

use std::time::Duration;

use trainstate_client::StateError;
use trainstate_schema::{RunId, ValidationError};

/// Why a call of [`TrainRunStateManager`](crate::TrainRunStateManager) did
/// not do what was asked.
///
/// None of these stop training: they tell the training code what happened,
/// and it decides.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ManagerError {
    /// A worker could not report its metadata.
    #[error("worker of rank {rank} failed to report its metadata: {source}")]
    Worker {
        /// The world rank of the worker.
        rank: u32,
        /// What went wrong.
        #[source]
        source: WorkerError,
    },
    /// A worker did not report its metadata before the gather deadline.
    #[error("worker of rank {rank} did not report its metadata within {after:?}")]
    WorkerTimeout {
        /// The world rank of the worker (the lowest one, if several were late).
        rank: u32,
        /// The gather deadline.
        after: Duration,
    },
    /// The run built from the workers' metadata breaks a rule of the wire
    /// format (for example two workers on one node with the same local rank).
    #[error("the run's metadata is invalid: {0}")]
    InvalidRun(#[from] ValidationError),
    /// This manager tracks no live run with this id: it did not register it,
    /// or the run has already ended.
    #[error("this manager tracks no live run {id}")]
    UnknownRun {
        /// The id asked for.
        id: RunId,
    },
    /// The state actor refused the write for good (a conflict, an illegal
    /// transition or invalid input); retrying would not help.
    #[error("the state actor refused the write to run {id}: {source}")]
    Rejected {
        /// The run.
        id: RunId,
        /// The actor's answer.
        #[source]
        source: StateError,
    },
    /// The head did not answer within the call deadline (it is down, or
    /// busy). What was sent is not kept to be sent again: stacks are of a
    /// moment, and a later call attaches fresher ones.
    #[error("the state actor did not take the write to run {id}: {source}")]
    Unreachable {
        /// The run.
        id: RunId,
        /// What the handle said.
        #[source]
        source: StateError,
    },
    /// Stacks attached with no rank: a capture needs at least one rank's.
    #[error("the stacks are invalid: {0}")]
    InvalidStacks(ValidationError),
    /// A rank's progress report breaks a rule (for example a checkpoint
    /// mark ahead of the rank's step, `progress.checkpoint`); nothing of it
    /// is sent.
    #[error("the progress report is invalid: {0}")]
    InvalidProgress(ValidationError),
    /// The manager was built with no state actor: nothing is tracked, and
    /// a call that must answer with the head's record cannot.
    #[error("no state actor: run-state tracking is off")]
    Untracked,
    /// The manager has been shut down.
    #[error("the manager has been shut down")]
    ShutDown,
    /// The call was made outside a Tokio runtime; nothing was gathered or
    /// sent.
    #[error("called outside a Tokio runtime; nothing was sent")]
    NoRuntime,
}

/// Why a worker could not report its metadata.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The worker group has no worker of this rank.
    #[error("no worker has this rank")]
    NoSuchRank,
    /// The worker could not be reached (its actor has stopped).
    #[error("the worker is unreachable: {reason}")]
    Unreachable {
        /// What went wrong.
        reason: String,
    },
    /// The worker answered with an error, or dropped the request.
    #[error("the worker failed: {reason}")]
    Failed {
        /// What went wrong.
        reason: String,
    },
    /// The worker's metadata breaks a rule of the wire format.
    #[error("the worker's metadata is invalid: {0}")]
    Invalid(#[from] ValidationError),
}

impl WorkerError {
    /// A [`WorkerError::Failed`] with a reason.
    pub fn failed(reason: impl Into<String>) -> Self {
        Self::Failed { reason: reason.into() }
    }

    /// A [`WorkerError::Unreachable`] with a reason.
    pub fn unreachable(reason: impl Into<String>) -> Self {
        Self::Unreachable { reason: reason.into() }
    }
}
