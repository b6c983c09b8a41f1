//! The errors of the state actor's protocol.

use std::time::Duration;

use trainstate_schema::{RunId, RunStatus, ValidationError};

/// Why a request to the state actor failed. Each variant maps to one HTTP
/// status in the head service.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// No run has this id.
    #[error("run {id} not found")]
    NotFound {
        /// The id that was asked for.
        id: RunId,
    },
    /// The request contradicts what is stored (for example a registration
    /// with the same id and different static metadata).
    #[error("conflict on run {id}: {reason}")]
    Conflict {
        /// The run.
        id: RunId,
        /// What differs.
        reason: String,
    },
    /// The request asks for a status change the lifecycle does not allow.
    #[error("illegal transition of run {id} from {from} to {to}: {reason}")]
    IllegalTransition {
        /// The run.
        id: RunId,
        /// Its stored status.
        from: RunStatus,
        /// The status asked for.
        to: RunStatus,
        /// Why it is refused.
        reason: String,
    },
    /// The request is malformed or breaks a rule of the wire format.
    #[error("invalid {field}: {message}")]
    Invalid {
        /// The path of the offending field, for example `workers[3].pid`.
        field: String,
        /// The rule that was broken.
        message: String,
    },
    /// The state actor or its store cannot serve now (not running, stopped
    /// while handling the request, or its store failed).
    #[error("state actor unavailable: {reason}")]
    Unavailable {
        /// What went wrong.
        reason: String,
    },
    /// Too many writes are in flight; retry later.
    #[error("state actor overloaded: {in_flight} writes in flight")]
    Overloaded {
        /// Writes in flight when the request was refused.
        in_flight: usize,
    },
    /// The head refused the request's credentials (remote handles only).
    #[error("unauthorized: {reason}")]
    Unauthorized {
        /// What the head said.
        reason: String,
    },
    /// No answer came within the deadline. The request may still take effect.
    #[error("no answer from the state actor within {after:?}")]
    Timeout {
        /// The deadline that passed.
        after: Duration,
    },
}

impl StateError {
    /// An [`StateError::Invalid`] for `field`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Invalid { field: field.into(), message: message.into() }
    }

    /// An [`StateError::Unavailable`] with a reason.
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Self::Unavailable { reason: reason.into() }
    }

    /// True when retrying the same request later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. } | Self::Overloaded { .. } | Self::Timeout { .. })
    }
}

impl From<ValidationError> for StateError {
    fn from(err: ValidationError) -> Self {
        Self::Invalid { field: err.field().to_owned(), message: err.rule().to_string() }
    }
}
