//! Alertmanager's alerts for events (pure): what `POST /api/v2/alerts`
//! takes, one alert per run and condition.
//!
//! Alertmanager tells alerts apart by their labels: `alertname`
//! (`TrainRunStalled`, `TrainRunErrored`, ...), `run_id`, `run_name`,
//! `cluster`, `job_id`, `node` (the IP of the first rank named), `severity`
//! and, for a restart, `attempt_id`. An alert is firing until its `endsAt`:
//!
//! - a stall is a condition that holds: its alert is sent again every
//!   `resend` with `endsAt` four resends ahead (as Prometheus does), and
//!   with `endsAt` now once the run advances again or ends;
//! - an end or a restart happens once: its alert is sent once, firing for
//!   [`ONE_SHOT_HOLD`], after which Alertmanager resolves it.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use serde_json::{Value, json};
use trainstate_schema::api::{NotifyEvent, NotifyEventKind};

use super::events::{Notice, Stall, ended_words, goodput_line, suspect_lines};

/// How long the alert of an end or a restart fires.
pub(crate) const ONE_SHOT_HOLD: Duration = Duration::from_secs(3600);

/// One alert, without its `endsAt` (which is decided when it is sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Alert {
    labels: BTreeMap<&'static str, String>,
    annotations: BTreeMap<&'static str, String>,
    starts_at_ms: u64,
    generator_url: Option<String>,
}

impl Alert {
    /// The alert as Alertmanager takes it, ending at `ends_at_ms`.
    pub(crate) fn to_json(&self, ends_at_ms: u64) -> Value {
        let mut alert = json!({
            "labels": self.labels,
            "annotations": self.annotations,
            "startsAt": rfc3339(self.starts_at_ms),
            "endsAt": rfc3339(ends_at_ms.max(self.starts_at_ms)),
        });
        if let Some(url) = &self.generator_url {
            alert["generatorURL"] = json!(url);
        }
        alert
    }
}

/// The alerts that sending `notice` posts, each with its `endsAt`, at
/// `now_ms`: the event's own alert when the target sends its kind
/// (`sends`), and the resolution of the stall it ends when the target
/// sends stalls; the stall's alert as it was sent is `fired`, if known.
pub(crate) fn alerts_for(
    notice: &Notice,
    sends: impl Fn(NotifyEventKind) -> bool,
    fired: Option<&Alert>,
    now_ms: u64,
    resend: Duration,
) -> Vec<Value> {
    let event = &notice.event;
    let mut alerts = Vec::new();
    match event.event {
        NotifyEventKind::Stalled => {
            if sends(NotifyEventKind::Stalled) {
                alerts.push(stall_alert(event).to_json(firing_until(now_ms, resend)));
            }
        }
        NotifyEventKind::Recovered => {}
        kind => {
            if sends(kind) {
                let ends = now_ms.saturating_add(ONE_SHOT_HOLD.as_millis() as u64);
                alerts.push(one_shot_alert(event).to_json(ends));
            }
        }
    }
    if let Some(stall) = &notice.ends_stall
        && sends(NotifyEventKind::Stalled)
    {
        let resolved = fired.cloned().unwrap_or_else(|| ended_stall_alert(event, stall));
        alerts.push(resolved.to_json(now_ms));
    }
    alerts
}

/// When a firing stall alert sent at `now_ms` ends if it is not sent again.
pub(crate) fn firing_until(now_ms: u64, resend: Duration) -> u64 {
    now_ms.saturating_add(4 * resend.as_millis() as u64)
}

/// The alert of the stall a `STALLED` event tells of.
pub(crate) fn stall_alert(event: &NotifyEvent) -> Alert {
    let stall =
        Stall { since_ms: event.at_ms, ranks: event.ranks.clone(), node: event.node.clone() };
    let mut alert = ended_stall_alert(event, &stall);
    alert.annotations.insert("description", event.detail.clone());
    // Where to look first, once the capture of the ranks' stacks is
    // complete: a line per suspect, and the capture itself.
    let suspects = suspect_lines(event);
    if !suspects.is_empty() {
        alert.annotations.insert("suspects", suspects.join("\n"));
    }
    if let Some(url) = &event.stacks_url {
        alert.annotations.insert("stacks_url", url.clone());
    }
    alert
}

/// The alert of `stall`, as the later `event` (a recovery, the run's end)
/// rebuilds it to resolve it: the same labels as the stall's own.
fn ended_stall_alert(event: &NotifyEvent, stall: &Stall) -> Alert {
    let mut labels = run_labels(event, "TrainRunStalled", "warning");
    if let Some(node) = &stall.node {
        labels.insert("node", node.node_ip.clone());
    }
    let summary = match &event.cluster {
        Some(cluster) => format!("Run {} stalled on {cluster}", event.name),
        None => format!("Run {} stalled", event.name),
    };
    let mut annotations = BTreeMap::from([("summary", summary)]);
    if event.event != NotifyEventKind::Stalled {
        annotations.insert("description", event.detail.clone());
    }
    Alert { labels, annotations, starts_at_ms: stall.since_ms, generator_url: event.link.clone() }
}

