//! The events a run's stored document holds, derived from it alone (pure).
//!
//! A document keeps everything a notification tells of: its end (status,
//! time, cause), its health changes (`health_history`, the latest 32) and
//! its attempts. So the events of a run are a function of its document,
//! and so are their ids: a run read again after a crash, or read once
//! after many changes, yields the same events with the same ids, and
//! nothing the document keeps is lost by collapsing its changes.

use serde::Deserialize;
use trainstate_schema::api::{CaptureState, NotifyEvent, NotifyEventKind, NotifyNode};
use trainstate_schema::limits::MAX_NOTIFY_SUSPECTS;
use trainstate_schema::text::one_line;
use trainstate_schema::{
    CauseClass, CauseKind, HealthChange, HealthState, RunCause, RunGoodput, RunHealth, RunStatus,
};

use crate::decisions::time_text;

/// The longest `detail` an event carries, in characters.
pub(crate) const MAX_DETAIL_CHARS: usize = 500;

/// A run's stored document, as far as notifications read it. The stored
/// JSON is the head's own canonical form of a validated run; the members
/// not named here are skipped unparsed.
#[derive(Debug, Deserialize)]
pub(crate) struct StoredRun {
    id: String,
    name: String,
    job_id: String,
    #[serde(default)]
    cluster: Option<String>,
    run_status: RunStatus,
    #[serde(default)]
    status: Option<RunStatus>,
    #[serde(default)]
    status_detail: String,
    #[serde(default)]
    end_time_ms: Option<u64>,
    #[serde(default)]
    cause: Option<RunCause>,
    #[serde(default)]
    health: Option<RunHealth>,
    #[serde(default)]
    health_history: Vec<HealthChange>,
    #[serde(default)]
    attempts: Vec<StoredAttempt>,
    #[serde(default)]
    workers: Vec<StoredWorker>,
    #[serde(default)]
    goodput: Option<RunGoodput>,
}

#[derive(Debug, Deserialize)]
struct StoredAttempt {
    attempt_id: String,
    start_time_ms: u64,
    #[serde(default)]
    status_detail: String,
    #[serde(default)]
    cause: Option<RunCause>,
}

#[derive(Debug, Deserialize)]
struct StoredWorker {
    world_rank: u32,
    node_id: String,
    node_ip: String,
}

impl StoredRun {
    /// The run's id.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The run's cluster.
    pub(crate) fn cluster(&self) -> Option<&str> {
        self.cluster.as_deref()
    }

    /// The run's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The run's lifecycle status.
    pub(crate) fn status(&self) -> RunStatus {
        self.status.unwrap_or(self.run_status)
    }

    /// The node of rank `rank` among the current attempt's workers.
    fn node_of(&self, rank: u32) -> Option<NotifyNode> {
        self.workers
            .iter()
            .find(|w| w.world_rank == rank)
            .map(|w| NotifyNode::new(rank, w.node_id.clone(), w.node_ip.clone()))
    }
}

/// A stall, as the event that ends it (a recovery, the run's end) names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stall {
    /// When the run stalled (Unix ms): the id of its `STALLED` event.
    pub(crate) since_ms: u64,
    /// The ranks it named.
    pub(crate) ranks: Vec<u32>,
    /// The node of the first of them.
    pub(crate) node: Option<NotifyNode>,
}

/// One event of a run, ready to be sent in any format.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Notice {
    /// What a webhook receives (and what the other formats are made from).
    pub(crate) event: NotifyEvent,
    /// For a recovery, the stall it ends; for an end, the stall the run
    /// ended in, if it did. An Alertmanager target resolves that stall's
    /// alert when it sends this event.
    pub(crate) ends_stall: Option<Stall>,
    /// A stall whose capture of the ranks' stacks is still pending: the
    /// event is the document's, but it is sent once the capture is
    /// complete (a later document), naming its suspects.
    pub(crate) awaits_capture: bool,
}

impl Notice {
    /// The event's id.
    pub(crate) fn id(&self) -> &str {
        &self.event.event_id
    }

    /// Its kind.
    pub(crate) fn kind(&self) -> NotifyEventKind {
        self.event.event
    }

