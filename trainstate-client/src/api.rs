//! The JSON bodies of the head service's HTTP API.
//!
//! The server and the remote [`StateHandle`](crate::StateHandle) share these
//! types, and the OpenAPI document is generated from their JSON Schemas.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use trainstate_schema::{RunCause, RunStatus, TrainRunInfo, TrainWorkerInfo};

use crate::error::StateError;
use crate::protocol::{NewAttempt, StatusUpdate};

/// Body of `POST /api/train/runs/{id}/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct StatusRequest {
    /// The new status.
    pub status: RunStatus,
    /// Human-readable detail; for `ERRORED`, the error and its trace.
    #[serde(default)]
    pub detail: String,
    /// The machine-readable cause of an `ERRORED` or `ABORTED` run.
    #[serde(default)]
    pub cause: Option<RunCause>,
    /// When the run ended (Unix ms); stamped by the head if absent.
    #[serde(default)]
    pub end_time_ms: Option<u64>,
}

impl From<StatusUpdate> for StatusRequest {
    fn from(update: StatusUpdate) -> Self {
        Self {
            status: update.status,
            detail: update.detail,
            cause: update.cause,
            end_time_ms: update.end_time_ms,
        }
    }
}

impl From<StatusRequest> for StatusUpdate {
    fn from(request: StatusRequest) -> Self {
        let mut update = StatusUpdate::finished();
        update.status = request.status;
        update.detail = request.detail;
        update.cause = request.cause;
        update.end_time_ms = request.end_time_ms;
        update
    }
}

/// Body of `POST /api/train/runs/{id}/attempts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct AttemptRequest {
    /// Id chosen by the caller, unique within the run.
    pub attempt_id: String,
    /// When the attempt's workers started (Unix ms).
    pub start_time_ms: u64,
    /// The attempt's workers.
    pub workers: Vec<TrainWorkerInfo>,
}

impl From<NewAttempt> for AttemptRequest {
    fn from(attempt: NewAttempt) -> Self {
        Self {
            attempt_id: attempt.attempt_id,
            start_time_ms: attempt.start_time_ms,
            workers: attempt.workers,
        }
    }
}

impl From<AttemptRequest> for NewAttempt {
    fn from(request: AttemptRequest) -> Self {
        NewAttempt::new(request.attempt_id, request.start_time_ms, request.workers)
    }
}

/// Answer of `POST /api/train/runs`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct RegisterResponse {
    /// The run as stored.
    pub run: TrainRunInfo,
    /// How long the run stays live without a heartbeat, in milliseconds.
    pub lease_ms: u64,
    /// False when the run was already registered with the same metadata.
    pub created: bool,
}

/// Answer of `POST /api/train/runs/{id}/heartbeat`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct HeartbeatResponse {
    /// The renewed lease, in milliseconds from now.
    pub lease_ms: u64,
}

/// Answer of `GET /api/train/runs`: one page, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct RunListResponse {
    /// The runs of the page.
    pub train_runs: Vec<TrainRunInfo>,
    /// Pass as `cursor` to get the next page; null on the last page.
    pub next_cursor: Option<String>,
    /// How many runs matched the filters in all.
    pub total: usize,
}

/// Answer of `GET /api/train/v2/runs`, as Ray's dashboard gives it: every
/// retained run, newest first, unpaged.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct RayRunListResponse {
    /// Every retained run.
    pub train_runs: Vec<TrainRunInfo>,
}

/// Answer of `GET /api/version`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct VersionResponse {
    /// The head service's version.
    pub version: String,
    /// The version of the wire schema.
    pub wire_schema_version: String,
    /// The schema version of the store.
    pub store_schema_version: u32,
}

impl VersionResponse {
    /// A version answer.
    pub fn new(version: String, wire_schema_version: String, store_schema_version: u32) -> Self {
        Self { version, wire_schema_version, store_schema_version }
    }
}

/// The data of one event of `GET /api/train/events`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct EventData {
    /// Position in the stream; also the SSE event id.
    pub seq: u64,
    /// What happened: `registered`, `status_changed`, `attempt_started`,
    /// `evicted` or `deleted`.
    pub kind: String,
    /// The run it happened to.
    pub run_id: String,
    /// The run after the change; null when it was evicted or deleted.
    pub run: Option<TrainRunInfo>,
}

/// The data of a `snapshot` event of `GET /api/train/events`: every run,
/// sent first, and again whenever the stream cannot resume without a gap.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct SnapshotData {
    /// The sequence number the snapshot is current at.
    pub seq: u64,
    /// Every retained run, newest first.
    pub train_runs: Vec<TrainRunInfo>,
}

/// Every error answer of the HTTP API.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ErrorResponse {
    /// What went wrong.
    pub error: ErrorBody,
}

/// What went wrong.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[non_exhaustive]
pub struct ErrorBody {
    /// A stable machine-readable code: `bad_request`, `invalid`,
    /// `unsupported_media_type`, `payload_too_large`, `unauthorized`,
    /// `not_found`, `method_not_allowed`, `conflict`, `illegal_transition`,
    /// `unavailable`, `overloaded`, `timeout`, `too_many_subscribers`.
    pub code: String,
    /// A human-readable message naming the rule that was broken.
    pub message: String,
    /// The path of the offending field, when one is to blame.
    pub field: Option<String>,
    /// For `illegal_transition`: the run's stored status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<RunStatus>,
    /// For `illegal_transition`: the status asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<RunStatus>,
}

impl ErrorBody {
    /// An error body.
    pub fn new(code: impl Into<String>, message: impl Into<String>, field: Option<String>) -> Self {
        Self { code: code.into(), message: message.into(), field, from: None, to: None }
    }
}

impl From<&StateError> for ErrorBody {
    fn from(err: &StateError) -> Self {
        let message = err.to_string();
        match err {
            StateError::NotFound { .. } => Self::new("not_found", message, None),
            StateError::Conflict { .. } => Self::new("conflict", message, None),
            StateError::IllegalTransition { from, to, .. } => Self {
                from: Some(*from),
                to: Some(*to),
                ..Self::new("illegal_transition", message, None)
            },
            StateError::Invalid { field, .. } => Self::new("invalid", message, Some(field.clone())),
            StateError::Unavailable { .. } => Self::new("unavailable", message, None),
            StateError::Overloaded { .. } => Self::new("overloaded", message, None),
            StateError::Timeout { .. } => Self::new("timeout", message, None),
            StateError::Unauthorized { .. } => Self::new("unauthorized", message, None),
        }
    }
}
