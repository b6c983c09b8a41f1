//! The documents of notifications: what a head sends a generic webhook
//! when a run needs people ([`NotifyEvent`]), and how `GET /api/notify`
//! describes each notification target ([`NotifyResponse`]).
//!
//! Every event is derived from a committed run document and has an id that
//! is a function of that document (`event_id`), so a receiver that sees the
//! same id twice drops the repeat: delivery is at least once.

use serde::{Deserialize, Serialize};

use crate::api::StackSuspect;
use crate::{CauseClass, CauseKind, HealthState, RunCause, RunGoodput, RunStatus};

/// What happened to a run that a notification tells of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum NotifyEventKind {
    /// The run ended with an error.
    Errored,
    /// The run was stopped before it finished.
    Aborted,
    /// The run ended successfully.
    Finished,
    /// No rank of the run advanced for its stall window.
    Stalled,
    /// A rank of a stalled run advanced again.
    Recovered,
    /// The run started a new attempt after a failure.
    Restarting,
}

impl NotifyEventKind {
    /// Every kind, in a fixed order.
    pub const ALL: [NotifyEventKind; 6] = [
        NotifyEventKind::Errored,
        NotifyEventKind::Aborted,
        NotifyEventKind::Finished,
        NotifyEventKind::Stalled,
        NotifyEventKind::Recovered,
        NotifyEventKind::Restarting,
    ];

    /// The wire spelling, for example `STALLED`.
    pub fn as_str(self) -> &'static str {
        match self {
            NotifyEventKind::Errored => "ERRORED",
            NotifyEventKind::Aborted => "ABORTED",
            NotifyEventKind::Finished => "FINISHED",
            NotifyEventKind::Stalled => "STALLED",
            NotifyEventKind::Recovered => "RECOVERED",
            NotifyEventKind::Restarting => "RESTARTING",
        }
    }

    /// The kind of the run's end for a terminal `status`; `None` for a live one.
    pub fn ending(status: RunStatus) -> Option<Self> {
        match status {
            RunStatus::Errored => Some(NotifyEventKind::Errored),
            RunStatus::Aborted => Some(NotifyEventKind::Aborted),
            RunStatus::Finished => Some(NotifyEventKind::Finished),
            _ => None,
        }
    }
}

impl std::fmt::Display for NotifyEventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The node of a rank a notification names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct NotifyNode {
    /// The world rank.
    pub world_rank: u32,
    /// Its node's id.
    pub node_id: String,
    /// Its node's IP address.
    pub node_ip: String,
}

impl NotifyNode {
    /// Rank `world_rank`, on the node `node_id` at `node_ip`.
    pub fn new(world_rank: u32, node_id: impl Into<String>, node_ip: impl Into<String>) -> Self {
        Self { world_rank, node_id: node_id.into(), node_ip: node_ip.into() }
    }
}

/// The body a generic webhook target receives (`POST`, JSON), one event per
/// request. `event_id` is the same every time the same event is sent: a
/// receiver drops the repeats (delivery is at least once).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct NotifyEvent {
    /// The event's id, a function of the run's stored document:
    /// `<run_id>:ERRORED` (`ABORTED`, `FINISHED`), `<run_id>:STALLED:<at_ms>`,
    /// `<run_id>:RECOVERED:<at_ms>`, `<run_id>:RESTARTING:<attempt_id>`.
    pub event_id: String,
    /// What happened.
    pub event: NotifyEventKind,
    /// The run's id.
    pub run_id: String,
    /// The run's name.
    pub name: String,
    /// The run's cluster, when it has one.
    pub cluster: Option<String>,
    /// The id of the job that started the run.
    pub job_id: String,
    /// The run's status in the document the event was read from (a stall
    /// read after the run ended says how it ended).
    pub status: RunStatus,
    /// The run's health in that document; null for a run that never
    /// reported progress.
    pub health: Option<HealthState>,
    /// The cause of an `ERRORED` or `ABORTED` run, or for `RESTARTING`
    /// of the attempt that ended: its kind, its class and, when one did,
    /// the rank that failed first.
    pub cause: Option<RunCause>,
    /// The ranks the event names: the rank that failed first for an end,
    /// the culprits for a stall (and for the recovery, the stall's).
    #[serde(default)]
    pub ranks: Vec<u32>,
    /// The node of the first rank in `ranks`, when the run's workers say.
    pub node: Option<NotifyNode>,
    /// The attempt a `RESTARTING` event tells of.
    pub attempt_id: Option<String>,
    /// What happened, in a few words for a person (at most 500 characters).
    pub detail: String,
    /// The run's page on the head (`--public-url` followed by
    /// `/runs/<run_id>`); null when the head was given no public URL.
    pub link: Option<String>,
    /// When it happened (Unix ms): the run's end, the health change, the
    /// attempt's start.
    pub at_ms: u64,
    /// For `STALLED`, once the capture of the ranks' stacks the stall
    /// opened is complete: where to look first, the capture's first
    /// suspects (at most 5), each with its rank, node and innermost frame.
    /// Empty for a stall with no capture (its ranks have no watcher) and
    /// for every other event.
    #[serde(default)]
    pub suspects: Vec<StackSuspect>,
    /// How many suspects of the capture `suspects` leaves out.
    #[serde(default)]
    pub suspects_left_out: u32,
    /// For `STALLED` with a capture: the capture on the head
    /// (`--public-url` followed by `/api/train/runs/<run_id>/stacks`);
    /// null without a capture or a public URL.
    #[serde(default)]
    pub stacks_url: Option<String>,
    /// For `ERRORED`, `ABORTED` and `FINISHED`: where the run's wall-clock
    /// time went (its goodput and badput by bucket); null for a run the
    /// head counted none of, and for every other event.
    #[serde(default)]
    pub goodput: Option<RunGoodput>,
    /// For `RESTARTING`: true when this restart put the run in a restart
    /// loop (`RESTART_LOOP_RESTARTS` failed attempts without a new
    /// checkpoint mark); the detail says so.
    #[serde(default)]
    pub restart_loop: bool,
}

