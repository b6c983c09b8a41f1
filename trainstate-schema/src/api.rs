//! The documents of the head service's HTTP API: every request body, every
//! answer, every event of the live stream, the error body and the list
//! query, defined once.
//!
//! These are data only (serde, and schemars behind the `schemars` feature):
//! a frontend or another program reads and writes them without any
//! runtime. How they travel (routes, methods, status codes) is the client
//! crate's business; its OpenAPI document is generated from these types.
//!
//! Answers that carry runs are generic over the run's representation `R`,
//! by default [`TrainRunInfo`]. A server may fill them with stored runs kept
//! as raw JSON, so that listing stays a copy; the JSON is the same.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::{RunCause, RunId, RunStatus, TrainRunInfo, TrainRunInfoDraft, TrainWorkerInfoDraft};

mod goodput;
mod nodes;
mod notify;
mod progress;
mod rendezvous;
mod stacks;
mod tokens;
pub use goodput::*;
pub use nodes::*;
pub use notify::*;
pub use progress::*;
pub use rendezvous::*;
pub use stacks::*;
pub use tokens::*;

/// Body of `POST /api/train/runs`: the run to register, as a draft so that a
/// broken rule is reported with its field path.
pub type RegisterRequest = TrainRunInfoDraft;

/// Body of `POST /api/train/runs/{id}/status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct StatusRequest {
    /// The new status.
    pub status: RunStatus,
    /// Human-readable detail; for `ERRORED`, the error and its trace.
    #[serde(default)]
    pub detail: String,
    /// The machine-readable cause of an `ERRORED` or `ABORTED` run.
    #[serde(default, deserialize_with = "crate::object::option")]
    pub cause: Option<RunCause>,
    /// When the run ended (Unix ms); stamped by the head if absent. Not before the start of the run's current attempt. Between 946684800000 (2000-01-01) and 7258118400000 (2200-01-01) when a client writes it: a time in seconds or nanoseconds is refused (422).
    #[serde(default)]
    pub end_time_ms: Option<u64>,
    /// When the change happened (Unix ms), if the writer knows better than the head: the
    /// time the run's `status_history` records for it, and the end of a run that ends
    /// without `end_time_ms`. Absent: when the head takes the write. Between 946684800000
    /// (2000-01-01) and 7258118400000 (2200-01-01): a time in seconds or nanoseconds is
    /// refused (422).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
}

impl StatusRequest {
    /// A request for `status`, with no detail, cause, end time or time of the change.
    pub fn new(status: RunStatus) -> Self {
        Self { status, detail: String::new(), cause: None, end_time_ms: None, at_ms: None }
    }
}

/// Query of Ray Train V2's writes (`PUT /api/train/v2/runs/{id}` and of
/// an attempt): when the change happened, for a writer that replays Ray's
/// events.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct RayWriteQuery {
    /// When the change happened (Unix ms), if the writer knows better than the head (Ray's
    /// own time of an export event): the time the run's `status_history` records for a
    /// status change, and the end of a run or attempt that ends without an end time.
    /// Absent: when the head takes the write. Between 946684800000 (2000-01-01) and
    /// 7258118400000 (2200-01-01): a time in seconds or nanoseconds is refused (422).
    #[serde(default)]
    pub at_ms: Option<u64>,
}

impl RayWriteQuery {
    /// A query with the time of the change, if known.
    pub fn at(at_ms: Option<u64>) -> Self {
        Self { at_ms }
    }
}

/// Body of `POST /api/train/runs/{id}/attempts`: a new worker group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct AttemptRequest {
    /// Id chosen by the caller, unique within the run.
    pub attempt_id: String,
    /// When the attempt's workers started (Unix ms). Between 946684800000 (2000-01-01) and 7258118400000 (2200-01-01) when a client writes it: a time in seconds or nanoseconds is refused (422).
    pub start_time_ms: u64,
    /// The attempt's workers; the same rules as a run's workers.
    #[serde(deserialize_with = "crate::object::vec")]
    pub workers: Vec<TrainWorkerInfoDraft>,
}