    /// Whose fault it tells of: a stall's (and its recovery's) is
    /// `NO_PROGRESS` of no kind; an end's or a restart's, its cause's.
    pub(crate) fn fault(&self) -> Fault {
        match self.kind() {
            NotifyEventKind::Stalled | NotifyEventKind::Recovered => Fault::STALL,
            _ => Fault {
                class: self.event.cause.as_ref().map(|c| c.class),
                kind: self.event.cause.as_ref().map(|c| c.kind),
            },
        }
    }
}

/// What an event is judged by: its class and its cause's kind, where it
/// has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fault {
    /// The event's class: its cause's, or `NO_PROGRESS` for a stall.
    pub(crate) class: Option<CauseClass>,
    /// Its cause's kind.
    pub(crate) kind: Option<CauseKind>,
}

impl Fault {
    /// A stall's: no progress, of no kind.
    pub(crate) const STALL: Fault = Fault { class: Some(CauseClass::NoProgress), kind: None };
}

/// Every event of `run`, oldest first (the end last), each with its link
/// under `link_base` (the head's public URL), if there is one.
pub(crate) fn derive(run: &StoredRun, link_base: Option<&str>) -> Vec<Notice> {
    let link = link_base.map(|base| format!("{}/runs/{}", base.trim_end_matches('/'), run.id));
    let event = |event_id: String, kind: NotifyEventKind, at_ms: u64| {
        let mut event = NotifyEvent::new(
            event_id,
            kind,
            run.id.clone(),
            run.name.clone(),
            run.job_id.clone(),
            run.status(),
            at_ms,
        );
        event.cluster.clone_from(&run.cluster);
        event.health = run.health.as_ref().map(|h| h.state);
        event.link.clone_from(&link);
        event
    };
    let mut notices = Vec::new();

    for (i, attempt) in run.attempts.iter().enumerate().skip(1) {
        let kind = NotifyEventKind::Restarting;
        let id = format!("{}:{kind}:{}", run.id, attempt.attempt_id);
        let mut event = event(id, kind, attempt.start_time_ms);
        event.attempt_id = Some(attempt.attempt_id.clone());
        let previous = &run.attempts[i - 1];
        event.cause.clone_from(&previous.cause);
        let why = summary(&previous.status_detail, previous.cause.as_ref());
        event.detail = if why.is_empty() {
            format!(
                "Attempt {} started after attempt {} ended.",
                attempt.attempt_id, previous.attempt_id
            )
        } else {
            format!(
                "Attempt {} started after attempt {} ended: {why}",
                attempt.attempt_id, previous.attempt_id
            )
        };
        notices.push(Notice { event, ends_stall: None, awaits_capture: false });
    }
    // The latest restart is the one that put the run in its restart loop,
    // once its attempt is there: a run counts a restart when it turns
    // RESTARTING, before the restart's attempt starts, and the restart
    // before it must not be told as the loop meanwhile.
    if let Some(goodput) = run.goodput.as_ref().filter(|g| g.restart_loop)
        && restarts_with_attempts(run, goodput) >= goodput.restarts_since_checkpoint
        && let Some(latest) = notices.last_mut()
    {
        latest.event.restart_loop = true;
        latest.event.detail = format!("{} {}", restart_loop_words(goodput), latest.event.detail);
    }

    let mut open_stall: Option<Stall> = None;
    // When a rank last advanced before the open stall: its length is
    // counted from it (from the stall itself when the history does not say).
    let mut stalled_from = 0;
    for change in &run.health_history {
        let stall = |change: &HealthChange| Stall {
            since_ms: change.at_ms,
            ranks: change.ranks.clone(),
            node: change.ranks.first().and_then(|&rank| run.node_of(rank)),
        };
        match change.state {
            HealthState::Stalled => {
                let kind = NotifyEventKind::Stalled;
                let id = format!("{}:{kind}:{}", run.id, change.at_ms);
                let mut event = event(id, kind, change.at_ms);
                let now = stall(change);
                event.ranks.clone_from(&now.ranks);
                event.node.clone_from(&now.node);
                // The run's health is this stall's while the run has not
                // moved since: its detail and its capture are this stall's.
                let current = run.health.as_ref().filter(|health| {
                    health.state == HealthState::Stalled && health.since_ms == change.at_ms
                });
                event.detail = match current {
                    Some(health) if !health.detail.is_empty() => health.detail.clone(),
                    _ => format!(
                        "No rank advanced for the run's stall window, from {}{}.",
                        time_text::iso_ms(change.at_ms),
                        ranks_named(&now.ranks)
                    ),
                };
                let capture = current.and_then(|health| health.capture.as_ref());
                // A capture still pending is waited for while the run lives:
                // its completion is written within the capture's deadline,
                // and the stall is told then, once, with its suspects. A run
                // that ended (or moved) will see no more of it: told now.
                let awaits_capture = capture.is_some_and(|c| c.state == CaptureState::Pending)
                    && !status_ended(run.status());
                if let Some(capture) = capture.filter(|c| c.state == CaptureState::Complete) {
                    event.suspects =
                        capture.suspects.iter().take(MAX_NOTIFY_SUSPECTS).cloned().collect();
                    event.suspects_left_out =
                        capture.suspects.len().saturating_sub(MAX_NOTIFY_SUSPECTS) as u32;
                }
                if capture.is_some() {
                    event.stacks_url = link_base.map(|base| {
                        format!("{}/api/train/runs/{}/stacks", base.trim_end_matches('/'), run.id)
                    });
                }
                notices.push(Notice { event, ends_stall: None, awaits_capture });
                stalled_from = change.last_advance_ms.unwrap_or(change.at_ms);
                open_stall = Some(now);
            }
            HealthState::Progressing => {
                // A first PROGRESSING is no recovery; nor one whose stall
                // has left the bounded history (it was told long ago).
                let Some(ended) = open_stall.take() else { continue };
                let kind = NotifyEventKind::Recovered;
                let id = format!("{}:{kind}:{}", run.id, change.at_ms);
                let mut event = event(id, kind, change.at_ms);
                event.ranks.clone_from(&ended.ranks);
                event.node.clone_from(&ended.node);
                // The stall's length: from the last advance before it (when
                // the history says) to the advance that ended it.
                event.detail = format!(
                    "A rank advanced again at {}, after {} without an advance.",
                    time_text::iso_ms(change.at_ms),
                    time_text::seconds(change.at_ms.saturating_sub(stalled_from))
                );
                notices.push(Notice { event, ends_stall: Some(ended), awaits_capture: false });
            }
            _ => {}
        }
    }

    let status = run.status();
    if let Some(kind) = NotifyEventKind::ending(status) {
        let at_ms = run.end_time_ms.unwrap_or_default();
        let mut event = event(format!("{}:{kind}", run.id), kind, at_ms);
        event.cause = run.cause.clone();
        event.goodput.clone_from(&run.goodput);
        if let Some(rank) = run.cause.as_ref().and_then(|c| c.failed_world_rank) {
            event.ranks = vec![rank];
            event.node = run.node_of(rank);
        }
        let detail = summary(&run.status_detail, run.cause.as_ref());
        event.detail = if detail.is_empty() {
            format!("The run {} at {}.", ended_words(status), time_text::iso_ms(at_ms))
        } else {
            detail
        };
        if open_stall.is_some() {
            // The end resolves the stall it ended in: said first, so that
            // no truncation of a long detail loses it.
            event.detail = format!(
                "It ended while stalled: no rank advanced since {}. {}",
                time_text::iso_ms(stalled_from),
                event.detail
            );
        }
        notices.push(Notice { event, ends_stall: open_stall.take(), awaits_capture: false });
    }

    // Oldest first; of one millisecond, in the order above (attempts,
    // health, the end), which the stable sort keeps.
    notices.sort_by_key(|n| {
        if NotifyEventKind::ending(status) == Some(n.kind()) { u64::MAX } else { n.event.at_ms }
    });
    for notice in &mut notices {
        notice.event.detail = truncated(&notice.event.detail, MAX_DETAIL_CHARS);
    }
    notices
}

