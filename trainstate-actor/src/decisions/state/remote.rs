//! The working state beside other writers: changes other heads committed
//! to a shared store, refused (stale) writes, heartbeats other heads
//! received, and runs forwarded from other clusters.
//!
//! A run of another cluster (its `cluster` is set and is not this head's)
//! is *foreign*: it changes only through forwarding, and this head never
//! aborts it for a missing heartbeat (its own head does that).
//!
//! A hub keys forwarded runs by their cluster and their id, so two
//! clusters' runs never collide: the first cluster to forward an id holds
//! it, and a run of any other cluster with that id is stored under the
//! qualified id `<qualifier>:<id>` ([`qualifier`]), where every later
//! forward of that cluster's run goes. No one can take an id from the
//! cluster that holds it, nor write another cluster's qualified id.
//!
//! Leases are decided on this head's monotonic clock, but the heartbeats
//! other heads of a shared store received arrive as their wall times. Each
//! is converted on receipt: a heartbeat `age` ms old by this head's wall
//! clock was heard `age` ms before now on its monotonic clock, and never
//! later than now. Wall clocks of different machines disagree, and either
//! may be stepped; so when a run's shared heartbeat is newer than the one
//! this head read before, it was shared after that earlier read, and its
//! converted time is never put before that read either. A wall clock
//! stepped forward on this head (or behind on another) then makes other
//! heads' heartbeats look no older than the interval between two reads
//! (a sweep period, plus the other head's share period of about a second);
//! one ahead makes them look no newer than now. Either way no run is
//! aborted for a clock step, and a lease is extended by at most that
//! interval.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use sha2::{Digest, Sha256};
use trainstate_client::{EventKind, RunDocument, StateError};
use trainstate_schema::{RunId, TrainRunInfo};

use super::{Change, Entry, Outcome, Runs};
use crate::decisions::change::{Absorb, PendingEvent, StoreOp};
use crate::decisions::record::RunRecord;

/// The "last heard" time of a run this head never sweeps.
pub(super) use crate::decisions::liveness::NEVER_SWEPT;

/// Records, in the record that replaces `previous` in the working state,
/// the version it was decided on.
pub(super) fn note_base(record: &RunRecord, previous: &RunRecord) {
    record.base.store(previous.version, Ordering::Relaxed);
}

