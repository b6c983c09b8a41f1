//! The errors of the state actor's protocol.

use ractor::RpcReplyPort;
use std::time::Duration;

use trainstate_schema::api::{ErrorBody, ErrorCode};
use trainstate_schema::{RunId, RunStatus, ValidationError};

/// How heads before [`ErrorCode::NoSuchRoute`] began the message of a
/// route miss, which they answered with `not_found`.
const LEGACY_ROUTE_MISS: &str = "no such route;";

/// Why a request to the state actor failed. Each variant maps to one
/// [`ErrorCode`] of the HTTP API, and so to one HTTP status.
///
/// Only what a retry can fix is retryable ([`StateError::is_retryable`]):
/// `Unavailable`, `Overloaded` and `Timeout`. Every other error is final.
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
    #[error("state actor overloaded{}", match in_flight {
        Some(n) => format!(": {n} writes in flight"),
        None => String::new(),
    })]
    Overloaded {
        /// Writes in flight when the request was refused, when known.
        in_flight: Option<u64>,
    },
    /// A new live run past the head's bound on live runs (`--max-live-runs`):
    /// nothing was stored. Retryable: a place frees when a live run ends.
    #[error(
        "the head keeps at most {max} live runs (--max-live-runs, TRAINSTATE_MAX_LIVE_RUNS) and \
         has that many; a new live run is refused until one ends, and nothing was stored"
    )]
    TooManyLiveRuns {
        /// The bound.
        max: u64,
    },
    /// The head refused the request's credentials (remote handles only).
    #[error("unauthorized: {reason}")]
    Unauthorized {
        /// What the head said.
        reason: String,
    },
    /// No answer came within the deadline. A write may have taken effect
    /// (it is committed if the actor decided it: a deadline does not cancel
    /// it); every write is idempotent, so repeating it is safe and answers
    /// what is stored.
    #[error(
        "no answer from the state actor within {after:?}; a write may have taken effect (repeating it is safe: every write is idempotent)"
    )]
    Timeout {
        /// The deadline that passed.
        after: Duration,
    },
    /// The head knows the request's token, but the token may not do this:
    /// it lacks the route's scope, or it is bound to another cluster.
    /// Retrying does not help.
    #[error("forbidden: {reason}")]
    Forbidden {
        /// What the head said: the scope or the cluster needed.
        reason: String,
    },
    /// A stored run does not parse: the store is damaged, or was written
    /// by a newer version. Retrying does not help.
    #[error("stored run does not parse: {reason}")]
    Corrupt {
        /// What the parser said.
        reason: String,
    },
    /// The rendezvous refused a rank: a second process for a rank that has
    /// joined, a world size that disagrees with the group's, a join into a
    /// group that has closed or into a run that has ended.
    #[error("rendezvous refused the rank: {reason}")]
    Refused {
        /// Why, naming the group.
        reason: String,
    },
    /// The call is not available on this transport (for example a
    /// subscription over HTTP), or the head does not serve it.
    #[error("unsupported: {reason}")]
    Unsupported {
        /// What is not supported, and what to use instead.
        reason: String,
    },
    /// The URL reaches no route of a trainstate head: the head answered
    /// `no_such_route`, or something else (a proxy's page, another server)
    /// answered 404. The client's URL is wrong (a path before `/api`, a
    /// typo, a proxy that does not pass the API on), so nothing is known of
    /// the run the request was about: this is never "run not found". A
    /// retry does not help until the URL or the proxy is fixed.
    #[error(
        "the URL reaches no route of a trainstate head ({reason}); give the head's own address \
         (scheme, host and port, no path), or fix the proxy in front of it"
    )]
    NoSuchRoute {
        /// What answered, and what it said.
        reason: String,
    },
    /// The head answered something this client cannot read: not a
    /// trainstate head, or an incompatible version.
    #[error("unexpected answer from the head: {reason}")]
    Protocol {
        /// What was wrong with the answer.
        reason: String,
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

    /// True when retrying the same request later may succeed: the head
    /// was unavailable, busy or slow, not the request wrong.
    pub fn is_retryable(&self) -> bool {
        self.code().is_retryable()
    }

    /// The code of the HTTP API's error answer for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::NotFound { .. } => ErrorCode::NotFound,
            Self::NoSuchRoute { .. } => ErrorCode::NoSuchRoute,
            Self::Conflict { .. } | Self::Refused { .. } => ErrorCode::Conflict,
            Self::IllegalTransition { .. } => ErrorCode::IllegalTransition,
            Self::Invalid { .. } => ErrorCode::Invalid,
            Self::Unavailable { .. } => ErrorCode::Unavailable,
            Self::Overloaded { .. } | Self::TooManyLiveRuns { .. } => ErrorCode::Overloaded,
            Self::Unauthorized { .. } => ErrorCode::Unauthorized,
            Self::Forbidden { .. } => ErrorCode::Forbidden,
            Self::Timeout { .. } => ErrorCode::Timeout,
            Self::Corrupt { .. } => ErrorCode::Corrupt,
            Self::Unsupported { .. } | Self::Protocol { .. } => ErrorCode::Internal,
        }
    }

    /// The error answer's body for this error.
    pub fn to_error_body(&self) -> ErrorBody {
        let body = ErrorBody::new(self.code(), self.to_string());
        match self {
            Self::Invalid { field, .. } => body.with_field(field.clone()),
            Self::IllegalTransition { from, to, .. } => body.with_transition(*from, *to),
            Self::Overloaded { in_flight: Some(n) } => body.with_in_flight(*n),
            _ => body,
        }
    }

    /// The error an answer's body stands for. `run_id` is the run the
    /// request was about, if any: the body does not repeat it. What the body
    /// does not say is not made up: an answer that lacks what its code
    /// needs is a [`StateError::Protocol`] error.
    pub fn from_error_body(body: ErrorBody, run_id: Option<&RunId>) -> Self {
        let missing = |what: &str| Self::Protocol {
            reason: format!("a {} error answer without {what}: {}", body.code, body.message),
        };
        match body.code {
            ErrorCode::NoSuchRoute => Self::NoSuchRoute { reason: body.message },
            // Heads before `no_such_route` answered a route miss with
            // `not_found` and this message.
            ErrorCode::NotFound if body.message.starts_with(LEGACY_ROUTE_MISS) => {
                Self::NoSuchRoute { reason: body.message }
            }
            ErrorCode::NotFound => match run_id {
                Some(id) => Self::NotFound { id: id.clone() },
                None => Self::Unsupported { reason: body.message },
            },
            ErrorCode::MethodNotAllowed => Self::Unsupported { reason: body.message },
            ErrorCode::Conflict => match run_id {
                Some(id) => Self::Conflict { id: id.clone(), reason: body.message },
                // A conflict about no run: the rendezvous refused a rank.
                None => Self::Refused { reason: body.message },
            },
            ErrorCode::IllegalTransition => match (run_id, body.from, body.to) {
                (Some(id), Some(from), Some(to)) => {
                    Self::IllegalTransition { id: id.clone(), from, to, reason: body.message }
                }
                _ => missing("the run id and both statuses"),
            },
            ErrorCode::Invalid
            | ErrorCode::BadRequest
            | ErrorCode::UnsupportedMediaType
            | ErrorCode::PayloadTooLarge => Self::Invalid {
                field: body.field.unwrap_or_else(|| "body".into()),
                message: body.message,
            },
            ErrorCode::Unauthorized => Self::Unauthorized { reason: body.message },
            ErrorCode::Forbidden => Self::Forbidden { reason: body.message },
            ErrorCode::Overloaded | ErrorCode::TooManySubscribers => {
                Self::Overloaded { in_flight: body.in_flight }
            }
            ErrorCode::Unavailable | ErrorCode::Timeout | ErrorCode::RequestTimeout => {
                Self::Unavailable { reason: body.message }
            }
            ErrorCode::Corrupt => Self::Corrupt { reason: body.message },
            _ => Self::Protocol { reason: format!("{}: {}", body.code, body.message) },
        }
    }
}

impl From<ValidationError> for StateError {
    fn from(err: ValidationError) -> Self {
        Self::Invalid { field: err.field().to_owned(), message: err.rule().to_string() }
    }
}

/// The reply port of every request: the answer or a typed error.
pub type Reply<T> = RpcReplyPort<Result<T, StateError>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_route_miss_is_never_run_not_found() {
        let id = RunId::parse("run-1").unwrap();
        let miss = ErrorBody::new(ErrorCode::NoSuchRoute, "no such route: PUT /prefix/api");
        assert!(matches!(
            StateError::from_error_body(miss, Some(&id)),
            StateError::NoSuchRoute { .. }
        ));
        let legacy = ErrorBody::new(ErrorCode::NotFound, "no such route; see /openapi.json");
        let legacy = StateError::from_error_body(legacy, Some(&id));
        assert!(matches!(legacy, StateError::NoSuchRoute { .. }), "{legacy}");
        assert!(!legacy.is_retryable());
        let missing = ErrorBody::new(ErrorCode::NotFound, "run run-1 not found");
        assert_eq!(StateError::from_error_body(missing, Some(&id)), StateError::NotFound { id });
    }
}
