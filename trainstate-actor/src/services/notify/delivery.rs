//! One notification target as a sink of the change feed
//! ([`crate::engine::supervisor::Sink`]): what a run's document holds to
//! send to it (its events, as the target's filters keep them), and how a
//! batch of them is sent. The feed reads the runs, queues the events not
//! delivered yet (bounded: past the backlog the oldest are dropped while
//! the target fails), retries, and saves the position with the events
//! delivered; see `crate::engine::feed`.
//!
//! A webhook or Slack target has up to [`IN_FLIGHT`] events in flight at
//! once, each of another run (a run's events go one after the other, oldest
//! first): one slow receiver's answer no longer holds back every event of
//! its target. An Alertmanager target sends a batch of alerts at a time.
//!
//! What the sink keeps itself: an Alertmanager target's firing stall
//! alerts, rebuilt from the committed runs when this head starts sending
//! and sent again every `resend` (Alertmanager resolves an alert that is
//! not).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use trainstate_schema::api::{NotifyEventKind, NotifyTargetKind};

use super::alertmanager::{self, Alert};
use super::events::{self, Fault, Notice, StoredRun};
use super::slack;
use super::target::NotifyTarget;
use crate::decisions::log_throttle::LogThrottle;
use crate::engine::stats::NotifyStats;
use crate::engine::supervisor::{
    Feed, FeedContext, FeedCounters, Item, QueuePolicy, RunItems, SendOne, Sent, Sink,
};

/// The most events a webhook or Slack target has in flight at once.
pub(crate) const IN_FLIGHT: usize = 4;

/// The first wait before a failed send is tried again; it doubles with
/// each failure, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// The longest wait between two tries, but what a receiver asks for.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The most events an Alertmanager target sends in one request.
const ALERT_BATCH: usize = 64;

/// The most bytes of a refusing answer's body kept for the error shown.
const MAX_ANSWER_SHOWN: usize = 200;

/// A target's delivery: the sink of its feed.
pub(crate) struct Delivery {
    pub(crate) target: Arc<NotifyTarget>,
    pub(crate) client: reqwest::Client,
    pub(crate) stats: Arc<NotifyStats>,
    /// The head's public URL, under which each run's page is linked.
    pub(crate) link_base: Option<String>,
    /// The most events held to send.
    pub(crate) backlog: usize,
    /// An Alertmanager target's firing stall alerts, by run id.
    pub(crate) firing: BTreeMap<String, Alert>,
    /// When the firing alerts are sent again.
    pub(crate) resend_at: Instant,
    /// Failed resends, logged at most a line per interval.
    pub(crate) resend_log: LogThrottle,
}

impl Item for Notice {
    fn id(&self) -> &str {
        &self.event.event_id
    }

    fn run_id(&self) -> &str {
        &self.event.run_id
    }
}

impl Sink for Delivery {
    type Item = Notice;

    fn name(&self) -> &str {
        &self.target.name
    }

    fn feed(&self) -> Feed {
        Feed::Notify(self.target.name.clone())
    }

    fn policy(&self) -> QueuePolicy {
        QueuePolicy {
            backlog: self.backlog,
            drop_oldest: true,
            first_backoff: FIRST_BACKOFF,
            max_backoff: MAX_BACKOFF,
            count_ahead: false,
        }
    }

    fn counters(&self) -> Arc<dyn FeedCounters> {
        self.stats.clone()
    }

    fn items(&mut self, _: u64, json: &str) -> Result<RunItems<Notice>, String> {
        let run: StoredRun = serde_json::from_str(json).map_err(|e| e.to_string())?;
        let notices = events::derive(&run, self.link_base.as_deref());
        let covered = self.target.covers(run.cluster(), run.name());
        // A stall that awaits its capture is the document's all the same:
        // it stays derivable, so that once told it is never told again.
        let derivable: BTreeSet<String> = notices.iter().map(|n| n.id().to_owned()).collect();
        let wanted =
            notices.into_iter().filter(|n| covered && !n.awaits_capture && self.wants(n)).collect();
        Ok(RunItems { derivable, wanted })
    }

    fn started(&mut self, context: &FeedContext) {
        tracing::info!(target = %self.target.name, url = %self.target.shown_url(), "sending notifications");
        self.resend_at = Instant::now();
        if self.target.kind == NotifyTargetKind::Alertmanager
            && self.target.kinds.contains(&NotifyEventKind::Stalled)
        {
            self.firing = self.firing_now(context);
        }
    }

