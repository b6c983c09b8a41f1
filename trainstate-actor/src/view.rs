//! The committed view: what readers and subscribers see.
//!
//! Only the store writer changes it, after a commit, so reads and events
//! never show a write that is not durable.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::broadcast;
use trainstate_client::{Cursor, EventKind, RunPage, RunQuery, StateEvent, Subscription};
use trainstate_schema::{RunId, RunStatus};

use crate::record::RunRecord;
use crate::store::StoreOp;

/// The sequence number a new view starts at: its epoch. An event id from an
/// earlier process, or an earlier view of this one (an actor restart), is
/// then below every id this view hands out and is answered with a
/// snapshot, instead of being taken for one of this view's events when
/// numbers restarted at 1.
///
/// It is the Unix time in microseconds, so a later process starts above
/// every id an earlier one handed out unless that one published more than
/// one event per microsecond of its life (ids stay below 2^53, exact in
/// JavaScript, until 2255); within one process each view starts 2^32 above
/// the previous one even if the clock stepped back. The wall clock, not
/// the injected one: only distinctness matters here, never a duration.
fn epoch() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now_us = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as u64);
    let mut last = LAST.load(Ordering::SeqCst);
    loop {
        let next = if last == 0 { now_us } else { now_us.max(last + (1 << 32)) };
        match LAST.compare_exchange(last, next, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// Committed runs in listing order, and the recent events.
pub(crate) struct View {
    runs: HashMap<RunId, Arc<RunRecord>>,
    /// (start_time_ms, id), iterated in reverse for newest first.
    order: BTreeSet<(u64, RunId)>,
    last_seq: u64,
    backlog: VecDeque<StateEvent>,
    backlog_cap: usize,
}

impl View {
    pub(crate) fn new(backlog_cap: usize) -> Self {
        Self {
            runs: HashMap::new(),
            order: BTreeSet::new(),
            last_seq: epoch(),
            backlog: VecDeque::new(),
            backlog_cap,
        }
    }

    /// Replaces every run (after loading the store). Events go on from the
    /// same sequence number.
    pub(crate) fn replace_all(&mut self, records: &[Arc<RunRecord>]) {
        self.runs.clear();
        self.order.clear();
        for record in records {
            self.put(record.clone());
        }
    }

    pub(crate) fn apply(&mut self, op: &StoreOp) {
        match op {
            StoreOp::Put(record) => self.put(record.clone()),
            StoreOp::Delete(id) => {
                if let Some(old) = self.runs.remove(id) {
                    self.order.remove(&(old.start_time_ms, old.id.clone()));
                }
            }
        }
    }

    fn put(&mut self, record: Arc<RunRecord>) {
        self.order.insert((record.start_time_ms, record.id.clone()));
        if let Some(old) = self.runs.insert(record.id.clone(), record) {
            // start_time_ms is static metadata, so the key is unchanged.
            debug_assert!(self.order.contains(&(old.start_time_ms, old.id.clone())));
        }
    }

    /// Every committed run.
    pub(crate) fn records(&self) -> Vec<Arc<RunRecord>> {
        self.runs.values().cloned().collect()
    }

    pub(crate) fn get(&self, id: &RunId) -> Option<&Arc<RunRecord>> {
        self.runs.get(id)
    }

    pub(crate) fn len(&self) -> usize {
        self.runs.len()
    }

    /// Counts of committed runs by status, in [`RunStatus::ALL`] order.
    pub(crate) fn count_by_status(&self) -> [usize; 4] {
        let mut counts = [0; 4];
        for record in self.runs.values() {
            if let Some(i) = RunStatus::ALL.iter().position(|s| *s == record.status) {
                counts[i] += 1;
            }
        }
        counts
    }

    /// One page of runs, newest first. `heartbeat` gives a live run's last
    /// heartbeat time, kept outside the stored JSON.
    pub(crate) fn list(
        &self,
        query: &RunQuery,
        heartbeat: impl Fn(&RunRecord) -> Option<u64>,
    ) -> RunPage {
        let matches = |record: &RunRecord| {
            (query.statuses.is_empty() || query.statuses.iter().any(|s| s.matches(record.status)))
                && query.job_id.as_deref().is_none_or(|job| *record.job_id == *job)
                && query.name_contains.as_deref().is_none_or(|text| record.name.contains(text))
                && query
                    .node_id
                    .as_deref()
                    .is_none_or(|n| record.node_ids.iter().any(|x| **x == *n))
                && query
                    .node_ip
                    .as_deref()
                    .is_none_or(|n| record.node_ips.iter().any(|x| **x == *n))
                && query.cluster.as_deref().is_none_or(|c| record.cluster.as_deref() == Some(c))
        };
        let unfiltered = query.statuses.is_empty()
            && query.job_id.is_none()
            && query.name_contains.is_none()
            && query.node_id.is_none()
            && query.node_ip.is_none()
            && query.cluster.is_none();

        let after = query.cursor.as_ref().map(|c| (c.start_time_ms(), c.id().clone()));
        let newest_first = match &after {
            Some(key) => Box::new(self.order.range(..key.clone()).rev())
                as Box<dyn Iterator<Item = &(u64, RunId)>>,
            None => Box::new(self.order.iter().rev()),
        };
        let limit = query.limit.unwrap_or(usize::MAX);
        let mut runs = Vec::with_capacity(limit.min(self.runs.len()));
        let mut more = false;
        for (_, id) in newest_first {
            let record = &self.runs[id];
            if !matches(record) {
                continue;
            }
            if runs.len() == limit {
                more = true;
                break;
            }
            runs.push(record);
        }
        let total = if unfiltered {
            self.runs.len()
        } else {
            self.runs.values().filter(|r| matches(r)).count()
        };
        let next_cursor = match (more, runs.last()) {
            (true, Some(last)) => Some(Cursor::new(last.start_time_ms, last.id.clone())),
            _ => None,
        };
        let runs = runs.into_iter().map(|r| r.document(heartbeat(r))).collect();
        RunPage::new(runs, next_cursor, total)
    }

    /// Announces one committed change.
    pub(crate) fn publish(
        &mut self,
        events: &broadcast::Sender<StateEvent>,
        kind: EventKind,
        run_id: RunId,
        record: Option<&Arc<RunRecord>>,
    ) {
        self.last_seq += 1;
        let event = StateEvent::new(self.last_seq, kind, run_id, record.map(|r| r.document(None)));
        if self.backlog_cap > 0 {
            if self.backlog.len() == self.backlog_cap {
                self.backlog.pop_front();
            }
            self.backlog.push_back(event.clone());
        }
        // No receivers is fine: nobody is listening.
        let _ = events.send(event);
    }

    /// A subscription that misses nothing: taken under the same lock the
    /// writer publishes under.
    pub(crate) fn subscribe(
        &self,
        events: &broadcast::Sender<StateEvent>,
        after_seq: Option<u64>,
    ) -> Subscription {
        let backlog = after_seq.and_then(|after| {
            if after > self.last_seq {
                return None;
            }
            let oldest_kept = self.backlog.front().map_or(self.last_seq + 1, |e| e.seq);
            (after + 1 >= oldest_kept)
                .then(|| self.backlog.iter().filter(|e| e.seq > after).cloned().collect())
        });
        Subscription::new(events.subscribe(), backlog, self.last_seq)
    }
}
