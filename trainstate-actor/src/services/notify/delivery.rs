//! One target's delivery loop: it reads the runs changed after the
//! target's durable position (through the writer, a batch at a time, as
//! forwarding does), derives their events, queues the ones the target has
//! not delivered, sends them oldest first with retries, and moves the
//! position on only past runs whose events were all delivered or dropped.
//!
//! What is kept where:
//!
//! - The store (durable): the position, and for each run the ids of its
//!   events the target delivered ([`crate::store::Store::save_notify_progress`]),
//!   saved together at most once a [`SAVE_EVERY`]. A run that changes again
//!   is read again, whole; its events already delivered are not sent again.
//! - Memory: the queue (at most the backlog bound; past it the oldest
//!   events are dropped, counted and logged), what was delivered since the
//!   last save, and an Alertmanager target's firing stall alerts.
//!
//! After a crash the events delivered since the last save are sent again
//! (with the same ids): at least once. A target that does not answer
//! never slows a write: the loop only asks the writer for a batch of runs
//! now and then, and for a save at most once a second.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use trainstate_schema::api::{NotifyEventKind, NotifyTargetKind};
use trainstate_schema::{HealthState, RunId};

use super::alertmanager::{self, Alert};
use super::events::{self, Notice, StoredRun};
use super::slack;
use super::target::NotifyTarget;
use crate::decisions::log_throttle::LogThrottle;
use crate::engine::stats::NotifyStats;
use crate::engine::writer::Writer;
use crate::store::{NotifyRun, Position};

/// Runs read from the store at a time.
const BATCH: usize = 256;

/// The least time between two reads of the store: however many runs
/// change, the writer spends at most one read of a batch per this much
/// time on a target (a burst is read at up to 2,560 runs a second).
const MIN_READ_GAP: Duration = Duration::from_millis(100);

/// The least time between two reads while the target fails with its
/// backlog full, when a read only drops the oldest events.
const DROPPING_READ_GAP: Duration = Duration::from_secs(2);

/// How often the store is read when no commit was announced (one that
/// was missed is found then).
const IDLE_READ: Duration = Duration::from_secs(1);

/// How often the position and the events delivered are saved, at most.
pub(crate) const SAVE_EVERY: Duration = Duration::from_secs(1);

/// The first wait before a failed send is tried again; it doubles with
/// each failure, up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(200);

/// The longest wait between two tries, but what a receiver asks for.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The longest `Retry-After` heeded.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// The most events an Alertmanager target sends in one request.
const ALERT_BATCH: usize = 64;

/// The most bytes of a refusing answer's body kept for the error shown.
const MAX_ANSWER_SHOWN: usize = 200;

/// A target's delivery, from its start to its stop.
pub(crate) struct Delivery {
    pub(crate) writer: Arc<Writer>,
    pub(crate) target: NotifyTarget,
    pub(crate) client: reqwest::Client,
    pub(crate) stats: Arc<NotifyStats>,
    pub(crate) stopped: watch::Receiver<bool>,
    /// The head's public URL, under which each run's page is linked.
    pub(crate) link_base: Option<String>,
    /// The most events held to send.
    pub(crate) backlog: usize,
}

/// What the loop holds while this head sends for the target.
struct Sending {
    /// Runs were read up to here.
    read_at: Position,
    /// The durable position.
    saved: Position,
    /// Events to send, oldest first.
    queue: VecDeque<Queued>,
    /// The ids of the events in `queue`.
    queued: HashSet<String>,
    /// Runs with events in the queue or delivered since the last save.
    runs: HashMap<String, RunProgress>,
    /// Something to save: the position moved, or events were delivered.
    dirty: bool,
    /// The last read filled its batch: there is more to read.
    more: bool,
    /// A commit was announced since the last read.
    changed: bool,
    last_read: Option<Instant>,
    last_save: Instant,
    /// When the front of the queue may be tried again after a failure.
    retry_at: Option<Instant>,
    backoff: Duration,
    /// An Alertmanager target's firing stall alerts, by run id.
    firing: BTreeMap<String, Alert>,
    /// When the firing alerts are sent again.
    resend_at: Instant,
    /// Failed tries, logged at most a line per interval.
    failure_log: LogThrottle,
    /// Events dropped past the bound, logged at most a line per interval.
    drop_log: LogThrottle,
}

