//! The documents of stack captures: where every rank of a run is stuck
//! (`GET` and `POST /api/train/runs/{id}/stacks`).
//!
//! A capture is opened by the head when a run of the rendezvous becomes
//! STALLED, or on request ([`StacksRequest`] with no ranks). Each rank's
//! watcher learns of it from its heartbeat's answer
//! ([`RendezvousResponse::capture`](crate::api::RendezvousResponse)),
//! captures its rank's Python stacks from outside the rank and posts them
//! ([`StacksRequest`] with `capture_id` and its rank). A controller attaches
//! the stacks it holds in one request (no `capture_id`). The head keeps
//! every capture with the run, groups the ranks whose stacks are the same
//! after normalising and names the ranks outside the largest group as the
//! suspects ([`StackCapture`]).

use serde::{Deserialize, Serialize};

/// Body of `POST /api/train/runs/{id}/stacks`.
///
/// - No `capture_id` and no `ranks`: ask the run's ranks for their stacks
///   (202 with the capture opened; 409 while another capture is pending or
///   within `MIN_CAPTURE_INTERVAL_MS` of the last one).
/// - `capture_id` and `ranks`: the answer of ranks to that capture (a
///   watcher posts its own rank's).
/// - `ranks` and no `capture_id`: a capture a controller made itself, kept
///   whole at once; a rank it does not list is listed as not answering.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct StacksRequest {
    /// The capture the ranks answer, as the heartbeat's answer named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture_id: Option<u64>,
    /// The attempt the ranks belong to; the run's current attempt when
    /// absent. A capture of an ended attempt is refused (409).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_id: Option<String>,
    /// Why the capture is asked for, in a few words (`"stuck in eval?"`).
    /// At most 256 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(length(max = 256)))]
    pub reason: Option<String>,
    /// The ranks' stacks, one entry per rank.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ranks: Vec<RankStackReport>,
}

impl StacksRequest {
    /// A request for a capture of every rank, for `reason`.
    pub fn capture(reason: Option<String>) -> Self {
        Self { reason, ..Self::default() }
    }

    /// The answer of `ranks` to capture `capture_id`.
    pub fn answer(
        capture_id: u64,
        attempt_id: Option<String>,
        ranks: Vec<RankStackReport>,
    ) -> Self {
        Self { capture_id: Some(capture_id), attempt_id, reason: None, ranks }
    }

    /// A controller's own capture of `ranks`, for `reason`.
    pub fn attach(
        attempt_id: Option<String>,
        reason: Option<String>,
        ranks: Vec<RankStackReport>,
    ) -> Self {
        Self { capture_id: None, attempt_id, reason, ranks }
    }
}

/// One rank's stacks, as its watcher or a controller captured them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct RankStackReport {
    /// The world rank.
    pub rank: u32,
    /// The stacks as text, every thread (Python's `faulthandler` format,
    /// `py-spy dump`'s, or a controller's own). Empty when the rank did not
    /// answer (say why in `note`). Over the byte bound the head keeps its
    /// first lines and marks it `truncated`.
    #[serde(default)]
    pub stack: String,
    /// How it was captured: `faulthandler`, `py-spy`, `controller`... 1 to
    /// 32 of `a-z 0-9 - _`.
    #[cfg_attr(feature = "schemars", schemars(length(min = 1, max = 32)))]
    pub source: String,
    /// True when the sender already cut the stack short.
    #[serde(default)]
    pub truncated: bool,
    /// Why there is no stack (`"no answer to signal 41 within 5 s"`), or
    /// what else was found (a flight-recorder dump's path). At most 1,024
    /// characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schemars", schemars(length(max = 1024)))]
    pub note: Option<String>,
}

impl RankStackReport {
    /// Rank `rank`'s stacks, captured by `source`.
    pub fn new(rank: u32, source: impl Into<String>, stack: impl Into<String>) -> Self {
        Self { rank, stack: stack.into(), source: source.into(), truncated: false, note: None }
    }

    /// Rank `rank` did not answer, for the reason `note`.
    pub fn no_answer(rank: u32, source: impl Into<String>, note: impl Into<String>) -> Self {
        Self {
            rank,
            stack: String::new(),
            source: source.into(),
            truncated: false,
            note: Some(note.into()),
        }
    }
}

/// What asked for a capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum CaptureTrigger {
    /// The run became STALLED.
    Stalled,
    /// Someone asked (`POST .../stacks`, `trainstate runs stacks --capture`).
    Requested,
    /// A controller attached the stacks it holds.
    Controller,
}

/// Whether a capture still waits for ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum CaptureState {
    /// Some ranks have not answered and the deadline has not passed.
    Pending,
    /// Every rank answered, or the deadline passed: a rank that did not
    /// answer is listed as not answering.
    Complete,
}

/// One rank's entry of a capture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct RankStack {
    /// The world rank.
    pub rank: u32,
    /// The rank's node (its worker's `node_name`, else `node_id`), when
    /// known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// False when the rank gave no stack: it did not answer within the
    /// deadline, or its watcher could not capture it (see `note`).
    pub answered: bool,
    /// How it was captured (`faulthandler`, `py-spy`, `controller`); absent
    /// for a rank never heard from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// When the head received it (Unix ms, the head's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ms: Option<u64>,
    /// The stacks as text, as captured (cut at the byte bound).
    #[serde(default)]
    pub stack: String,
    /// True when the stack was cut at the byte bound (by the sender or by
    /// the head).
    #[serde(default)]
    pub truncated: bool,
    /// Why there is no stack, or what else was found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The group the rank's stack falls in (an index into the capture's
    /// `groups`); absent for a rank with no stack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<u32>,
}

