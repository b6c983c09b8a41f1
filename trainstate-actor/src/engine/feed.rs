//! The change feed: one consumer of the committed changes, from a durable
//! cursor, for every sink that sends them somewhere (forwarding to a hub,
//! each notification target).
//!
//! The feed owns everything but the sending: it reads the runs changed
//! after its cursor (through the writer, a batch at a time), asks the sink
//! what each run holds to send ([`Sink::items`]), queues what was not
//! delivered yet (bounded), hands the front of the queue to the sink with
//! back-off on failure, and saves its cursor, with the items of each run
//! delivered, durably ([`crate::store::Store::save_cursor`]) at most once a
//! [`SAVE_EVERY`]. The cursor moves on only past runs whose items were all
//! delivered or dropped, so after a crash what was in flight is sent
//! again, with the same ids: at least once. A sink may have several items
//! in flight at once ([`Sink::concurrency`]), never two of one run: a
//! run's items go in order, different runs' side by side. With a shared store only the
//! head that sweeps sends; another takes over from the saved cursor.
//!
//! A sink that does not answer never slows a write: the feed only asks the
//! writer for a batch of runs now and then, and for a save at most once a
//! [`SAVE_EVERY`].

// Parts serve only forwarding or notifications.
#![cfg_attr(not(all(feature = "forward", feature = "notify")), allow(dead_code, unused_imports))]

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use trainstate_schema::{HealthState, RunId};

use crate::decisions::log_throttle::LogThrottle;
pub(crate) use crate::store::Feed;
use crate::store::{ChangedRun, Position};

use super::writer::{Published, Writer};

/// Runs read from the store at a time.
const BATCH: usize = 256;

/// The least time between two reads of the store: however many runs
/// change, the writer spends at most one read of a batch per this much
/// time on a feed (a burst is read at up to 2,560 runs a second).
const MIN_READ_GAP: Duration = Duration::from_millis(100);

/// The least time between two reads while the sink fails with its
/// backlog full, when a read only drops the oldest items.
const DROPPING_READ_GAP: Duration = Duration::from_secs(2);

/// How often the store is read when no commit was announced (one that
/// was missed is found then).
const IDLE_READ: Duration = Duration::from_secs(1);

/// How often the cursor and the items delivered are saved, at most.
pub(crate) const SAVE_EVERY: Duration = Duration::from_secs(1);

/// The most items of the queue's front a sink is offered at once.
const FRONT: usize = 64;

/// The longest wait a receiver may ask for before a try again.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// One thing a sink sends, derived from a run's stored document.
pub(crate) trait Item: Send + Sync + 'static {
    /// Its id: a function of the run's document, the same each time the
    /// run is read, and what is saved as delivered.
    fn id(&self) -> &str;
    /// The run it is of.
    fn run_id(&self) -> &str;
}

/// How a send went.
pub(crate) enum Sent {
    /// The receiver took what it was sent.
    Delivered,
    /// The receiver is away or busy; try again (no sooner than `after`, if
    /// it said).
    Retry {
        /// Why, for the logs and the counters.
        error: String,
        /// How long the receiver asked to wait.
        after: Option<Duration>,
    },
    /// The receiver refused it for good; trying again would not help: it
    /// is dropped, and the feed goes on.
    Refused(String),
}

/// One item's send, in flight beside others: it owns what it needs.
pub(crate) type SendOne = Pin<Box<dyn Future<Output = Sent> + Send + 'static>>;

/// How a feed holds what it has to send.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueuePolicy {
    /// The most items held to send: while the sink takes what it is sent,
    /// the store is not read past it.
    pub(crate) backlog: usize,
    /// While the sink fails, the store is read on and the oldest items
    /// past the backlog are dropped (counted and logged); otherwise they
    /// wait in the store, and nothing is lost.
    pub(crate) drop_oldest: bool,
    /// The first wait before a failed send is tried again; it doubles with
    /// each failure, up to `max_backoff`.
    pub(crate) first_backoff: Duration,
    /// The longest wait between two tries, but what a receiver asks for.
    pub(crate) max_backoff: Duration,
    /// Count in what is pending the runs changed after what was read: while
    /// the queue is full, the store is read ahead only to count them, and
    /// the count is of runs, each once however often it changed (each is
    /// sent as it is now). Otherwise what is pending is the queue's items.
    pub(crate) count_ahead: bool,
}