/// One event to send, and where reading must resume to find it again.
struct Queued {
    notice: Notice,
    /// The position just before its run: the durable position never
    /// passes it while the event waits.
    resume: Position,
}

/// What the loop knows of one run's events beside the store.
#[derive(Default)]
struct RunProgress {
    /// Delivered, as the store had it when the run was last read.
    durable: BTreeSet<String>,
    /// Every event of the run's latest document read.
    derivable: BTreeSet<String>,
    /// Delivered or dropped since the last save.
    handled: BTreeSet<String>,
    /// Its events in the queue.
    queued: usize,
}

/// How a send went.
enum Outcome {
    Delivered,
    /// The receiver is away or busy; try again (no sooner than `after`, if
    /// it said).
    Retry {
        error: String,
        after: Option<Duration>,
    },
    /// The receiver refused the payload for good; trying again would not help.
    Refused(String),
    /// The head stops: the send was given up, its answer unknown.
    Stopped,
}

impl Delivery {
    pub(crate) async fn run(self) {
        let mut changes = self.writer.shared.events.subscribe();
        let mut sending: Option<Sending> = None;
        loop {
            if *self.stopped.borrow() {
                break;
            }
            if !self.writer.shared.sweeps() {
                // Another head of this shared store sends, from the
                // position this one saved (it only moves forward).
                if let Some(mut state) = sending.take() {
                    if state.dirty {
                        self.save(&mut state).await;
                    }
                    tracing::info!(target = %self.target.name, "no longer the sweeping head: not sending notifications");
                }
                self.stats.sending.store(false, Ordering::Relaxed);
                self.stats.pending.store(0, Ordering::Relaxed);
                if self.pause(IDLE_READ).await {
                    break;
                }
                continue;
            }
            let state = match &mut sending {
                Some(state) => state,
                None => match self.start().await {
                    Ok(state) => sending.insert(state),
                    Err(err) => {
                        tracing::warn!(target = %self.target.name, error = %err, "cannot read the notification position; retrying");
                        if self.pause(IDLE_READ).await {
                            break;
                        }
                        continue;
                    }
                },
            };
            let now = Instant::now();
            if self.read_due(state, now)
                && let Err(err) = self.read(state).await
            {
                tracing::warn!(target = %self.target.name, error = %err, "cannot read runs to notify of; retrying");
                state.last_read = Some(now);
                state.more = false;
            }
            if !state.queue.is_empty() && state.retry_at.is_none_or(|at| at <= Instant::now()) {
                self.send_front(state).await;
            }
            if self.target.kind == NotifyTargetKind::Alertmanager
                && state.resend_at <= Instant::now()
            {
                self.resend(state).await;
            }
            if state.dirty && state.last_save + SAVE_EVERY <= Instant::now() {
                self.save(state).await;
            }
            let wake = self.next_wake(state);
            if wake <= Instant::now() {
                tokio::task::yield_now().await;
                continue;
            }
            let mut stopped = self.stopped.clone();
            tokio::select! {
                _ = changes.recv() => state.changed = true,
                () = tokio::time::sleep_until(wake) => {}
                _ = stopped.changed() => {}
            }
        }
        if let Some(state) = &mut sending
            && state.dirty
        {
            self.save(state).await;
        }
    }