impl NotifyEvent {
    /// The event `event_id` of kind `event`, of the run `run_id` (named
    /// `name`, of job `job_id`, now `status`), at `at_ms`; the other fields
    /// empty, for the caller to fill.
    pub fn new(
        event_id: impl Into<String>,
        event: NotifyEventKind,
        run_id: impl Into<String>,
        name: impl Into<String>,
        job_id: impl Into<String>,
        status: RunStatus,
        at_ms: u64,
    ) -> Self {
        Self {
            event_id: event_id.into(),
            event,
            run_id: run_id.into(),
            name: name.into(),
            cluster: None,
            job_id: job_id.into(),
            status,
            health: None,
            cause: None,
            ranks: Vec::new(),
            node: None,
            attempt_id: None,
            detail: String::new(),
            link: None,
            at_ms,
            suspects: Vec::new(),
            suspects_left_out: 0,
            stacks_url: None,
            goodput: None,
            restart_loop: false,
        }
    }
}

/// Where a notification target sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum NotifyTargetKind {
    /// A generic webhook: a [`NotifyEvent`] per request.
    Webhook,
    /// A Slack incoming webhook: a Block Kit message per event.
    Slack,
    /// Alertmanager's `POST /api/v2/alerts`: an alert per run and condition.
    Alertmanager,
}

impl NotifyTargetKind {
    /// The wire spelling, for example `slack`.
    pub fn as_str(self) -> &'static str {
        match self {
            NotifyTargetKind::Webhook => "webhook",
            NotifyTargetKind::Slack => "slack",
            NotifyTargetKind::Alertmanager => "alertmanager",
        }
    }
}

impl std::fmt::Display for NotifyTargetKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One notification target as `GET /api/notify` describes it: what it is,
/// what it sends, and how its delivery goes on this head.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct NotifyTargetInfo {
    /// The target's name: its label in the metrics and the key of its
    /// durable position.
    pub name: String,
    /// What it is.
    pub kind: NotifyTargetKind,
    /// Where it sends, without secrets: the scheme, host and port only,
    /// followed by `/…` when a path or query was left out (a webhook's
    /// path often holds its secret), for every kind of target.
    pub url: String,
    /// The events it sends.
    pub events: Vec<NotifyEventKind>,
    /// Only runs of these clusters; empty for every run.
    #[serde(default)]
    pub clusters: Vec<String>,
    /// Only runs whose name matches this pattern (`*` matches any text).
    pub run_name: Option<String>,
    /// Only events of these classes (`classes=`); empty for every class.
    #[serde(default)]
    pub classes: Vec<CauseClass>,
    /// Only events whose cause is of these kinds (`causes=`); empty for
    /// every kind.
    #[serde(default)]
    pub causes: Vec<CauseKind>,
    /// Never events whose cause is of these kinds (`causes=!kind`).
    #[serde(default)]
    pub causes_left_out: Vec<CauseKind>,
    /// True while this head sends (on a shared store, only the head that
    /// sweeps does).
    pub sending: bool,
    /// The store's commit sequence number up to which every event was
    /// delivered or dropped: durable, where a restart resumes.
    pub position: u64,
    /// Events read and not yet delivered.
    pub pending: u64,
    /// Events delivered since this head started.
    pub sent: u64,
    /// Tries that failed since this head started (each is tried again).
    pub failures: u64,
    /// Events dropped since this head started: past the backlog bound, or
    /// refused by the receiver for good.
    pub dropped: u64,
    /// Why the last try failed.
    pub last_error: Option<String>,
    /// When the last try failed (Unix ms).
    pub last_error_ms: Option<u64>,
    /// When the last event was delivered (Unix ms).
    pub last_sent_ms: Option<u64>,
}

impl NotifyTargetInfo {
    /// The target `name` of kind `kind`, sending to `url` (without
    /// secrets); the other fields empty or zero, for the caller to fill.
    pub fn new(name: impl Into<String>, kind: NotifyTargetKind, url: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            kind,
            url: url.into(),
            events: Vec::new(),
            clusters: Vec::new(),
            run_name: None,
            classes: Vec::new(),
            causes: Vec::new(),
            causes_left_out: Vec::new(),
            sending: false,
            position: 0,
            pending: 0,
            sent: 0,
            failures: 0,
            dropped: 0,
            last_error: None,
            last_error_ms: None,
            last_sent_ms: None,
        }
    }
}

/// Answer of `GET /api/notify`: every notification target of the head, in
/// the order they were given.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct NotifyResponse {
    /// The targets.
    pub targets: Vec<NotifyTargetInfo>,
}

impl NotifyResponse {
    /// An answer listing `targets`.
    pub fn new(targets: Vec<NotifyTargetInfo>) -> Self {
        Self { targets }
    }
}