/// The counters a feed keeps of its sink, for `/metrics` and the API.
pub(crate) trait FeedCounters: Send + Sync {
    /// This head sends (or no longer does, on a shared store).
    fn sending(&self, sending: bool);
    /// The durable cursor is at commit `seq`.
    fn position(&self, seq: u64);
    /// Items read and not yet delivered, and when the oldest of them was
    /// read (Unix ms of the service's clock; `None` when there is none).
    fn pending(&self, count: u64, oldest_ms: Option<u64>);
    /// `count` items delivered at `at_ms`.
    fn sent(&self, count: u64, at_ms: u64);
    /// A try failed (it is tried again).
    fn failed(&self, error: &str, at_ms: u64);
    /// `count` items refused for good.
    fn refused(&self, count: u64, error: &str, at_ms: u64);
    /// `count` items dropped past the backlog bound.
    fn dropped(&self, count: u64);
    /// Items dropped so far, for the logs.
    fn dropped_total(&self) -> u64;
}

/// What a sink may ask of the head while it sends.
#[derive(Clone)]
pub(crate) struct FeedContext {
    shared: Arc<Published>,
}

impl FeedContext {
    /// The service's clock, now (Unix ms).
    pub(crate) fn now_ms(&self) -> u64 {
        self.shared.clock.now_ms()
    }

    /// The stored documents of the live runs that are STALLED now.
    pub(crate) fn stalled_live_runs(&self) -> Vec<String> {
        let records =
            self.shared.view.read().unwrap_or_else(|e| e.into_inner()).stalled_live_runs();
        records.into_iter().map(|record| record.json().text().to_string()).collect()
    }

    /// True while the run `run_id` is live and STALLED.
    pub(crate) fn is_stalled(&self, run_id: &str) -> bool {
        let view = self.shared.view.read().unwrap_or_else(|e| e.into_inner());
        RunId::parse(run_id).ok().and_then(|id| view.get(&id).cloned()).is_some_and(|record| {
            record.status.is_live() && record.health == Some(HealthState::Stalled)
        })
    }
}

/// How to send: what a sink is called, where its cursor is kept, what a
/// run holds to send and how a batch of it is sent. The feed does the rest.
pub(crate) trait Sink: Send + Sync + 'static {
    /// What the sink sends.
    type Item: Item;

    /// Its name, in the logs.
    fn name(&self) -> &str;

    /// Where its cursor is kept.
    fn feed(&self) -> Feed;

    /// How its queue is held.
    fn policy(&self) -> QueuePolicy;

    /// Its counters.
    fn counters(&self) -> Arc<dyn FeedCounters>;

    /// Every item the run `json` (stored at commit `seq`) holds, oldest
    /// first, and which of them to send; an error when it does not parse.
    fn items(&mut self, seq: u64, json: &str) -> Result<RunItems<Self::Item>, String>;

    /// This head starts sending.
    fn started(&mut self, _context: &FeedContext) {}

    /// Sends the front of the queue (`front`, never empty): answers how
    /// many of it were sent (at least one) and how.
    fn send<'a>(
        &'a mut self,
        front: &'a [&'a Self::Item],
        context: &'a FeedContext,
    ) -> impl Future<Output = (usize, Sent)> + Send + 'a;

    /// How many items it may have in flight at once. Above 1, items are
    /// sent one a request with [`send_one`](Self::send_one), each of a run
    /// with nothing else in flight and nothing older queued: a run's items
    /// go one after the other, oldest first, and different runs' side by
    /// side. At 1, the front of the queue goes with [`send`](Self::send).
    fn concurrency(&self) -> usize {
        1
    }

    /// Sends `item` alone, beside other items in flight (a sink whose
    /// [`concurrency`](Self::concurrency) is above 1).
    fn send_one(&self, item: &Self::Item, _context: &FeedContext) -> SendOne {
        let refused = format!("{} sends a batch at a time, not one item", item.id());
        Box::pin(std::future::ready(Sent::Refused(refused)))
    }

    /// When [`tick`](Self::tick) is due next, if ever.
    fn tick_at(&self) -> Option<Instant> {
        None
    }

    /// Work of its own, done when [`tick_at`](Self::tick_at) says.
    fn tick<'a>(&'a mut self, _context: &'a FeedContext) -> impl Future<Output = ()> + Send + 'a {
        async {}
    }
}