impl AttemptRequest {
    /// A new attempt request.
    pub fn new(
        attempt_id: impl Into<String>,
        start_time_ms: u64,
        workers: Vec<TrainWorkerInfoDraft>,
    ) -> Self {
        Self { attempt_id: attempt_id.into(), start_time_ms, workers }
    }
}

/// Answer of `POST /api/train/runs`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schemars", schemars(rename = "RegisterResponse"))]
#[non_exhaustive]
pub struct RegisterResponse<R = TrainRunInfo> {
    /// The run as stored.
    pub run: R,
    /// How long the run stays live without a heartbeat, in milliseconds.
    pub lease_ms: u64,
    /// False when the run was already registered with the same metadata.
    pub created: bool,
}

impl<R> RegisterResponse<R> {
    /// A registration answer.
    pub fn new(run: R, lease_ms: u64, created: bool) -> Self {
        Self { run, lease_ms, created }
    }
}

/// Answer of `POST /api/train/runs` to a request with `Prefer:
/// return=minimal` (RFC 7240): the registration without the run it
/// stored, which the caller sent and need not read back. The answer says
/// `Preference-Applied: return=minimal`; its status is the full answer's
/// (201 registered, 200 already registered with the same metadata).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct RegisterMinimalResponse {
    /// False when the run was already registered with the same metadata.
    pub created: bool,
    /// The id of the run.
    pub run_id: RunId,
    /// How long the run stays live without a heartbeat, in milliseconds.
    pub lease_ms: u64,
}

impl RegisterMinimalResponse {
    /// A minimal registration answer.
    pub fn new(run_id: RunId, lease_ms: u64, created: bool) -> Self {
        Self { created, run_id, lease_ms }
    }
}

/// Answer of `POST /api/train/runs/{id}/heartbeat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct HeartbeatResponse {
    /// The renewed lease, in milliseconds from now.
    pub lease_ms: u64,
}

impl HeartbeatResponse {
    /// A heartbeat answer.
    pub fn new(lease_ms: u64) -> Self {
        Self { lease_ms }
    }
}

/// Answer of `GET /api/train/runs`: one page, newest first.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schemars", schemars(rename = "RunListResponse"))]
#[non_exhaustive]
pub struct RunListResponse<R = TrainRunInfo> {
    /// The runs of the page.
    pub train_runs: Vec<R>,
    /// Pass as `cursor` to get the next page; null on the last page.
    pub next_cursor: Option<Cursor>,
    /// How many runs matched the filters in all.
    pub total: u64,
}

impl<R> RunListResponse<R> {
    /// A page.
    pub fn new(train_runs: Vec<R>, next_cursor: Option<Cursor>, total: u64) -> Self {
        Self { train_runs, next_cursor, total }
    }
}

/// Answer of `GET /api/train/v2/runs`, as Ray's dashboard gives it: every
/// retained run, newest first, unpaged.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schemars", schemars(rename = "RayRunListResponse"))]
#[non_exhaustive]
pub struct RayRunListResponse<R = TrainRunInfo> {
    /// Every retained run.
    pub train_runs: Vec<R>,
}

impl<R> RayRunListResponse<R> {
    /// Every run.
    pub fn new(train_runs: Vec<R>) -> Self {
        Self { train_runs }
    }
}

/// Answer of `GET /api/version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
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

/// Answer of `GET /api/links`: the URL templates an operator configured,
/// for links out of the page and the CLI to logs and metrics dashboards.
///
/// A template is a URL with placeholders in braces, each filled with the
/// URL-encoded value: `{run_id}`, `{run_name}`, `{job_id}`, `{attempt_id}`,
/// `{start_ms}`, `{end_ms}` for a run, and also `{rank}`, `{node_id}`,
/// `{node_ip}`, `{pid}` for a worker. A template that names a worker's
/// placeholder links each worker; the others link the run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct LinksResponse {
    /// Where a run's or a worker's logs are.
    #[serde(default)]
    pub logs: Option<String>,
    /// Where a run's or a worker's metrics dashboard is.
    #[serde(default)]
    pub metrics: Option<String>,
}