    /// Starts sending: the durable position, and (Alertmanager) the stall
    /// alerts that fire now, rebuilt from the committed runs.
    async fn start(&self) -> Result<Sending, String> {
        let position = self.writer.notify_position(&self.target.name).await?;
        tracing::info!(target = %self.target.name, url = %self.target.shown_url(), seq = position.seq, "sending notifications");
        self.stats.position.store(position.seq, Ordering::Relaxed);
        self.stats.sending.store(true, Ordering::Relaxed);
        let now = Instant::now();
        let mut state = Sending {
            read_at: position.clone(),
            saved: position,
            queue: VecDeque::new(),
            queued: HashSet::new(),
            runs: HashMap::new(),
            dirty: false,
            more: true,
            changed: false,
            last_read: None,
            last_save: now,
            retry_at: None,
            backoff: FIRST_BACKOFF,
            firing: BTreeMap::new(),
            resend_at: now,
            failure_log: LogThrottle::default(),
            drop_log: LogThrottle::default(),
        };
        if self.target.kind == NotifyTargetKind::Alertmanager
            && self.target.kinds.contains(&NotifyEventKind::Stalled)
        {
            state.firing = self.firing_now();
        }
        Ok(state)
    }

    /// The stall alerts of the live runs that are STALLED now, as the
    /// target's filters keep them.
    fn firing_now(&self) -> BTreeMap<String, Alert> {
        let records =
            self.writer.shared.view.read().unwrap_or_else(|e| e.into_inner()).stalled_live_runs();
        let mut firing = BTreeMap::new();
        for record in records {
            let Ok(run) = serde_json::from_str::<StoredRun>(&record.json().text()) else {
                continue;
            };
            if !self.target.covers(run.cluster(), run.name()) {
                continue;
            }
            let stall = events::derive(&run, self.link_base.as_deref())
                .into_iter()
                .rfind(|n| n.kind() == NotifyEventKind::Stalled);
            if let Some(stall) = stall {
                firing.insert(run.id().to_owned(), alertmanager::stall_alert(&stall.event));
            }
        }
        firing
    }

    fn read_due(&self, state: &Sending, now: Instant) -> bool {
        // A receiver that takes what it is sent is not sent more than the
        // backlog holds: the rest waits in the store. One that fails has
        // the store read on, and the oldest events dropped past the bound.
        let room = state.queue.len() < self.backlog || state.retry_at.is_some();
        room && self.read_wanted_at(state, now) <= now
    }

    /// When the store should be read next, room in the queue aside: `now`
    /// if it never was.
    fn read_wanted_at(&self, state: &Sending, now: Instant) -> Instant {
        let Some(last) = state.last_read else { return now };
        if state.retry_at.is_some() && state.queue.len() >= self.backlog {
            // A read now only drops the oldest events: it is done slowly,
            // so that a burst of commits while a target is down does not
            // share the cores with reading and dropping all of it.
            return last + DROPPING_READ_GAP;
        }
        if state.more || state.changed { last + MIN_READ_GAP } else { last + IDLE_READ }
    }

    fn next_wake(&self, state: &Sending) -> Instant {
        let now = Instant::now();
        let mut wake = now + IDLE_READ;
        let room = state.queue.len() < self.backlog || state.retry_at.is_some();
        if room {
            wake = wake.min(self.read_wanted_at(state, now));
        }
        if !state.queue.is_empty() {
            wake = wake.min(state.retry_at.unwrap_or(now));
        }
        if self.target.kind == NotifyTargetKind::Alertmanager {
            wake = wake.min(state.resend_at);
        }
        if state.dirty {
            wake = wake.min(state.last_save + SAVE_EVERY);
        }
        wake
    }