/// The items of one run.
pub(crate) struct RunItems<I> {
    /// The ids of every item the run's document holds.
    pub(crate) derivable: BTreeSet<String>,
    /// The items to send, oldest first, if not delivered yet.
    pub(crate) wanted: Vec<I>,
}

/// A feed in progress; stop it with [`FeedHandle::stop`].
#[derive(Debug)]
pub(crate) struct FeedHandle {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl FeedHandle {
    /// Stops the feed; what was delivered is saved.
    pub(crate) async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Starts feeding `sink` the committed changes of `writer`'s store.
pub(crate) fn follow<S: Sink>(writer: Arc<Writer>, sink: S) -> FeedHandle {
    let (stop, stopped) = watch::channel(false);
    let feed = sink.feed();
    let counters = sink.counters();
    let policy = sink.policy();
    let context = FeedContext { shared: writer.shared.clone() };
    let driver = Driver { writer, sink, feed, counters, policy, context, stopped };
    FeedHandle { stop, task: tokio::spawn(driver.run()) }
}

/// One feed's loop.
struct Driver<S: Sink> {
    writer: Arc<Writer>,
    sink: S,
    feed: Feed,
    counters: Arc<dyn FeedCounters>,
    policy: QueuePolicy,
    context: FeedContext,
    stopped: watch::Receiver<bool>,
}

/// What the loop holds while this head sends.
struct Sending<I> {
    /// Runs were read up to here.
    read_at: Position,
    /// The durable cursor.
    saved: Position,
    /// Items to send, oldest first.
    queue: VecDeque<Queued<I>>,
    /// The ids of the items in `queue`.
    queued: HashSet<String>,
    /// Runs with items in the queue or delivered since the last save.
    runs: HashMap<String, RunProgress>,
    /// Something to save: the cursor moved, or items were delivered.
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
    /// Failed tries, logged at most a line per interval.
    failure_log: LogThrottle,
    /// Items dropped past the bound, logged at most a line per interval.
    drop_log: LogThrottle,
    /// The sends in flight (a sink that sends several items at once).
    in_flight: JoinSet<Flown>,
    /// The runs of the items in flight: one item a run at a time.
    flying_runs: HashSet<String>,
    /// Failed tries so far: a send that started after the latest failure
    /// and was delivered shows the receiver is back.
    failure_round: u64,
    /// (`count_ahead`) The runs changed after `read_at` as far as the store
    /// was read ahead, by id, each where it was last seen.
    ahead: HashMap<String, Position>,
    /// The store was read ahead up to here.
    ahead_at: Position,
    /// The last read ahead filled its batch: there is more to count.
    ahead_more: bool,
    /// A commit was announced since the last read ahead.
    ahead_changed: bool,
    last_ahead: Option<Instant>,
}

/// One item to send, and where reading must resume to find it again.
struct Queued<I> {
    item: I,
    /// The position just before its run: the durable cursor never passes
    /// it while the item waits.
    resume: Position,
    /// When it was read (Unix ms of the service's clock).
    queued_ms: u64,
}

/// A send that was in flight, done.
struct Flown {
    id: String,
    run_id: String,
    /// The failed tries counted when it started.
    round: u64,
    sent: Sent,
}

/// What the loop knows of one run's items beside the store.
#[derive(Default)]
struct RunProgress {
    /// Delivered, as the store had it when the run was last read.
    durable: BTreeSet<String>,
    /// Every item of the run's latest document read.
    derivable: BTreeSet<String>,
    /// Delivered or dropped since the last save.
    handled: BTreeSet<String>,
    /// Its items in the queue.
    queued: usize,
}

impl<S: Sink> Driver<S> {
    async fn run(mut self) {
        let mut changes = self.writer.shared.events.subscribe();
        let mut sending: Option<Sending<S::Item>> = None;
        loop {
            if *self.stopped.borrow() {
                break;
            }
            if !self.writer.shared.sweeps() {
                // Another head of this shared store sends, from the cursor
                // this one saved (it only moves forward).
                if let Some(mut state) = sending.take() {
                    if state.dirty {
                        self.save(&mut state).await;
                    }
                    tracing::info!(feed = %self.sink.name(), "no longer the sweeping head: not sending");
                }
                self.counters.sending(false);
                self.counters.pending(0, None);
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
                        tracing::warn!(feed = %self.sink.name(), error = %err, "cannot read the feed's position; retrying");
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
                tracing::warn!(feed = %self.sink.name(), error = %err, "cannot read the changed runs; retrying");
                state.last_read = Some(now);
                state.more = false;
            }
            if self.read_ahead_due(state, now)
                && let Err(err) = self.read_ahead(state).await
            {
                tracing::warn!(feed = %self.sink.name(), error = %err, "cannot count the changed runs; retrying");
                state.last_ahead = Some(now);
                state.ahead_more = false;
            }
            if self.sink.concurrency() > 1 {
                self.launch(state);
            } else if !state.queue.is_empty()
                && state.retry_at.is_none_or(|at| at <= Instant::now())
                && !self.send_front(state).await
            {
                break;
            }
            if self.sink.tick_at().is_some_and(|at| at <= Instant::now()) {
                let mut stopped = self.stopped.clone();
                tokio::select! {
                    () = self.sink.tick(&self.context) => {}
                    _ = stopped.changed() => {}
                }
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
                _ = changes.recv() => (state.changed, state.ahead_changed) = (true, true),
                () = tokio::time::sleep_until(wake) => {}
                _ = stopped.changed() => {}
                Some(flown) = state.in_flight.join_next(), if !state.in_flight.is_empty() => {
                    // A send that panicked is sent again.
                    if let Ok(flown) = flown {
                        self.finish(state, flown);
                    }
                }
            }
        }
        if let Some(state) = &mut sending
            && state.dirty
        {
            self.save(state).await;
        }
    }