impl LinksResponse {
    /// Templates for logs and metrics.
    pub fn new(logs: Option<String>, metrics: Option<String>) -> Self {
        Self { logs, metrics }
    }
}

/// The placeholders a link template may use for a run.
pub const RUN_LINK_PLACEHOLDERS: [&str; 6] =
    ["run_id", "run_name", "job_id", "attempt_id", "start_ms", "end_ms"];

/// The placeholders a link template may use for a worker, beside the run's.
pub const WORKER_LINK_PLACEHOLDERS: [&str; 4] = ["rank", "node_id", "node_ip", "pid"];

/// Answer of `GET /healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct HealthResponse {
    /// `ok` while the head serves and its state actor answers.
    pub status: HealthStatus,
    /// `true` once the head has loaded every stored run; `false` while it
    /// loads them after a start. Until then every other request waits for
    /// the load (a readiness probe reads this; a liveness probe only
    /// `status`).
    pub loaded: bool,
}

impl HealthResponse {
    /// A healthy head with every stored run loaded.
    pub fn ok() -> Self {
        Self { status: HealthStatus::Ok, loaded: true }
    }

    /// A head that serves but is still loading its stored runs.
    pub fn loading() -> Self {
        Self { status: HealthStatus::Ok, loaded: false }
    }
}

/// How the head is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum HealthStatus {
    /// It serves and its state actor answers.
    Ok,
}

/// What happened to a run, as the live stream names it (the SSE event name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// A new run was registered.
    Registered,
    /// A run's status changed (also a lost-controller abort by the sweep).
    StatusChanged,
    /// A run started a new attempt (worker group).
    AttemptStarted,
    /// An ended run was evicted by the retention policy.
    Evicted,
    /// An ended run was deleted on request.
    Deleted,
    /// A run's `health` changed (STALLED, or PROGRESSING again), as the
    /// head's lease sweep decided it.
    HealthChanged,
}

impl EventKind {
    /// The wire name, for example `status_changed`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Registered => "registered",
            EventKind::StatusChanged => "status_changed",
            EventKind::AttemptStarted => "attempt_started",
            EventKind::Evicted => "evicted",
            EventKind::Deleted => "deleted",
            EventKind::HealthChanged => "health_changed",
        }
    }
}

impl fmt::Display for EventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The data of a change event of `GET /api/train/events`; the SSE event's
/// name is its `kind` and its id its `seq`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schemars", schemars(rename = "RunEvent"))]
#[non_exhaustive]
pub struct RunEvent<R = TrainRunInfo> {
    /// Position in the stream; also the SSE event id: the stream's name,
    /// random per head and process, in its high 27 bits, a count in its low 26
    /// (below 2^53, exact in JavaScript).
    pub seq: u64,
    /// What happened.
    pub kind: EventKind,
    /// The run it happened to.
    pub run_id: RunId,
    /// The run after the change; null when it was evicted or deleted.
    pub run: Option<R>,
}

impl<R> RunEvent<R> {
    /// A change event.
    pub fn new(seq: u64, kind: EventKind, run_id: RunId, run: Option<R>) -> Self {
        Self { seq, kind, run_id, run }
    }
}

/// The data of a `snapshot` event of `GET /api/train/events`: every run,
/// sent first, and again whenever the stream cannot resume without a gap.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schemars", schemars(rename = "SnapshotEvent"))]
#[non_exhaustive]
pub struct SnapshotEvent<R = TrainRunInfo> {
    /// The sequence number the snapshot is current at.
    pub seq: u64,
    /// Every retained run as of `seq`, newest first, as stored: without
    /// `last_heartbeat_ms` (as change events; the listing and the run carry it).
    pub train_runs: Vec<R>,
}