/// What a restart event says of a run in a restart loop, first: how many
/// attempts failed since its last checkpoint mark, or since its start.
/// How many of the restarts since the checkpoint (or the run's start)
/// have their attempt in the run: the attempts after the mark's.
fn restarts_with_attempts(run: &StoredRun, goodput: &RunGoodput) -> u32 {
    let marked = goodput
        .checkpoint
        .as_ref()
        .and_then(|mark| run.attempts.iter().position(|a| a.attempt_id == mark.attempt_id))
        .unwrap_or(0);
    u32::try_from(run.attempts.len().saturating_sub(marked + 1)).unwrap_or(u32::MAX)
}

fn restart_loop_words(goodput: &RunGoodput) -> String {
    let failed = goodput.restarts_since_checkpoint;
    match &goodput.checkpoint {
        Some(mark) => format!(
            "Restart loop: {failed} attempts failed since the last checkpoint (step {}).",
            mark.step
        ),
        None => format!("Restart loop: {failed} attempts failed since the run's start."),
    }
}

/// One line of an ended run's goodput, for a chat message or an alert:
/// its ratio and its largest badput bucket.
pub(crate) fn goodput_line(goodput: &RunGoodput) -> Option<String> {
    let ratio = goodput.ratio?;
    let largest = trainstate_schema::GoodputBucket::ALL
        .into_iter()
        .skip(1)
        .map(|bucket| (bucket, goodput.badput.get(bucket)))
        .filter(|(_, ms)| *ms > 0)
        .max_by_key(|(_, ms)| *ms);
    let mut line =
        format!("Goodput {:.0}% of {}", ratio * 100.0, time_text::duration_words(goodput.wall_ms));
    if let Some((bucket, ms)) = largest {
        line.push_str(&format!(
            "; most lost to {}: {}",
            bucket.as_str().replace('_', " "),
            time_text::duration_words(ms)
        ));
    }
    Some(line)
}