/// The qualifier of `cluster`'s runs in qualified ids: the cluster's name
/// when it is 1 to 64 letters, digits, `_` or `-`, else `cluster-` and the
/// first 16 hex digits of its name's SHA-256 hash.
pub(crate) fn qualifier(cluster: &str) -> String {
    if RunId::is_qualifier(cluster) {
        return cluster.to_owned();
    }
    let hash = Sha256::digest(cluster.as_bytes());
    let hex: String = hash[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("cluster-{hex}")
}

/// Refuses a qualified id from anyone but a hub's forwarding, which makes
/// them (an error naming `id`).
pub(super) fn refuse_qualified(id: &RunId) -> Result<(), StateError> {
    match id.qualifier() {
        None => Ok(()),
        Some(qualifier) => Err(StateError::invalid(
            "id",
            format!(
                "{id:?} has the form of a qualified id (of cluster {qualifier:?}): only a hub \
                 makes those, for runs other clusters forward; a run's own id has no ':'"
            ),
        )),
    }
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
        for entry in self.by_id.values() {
            if let Some(beat) = entry.live_beat().filter(|_| is_foreign(&entry.record, home)) {
                beat.set_heard(NEVER_SWEPT, NEVER_SWEPT);
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
                let liveness = self.liveness.clone();
                let side_bytes = self.side_bytes();
                *self = Runs::load_at(
                    records,
                    now_ms,
                    self.monotonic_ms,
                    self.lease,
                    self.retention,
                    liveness,
                );
                self.exempt_foreign(home);
                self.restore_side_bytes(side_bytes);
            }
            Absorb::Heard(id, at_ms) => self.heard_elsewhere(id, at_ms, now_ms),
            Absorb::Histories(bytes) => {
                for (id, bytes) in bytes {
                    self.set_history_bytes(&id, bytes);
                }
            }
        }
    }

    /// Takes in a heartbeat another head received at `at_ms` on its wall
    /// clock, converted on receipt to this head's monotonic clock (see the
    /// module's documentation).
    fn heard_elsewhere(&mut self, id: trainstate_schema::RunId, at_ms: u64, now_ms: u64) {
        let mono_now = self.lease_now(now_ms);
        let previous = self.shared_heard.get(&id).copied();
        let Some(entry) = self.by_id.get(&id) else {
            self.shared_heard.remove(&id);
            return;
        };
        let Some(beat) = entry.live_beat().filter(|beat| beat.heard_ms() != NEVER_SWEPT) else {
            self.shared_heard.remove(&id);
            return;
        };
        beat.raise(at_ms, 0);
        let age = now_ms.saturating_sub(at_ms);
        let converted = match previous {
            // Read before, unchanged: already counted.
            Some((seen, _)) if at_ms <= seen => None,
            // Shared since that read, which bounds it from below.
            Some((_, read_mono)) => Some(mono_now.saturating_sub(age).max(read_mono)),
            // Not there at the previous read (or the run was not live here
            // then, and got a fresh lease when it became known).
            None => Some(mono_now.saturating_sub(age).max(self.shared_read_mono_ms.unwrap_or(0))),
        };
        if let Some(heard) = converted {
            beat.raise(0, heard.min(mono_now));
            self.shared_heard.insert(id, (at_ms, mono_now));
        }
    }

    /// After every shared heartbeat was read (at a sweep): notes when, as
    /// the lower bound of heartbeats that appear by the next read, and
    /// forgets what was read for runs no longer live here.
    pub(crate) fn finish_shared_read(&mut self, now_ms: u64) {
        self.shared_read_mono_ms = Some(self.lease_now(now_ms));
        let by_id = &self.by_id;
        self.shared_heard
            .retain(|id, _| by_id.get(id).is_some_and(|entry| !entry.record.status.is_terminal()));
    }

    /// After a failed commit: makes every run the committed version again
    /// (`committed`: every committed run), keeping when each live run was
    /// last heard from. Returns how many runs changed.
    pub(crate) fn restore(
        &mut self,
        committed: Vec<Arc<RunRecord>>,
        now_ms: u64,
        home: Option<&str>,
    ) -> usize {
        let committed: std::collections::HashMap<_, _> =
            committed.into_iter().map(|r| (r.id.clone(), r)).collect();
        let gone: Vec<_> =
            self.by_id.keys().filter(|id| !committed.contains_key(*id)).cloned().collect();
        for id in &gone {
            self.remove(id);
        }
        let mut changed = gone.len();
        for (id, record) in committed {
            let heard = match self.by_id.get(&id) {
                Some(entry) if entry.record.version == record.version => continue,
                Some(entry) => entry.last_heard_ms().unwrap_or(now_ms),
                None => now_ms,
            };
            let heard = if is_foreign(&record, home) { NEVER_SWEPT } else { heard };
            self.replace_entry(record, heard);
            changed += 1;
        }
        changed
    }

    /// Makes `record` the run's version, as committed by someone else: a
    /// sign of life of a live run of this cluster.
    fn replace_with(&mut self, record: Arc<RunRecord>, now_ms: u64, home: Option<&str>) {
        let heard = self
            .by_id
            .get(&record.id)
            .and_then(Entry::last_heard_ms)
            .map_or(now_ms, |t| t.max(now_ms));
        let heard = if is_foreign(&record, home) { NEVER_SWEPT } else { heard };
        self.replace_entry(record, heard);
    }

    /// Makes `record` its run's only version, heard from at `heard_ms`:
    /// the board its controller reports to, if any, is kept (and follows
    /// the new version: see [`Runs::follow_progress`]).
    fn replace_entry(&mut self, record: Arc<RunRecord>, heard_ms: u64) {
        let board = self.controller_board(&record.id);
        self.remove(&record.id);
        if let Some(board) = board {
            self.liveness.put_progress(record.id.clone(), board);
        }
        self.put(record, heard_ms);
    }

    /// Stores a run forwarded by the head of another cluster, as it is: the
    /// hub's write. Repeating it is a no-op; it never takes a run back
    /// (a terminal status stays final, but for a lost-controller abort that
    /// the run's own head replaced; a live run never loses attempts), and
    /// never changes static metadata or the run's cluster.
    ///
    /// The run is keyed by its cluster and its id ([`Runs::keyed_id`]): when
    /// another cluster's run holds its id, it is stored under its qualified
    /// id instead.
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
        let keyed = self.keyed_id(run.id(), &cluster)?;
        // Heartbeat times are the run's own head's business.
        let mut draft = run.into_draft();
        draft.last_heartbeat_ms = None;
        draft.id = keyed.as_str().to_owned();
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
        if kind == EventKind::Registered {
            self.refuse_past_live_bound(&record)?;
            self.refuse_if_evicted_at_once(&record)?;
        }
        self.refuse_if_live_bytes_full(&record)?;
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

    /// The id a run of `cluster` forwarded as `id` is stored under: `id`
    /// while no run of another cluster holds it, else (and from then on)
    /// its qualified id. A forwarded id that is qualified already must carry
    /// its own cluster's qualifier (a hub forwarding to another hub); any
    /// other is refused, naming `id`.
    fn keyed_id(&self, id: &RunId, cluster: &str) -> Result<RunId, StateError> {
        let qualifier = qualifier(cluster);
        if let Some(given) = id.qualifier() {
            if given != qualifier {
                return Err(StateError::invalid(
                    "id",
                    format!(
                        "{id:?} has the form of another cluster's qualified id; a run of \
                         cluster {cluster:?} is qualified by {qualifier:?} only"
                    ),
                ));
            }
            return Ok(id.clone());
        }
        let qualified = RunId::qualified(&qualifier, id)?;
        if self.by_id.contains_key(&qualified) {
            return Ok(qualified);
        }
        match self.by_id.get(id) {
            Some(entry) if entry.record.cluster.as_deref() != Some(cluster) => Ok(qualified),
            _ => Ok(id.clone()),
        }
    }
}