    async fn send<'a>(
        &'a mut self,
        front: &'a [&'a Notice],
        context: &'a FeedContext,
    ) -> (usize, Sent) {
        match self.target.kind {
            NotifyTargetKind::Alertmanager => {
                let (alerts, taken, firing) = self.alerts_of_front(front, context);
                let sent = self.try_post(serde_json::to_vec(&alerts), None).await;
                if matches!(sent, Sent::Delivered) {
                    self.firing = firing;
                }
                (taken, sent)
            }
            _ => {
                let notice = front[0];
                (1, self.try_post(self.body_of(notice), Some(notice.id())).await)
            }
        }
    }

    fn concurrency(&self) -> usize {
        if self.target.kind == NotifyTargetKind::Alertmanager { 1 } else { IN_FLIGHT }
    }

    fn send_one(&self, notice: &Notice, _: &FeedContext) -> SendOne {
        let body = self.body_of(notice);
        let (client, target, id) =
            (self.client.clone(), self.target.clone(), notice.id().to_owned());
        Box::pin(async move { post(&client, &target, body, Some(&id)).await })
    }

    fn tick_at(&self) -> Option<Instant> {
        (self.target.kind == NotifyTargetKind::Alertmanager).then_some(self.resend_at)
    }

    fn tick<'a>(&'a mut self, context: &'a FeedContext) -> impl Future<Output = ()> + Send + 'a {
        self.resend(context)
    }
}

impl Delivery {
    /// The stall alerts of the live runs that are STALLED now, as the
    /// target's filters keep them.
    fn firing_now(&self, context: &FeedContext) -> BTreeMap<String, Alert> {
        let mut firing = BTreeMap::new();
        for json in context.stalled_live_runs() {
            let Ok(run) = serde_json::from_str::<StoredRun>(&json) else {
                continue;
            };
            if !self.target.covers(run.cluster(), run.name()) {
                continue;
            }
            let stall = events::derive(&run, self.link_base.as_deref())
                .into_iter()
                .rfind(|n| n.kind() == NotifyEventKind::Stalled);
            // A stall still awaiting its capture has not fired yet.
            let fired = stall.filter(|stall| {
                !stall.awaits_capture && self.sends(stall, NotifyEventKind::Stalled)
            });
            if let Some(stall) = fired {
                firing.insert(run.id().to_owned(), alertmanager::stall_alert(&stall.event));
            }
        }
        firing
    }

    /// True when the target sends `notice`: its kind is one of the
    /// target's, or (Alertmanager) it resolves a stall the target fired.
    fn wants(&self, notice: &Notice) -> bool {
        self.sends(notice, notice.kind())
            || (self.target.kind == NotifyTargetKind::Alertmanager
                && notice.ends_stall.is_some()
                && self.sends(notice, NotifyEventKind::Stalled))
    }

    /// True when the target sends what `notice` tells of `kind`: the
    /// event itself, or (`STALLED`) the stall it ends. The target must
    /// send events of `kind`, and its cause filter pass the event (a
    /// stall being judged as one, whatever ends it).
    fn sends(&self, notice: &Notice, kind: NotifyEventKind) -> bool {
        let fault = if kind == NotifyEventKind::Stalled { Fault::STALL } else { notice.fault() };
        self.target.kinds.contains(&kind) && self.target.causes.passes(kind, fault)
    }

    /// The alerts of the events at the queue's front (at most a batch, and
    /// never an alert's firing and its resolution in one request, which
    /// Alertmanager could take in either order), how many events they
    /// cover, and the firing alerts once they are sent.
    fn alerts_of_front(
        &self,
        front: &[&Notice],
        context: &FeedContext,
    ) -> (Vec<serde_json::Value>, usize, BTreeMap<String, Alert>) {
        let now_ms = context.now_ms();
        let mut firing = self.firing.clone();
        let mut fired_here = HashSet::new();
        let mut alerts = Vec::new();
        let mut taken = 0;
        for &notice in front.iter().take(ALERT_BATCH) {
            let run_id = &notice.event.run_id;
            if notice.ends_stall.is_some() && fired_here.contains(run_id) {
                break;
            }
            let sends = |kind| self.sends(notice, kind);
            alerts.extend(alertmanager::alerts_for(
                notice,
                sends,
                firing.get(run_id),
                now_ms,
                self.target.resend,
            ));
            if notice.kind() == NotifyEventKind::Stalled && sends(NotifyEventKind::Stalled) {
                firing.insert(run_id.clone(), alertmanager::stall_alert(&notice.event));
                fired_here.insert(run_id.clone());
            } else if notice.ends_stall.is_some() {
                firing.remove(run_id);
            }
            taken += 1;
        }
        (alerts, taken, firing)
    }