/// What a notification says of a failure: the report of the rank that
/// failed first, when the head judged the cause from the ranks' reports
/// (`cause.report`), else `text` in one line.
fn summary(text: &str, cause: Option<&RunCause>) -> String {
    match cause.and_then(|cause| cause.report.as_deref()) {
        Some(report) => report.to_owned(),
        None => one_line(text),
    }
}

/// `text`, cut to `max` characters (the last one an ellipsis when cut).
pub(crate) fn truncated(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(max.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// True for a run's end: FINISHED, ERRORED, ABORTED.
fn status_ended(status: RunStatus) -> bool {
    NotifyEventKind::ending(status).is_some()
}

/// A stall's suspects in lines for a person, the text of each as the
/// capture gives it (the caller escapes it for its format): `rank 2 on
/// node-a: rank_two_is_stuck (train.py:41)`, then `and 3 more (see the
/// capture)`. Empty when the event names none.
pub(crate) fn suspect_lines(event: &NotifyEvent) -> Vec<String> {
    let mut lines: Vec<String> = event
        .suspects
        .iter()
        .map(|s| match &s.node {
            Some(node) => {
                format!("rank {} on {}: {}", s.rank, one_line(node), one_line(&s.innermost))
            }
            None => format!("rank {}: {}", s.rank, one_line(&s.innermost)),
        })
        .collect();
    if event.suspects_left_out > 0 {
        lines.push(format!("and {} more (see the capture)", event.suspects_left_out));
    }
    lines
}

/// `; ranks 1, 2 named` for the ranks a stall names, or nothing.
fn ranks_named(ranks: &[u32]) -> String {
    match ranks {
        [] => String::new(),
        [rank] => format!("; rank {rank} named"),
        ranks => {
            let list: Vec<String> = ranks.iter().map(u32::to_string).collect();
            format!("; ranks {} named", list.join(", "))
        }
    }
}

/// `errored`, `was aborted`, `finished`: how a run with `status` ended.
pub(crate) fn ended_words(status: RunStatus) -> &'static str {
    match status {
        RunStatus::Errored => "errored",
        RunStatus::Aborted => "was aborted",
        _ => "finished",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const T0: u64 = 1_760_000_000_000;

    fn run(extra: serde_json::Value) -> StoredRun {
        let mut doc = json!({
            "id": "r1", "name": "bert", "job_id": "j1", "controller_actor_id": "c",
            "workers": [
                {"world_rank": 0, "node_id": "n0", "node_ip": "10.0.0.1", "pid": 1},
                {"world_rank": 1, "node_id": "n1", "node_ip": "10.0.0.2", "pid": 2},
            ],
            "datasets": [], "run_status": "RUNNING", "status": "RUNNING",
            "start_time_ms": T0, "end_time_ms": null,
            "attempts": [{"attempt_id": "a0", "start_time_ms": T0}],
        });
        for (k, v) in extra.as_object().unwrap() {
            doc[k] = v.clone();
        }
        serde_json::from_value(doc).unwrap()
    }

    fn ids(notices: &[Notice]) -> Vec<&str> {
        notices.iter().map(Notice::id).collect()
    }

    #[test]
    fn a_live_run_without_changes_holds_no_event() {
        assert!(derive(&run(json!({})), None).is_empty());
    }

    #[test]
    fn a_cause_the_head_judged_is_told_by_the_ranks_report_not_by_what_followed_it() {
        let doc = run(json!({
            "run_status": "ERRORED", "status": "ERRORED", "end_time_ms": T0 + 5_000,
            "status_detail": "Rank 1 worker raised an error.\nValueError: boom\n\nThen, not the cause:\n- rank 2 0.5 s later: ABORTED (RAISED) SIGTERM",
            "cause": {"kind": "USER_ERROR", "failed_world_rank": 1, "how": "RAISED", "failed_at_ms": T0 + 4_000,
                      "report": "Rank 1 worker raised an error. … ValueError: boom"},
        }));
        let notices = derive(&doc, None);
        assert_eq!(notices[0].event.detail, "Rank 1 worker raised an error. … ValueError: boom");
        assert_eq!(notices[0].event.ranks, [1]);
    }

    #[test]
    fn an_errored_run_names_its_failed_rank_and_node_and_links_its_page() {
        let doc = run(json!({
            "run_status": "ERRORED", "status": "ERRORED", "end_time_ms": T0 + 5_000,
            "status_detail": "Rank 1 worker raised an error.\nTraceback (most recent call last):\n  File \"train.py\", line 3\nValueError: bad batch\n",
            "cause": {"kind": "USER_ERROR", "failed_world_rank": 1},
        }));
        let notices = derive(&doc, Some("https://ts.example/"));
        assert_eq!(ids(&notices), ["r1:ERRORED"]);
        let event = &notices[0].event;
        assert_eq!(event.at_ms, T0 + 5_000);
        assert_eq!(event.ranks, [1]);
        assert_eq!(event.node, Some(NotifyNode::new(1, "n1", "10.0.0.2")));
        assert_eq!(event.detail, "Rank 1 worker raised an error. … ValueError: bad batch");
        assert_eq!(event.link.as_deref(), Some("https://ts.example/runs/r1"));
        assert_eq!(event.cause.as_ref().and_then(|c| c.failed_world_rank), Some(1));
    }

    #[test]
    fn stalls_recoveries_and_restarts_come_oldest_first_with_ids_from_the_document() {
        let doc = run(json!({
            "run_status": "ABORTED", "status": "ABORTED", "end_time_ms": T0 + 90_000,
            "attempts": [
                {"attempt_id": "a0", "start_time_ms": T0, "status_detail": "node lost"},
                {"attempt_id": "a1", "start_time_ms": T0 + 20_000},
            ],
            "health": {"state": "STALLED", "since_ms": T0 + 60_000, "ranks": [0], "detail": "No rank has advanced for 10 s."},
            "health_history": [
                {"state": "PROGRESSING", "at_ms": T0 + 1_000, "ranks": []},
                {"state": "STALLED", "at_ms": T0 + 10_000, "ranks": [1], "last_advance_ms": T0 + 2_000},
                {"state": "PROGRESSING", "at_ms": T0 + 15_000, "ranks": []},
                {"state": "STALLED", "at_ms": T0 + 60_000, "ranks": [0]},
            ],
        }));
        let notices = derive(&doc, None);
        assert_eq!(
            ids(&notices),
            [
                format!("r1:STALLED:{}", T0 + 10_000),
                format!("r1:RECOVERED:{}", T0 + 15_000),
                "r1:RESTARTING:a1".to_owned(),
                format!("r1:STALLED:{}", T0 + 60_000),
                "r1:ABORTED".to_owned(),
            ]
        );
        let recovered = &notices[1];
        assert_eq!(recovered.event.ranks, [1], "the recovery names the stall's ranks");
        assert_eq!(recovered.ends_stall.as_ref().map(|s| s.since_ms), Some(T0 + 10_000));
        // From the last advance before the stall to the one that ended it.
        assert!(
            recovered.event.detail.contains("after 13 s without an advance"),
            "{}",
            recovered.event.detail
        );
        assert_eq!(notices[2].event.attempt_id.as_deref(), Some("a1"));
        assert!(notices[2].event.detail.ends_with("attempt a0 ended: node lost"));
        assert_eq!(notices[3].event.detail, "No rank has advanced for 10 s.");
        let end = &notices[4];
        assert_eq!(end.ends_stall.as_ref().map(|s| s.since_ms), Some(T0 + 60_000));
        assert_eq!(
            end.event.detail,
            format!(
                "It ended while stalled: no rank advanced since {}. The run was aborted at {}.",
                time_text::iso_ms(T0 + 60_000),
                time_text::iso_ms(T0 + 90_000)
            )
        );
        // The same document, read again, gives the same events.
        assert_eq!(derive(&doc, None), notices);
    }

    #[test]
    fn every_stall_is_resolved_by_its_recovery_or_by_the_runs_end() {
        let stalled = json!({"state": "STALLED", "at_ms": T0 + 12_000, "ranks": [1], "last_advance_ms": T0 + 2_000});
        // (what the run's history holds after the stall, the events, what
        // the end resolves, words the last event's detail holds)
        let cases = [
            (
                "recovered then finished",
                json!([stalled, {"state": "PROGRESSING", "at_ms": T0 + 42_000, "ranks": []}]),
                vec!["STALLED", "RECOVERED", "FINISHED"],
                None,
                "The run finished",
            ),
            (
                "ended while stalled",
                json!([{"state": "STALLED", "at_ms": T0 + 12_000, "ranks": [1], "last_advance_ms": T0 + 2_000, "ended_ms": T0 + 50_000}]),
                vec!["STALLED", "FINISHED"],
                Some(T0 + 12_000),
                "It ended while stalled: no rank advanced since",
            ),
        ];
        for (what, history, kinds, resolved, words) in cases {
            let doc = run(json!({
                "run_status": "FINISHED", "status": "FINISHED", "end_time_ms": T0 + 50_000,
                "health_history": history,
            }));
            let notices = derive(&doc, None);
            let seen: Vec<String> = notices.iter().map(|n| n.kind().to_string()).collect();
            assert_eq!(seen, kinds, "{what}");
            let end = notices.last().unwrap();
            assert_eq!(end.ends_stall.as_ref().map(|s| s.since_ms), resolved, "{what}");
            assert!(end.event.detail.contains(words), "{what}: {}", end.event.detail);
            if let Some(recovered) = notices.iter().find(|n| n.kind() == NotifyEventKind::Recovered)
            {
                // A 40 s pause reads 40 s: from the last advance before the
                // stall to the advance that ended it.
                assert_eq!(recovered.event.at_ms, T0 + 42_000, "{what}");
                assert!(
                    recovered.event.detail.contains("after 40 s without an advance"),
                    "{what}: {}",
                    recovered.event.detail
                );
            }
        }
    }

    #[test]
    fn a_restart_carries_the_cause_of_the_attempt_that_ended_and_a_stall_is_no_progress() {
        let doc = run(json!({
            "attempts": [
                {"attempt_id": "a0", "start_time_ms": T0, "status_detail": "preempted",
                 "cause": {"kind": "PREEMPTED", "failed_world_rank": 1}},
                {"attempt_id": "a1", "start_time_ms": T0 + 20_000},
            ],
            "health_history": [{"state": "STALLED", "at_ms": T0 + 30_000, "ranks": [0]}],
        }));
        let notices = derive(&doc, None);
        let restart = &notices[0];
        assert_eq!(restart.kind(), NotifyEventKind::Restarting);
        let cause = restart.event.cause.as_ref().unwrap();
        assert_eq!((cause.kind, cause.class), (CauseKind::Preempted, CauseClass::Interrupted));
        assert_eq!(
            restart.fault(),
            Fault { class: Some(CauseClass::Interrupted), kind: Some(CauseKind::Preempted) }
        );
        assert_eq!(notices[1].fault(), Fault::STALL);
    }

    /// A run's document with `attempts` and `goodput`.
    fn doc_json(attempts: &[serde_json::Value], goodput: &serde_json::Value) -> serde_json::Value {
        json!({"run_status": "RUNNING", "attempts": attempts, "goodput": goodput})
    }

    #[test]
    fn an_ended_run_carries_its_goodput_and_the_latest_restart_tells_of_a_restart_loop() {
        let goodput = json!({
            "wall_ms": 100_000, "productive_ms": 60_000, "ratio": 0.6, "as_of_ms": T0 + 100_000,
            "badput": {"waiting_to_start_ms": 10_000, "restarting_ms": 30_000, "stalled_ms": 0,
                       "checkpointing_ms": 0, "progress_lost_ms": 0, "slower_than_pace_ms": 0},
            "checkpoint": {"step": 40, "at_ms": T0 + 5_000, "attempt_id": "a0"},
            "productive_at_checkpoint_ms": 60_000, "restarts_since_checkpoint": 3,
            "restart_loop": true,
        });
        let attempts: Vec<serde_json::Value> = (0..4)
            .map(|i| json!({"attempt_id": format!("a{i}"), "start_time_ms": T0 + i * 10_000}))
            .collect();
        let doc = run(json!({
            "run_status": "ERRORED", "status": "ERRORED", "end_time_ms": T0 + 100_000,
            "attempts": attempts, "goodput": goodput,
        }));
        let notices = derive(&doc, None);
        let loops: Vec<bool> = notices.iter().map(|n| n.event.restart_loop).collect();
        assert_eq!(loops, [false, false, true, false], "only the latest restart");
        assert!(
            notices[2].event.detail.starts_with(
                "Restart loop: 3 attempts failed since the last checkpoint (step 40). Attempt a3"
            ),
            "{}",
            notices[2].event.detail
        );
        // Turned RESTARTING for the third time, before that restart's
        // attempt: no restart told so far is the loop's.
        let mut between = doc_json(&attempts[..3], &goodput);
        between["run_status"] = json!("RESTARTING");
        let loops: Vec<bool> =
            derive(&run(between), None).iter().map(|n| n.event.restart_loop).collect();
        assert_eq!(loops, [false, false], "the second restart is not the loop's");
        let ended = notices.last().unwrap();
        assert_eq!(ended.kind(), NotifyEventKind::Errored);
        let carried = ended.event.goodput.as_ref().unwrap();
        assert_eq!(carried.productive_ms, 60_000);
        assert!(notices[..3].iter().all(|n| n.event.goodput.is_none()), "only the end's");
        assert_eq!(
            goodput_line(carried).unwrap(),
            "Goodput 60% of 1 min 40 s; most lost to restarting: 30 s"
        );
    }

    #[test]
    fn a_failure_is_summed_up_by_its_causes_report_not_by_the_detail() {
        let text = "Rank 1 worker raised an error.\nValueError: bad batch\n\nThen, not the cause:\n  \
                    rank 0, 0.1 s later: RuntimeError: Connection closed by peer";
        let mut judged = RunCause::new(trainstate_schema::CauseKind::UserError, Some(1))
            .with_failure(Some(trainstate_schema::FailureMode::Raised), Some(T0));
        judged.report = Some("Rank 1 worker raised an error. … ValueError: bad batch".into());
        assert_eq!(summary(text, Some(&judged)), judged.report.clone().unwrap());
        // Without a report (a controller's cause), the detail in one line.
        assert_eq!(
            summary(text, None),
            "Rank 1 worker raised an error. … rank 0, 0.1 s later: RuntimeError: Connection closed by peer"
        );
    }

    #[test]
    fn details_are_bounded_and_never_raw_milliseconds() {
        let doc = run(json!({
            "run_status": "ERRORED", "status": "ERRORED", "end_time_ms": T0,
            "status_detail": "x".repeat(5_000),
            "health_history": [{"state": "STALLED", "at_ms": T0 - 1, "ranks": [0, 1]}],
        }));
        let notices = derive(&doc, None);
        assert_eq!(notices[1].event.detail.chars().count(), MAX_DETAIL_CHARS);
        let stalled = &notices[0].event.detail;
        assert!(!stalled.contains(&(T0 - 1).to_string()), "{stalled}");
        assert!(stalled.ends_with("; ranks 0, 1 named."), "{stalled}");
    }

    /// A run STALLED since `T0 + 60_000` (after a first PROGRESSING), its
    /// health carrying `capture` (null for none), now `status`.
    fn stalled_with(capture: serde_json::Value, status: &str) -> StoredRun {
        let mut health = json!({"state": "STALLED", "since_ms": T0 + 60_000, "ranks": [0],
                                "detail": "No rank has advanced for 1 min."});
        if !capture.is_null() {
            health["capture"] = capture;
        }
        let ended = (status != "RUNNING").then_some(T0 + 90_000);
        run(json!({
            "run_status": status, "status": status, "end_time_ms": ended,
            "health": health,
            "health_history": [
                {"state": "PROGRESSING", "at_ms": T0 + 1_000, "ranks": []},
                {"state": "STALLED", "at_ms": T0 + 60_000, "ranks": [0], "last_advance_ms": T0},
            ],
        }))
    }

    #[test]
    fn a_stall_is_told_once_its_capture_is_complete_naming_its_suspects() {
        let suspects: Vec<serde_json::Value> = (0..7)
            .map(|i| json!({"rank": 2 + i, "node": format!("node-{i}"), "innermost": if i == 0 { "rank_two_is_stuck (train.py:41)".to_owned() } else { format!("wait_{i} (train.py:9)") }}))
            .collect();
        let pending = json!({"capture_id": 1, "state": "PENDING", "suspects": []});
        let complete = json!({"capture_id": 1, "state": "COMPLETE", "suspects": suspects});
        let stall_id = format!("r1:STALLED:{}", T0 + 60_000);
        let stall_of = |doc: &StoredRun| {
            derive(doc, Some("https://ts.example/")).into_iter().find(|n| n.id() == stall_id)
        };

        // (what, the capture, the run's status, awaits its capture,
        // suspects named, left out, the capture linked)
        let cases = [
            ("no capture: told at once", serde_json::Value::Null, "RUNNING", false, 0, 0, false),
            ("a pending capture: not told yet", pending.clone(), "RUNNING", true, 0, 0, true),
            ("complete: told, naming suspects", complete.clone(), "RUNNING", false, 5, 2, true),
            ("pending when the run ended: told", pending, "ABORTED", false, 0, 0, true),
        ];
        for (what, capture, status, awaits, named, left_out, linked) in cases {
            let notice = stall_of(&stalled_with(capture, status)).expect(what);
            assert_eq!(notice.awaits_capture, awaits, "{what}");
            assert_eq!(notice.event.suspects.len(), named, "{what}");
            assert_eq!(notice.event.suspects_left_out, left_out, "{what}");
            assert_eq!(notice.event.stacks_url.is_some(), linked, "{what}");
            assert_eq!(notice.event.detail, "No rank has advanced for 1 min.", "{what}");
        }

        let notice = stall_of(&stalled_with(complete, "RUNNING")).unwrap();
        let first = &notice.event.suspects[0];
        assert_eq!((first.rank, first.node.as_deref()), (2, Some("node-0")));
        assert_eq!(first.innermost, "rank_two_is_stuck (train.py:41)");
        assert_eq!(
            notice.event.stacks_url.as_deref(),
            Some("https://ts.example/api/train/runs/r1/stacks")
        );
        assert_eq!(
            suspect_lines(&notice.event)[0],
            "rank 2 on node-0: rank_two_is_stuck (train.py:41)"
        );
        assert_eq!(suspect_lines(&notice.event)[5], "and 2 more (see the capture)");
        // The webhook's JSON carries them.
        let body = serde_json::to_value(&notice.event).unwrap();
        assert_eq!(body["suspects"][0]["innermost"], "rank_two_is_stuck (train.py:41)");
        assert_eq!(body["stacks_url"], "https://ts.example/api/train/runs/r1/stacks");
    }
}