    /// Reads one batch of changed runs and queues their new events.
    async fn read(&self, state: &mut Sending) -> Result<(), String> {
        state.changed = false;
        state.last_read = Some(Instant::now());
        let batch = self
            .writer
            .notify_changed_after(&self.target.name, state.read_at.clone(), BATCH)
            .await?;
        state.more = batch.len() == BATCH;
        let mut dropped = 0;
        for changed in batch {
            let resume = std::mem::replace(&mut state.read_at, changed.at.clone());
            state.dirty = true;
            self.take_in(state, changed, resume);
            // The oldest go first, so the queue never holds more than the bound.
            while state.queue.len() > self.backlog {
                if let Some(oldest) = state.queue.pop_front() {
                    self.handled(state, &oldest.notice);
                    dropped += 1;
                }
            }
        }
        if dropped > 0 {
            self.stats.dropped.fetch_add(dropped, Ordering::Relaxed);
            let error =
                format!("the backlog of {} events is full while the target fails", self.backlog);
            if let Some(due) = state.drop_log.failed(std::time::Instant::now(), dropped, &error) {
                tracing::warn!(
                    target = %self.target.name,
                    dropped = due.count,
                    total_dropped = self.stats.dropped.load(Ordering::Relaxed),
                    "notification events dropped, the oldest first: {}", due.last_error
                );
            }
        }
        self.stats.pending.store(state.queue.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Queues the events of one run read that the target wants and has
    /// neither delivered nor queued.
    fn take_in(&self, state: &mut Sending, changed: NotifyRun, resume: Position) {
        let run: StoredRun = match serde_json::from_str(&changed.json) {
            Ok(run) => run,
            Err(err) => {
                tracing::error!(position = ?changed.at, error = %err, "a stored run does not parse; no notification for it");
                return;
            }
        };
        let durable: BTreeSet<String> = changed
            .delivered
            .as_deref()
            .and_then(|text| serde_json::from_str::<Vec<String>>(text).ok())
            .unwrap_or_default()
            .into_iter()
            .collect();
        let notices = events::derive(&run, self.link_base.as_deref());
        let covered = self.target.covers(run.cluster(), run.name());
        let derivable: BTreeSet<String> = notices.iter().map(|n| n.id().to_owned()).collect();
        let known = state.runs.get(run.id());
        let done = |id: &str| durable.contains(id) || known.is_some_and(|p| p.handled.contains(id));
        let new: Vec<Notice> = notices
            .into_iter()
            .filter(|n| covered && self.wants(n) && !done(n.id()) && !state.queued.contains(n.id()))
            .collect();
        if new.is_empty() && known.is_none() {
            return;
        }
        let progress = state.runs.entry(run.id().to_owned()).or_default();
        progress.durable = durable;
        progress.derivable = derivable;
        progress.queued += new.len();
        for notice in new {
            state.queued.insert(notice.id().to_owned());
            state.queue.push_back(Queued { notice, resume: resume.clone() });
        }
    }

    /// True when the target sends `notice`: its kind is one of the
    /// target's, or (Alertmanager) it resolves a stall the target fired.
    fn wants(&self, notice: &Notice) -> bool {
        self.target.kinds.contains(&notice.kind())
            || (self.target.kind == NotifyTargetKind::Alertmanager
                && notice.ends_stall.is_some()
                && self.target.kinds.contains(&NotifyEventKind::Stalled))
    }

    /// Notes that `notice` was delivered or dropped: it leaves the queue's
    /// books, and is saved as delivered with the next save.
    fn handled(&self, state: &mut Sending, notice: &Notice) {
        state.queued.remove(notice.id());
        let progress = state.runs.entry(notice.event.run_id.clone()).or_default();
        progress.queued = progress.queued.saturating_sub(1);
        progress.handled.insert(notice.id().to_owned());
        state.dirty = true;
    }

    /// Sends the front of the queue (for Alertmanager, up to a batch).
    async fn send_front(&self, state: &mut Sending) {
        let count;
        let outcome = match self.target.kind {
            NotifyTargetKind::Alertmanager => {
                let (alerts, taken, firing) = self.alerts_of_front(state);
                count = taken;
                let outcome = self.post(serde_json::to_vec(&alerts), None).await;
                if matches!(outcome, Outcome::Delivered) {
                    state.firing = firing;
                }
                outcome
            }
            kind => {
                count = 1;
                let notice = &state.queue[0].notice;
                let body = if kind == NotifyTargetKind::Slack {
                    serde_json::to_vec(&slack::message(notice))
                } else {
                    serde_json::to_vec(&notice.event)
                };
                self.post(body, Some(notice.id())).await
            }
        };
        let now_ms = self.writer.shared.clock.now_ms();
        match outcome {
            Outcome::Delivered => {
                for _ in 0..count {
                    if let Some(sent) = state.queue.pop_front() {
                        self.handled(state, &sent.notice);
                    }
                }
                self.stats.sent.fetch_add(count as u64, Ordering::Relaxed);
                self.stats.last_sent_ms.store(now_ms, Ordering::Relaxed);
                state.retry_at = None;
                state.backoff = FIRST_BACKOFF;
                let failures = state.failure_log.recovered();
                let dropped = state.drop_log.recovered();
                if failures > 0 || dropped > 0 {
                    tracing::warn!(
                        target = %self.target.name,
                        failures_not_yet_logged = failures,
                        dropped_not_yet_logged = dropped,
                        total_dropped = self.stats.dropped.load(Ordering::Relaxed),
                        "the notification target takes events again"
                    );
                }
            }
            Outcome::Retry { error, after } => {
                self.stats.failed(error.clone(), now_ms);
                let wait = after.map_or(state.backoff, |after| after.max(state.backoff));
                state.retry_at = Some(Instant::now() + wait.min(MAX_RETRY_AFTER));
                state.backoff = (state.backoff * 2).min(MAX_BACKOFF);
                if let Some(due) = state.failure_log.failed(std::time::Instant::now(), 1, &error) {
                    tracing::warn!(target = %self.target.name, failures = due.count, error = %due.last_error, "cannot deliver a notification; retrying");
                }
            }
            Outcome::Refused(error) => {
                // Sending it again would be refused again: it is dropped,
                // counted and logged, and the queue goes on.
                self.stats.failed(error.clone(), now_ms);
                self.stats.dropped.fetch_add(count as u64, Ordering::Relaxed);
                for _ in 0..count {
                    if let Some(refused) = state.queue.pop_front() {
                        tracing::error!(target = %self.target.name, event_id = %refused.notice.id(), error = %error, "the notification target refused the event for good; dropped");
                        self.handled(state, &refused.notice);
                    }
                }
                state.retry_at = None;
            }
            // Sent again after the restart, if it was not taken.
            Outcome::Stopped => {}
        }
        self.stats.pending.store(state.queue.len() as u64, Ordering::Relaxed);
    }

    /// The alerts of the events at the queue's front (at most a batch, and
    /// never an alert's firing and its resolution in one request, which
    /// Alertmanager could take in either order), how many events they
    /// cover, and the firing alerts once they are sent.
    fn alerts_of_front(
        &self,
        state: &Sending,
    ) -> (Vec<serde_json::Value>, usize, BTreeMap<String, Alert>) {
        let now_ms = self.writer.shared.clock.now_ms();
        let sends = |kind| self.target.kinds.contains(&kind);
        let mut firing = state.firing.clone();
        let mut fired_here = HashSet::new();
        let mut alerts = Vec::new();
        let mut taken = 0;
        for queued in state.queue.iter().take(ALERT_BATCH) {
            let notice = &queued.notice;
            let run_id = &notice.event.run_id;
            if notice.ends_stall.is_some() && fired_here.contains(run_id) {
                break;
            }
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
    async fn resend(&self, state: &mut Sending) {
        state.resend_at = Instant::now() + self.target.resend;
        if state.firing.is_empty() {
            return;
        }
        let now_ms = self.writer.shared.clock.now_ms();
        let mut cleared = Vec::new();
        {
            let view = self.writer.shared.view.read().unwrap_or_else(|e| e.into_inner());
            for run_id in state.firing.keys() {
                let holds = RunId::parse(run_id)
                    .ok()
                    .and_then(|id| view.get(&id).cloned())
                    .is_some_and(|record| {
                        record.status.is_live() && record.health == Some(HealthState::Stalled)
                    });
                if !holds {
                    cleared.push(run_id.clone());
                }
            }
        }
        let until = alertmanager::firing_until(now_ms, self.target.resend);
        let alerts: Vec<serde_json::Value> = state
            .firing
            .iter()
            .map(|(run_id, alert)| {
                alert.to_json(if cleared.contains(run_id) { now_ms } else { until })
            })
            .collect();
        match self.post(serde_json::to_vec(&alerts), None).await {
            Outcome::Delivered => {
                for run_id in cleared {
                    state.firing.remove(&run_id);
                }
            }
            Outcome::Stopped => {}
            Outcome::Retry { error, .. } | Outcome::Refused(error) => {
                self.stats.failed(error.clone(), now_ms);
                if let Some(due) = state.failure_log.failed(std::time::Instant::now(), 1, &error) {
                    tracing::warn!(target = %self.target.name, failures = due.count, error = %due.last_error, "cannot send the firing alerts again; retrying at the next resend");
                }
            }
        }
    }

    /// Saves the position (before the oldest event still queued) and the
    /// events delivered since the last save.
    async fn save(&self, state: &mut Sending) {
        let position =
            state.queue.front().map_or_else(|| state.read_at.clone(), |q| q.resume.clone());
        let delivered: Vec<(String, String)> = state
            .runs
            .iter()
            .filter(|(_, p)| !p.handled.is_empty())
            .map(|(run_id, p)| {
                let ids: Vec<&String> =
                    p.durable.union(&p.handled).filter(|id| p.derivable.contains(*id)).collect();
                (run_id.clone(), serde_json::to_string(&ids).unwrap_or_else(|_| "[]".into()))
            })
            .collect();
        state.last_save = Instant::now();
        let position = position.max(state.saved.clone());
        match self.writer.save_notify_progress(&self.target.name, position.clone(), delivered).await
        {
            Ok(()) => {
                self.stats.position.store(position.seq, Ordering::Relaxed);
                state.saved = position;
                state.dirty = false;
                state.runs.retain(|_, p| {
                    let handled = std::mem::take(&mut p.handled);
                    p.durable.extend(handled);
                    p.queued > 0
                });
            }
            // Not fatal: what was delivered since the last save may be
            // sent again after a restart (at least once).
            Err(err) => {
                tracing::warn!(target = %self.target.name, error = %err, "cannot save the notification position")
            }
        }
    }

    /// Posts `body` (JSON) to the target, unless the head stops first.
    async fn post(&self, body: serde_json::Result<Vec<u8>>, event_id: Option<&str>) -> Outcome {
        let mut stopped = self.stopped.clone();
        if *stopped.borrow() {
            return Outcome::Stopped;
        }
        tokio::select! {
            outcome = self.try_post(body, event_id) => outcome,
            _ = stopped.changed() => Outcome::Stopped,
        }
    }

    /// Posts `body` (JSON) to the target.
    async fn try_post(&self, body: serde_json::Result<Vec<u8>>, event_id: Option<&str>) -> Outcome {
        let body = match body {
            Ok(body) => body,
            Err(err) => return Outcome::Refused(format!("cannot encode the event: {err}")),
        };
        let mut request = self
            .client
            .post(self.target.url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
        if let Some(id) = event_id {
            request = request.header("Idempotency-Key", id);
        }
        let response = match request.send().await {
            Ok(response) => response,
            // Without the URL: a Slack webhook's URL is its secret.
            Err(err) => {
                return Outcome::Retry { error: error_chain(&err.without_url()), after: None };
            }
        };
        let status = response.status();
        if status.is_success() {
            return Outcome::Delivered;
        }
        let after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let answer = answer_text(response).await;
        let error = if answer.is_empty() {
            format!("HTTP {status}")
        } else {
            format!("HTTP {status}: {answer}")
        };
        match status.as_u16() {
            // The payload itself is refused: it would be every time.
            400 | 413 | 422 => Outcome::Refused(error),
            _ => Outcome::Retry { error, after },
        }
    }

    /// Waits `duration`; true if stopped meanwhile.
    async fn pause(&self, duration: Duration) -> bool {
        let mut stopped = self.stopped.clone();
        if *stopped.borrow() {
            return true;
        }
        tokio::select! {
            () = tokio::time::sleep(duration) => *stopped.borrow(),
            _ = stopped.changed() => true,
        }
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