impl<R> SnapshotEvent<R> {
    /// A snapshot.
    pub fn new(seq: u64, train_runs: Vec<R>) -> Self {
        Self { seq, train_runs }
    }
}

/// Query of `GET /api/train/events`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct EventsQuery {
    /// Resume after this event id (as the `Last-Event-ID` header does, which
    /// wins when both are given). An id of another stream (another head, an
    /// earlier process) gets a snapshot.
    #[serde(default)]
    pub last_event_id: Option<u64>,
}

/// Query of `GET /api/train/runs`: filters and paging. Every filter is
/// optional; runs come newest first (`start_time_ms` desc, `id` desc).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct ListQuery {
    /// Comma-separated statuses, any of INITIALIZING, SCHEDULING, RUNNING, RESTARTING,
    /// RESIZING, FINISHED, ERRORED, ABORTED. As V1 readers see runs, RUNNING keeps every
    /// live run; every other status keeps exactly itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<StatusFilter>,
    /// Only runs of this job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<String>,
    /// Only runs whose name contains this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Only runs that had a worker on this node id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// Only runs that had a worker on this node IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_ip: Option<String>,
    /// Only runs of this cluster (their `cluster`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// Only runs whose `health` is this state (`STALLED` or `PROGRESSING`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<crate::HealthState>,
    /// Page size, 1 to 1000; 100 when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schemars",
        schemars(range(min = 1, max = crate::limits::MAX_PAGE_LIMIT))
    )]
    pub limit: Option<u32>,
    /// The `next_cursor` of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<Cursor>,
}

/// A set of run statuses, written comma-separated (`RUNNING,ERRORED`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusFilter(pub Vec<RunStatus>);

impl fmt::Display for StatusFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, status) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(status.as_str())?;
        }
        Ok(())
    }
}

impl FromStr for StatusFilter {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        text.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                RunStatus::parse(s).ok_or_else(|| {
                    let known: Vec<&str> = RunStatus::ALL.iter().map(|s| s.as_str()).collect();
                    format!("unknown status {s:?}: use one of {}", known.join(", "))
                })
            })
            .collect::<Result<_, _>>()
            .map(StatusFilter)
    }
}

impl Serialize for StatusFilter {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for StatusFilter {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "schemars")]
impl schemars::JsonSchema for StatusFilter {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "StatusFilter".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "Comma-separated run statuses, for example RUNNING,ERRORED.",
            "pattern": "^ *(INITIALIZING|SCHEDULING|RUNNING|STARTED|RESTARTING|RESIZING|FINISHED|ERRORED|ABORTED)? *(, *(INITIALIZING|SCHEDULING|RUNNING|STARTED|RESTARTING|RESIZING|FINISHED|ERRORED|ABORTED) *)*$"
        })
    }
}

/// A position in the listing order, handed out as a page's `next_cursor`
/// and passed back as `cursor`: the last (`start_time_ms`, `id`) of a page.
///
/// Opaque on the wire, and versioned: its text starts with the format's
/// version, so a later format can be told apart and refused clearly.
///
/// ```
/// use trainstate_schema::RunId;
/// use trainstate_schema::api::Cursor;
///
/// let cursor = Cursor::new(1_760_000_000_000, RunId::parse("abc").unwrap());
/// let text = cursor.to_string();
/// assert_eq!(text.parse::<Cursor>().unwrap(), cursor);
/// assert!("not-a-cursor".parse::<Cursor>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cursor {
    start_time_ms: u64,
    id: RunId,
}

/// The version tag of the cursor's text form.
const CURSOR_VERSION: &str = "v1";

impl Cursor {
    /// The cursor after the run started at `start_time_ms` with `id`.
    pub fn new(start_time_ms: u64, id: RunId) -> Self {
        Self { start_time_ms, id }
    }