impl RankStack {
    /// Rank `rank` on `node`, not heard from (yet).
    pub fn unanswered(rank: u32, node: Option<String>) -> Self {
        Self {
            rank,
            node,
            answered: false,
            source: None,
            at_ms: None,
            stack: String::new(),
            truncated: false,
            note: None,
            group: None,
        }
    }

    /// The same entry, with `report` received at `at_ms`: answered when it
    /// carries a stack.
    pub fn with_report(mut self, report: RankStackReport, at_ms: u64) -> Self {
        self.answered = !report.stack.is_empty();
        self.source = Some(report.source);
        self.at_ms = Some(at_ms);
        self.stack = report.stack;
        self.truncated = report.truncated;
        self.note = report.note;
        self
    }
}

/// Ranks whose stacks are the same after normalising (addresses, thread
/// ids and line numbers taken out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct StackGroup {
    /// The ranks of the group, ascending.
    pub ranks: Vec<u32>,
    /// The normalised frames of the group's main thread, innermost first
    /// (`function (file)`).
    pub frames: Vec<String>,
    /// The innermost frame as the group's first rank gave it, with its
    /// line (`rank_two_is_stuck (train.py:41)`).
    pub innermost: String,
}

impl StackGroup {
    /// A group of `ranks` whose main thread has `frames`, innermost first.
    pub fn new(ranks: Vec<u32>, frames: Vec<String>, innermost: String) -> Self {
        Self { ranks, frames, innermost }
    }
}

/// A rank outside the largest group: where to look first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct StackSuspect {
    /// The world rank.
    pub rank: u32,
    /// Its node, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Its innermost frame, with its line (`rank_two_is_stuck
    /// (train.py:41)`); for a rank that did not answer, `no answer`.
    pub innermost: String,
}

impl StackSuspect {
    /// Rank `rank` on `node`, stuck at `innermost`.
    pub fn new(rank: u32, node: Option<String>, innermost: String) -> Self {
        Self { rank, node, innermost }
    }
}

/// One capture of a run's stacks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct StackCapture {
    /// The capture's number within the run, from 1.
    pub capture_id: u64,
    /// The attempt whose ranks were captured.
    pub attempt_id: String,
    /// When it was opened (Unix ms, the head's clock).
    pub at_ms: u64,
    /// What asked for it.
    pub trigger: CaptureTrigger,
    /// Why, in words.
    #[serde(default)]
    pub reason: String,
    /// Pending or complete.
    pub state: CaptureState,
    /// When a pending capture stops waiting (Unix ms, the head's clock).
    pub deadline_ms: u64,
    /// Every rank of the attempt, by rank: its stack, or that it did not
    /// answer.
    pub ranks: Vec<RankStack>,
    /// The groups of the ranks that answered, the largest first.
    pub groups: Vec<StackGroup>,
    /// The ranks outside the largest group, and those that did not answer
    /// once the capture is complete: where to look first. Empty when every
    /// rank that answered is in one group and none is missing.
    pub suspects: Vec<StackSuspect>,
}

impl StackCapture {
    /// Capture `capture_id` of attempt `attempt_id`, opened at `at_ms` by
    /// `trigger` for `reason`, pending until `deadline_ms`, of `ranks`, not
    /// grouped yet.
    pub fn new(
        capture_id: u64,
        attempt_id: impl Into<String>,
        at_ms: u64,
        trigger: CaptureTrigger,
        reason: impl Into<String>,
        deadline_ms: u64,
        ranks: Vec<RankStack>,
    ) -> Self {
        Self {
            capture_id,
            attempt_id: attempt_id.into(),
            at_ms,
            trigger,
            reason: reason.into(),
            state: CaptureState::Pending,
            deadline_ms,
            ranks,
            groups: Vec::new(),
            suspects: Vec::new(),
        }
    }
}

/// Answer of `GET /api/train/runs/{id}/stacks`: the run's captures, newest
/// first (at most `MAX_CAPTURES_PER_RUN`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct StacksResponse {
    /// The run.
    pub run_id: crate::RunId,
    /// Its captures, newest first.
    pub captures: Vec<StackCapture>,
}

impl StacksResponse {
    /// The captures of run `run_id`.
    pub fn new(run_id: crate::RunId, captures: Vec<StackCapture>) -> Self {
        Self { run_id, captures }
    }
}

/// What a rank's watcher is asked to capture (in a heartbeat's answer).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[non_exhaustive]
pub struct CaptureOrder {
    /// The capture to answer (`POST .../stacks` with this `capture_id`).
    pub capture_id: u64,
    /// How long the watcher may wait for its rank's stacks before it
    /// answers that the rank did not (ms).
    pub answer_within_ms: u64,
}

impl CaptureOrder {
    /// Answer capture `capture_id` within `answer_within_ms`.
    pub fn new(capture_id: u64, answer_within_ms: u64) -> Self {
        Self { capture_id, answer_within_ms }
    }
}

/// What a run asks the head to do when it stalls (`JoinRequest.on_stall`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
#[non_exhaustive]
pub enum StallAction {
    /// Say so (health STALLED, the capture, notifications): the default.
    #[default]
    Detect,
    /// As `DETECT`, then, `abort_after_ms` after the stall, end the ranks
    /// the stall names (the suspects of its capture, else the ranks whose
    /// last advance is the oldest) so that the launcher restarts the job.
    Abort,
}

/// The default grace between STALLED and the end of its ranks under
/// `on_stall: ABORT`: 60 s.
pub const DEFAULT_ABORT_AFTER_MS: u64 = 60_000;