/// The alert of an end or a restart.
fn one_shot_alert(event: &NotifyEvent) -> Alert {
    let (name, severity) = match event.event {
        NotifyEventKind::Errored => ("TrainRunErrored", "critical"),
        NotifyEventKind::Aborted => ("TrainRunAborted", "warning"),
        NotifyEventKind::Restarting => ("TrainRunRestarting", "warning"),
        _ => ("TrainRunFinished", "info"),
    };
    let mut labels = run_labels(event, name, severity);
    if let Some(node) = &event.node {
        labels.insert("node", node.node_ip.clone());
    }
    if let Some(attempt) = &event.attempt_id {
        labels.insert("attempt_id", attempt.clone());
    }
    if let Some(cause) = &event.cause {
        labels.insert("cause", cause.kind.to_string());
        labels.insert("class", cause.class.to_string());
    }
    let what = match event.event {
        NotifyEventKind::Restarting => "restarts",
        _ => ended_words(event.status),
    };
    let summary = match &event.cluster {
        Some(cluster) => format!("Run {} {what} on {cluster}", event.name),
        None => format!("Run {} {what}", event.name),
    };
    let mut annotations =
        BTreeMap::from([("summary", summary), ("description", event.detail.clone())]);
    if let Some(line) = event.goodput.as_ref().and_then(goodput_line) {
        annotations.insert("goodput", line);
    }
    if event.restart_loop {
        labels.insert("restart_loop", "true".to_owned());
    }
    Alert { labels, annotations, starts_at_ms: event.at_ms, generator_url: event.link.clone() }
}

/// The labels every alert of a run has. A label with no value is left
/// out (Alertmanager treats an empty label as a missing one).
fn run_labels(
    event: &NotifyEvent,
    alertname: &str,
    severity: &str,
) -> BTreeMap<&'static str, String> {
    let mut labels = BTreeMap::from([
        ("alertname", alertname.to_owned()),
        ("severity", severity.to_owned()),
        ("run_id", event.run_id.clone()),
        ("run_name", event.name.clone()),
        ("job_id", event.job_id.clone()),
    ]);
    if let Some(cluster) = &event.cluster {
        labels.insert("cluster", cluster.clone());
    }
    labels.retain(|_, value| !value.is_empty());
    labels
}

/// `ms` (Unix ms) as RFC 3339 in UTC.
fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

#[cfg(test)]
mod tests {
    use trainstate_schema::api::{NotifyNode, StackSuspect};
    use trainstate_schema::{CauseKind, RunCause, RunStatus};

    use super::*;

    const T0: u64 = 1_760_000_000_000;

    fn event(kind: NotifyEventKind, status: RunStatus, at_ms: u64) -> NotifyEvent {
        let mut event =
            NotifyEvent::new(format!("r1:{kind}"), kind, "r1", "bert", "j1", status, at_ms);
        event.cluster = Some("west".into());
        event.link = Some("https://ts.example/runs/r1".into());
        event
    }

    #[test]
    fn an_ended_runs_alert_shows_its_goodput_and_a_restart_loop_is_a_label() {
        let mut finished = event(NotifyEventKind::Finished, RunStatus::Finished, T0);
        let mut goodput = trainstate_schema::RunGoodput::starting_at(T0);
        goodput.add(trainstate_schema::GoodputBucket::Productive, 90_000);
        goodput.add(trainstate_schema::GoodputBucket::Stalled, 10_000);
        finished.goodput = Some(goodput);
        let notice = Notice { event: finished, ends_stall: None, awaits_capture: false };
        let alerts = alerts_for(&notice, |_| true, None, T0, Duration::from_secs(60));
        assert_eq!(
            alerts[0]["annotations"]["goodput"],
            "Goodput 90% of 1 min 40 s; most lost to stalled: 10 s"
        );
        let mut restart = event(NotifyEventKind::Restarting, RunStatus::Running, T0);
        restart.restart_loop = true;
        let notice = Notice { event: restart, ends_stall: None, awaits_capture: false };
        let alerts = alerts_for(&notice, |_| true, None, T0, Duration::from_secs(60));
        assert_eq!(alerts[0]["labels"]["restart_loop"], "true");
        assert!(alerts[0]["annotations"].get("goodput").is_none());
    }