    /// Sends the firing stall alerts again (Alertmanager resolves an alert
    /// not sent again before its `endsAt`), and resolves those whose run is
    /// no longer a live STALLED one (a recovery dropped past the bound, a
    /// run deleted).
    async fn resend(&mut self, context: &FeedContext) {
        self.resend_at = Instant::now() + self.target.resend;
        if self.firing.is_empty() {
            return;
        }
        let now_ms = context.now_ms();
        let cleared: Vec<String> =
            self.firing.keys().filter(|run_id| !context.is_stalled(run_id)).cloned().collect();
        let until = alertmanager::firing_until(now_ms, self.target.resend);
        let alerts: Vec<serde_json::Value> = self
            .firing
            .iter()
            .map(|(run_id, alert)| {
                alert.to_json(if cleared.contains(run_id) { now_ms } else { until })
            })
            .collect();
        match self.try_post(serde_json::to_vec(&alerts), None).await {
            Sent::Delivered => {
                for run_id in cleared {
                    self.firing.remove(&run_id);
                }
            }
            Sent::Retry { error, .. } | Sent::Refused(error) => {
                self.stats.failed(error.clone(), now_ms);
                if let Some(due) = self.resend_log.failed(std::time::Instant::now(), 1, &error) {
                    tracing::warn!(target = %self.target.name, failures = due.count, error = %due.last_error, "cannot send the firing alerts again; retrying at the next resend");
                }
            }
        }
    }

    /// What a webhook or Slack target is sent of `notice`.
    fn body_of(&self, notice: &Notice) -> serde_json::Result<Vec<u8>> {
        if self.target.kind == NotifyTargetKind::Slack {
            serde_json::to_vec(&slack::message(notice))
        } else {
            serde_json::to_vec(&notice.event)
        }
    }

    /// Posts `body` (JSON) to the target.
    async fn try_post(&self, body: serde_json::Result<Vec<u8>>, event_id: Option<&str>) -> Sent {
        post(&self.client, &self.target, body, event_id).await
    }
}

/// Posts `body` (JSON) to `target` with `client`.
async fn post(
    client: &reqwest::Client,
    target: &NotifyTarget,
    body: serde_json::Result<Vec<u8>>,
    event_id: Option<&str>,
) -> Sent {
    let body = match body {
        Ok(body) => body,
        Err(err) => return Sent::Refused(format!("cannot encode the event: {err}")),
    };
    let mut request = client
        .post(target.url.clone())
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body);
    if let Some(id) = event_id {
        request = request.header("Idempotency-Key", id);
    }
    let response = match request.send().await {
        Ok(response) => response,
        // Without the URL: a webhook's path is its secret, whatever
        // its kind.
        Err(err) => {
            let error = target.without_secrets(&error_chain(&err.without_url()));
            return Sent::Retry { error, after: None };
        }
    };
    let status = response.status();
    if status.is_success() {
        return Sent::Delivered;
    }
    let after = response
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
        .map(Duration::from_secs);
    // A receiver's answer may echo the path it was asked for (`no hook
    // /hooks/<key>`): the error recorded and shown never carries it.
    let answer = target.without_secrets(&answer_text(response).await);
    let error = if answer.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {answer}")
    };
    match status.as_u16() {
        // The payload itself is refused: it would be every time.
        400 | 413 | 422 => Sent::Refused(error),
        _ => Sent::Retry { error, after },
    }
}

/// `err` and what caused it, in one line: `error sending request: client
/// error (Connect): tcp connect error: Connection refused (os error 111)`.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        source = cause.source();
    }
    text
}

/// The start of a refusing answer's body, on one line, for the error shown.
async fn answer_text(mut response: reqwest::Response) -> String {
    let mut bytes = Vec::new();
    while bytes.len() < MAX_ANSWER_SHOWN {
        match response.chunk().await {
            Ok(Some(chunk)) => bytes.extend_from_slice(&chunk),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_ANSWER_SHOWN)]);
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