    /// `start_time_ms` of the last run of the page.
    pub fn start_time_ms(&self) -> u64 {
        self.start_time_ms
    }

    /// `id` of the last run of the page.
    pub fn id(&self) -> &RunId {
        &self.id
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{CURSOR_VERSION}.{:x}.{}", self.start_time_ms, self.id)
    }
}

/// A text that is not a cursor this version hands out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorError;

impl fmt::Display for CursorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("must be a next_cursor returned by a listing")
    }
}

impl std::error::Error for CursorError {}

impl FromStr for Cursor {
    type Err = CursorError;

    fn from_str(text: &str) -> Result<Self, CursorError> {
        let mut parts = text.splitn(3, '.');
        let (Some(CURSOR_VERSION), Some(start), Some(id)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(CursorError);
        };
        let lower_hex =
            !start.is_empty() && start.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !lower_hex {
            return Err(CursorError);
        }
        Ok(Self {
            start_time_ms: u64::from_str_radix(start, 16).map_err(|_| CursorError)?,
            id: RunId::parse(id).map_err(|_| CursorError)?,
        })
    }
}

impl Serialize for Cursor {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cursor {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "schemars")]
impl schemars::JsonSchema for Cursor {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Cursor".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "An opaque, versioned position in the listing: pass a page's next_cursor back as cursor.",
            "pattern": "^v1\\.[0-9a-f]{1,16}\\.[A-Za-z0-9_-]{1,128}$"
        })
    }
}

/// Every error answer of the HTTP API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct ErrorResponse {
    /// What went wrong.
    pub error: ErrorBody,
}

impl ErrorResponse {
    /// An error answer.
    pub fn new(error: ErrorBody) -> Self {
        Self { error }
    }
}

/// What went wrong.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct ErrorBody {
    /// A stable machine-readable code.
    pub code: ErrorCode,
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
    /// For `overloaded`: the writes in flight when the request was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<u64>,
}

impl ErrorBody {
    /// An error body with no field to blame.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), field: None, from: None, to: None, in_flight: None }
    }

    /// The same body, blaming `field`.
    pub fn with_field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }

    /// The same body, for an illegal transition `from` → `to`.
    pub fn with_transition(mut self, from: RunStatus, to: RunStatus) -> Self {
        self.from = Some(from);
        self.to = Some(to);
        self
    }

    /// The same body, with the writes in flight.
    pub fn with_in_flight(mut self, in_flight: u64) -> Self {
        self.in_flight = Some(in_flight);
        self
    }
}

/// The machine-readable code of an error answer. Each has one HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// The body is not JSON, or a query string does not parse (400).
    BadRequest,
    /// A field has the wrong type, is missing or breaks a rule (422).
    Invalid,
    /// The body is not `application/json` (415).
    UnsupportedMediaType,
    /// The body is over the size limit (413).
    PayloadTooLarge,
    /// A bearer token is missing or wrong (401).
    Unauthorized,
    /// The bearer token is valid but may not do this: it lacks the route's
    /// scope, or it is bound to another cluster than the run's (403).
    Forbidden,
    /// What the route names does not exist: no run has this id, no wire
    /// type has this name (404).
    NotFound,
    /// No route has this path: the URL is wrong (a path before `/api`, a
    /// typo), not the thing it names missing. Never "run not found" (404).
    NoSuchRoute,
    /// The route does not take this method (405).
    MethodNotAllowed,
    /// The `Host` header names no address of this head, which serves only
    /// its own names without a token: a guard against DNS rebinding (421).
    MisdirectedRequest,
    /// The request contradicts the stored run (409).
    Conflict,
    /// The lifecycle does not allow this status change (409).
    IllegalTransition,
    /// The store or the state actor cannot serve now; retry (503).
    Unavailable,
    /// Too many writes are in flight; retry (503).
    Overloaded,
    /// No answer within the request's deadline (which grows with the body's
    /// size); a write may have taken effect. Retry: every write is
    /// idempotent, so a repeat answers what is stored (503).
    Timeout,
    /// Too many event subscribers; retry (503).
    TooManySubscribers,
    /// The request's body sent nothing for the head's body-read timeout
    /// and was cut off; nothing was done. Send it again (408).
    RequestTimeout,
    /// A stored run does not parse: the store is damaged (500).
    Corrupt,
    /// Something the head did not expect (500).
    Internal,
}