    #[test]
    fn a_stall_fires_and_its_recovery_resolves_the_same_alert() {
        let mut stalled = event(NotifyEventKind::Stalled, RunStatus::Running, T0);
        stalled.ranks = vec![1];
        stalled.node = Some(NotifyNode::new(1, "n1", "10.0.0.2"));
        let notice = Notice { event: stalled.clone(), ends_stall: None, awaits_capture: false };
        let resend = Duration::from_secs(60);
        let fired = alerts_for(&notice, |_| true, None, T0 + 1_000, resend);
        assert_eq!(fired.len(), 1);
        assert_eq!(fired[0]["labels"]["alertname"], "TrainRunStalled");
        assert_eq!(fired[0]["labels"]["node"], "10.0.0.2");
        assert_eq!(fired[0]["labels"]["cluster"], "west");
        assert_eq!(fired[0]["startsAt"], rfc3339(T0));
        assert_eq!(fired[0]["endsAt"], rfc3339(T0 + 1_000 + 240_000));
        assert_eq!(fired[0]["generatorURL"], "https://ts.example/runs/r1");

        let stall = Stall { since_ms: T0, ranks: vec![1], node: stalled.node.clone() };
        let recovered = Notice {
            event: event(NotifyEventKind::Recovered, RunStatus::Running, T0 + 9_000),
            ends_stall: Some(stall),
            awaits_capture: false,
        };
        let resolved = alerts_for(&recovered, |_| true, None, T0 + 10_000, resend);
        assert_eq!(resolved.len(), 1);
        assert_eq!(resolved[0]["labels"], fired[0]["labels"], "the same alert");
        assert_eq!(resolved[0]["endsAt"], rfc3339(T0 + 10_000));
    }

    #[test]
    fn a_stalls_alert_names_its_suspects_and_links_its_capture() {
        let mut stalled = event(NotifyEventKind::Stalled, RunStatus::Running, T0);
        let alert = stall_alert(&stalled).to_json(T0);
        assert!(alert["annotations"].get("suspects").is_none(), "no capture: {alert}");
        assert!(alert["annotations"].get("stacks_url").is_none(), "no capture: {alert}");

        stalled.suspects = vec![
            StackSuspect::new(2, Some("node-a".into()), "rank_two_is_stuck (train.py:41)".into()),
            StackSuspect::new(5, None, "no answer".into()),
        ];
        stalled.suspects_left_out = 3;
        stalled.stacks_url = Some("https://ts.example/api/train/runs/r1/stacks".into());
        let alert = stall_alert(&stalled).to_json(T0);
        assert_eq!(
            alert["annotations"]["suspects"],
            "rank 2 on node-a: rank_two_is_stuck (train.py:41)\nrank 5: no answer\n\
             and 3 more (see the capture)"
        );
        assert_eq!(
            alert["annotations"]["stacks_url"],
            "https://ts.example/api/train/runs/r1/stacks"
        );
        assert_eq!(alert["labels"]["alertname"], "TrainRunStalled", "the same alert as ever");
    }

    #[test]
    fn an_end_fires_once_and_resolves_the_stall_it_ended_in_even_when_ends_are_not_sent() {
        let mut errored = event(NotifyEventKind::Errored, RunStatus::Errored, T0 + 5_000);
        errored.job_id = String::new();
        errored.cause = Some(RunCause::new(CauseKind::Oom, Some(1)));
        let notice = Notice {
            event: errored,
            ends_stall: Some(Stall { since_ms: T0, ranks: vec![], node: None }),
            awaits_capture: false,
        };
        let both = alerts_for(&notice, |_| true, None, T0 + 6_000, Duration::from_secs(60));
        assert_eq!(both.len(), 2);
        assert_eq!(both[0]["labels"]["alertname"], "TrainRunErrored");
        assert_eq!(both[0]["labels"]["severity"], "critical");
        assert!(both[0]["labels"].get("job_id").is_none(), "no empty label");
        assert_eq!(both[0]["labels"]["cause"], "OOM");
        assert_eq!(both[0]["labels"]["class"], "INFRASTRUCTURE");
        assert!(both[1]["labels"].get("class").is_none(), "the stall's alert is the stall's own");
        assert_eq!(both[0]["endsAt"], rfc3339(T0 + 6_000 + 3_600_000));
        assert_eq!(both[1]["labels"]["alertname"], "TrainRunStalled");
        assert_eq!(both[1]["endsAt"], rfc3339(T0 + 6_000));
        let stalls_only = alerts_for(
            &notice,
            |kind| kind == NotifyEventKind::Stalled,
            None,
            T0 + 6_000,
            Duration::from_secs(60),
        );
        assert_eq!(stalls_only.len(), 1);
        assert_eq!(stalls_only[0]["labels"]["alertname"], "TrainRunStalled");
    }
}