    /// Starts sending from the durable cursor.
    async fn start(&mut self) -> Result<Sending<S::Item>, crate::store::StoreError> {
        let position = self.writer.load_cursor(&self.feed).await?;
        tracing::info!(feed = %self.sink.name(), seq = position.seq, "sending the committed changes");
        self.counters.position(position.seq);
        self.counters.sending(true);
        self.sink.started(&self.context);
        let now = Instant::now();
        Ok(Sending {
            read_at: position.clone(),
            saved: position.clone(),
            queue: VecDeque::new(),
            queued: HashSet::new(),
            runs: HashMap::new(),
            dirty: false,
            more: true,
            changed: false,
            last_read: None,
            last_save: now,
            retry_at: None,
            backoff: self.policy.first_backoff,
            failure_log: LogThrottle::default(),
            drop_log: LogThrottle::default(),
            in_flight: JoinSet::new(),
            flying_runs: HashSet::new(),
            failure_round: 0,
            ahead: HashMap::new(),
            ahead_at: position,
            ahead_more: true,
            ahead_changed: false,
            last_ahead: None,
        })
    }

    /// True when the queue has room to read into: below the backlog, or
    /// (dropping the oldest) while the sink fails.
    fn room(&self, state: &Sending<S::Item>) -> bool {
        state.queue.len() < self.policy.backlog
            || (self.policy.drop_oldest && state.retry_at.is_some())
    }

    fn read_due(&self, state: &Sending<S::Item>, now: Instant) -> bool {
        // A sink that takes what it is sent is not sent more than the
        // backlog holds: the rest waits in the store. One that fails has
        // the store read on, and the oldest items dropped past the bound
        // (if its policy says so).
        self.room(state) && self.read_wanted_at(state, now) <= now
    }