impl ErrorCode {
    /// Every code.
    pub const ALL: [ErrorCode; 19] = [
        ErrorCode::BadRequest,
        ErrorCode::Invalid,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::PayloadTooLarge,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::NotFound,
        ErrorCode::NoSuchRoute,
        ErrorCode::MethodNotAllowed,
        ErrorCode::MisdirectedRequest,
        ErrorCode::Conflict,
        ErrorCode::IllegalTransition,
        ErrorCode::Unavailable,
        ErrorCode::Overloaded,
        ErrorCode::Timeout,
        ErrorCode::TooManySubscribers,
        ErrorCode::RequestTimeout,
        ErrorCode::Corrupt,
        ErrorCode::Internal,
    ];

    /// The wire spelling, for example `illegal_transition`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::Invalid => "invalid",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotFound => "not_found",
            ErrorCode::NoSuchRoute => "no_such_route",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::MisdirectedRequest => "misdirected_request",
            ErrorCode::Conflict => "conflict",
            ErrorCode::IllegalTransition => "illegal_transition",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Overloaded => "overloaded",
            ErrorCode::Timeout => "timeout",
            ErrorCode::TooManySubscribers => "too_many_subscribers",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::Corrupt => "corrupt",
            ErrorCode::Internal => "internal",
        }
    }

    /// The HTTP status every answer with this code has.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::BadRequest => 400,
            ErrorCode::Unauthorized => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::NotFound | ErrorCode::NoSuchRoute => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::RequestTimeout => 408,
            ErrorCode::Conflict | ErrorCode::IllegalTransition => 409,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::MisdirectedRequest => 421,
            ErrorCode::UnsupportedMediaType => 415,
            ErrorCode::Invalid => 422,
            ErrorCode::Corrupt | ErrorCode::Internal => 500,
            ErrorCode::Unavailable
            | ErrorCode::Overloaded
            | ErrorCode::Timeout
            | ErrorCode::TooManySubscribers => 503,
        }
    }

    /// True when the same request may succeed later: the head was
    /// unavailable, busy or slow, or the request's body stalled on the
    /// way, not the request wrong.
    pub fn is_retryable(self) -> bool {
        self.http_status() == 503 || self == ErrorCode::RequestTimeout
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_serialize_as_their_wire_spelling() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&json).unwrap(), code);
        }
    }

    #[test]
    fn cursors_refuse_other_versions_and_shapes() {
        for bad in ["", "v1", "v1.", "v1.zz.abc", "v2.1.abc", "v1.1.a b", "v1.1.", "v1.A.abc"] {
            assert_eq!(bad.parse::<Cursor>(), Err(CursorError), "{bad:?}");
        }
        let cursor: Cursor = "v1.ff.run-1".parse().unwrap();
        assert_eq!((cursor.start_time_ms(), cursor.id().as_str()), (255, "run-1"));
    }

    #[test]
    fn status_filters_name_the_unknown_status() {
        let parsed: StatusFilter = "RUNNING, ERRORED".parse().unwrap();
        assert_eq!(parsed.0, [RunStatus::Running, RunStatus::Errored]);
        assert_eq!(parsed.to_string(), "RUNNING,ERRORED");
        assert!("RUNNING,LOST".parse::<StatusFilter>().unwrap_err().contains("\"LOST\""));
    }
}
