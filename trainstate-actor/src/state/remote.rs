//! The working state beside other writers: changes other heads committed
//! to a shared store, refused (stale) writes, heartbeats other heads
//! received, and runs forwarded from other clusters.
//!
//! A run of another cluster (its `cluster` is set and is not this head's)
//! is *foreign*: it changes only through forwarding, and this head never
//! aborts it for a missing heartbeat (its own head does that).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use trainstate_client::{EventKind, RunDocument, StateError};
use trainstate_schema::TrainRunInfo;

use super::{Change, Outcome, Runs};
use crate::record::RunRecord;
use crate::store::StoreOp;
use crate::writer::{Absorb, PendingEvent};

/// The "last heard" time of a run this head never sweeps.
pub(super) const NEVER_SWEPT: u64 = u64::MAX;

/// Records, in the record that replaces `previous` in the working state,
/// the version it was decided on.
pub(super) fn note_base(record: &RunRecord, previous: &RunRecord) {
    record.base.store(previous.version, Ordering::Relaxed);
}

/// True when `record` belongs to another cluster than `home`.
pub(crate) fn is_foreign(record: &RunRecord, home: Option<&str>) -> bool {
    record.cluster.as_deref().is_some_and(|cluster| Some(cluster) != home)
}

impl Runs {
    /// The working state's version of a run.
    pub(crate) fn record(&self, id: &trainstate_schema::RunId) -> Option<&Arc<RunRecord>> {
        self.by_id.get(id).map(|e| &e.record)
    }

    /// Marks every run of another cluster as one this head never sweeps
    /// (after loading the store).
    pub(crate) fn exempt_foreign(&mut self, home: Option<&str>) {
        for entry in self.by_id.values_mut() {
            if is_foreign(&entry.record, home) {
                entry.last_heard_ms = NEVER_SWEPT;
            }
        }
    }

    /// Takes in one thing the writer reports (see [`Absorb`]).
    pub(crate) fn absorb(&mut self, item: Absorb, now_ms: u64, home: Option<&str>) {
        match item {
            Absorb::Remote(change, heard_ms) => match change.record {
                Some(record) => self.replace_with(record, heard_ms.min(now_ms), home),
                None => {
                    self.remove(&change.id);
                }
            },
            Absorb::Reset { id, stale, truth } => {
                let current = self.by_id.get(&id).map(|e| e.record.version);
                let applies = match stale {
                    Some(version) => current == Some(version),
                    None => current.is_none(),
                };
                if applies {
                    match truth {
                        Some(record) => self.replace_with(record, now_ms, home),
                        None => {
                            self.remove(&id);
                        }
                    }
                }
            }
            Absorb::Reload(records) => {
                *self = Runs::load(records, now_ms, self.lease, self.retention);
                self.exempt_foreign(home);
            }
            Absorb::Heard(id, at_ms) => {
                if let Some(entry) = self.by_id.get_mut(&id)
                    && !entry.record.status.is_terminal()
                    && entry.last_heard_ms != NEVER_SWEPT
                {
                    entry.last_heard_ms = entry.last_heard_ms.max(at_ms);
                }
            }
        }
    }

    /// Makes `record` the run's version, as committed by someone else: a
    /// sign of life of a live run of this cluster.
    fn replace_with(&mut self, record: Arc<RunRecord>, now_ms: u64, home: Option<&str>) {
        let heard = self.by_id.get(&record.id).map_or(now_ms, |e| e.last_heard_ms.max(now_ms));
        let heard = if is_foreign(&record, home) { NEVER_SWEPT } else { heard };
        self.remove(&record.id);
        self.put(record, heard);
    }

    /// Stores a run forwarded by the head of another cluster, as it is: the
    /// hub's write. Repeating it is a no-op; it never takes a run back
    /// (a terminal status stays final, but for a lost-controller abort that
    /// the run's own head replaced; a live run never loses attempts), and
    /// never changes static metadata or the run's cluster.
    pub(crate) fn upsert(
        &mut self,
        run: TrainRunInfo,
        home: Option<&str>,
    ) -> Result<Outcome<RunDocument>, StateError> {
        let Some(cluster) = run.cluster().map(str::to_owned) else {
            return Err(StateError::invalid(
                "cluster",
                "a forwarded run names the cluster it ran on",
            ));
        };
        if Some(cluster.as_str()) == home {
            return Err(StateError::Conflict {
                id: run.id().clone(),
                reason: format!(
                    "the run names this head's own cluster {cluster:?}; only runs of other clusters are forwarded to it"
                ),
            });
        }
        // Heartbeat times are the run's own head's business.
        let mut draft = run.into_draft();
        draft.last_heartbeat_ms = None;
        let run = draft.validate()?;
        let record = RunRecord::new(&run)?;
        let id = record.id.clone();

        let kind = match self.by_id.get(&id) {
            None => EventKind::Registered,
            Some(entry) => {
                let stored = entry.record.run()?;
                if let Some(field) = stored.static_difference(&run) {
                    return Err(StateError::Conflict {
                        id,
                        reason: format!(
                            "already stored with a different {field}; a run's static metadata never changes"
                        ),
                    });
                }
                if stored.cluster() != run.cluster() {
                    return Err(StateError::Conflict {
                        id,
                        reason: format!(
                            "the run belongs to cluster {:?}, not {cluster:?}",
                            stored.cluster().unwrap_or("")
                        ),
                    });
                }
                if entry.record.json().text() == record.json().text() {
                    let stored = entry.record.clone();
                    return Ok(Outcome::Unchanged(self.document(&stored)));
                }
                let (from, to) = (stored.run_status(), run.run_status());
                let illegal = |reason: &str| StateError::IllegalTransition {
                    id: id.clone(),
                    from,
                    to,
                    reason: reason.to_owned(),
                };
                if from.is_terminal() && !(entry.record.lost_controller && to.is_terminal()) {
                    return Err(illegal("a terminal status is final"));
                }
                if run.attempts().len() < stored.attempts().len() {
                    return Err(illegal("the forwarded run is older than the stored one"));
                }
                if from != to {
                    EventKind::StatusChanged
                } else if run.attempts().len() > stored.attempts().len() {
                    EventKind::AttemptStarted
                } else {
                    EventKind::StatusChanged
                }
            }
        };
        self.put(record.clone(), NEVER_SWEPT);
        let mut change = Change {
            ops: vec![StoreOp::Put(record.clone())],
            events: vec![PendingEvent { kind, run_id: id, record: Some(record.clone()) }],
            answer: self.document(&record),
        };
        if kind == EventKind::Registered {
            self.evict_over_capacity(&mut change.ops, &mut change.events);
        }
        Ok(Outcome::Changed(change))
    }
}