    /// When the store should be read next, room in the queue aside: `now`
    /// if it never was.
    fn read_wanted_at(&self, state: &Sending<S::Item>, now: Instant) -> Instant {
        let Some(last) = state.last_read else { return now };
        if state.retry_at.is_some() && state.queue.len() >= self.policy.backlog {
            // A read now only drops the oldest items: it is done slowly,
            // so that a burst of commits while a sink is down does not
            // share the cores with reading and dropping all of it.
            return last + DROPPING_READ_GAP;
        }
        if state.more || state.changed { last + MIN_READ_GAP } else { last + IDLE_READ }
    }

    fn next_wake(&self, state: &Sending<S::Item>) -> Instant {
        let now = Instant::now();
        let mut wake = now + IDLE_READ;
        if self.room(state) {
            wake = wake.min(self.read_wanted_at(state, now));
        }
        if !state.queue.is_empty() {
            if self.sink.concurrency() <= 1 {
                wake = wake.min(state.retry_at.unwrap_or(now));
            } else if let Some(at) = state.retry_at.filter(|at| *at > now) {
                // Sent when it passes; otherwise what can be sent was
                // (`launch`), and the rest waits for a send to finish.
                wake = wake.min(at);
            }
        }
        if let Some(at) = self.sink.tick_at() {
            wake = wake.min(at);
        }
        if state.dirty {
            wake = wake.min(state.last_save + SAVE_EVERY);
        }
        if self.ahead_wanted(state) {
            wake = wake.min(state.last_ahead.map_or(now, |at| at + MIN_READ_GAP));
        }
        wake
    }

    /// True when the runs changed behind a full queue are to be counted:
    /// the feed counts them, the queue has no room to read them into, and
    /// the store may hold more of them than was counted.
    fn ahead_wanted(&self, state: &Sending<S::Item>) -> bool {
        self.policy.count_ahead && !self.room(state) && (state.ahead_more || state.ahead_changed)
    }

    fn read_ahead_due(&self, state: &Sending<S::Item>, now: Instant) -> bool {
        self.ahead_wanted(state) && state.last_ahead.is_none_or(|at| at + MIN_READ_GAP <= now)
    }

    /// Reads one batch of the runs changed after what was read (and
    /// counted), only to count them.
    async fn read_ahead(
        &mut self,
        state: &mut Sending<S::Item>,
    ) -> Result<(), crate::store::StoreError> {
        state.ahead_changed = false;
        state.last_ahead = Some(Instant::now());
        let from = state.ahead_at.clone().max(state.read_at.clone());
        let batch = self.writer.changes_after(&self.feed, from, BATCH).await?;
        state.ahead_more = batch.len() == BATCH;
        for changed in batch {
            state.ahead_at = changed.at.clone();
            state.ahead.insert(changed.at.id.clone(), changed.at);
        }
        self.show_pending(state);
        Ok(())
    }

    /// Reads one batch of changed runs and queues their new items.
    async fn read(&mut self, state: &mut Sending<S::Item>) -> Result<(), crate::store::StoreError> {
        state.changed = false;
        state.last_read = Some(Instant::now());
        let batch = self.writer.changes_after(&self.feed, state.read_at.clone(), BATCH).await?;
        state.more = batch.len() == BATCH;
        let mut dropped = 0;
        for changed in batch {
            let resume = std::mem::replace(&mut state.read_at, changed.at.clone());
            state.dirty = true;
            self.take_in(state, changed, resume);
            // The oldest go first, so the queue never holds more than the bound.
            while self.policy.drop_oldest && state.queue.len() > self.policy.backlog {
                if let Some(oldest) = state.queue.pop_front() {
                    handled(state, &oldest.item);
                    dropped += 1;
                }
            }
        }
        // What was read is no longer ahead of the reading; a run that changed
        // since it was counted is counted where it changed.
        let read_at = state.read_at.clone();
        state.ahead.retain(|_, at| *at > read_at);
        if dropped > 0 {
            self.counters.dropped(dropped);
            let error = format!(
                "the backlog of {} events is full while the target fails",
                self.policy.backlog
            );
            if let Some(due) = state.drop_log.failed(std::time::Instant::now(), dropped, &error) {
                tracing::warn!(
                    target = %self.sink.name(),
                    dropped = due.count,
                    total_dropped = self.counters.dropped_total(),
                    "notification events dropped, the oldest first: {}", due.last_error
                );
            }
        }
        self.show_pending(state);
        Ok(())
    }

