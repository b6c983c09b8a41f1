//! The documents of the head service's HTTP API, and how the actor's
//! protocol converts to and from them.
//!
//! The documents themselves are defined once, data only, in
//! [`trainstate_schema::api`] and re-exported here; [`trainstate_schema::routes`] says
//! which route takes and answers which, and the OpenAPI document is
//! generated from both.

pub use trainstate_schema::api::*;
use trainstate_schema::{TrainWorkerInfo, WorkerList};

use crate::protocol::{NewAttempt, StatusUpdate};

impl From<StatusUpdate> for StatusRequest {
    fn from(update: StatusUpdate) -> Self {
        let mut request = StatusRequest::new(update.status);
        request.detail = update.detail;
        request.cause = update.cause;
        request.end_time_ms = update.end_time_ms;
        request.at_ms = update.at_ms;
        request
    }
}

impl From<StatusRequest> for StatusUpdate {
    fn from(request: StatusRequest) -> Self {
        let mut update = StatusUpdate::finished();
        update.status = request.status;
        update.detail = request.detail;
        update.cause = request.cause;
        update.end_time_ms = request.end_time_ms;
        update.at_ms = request.at_ms;
        update
    }
}

impl From<NewAttempt> for AttemptRequest {
    fn from(attempt: NewAttempt) -> Self {
        let workers = attempt.workers.into_iter().map(TrainWorkerInfo::into_draft).collect();
        AttemptRequest::new(attempt.attempt_id, attempt.start_time_ms, workers)
    }
}

impl TryFrom<AttemptRequest> for NewAttempt {
    type Error = crate::StateError;

    /// Checks the worker group (each worker, and the rules across them); a
    /// broken rule names its path (`workers[3].pid`).
    fn try_from(request: AttemptRequest) -> Result<Self, Self::Error> {
        let workers = WorkerList::try_from(request.workers)?;
        Ok(NewAttempt::new(request.attempt_id, request.start_time_ms, workers.into_vec()))
    }
}