    /// Tells the counters how many items wait and since when.
    fn show_pending(&self, state: &Sending<S::Item>) {
        let oldest = state.queue.iter().map(|q| q.queued_ms).min();
        let count = if self.policy.count_ahead {
            let mut runs: HashSet<&str> = state.queue.iter().map(|q| q.item.run_id()).collect();
            runs.extend(state.ahead.keys().map(String::as_str));
            runs.len()
        } else {
            state.queue.len()
        };
        self.counters.pending(count as u64, oldest);
    }

    /// Queues the items of one run read that the sink wants and has
    /// neither delivered nor queued.
    fn take_in(&mut self, state: &mut Sending<S::Item>, changed: ChangedRun, resume: Position) {
        let items = match self.sink.items(changed.at.seq, &changed.json) {
            Ok(items) => items,
            Err(err) => {
                tracing::error!(feed = %self.sink.name(), position = ?changed.at, error = %err, "a stored run does not parse; nothing is sent of it");
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
        let known = state.runs.get(&changed.at.id);
        let done = |id: &str| durable.contains(id) || known.is_some_and(|p| p.handled.contains(id));
        let new: Vec<S::Item> = items
            .wanted
            .into_iter()
            .filter(|item| !done(item.id()) && !state.queued.contains(item.id()))
            .collect();
        if new.is_empty() && known.is_none() {
            return;
        }
        let progress = state.runs.entry(changed.at.id.clone()).or_default();
        progress.durable = durable;
        progress.derivable = items.derivable;
        progress.queued += new.len();
        let queued_ms = self.context.now_ms();
        for item in new {
            state.queued.insert(item.id().to_owned());
            state.queue.push_back(Queued { item, resume: resume.clone(), queued_ms });
        }
    }

    /// Sends the front of the queue; false when stopped first.
    async fn send_front(&mut self, state: &mut Sending<S::Item>) -> bool {
        let front: Vec<&S::Item> = state.queue.iter().take(FRONT).map(|q| &q.item).collect();
        let mut stopped = self.stopped.clone();
        let (count, outcome) = tokio::select! {
            sent = self.sink.send(&front, &self.context) => sent,
            // Sent again after the restart, if it was not taken.
            _ = stopped.changed() => return false,
        };
        drop(front);
        let count = count.clamp(1, state.queue.len());
        let now_ms = self.context.now_ms();
        let name = self.sink.name().to_owned();
        match outcome {
            Sent::Delivered => {
                for _ in 0..count {
                    if let Some(sent) = state.queue.pop_front() {
                        handled(state, &sent.item);
                    }
                }
                self.counters.sent(count as u64, now_ms);
                state.retry_at = None;
                state.backoff = self.policy.first_backoff;
                let failures = state.failure_log.recovered();
                let dropped = state.drop_log.recovered();
                if failures > 0 || dropped > 0 {
                    tracing::warn!(
                        feed = %name,
                        failures_not_yet_logged = failures,
                        dropped_not_yet_logged = dropped,
                        total_dropped = self.counters.dropped_total(),
                        "the receiver takes what it is sent again"
                    );
                }
            }
            Sent::Retry { error, after } => {
                self.counters.failed(&error, now_ms);
                let wait = after.map_or(state.backoff, |after| after.max(state.backoff));
                state.retry_at = Some(Instant::now() + wait.min(MAX_RETRY_AFTER));
                state.backoff = (state.backoff * 2).min(self.policy.max_backoff);
                if let Some(due) = state.failure_log.failed(std::time::Instant::now(), 1, &error) {
                    tracing::warn!(feed = %name, failures = due.count, error = %due.last_error, "cannot send; retrying");
                }
            }
            Sent::Refused(error) => {
                // Sending it again would be refused again: it is dropped,
                // counted and logged, and the queue goes on.
                self.counters.refused(count as u64, &error, now_ms);
                for _ in 0..count {
                    if let Some(refused) = state.queue.pop_front() {
                        tracing::error!(feed = %name, item = %refused.item.id(), error = %error, "the receiver refused it for good; dropped");
                        handled(state, &refused.item);
                    }
                }
                state.retry_at = None;
            }
        }
        self.show_pending(state);
        true
    }

    /// Starts sending what may be sent now, up to the sink's concurrency:
    /// in queue order, the oldest queued item of each run that has nothing
    /// in flight.
    fn launch(&self, state: &mut Sending<S::Item>) {
        let concurrency = self.sink.concurrency();
        if state.in_flight.len() >= concurrency
            || state.retry_at.is_some_and(|at| at > Instant::now())
        {
            return;
        }
        // Runs seen in the queue so far: only the first item of each goes.
        let mut seen: HashSet<&str> = HashSet::new();
        let mut starts = Vec::new();
        for queued in &state.queue {
            if state.in_flight.len() + starts.len() >= concurrency {
                break;
            }
            let run_id = queued.item.run_id();
            if !seen.insert(run_id) || state.flying_runs.contains(run_id) {
                continue;
            }
            let send = self.sink.send_one(&queued.item, &self.context);
            starts.push((queued.item.id().to_owned(), run_id.to_owned(), send));
        }
        for (id, run_id, send) in starts {
            state.flying_runs.insert(run_id.clone());
            let round = state.failure_round;
            state.in_flight.spawn(async move { Flown { id, run_id, round, sent: send.await } });
        }
    }

    /// Takes in how a send in flight went.
    fn finish(&self, state: &mut Sending<S::Item>, flown: Flown) {
        let Flown { id, run_id, round, sent } = flown;
        state.flying_runs.remove(&run_id);
        // Gone from the queue if dropped past the bound meanwhile.
        let at = state.queue.iter().position(|q| q.item.id() == id);
        let now_ms = self.context.now_ms();
        let name = self.sink.name();
        match sent {
            Sent::Delivered => {
                if let Some(sent) = at.and_then(|at| state.queue.remove(at)) {
                    handled(state, &sent.item);
                    self.counters.sent(1, now_ms);
                }
                // Started after the latest failure: the receiver is back.
                if round == state.failure_round && state.retry_at.is_some() {
                    state.retry_at = None;
                    state.backoff = self.policy.first_backoff;
                    let failures = state.failure_log.recovered();
                    let dropped = state.drop_log.recovered();
                    tracing::warn!(
                        feed = %name,
                        failures_not_yet_logged = failures,
                        dropped_not_yet_logged = dropped,
                        total_dropped = self.counters.dropped_total(),
                        "the receiver takes what it is sent again"
                    );
                }
            }
            Sent::Retry { error, after } => {
                self.counters.failed(&error, now_ms);
                let now = Instant::now();
                let asked = after.map(|after| now + after.min(MAX_RETRY_AFTER));
                match state.retry_at.filter(|_| round < state.failure_round) {
                    // A failure of sends that started together with one
                    // that failed already: one back-off for them all.
                    Some(at) => state.retry_at = Some(asked.map_or(at, |asked| asked.max(at))),
                    None => {
                        let wait = after.map_or(state.backoff, |after| after.max(state.backoff));
                        state.retry_at = Some(now + wait.min(MAX_RETRY_AFTER));
                        state.backoff = (state.backoff * 2).min(self.policy.max_backoff);
                        state.failure_round += 1;
                    }
                }
                if let Some(due) = state.failure_log.failed(std::time::Instant::now(), 1, &error) {
                    tracing::warn!(feed = %name, failures = due.count, error = %due.last_error, "cannot send; retrying");
                }
            }
            Sent::Refused(error) => {
                self.counters.refused(1, &error, now_ms);
                if let Some(refused) = at.and_then(|at| state.queue.remove(at)) {
                    tracing::error!(feed = %name, item = %id, error = %error, "the receiver refused it for good; dropped");
                    handled(state, &refused.item);
                }
            }
        }
        self.show_pending(state);
    }

    /// Saves the cursor (before the oldest item still queued) and the items
    /// delivered since the last save.
    async fn save(&self, state: &mut Sending<S::Item>) {
        let position =
            state.queue.front().map_or_else(|| state.read_at.clone(), |q| q.resume.clone());
        let delivered: Vec<(String, String)> = match self.feed.target() {
            // A feed that keeps no delivered items saves only its cursor.
            None => Vec::new(),
            Some(_) => state
                .runs
                .iter()
                .filter(|(_, p)| !p.handled.is_empty())
                .map(|(run_id, p)| {
                    let ids: Vec<&String> = p
                        .durable
                        .union(&p.handled)
                        .filter(|id| p.derivable.contains(*id))
                        .collect();
                    (run_id.clone(), serde_json::to_string(&ids).unwrap_or_else(|_| "[]".into()))
                })
                .collect(),
        };
        state.last_save = Instant::now();
        let position = position.max(state.saved.clone());
        match self.writer.save_cursor(&self.feed, position.clone(), delivered).await {
            Ok(()) => {
                self.counters.position(position.seq);
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
                tracing::warn!(feed = %self.sink.name(), error = %err, "cannot save the feed's position")
            }
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

/// Notes that `item` was delivered or dropped: it leaves the queue's
/// books, and is saved as delivered with the next save.
fn handled<I: Item>(state: &mut Sending<I>, item: &I) {
    state.queued.remove(item.id());
    let progress = state.runs.entry(item.run_id().to_owned()).or_default();
    progress.queued = progress.queued.saturating_sub(1);
    progress.handled.insert(item.id().to_owned());
    state.dirty = true;
}

#[cfg(feature = "forward")]
impl FeedCounters for crate::engine::stats::ForwardStats {
    fn sending(&self, _: bool) {}

    fn position(&self, seq: u64) {
        self.position.store(seq, Ordering::Relaxed);
    }

    fn pending(&self, count: u64, _: Option<u64>) {
        self.pending.store(count, Ordering::Relaxed);
    }

    fn sent(&self, count: u64, at_ms: u64) {
        self.forwarded.fetch_add(count, Ordering::Relaxed);
        self.last_success_ms.store(at_ms, Ordering::Relaxed);
    }

    fn failed(&self, _: &str, _: u64) {
        self.retries.fetch_add(1, Ordering::Relaxed);
    }

    fn refused(&self, count: u64, _: &str, _: u64) {
        self.refused.fetch_add(count, Ordering::Relaxed);
    }

    fn dropped(&self, _: u64) {}

    fn dropped_total(&self) -> u64 {
        0
    }
}

#[cfg(feature = "notify")]
impl FeedCounters for crate::engine::stats::NotifyStats {
    fn sending(&self, sending: bool) {
        self.sending.store(sending, Ordering::Relaxed);
    }

    fn position(&self, seq: u64) {
        self.position.store(seq, Ordering::Relaxed);
    }

    fn pending(&self, count: u64, oldest_ms: Option<u64>) {
        self.pending.store(count, Ordering::Relaxed);
        self.oldest_pending_ms.store(oldest_ms.unwrap_or(0), Ordering::Relaxed);
    }

    fn sent(&self, count: u64, at_ms: u64) {
        self.sent.fetch_add(count, Ordering::Relaxed);
        self.last_sent_ms.store(at_ms, Ordering::Relaxed);
    }

    fn failed(&self, error: &str, at_ms: u64) {
        crate::engine::stats::NotifyStats::failed(self, error.to_owned(), at_ms);
    }

    fn refused(&self, count: u64, error: &str, at_ms: u64) {
        crate::engine::stats::NotifyStats::failed(self, error.to_owned(), at_ms);
        self.dropped.fetch_add(count, Ordering::Relaxed);
    }

    fn dropped(&self, count: u64) {
        self.dropped.fetch_add(count, Ordering::Relaxed);
    }

    fn dropped_total(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}
