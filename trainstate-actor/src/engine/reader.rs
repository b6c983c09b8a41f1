//! Reads and heartbeats answered without the actor's turn.
//!
//! A read needs only what is committed: the committed view (which the
//! writer updates after each commit, under its lock for as long as it
//! takes to apply one) and the liveness tables (when each live run and
//! rank was last heard from). So a connection reads them itself and never
//! queues behind the writes in the actor's mailbox. A heartbeat changes
//! nothing stored: a connection stamps it into the liveness tables when
//! the actor has an entry for it that takes heartbeats, and otherwise asks
//! the actor, whose answer carries the error.
//!
//! On a store other heads share, the view holds what this head has
//! committed and what it has followed of the others' commits (their
//! change log, followed on `NOTIFY`); a run another head has just
//! registered and this head has not followed yet is looked up by the
//! actor, which reads the store first, so a read never answers "not
//! found" for a run another head has committed.

// The reads off the actor's turn are the HTTP server's.
#![cfg_attr(not(feature = "server"), allow(dead_code))]

use std::sync::Arc;
use std::time::Duration;

use trainstate_client::api::{MetricsQuery, MetricsResponse, RendezvousResponse, StacksResponse};
use trainstate_client::{RunDocument, RunPage, RunQuery, StateError};
use trainstate_schema::api::{ProgressReport, ProgressResponse, RankProgress, RankProgressServed};
use trainstate_schema::{RunId, RunStatus};

use crate::decisions::clock::Clock;
use crate::decisions::liveness::Liveness;
use crate::decisions::progress::Reporter;
use crate::engine::writer::Published;

/// The least time the actor may take no turn before `/healthz` says so,
/// however short its sweep period (tests sweep every few milliseconds).
const QUIET_FLOOR: Duration = Duration::from_secs(2);

/// The reads of one head, for its connections.
#[derive(Clone)]
pub(crate) struct Reader {
    shared: Arc<Published>,
    clock: Arc<dyn Clock>,
    lease: Duration,
    /// How long the actor may take no turn before `/healthz` says so.
    quiet_limit: Duration,
}

/// What a read found in the committed view.
pub(crate) enum Found {
    Run(RunDocument),
    /// Not committed here, and no other head can have committed it.
    Missing,
    /// Not in this head's view, but the store is shared: the actor looks.
    AskTheActor,
}

impl Reader {
    pub(crate) fn new(
        shared: Arc<Published>,
        clock: Arc<dyn Clock>,
        lease: Duration,
        sweep_every: Duration,
    ) -> Self {
        let quiet_limit = (sweep_every * 3).max(QUIET_FLOOR);
        Self { shared, clock, lease, quiet_limit }
    }

    fn liveness(&self) -> &Liveness {
        &self.shared.liveness
    }

    /// One committed run, with when it (and each of its ranks) was last
    /// heard from.
    pub(crate) fn get(&self, id: &RunId) -> Found {
        let view = self.shared.view.read().unwrap_or_else(|e| e.into_inner());
        let Some(record) = view.get(id) else {
            return match self.shared.shared_store {
                Some(_) => Found::AskTheActor,
                None => Found::Missing,
            };
        };
        let record = record.clone();
        drop(view);
        let document = record.document(self.liveness().heartbeat_of(&record));
        Found::Run(self.liveness().decorate(&record, document, self.clock.now_ms()))
    }

    /// The attempt of an ended run whose ranks' last progress is to be
    /// read ([`Reader::last_progress`]): the run's last attempt, when the
    /// run is committed, ended, and this head holds no progress board of it.
    pub(crate) fn ended_attempt(&self, id: &RunId) -> Option<String> {
        if self.liveness().progress(id).is_some() {
            return None;
        }
        let view = self.shared.view.read().unwrap_or_else(|e| e.into_inner());
        let record = view.get(id)?.clone();
        drop(view);
        if !record.status.is_terminal() {
            return None;
        }
        record.run().ok()?.attempts().last().map(|a| a.attempt_id().to_owned())
    }

    /// The last progress of ended run `id`'s ranks in its attempt
    /// `attempt`, kept when their board went away: from the liveness
    /// tables until it is flushed, then from the store (blocking: call it
    /// where blocking is allowed). `None` when none was kept of that
    /// attempt.
    pub(crate) fn last_progress(
        &self,
        id: &RunId,
        attempt: &str,
    ) -> Result<Option<Arc<[Option<RankProgressServed>]>>, StateError> {
        let (kept_attempt, json) = match self.liveness().retired_progress(id) {
            Some((kept_attempt, json)) => (kept_attempt.to_string(), json.to_string()),
            None => match self.shared.metric_reader.last_progress(id).map_err(|e| {
                StateError::unavailable(format!("cannot read the run's last progress: {e}"))
            })? {
                Some(last) => (last.attempt_id, last.json),
                None => return Ok(None),
            },
        };
        if kept_attempt != attempt {
            return Ok(None);
        }
        let served: Vec<Option<RankProgressServed>> = serde_json::from_str(&json).map_err(|e| {
            StateError::unavailable(format!("the run's last progress cannot be read: {e}"))
        })?;
        Ok(Some(served.into()))
    }

    /// The metric series of a committed run's current attempt, read from
    /// the store (blocking: call it where blocking is allowed). Points
    /// reach the store about a second after they are reported.
    pub(crate) fn metrics(
        &self,
        id: &RunId,
        query: &MetricsQuery,
    ) -> Result<MetricsResponse, StateError> {
        let attempt = match self.liveness().progress(id) {
            Some(board) => Some(board.attempt_id().to_owned()),
            None => {
                let view = self.shared.view.read().unwrap_or_else(|e| e.into_inner());
                let record = view.get(id).ok_or_else(|| StateError::NotFound { id: id.clone() })?;
                let record = record.clone();
                drop(view);
                record.run()?.attempts().last().map(|a| a.attempt_id().to_owned())
            }
        };
        let series = match attempt {
            Some(attempt) => self.shared.metric_reader.read(id, &attempt, query).map_err(|e| {
                StateError::unavailable(format!("cannot read metric histories: {e}"))
            })?,
            None => Vec::new(),
        };
        Ok(MetricsResponse::new(id.clone(), series))
    }

    /// The stack captures of a committed run, newest first, read from the
    /// store (blocking: call it where blocking is allowed). A pending
    /// capture is served with the ranks that answered so far.
    pub(crate) fn stacks(&self, id: &RunId) -> Result<StacksResponse, StateError> {
        let known = {
            let view = self.shared.view.read().unwrap_or_else(|e| e.into_inner());
            view.get(id).is_some()
        };
        if !known {
            return Err(StateError::NotFound { id: id.clone() });
        }
        let captures = self
            .shared
            .metric_reader
            .captures(id)
            .map_err(|e| StateError::unavailable(format!("cannot read stack captures: {e}")))?;
        Ok(StacksResponse::new(id.clone(), captures))
    }

    /// A page of committed runs.
    pub(crate) fn list(&self, query: &RunQuery) -> Result<RunPage, StateError> {
        query.check()?;
        let liveness = self.liveness();
        let view = self.shared.view.read().unwrap_or_else(|e| e.into_inner());
        // The page's live runs, in its order, to serve their goodput live.
        let live = std::cell::RefCell::new(Vec::new());
        let mut page = view.list(query, |record| {
            live.borrow_mut().push((!record.status.is_terminal()).then(|| record.id.clone()));
            liveness.heartbeat_of(record)
        });
        let now_ms = self.clock.now_ms();
        for (document, id) in page.runs.iter_mut().zip(live.into_inner()) {
            if let Some(record) = id.and_then(|id| view.get(&id)) {
                let served = liveness.with_live_goodput(record, document.clone(), now_ms);
                *document = served;
            }
        }
        Ok(page)
    }

    /// Takes a run's heartbeat here when its run is live and this head's
    /// own: its lease. `None`: the actor decides it.
    pub(crate) fn heartbeat(&self, id: &RunId) -> Option<Duration> {
        let beat = self.liveness().beat(id).filter(|beat| beat.takes_heartbeats())?;
        let now = self.clock.now_ms();
        beat.raise(now, self.clock.monotonic_ms());
        self.shared.note_heartbeat(id, now);
        Some(self.lease)
    }

    /// Takes a rank's heartbeat here when this head tracks its group (see
    /// [`crate::decisions::rendezvous::heartbeat_rank_here`]). `None`: the actor
    /// decides it.
    pub(crate) fn heartbeat_rank(
        &self,
        id: &RunId,
        rank: u32,
        attempt_id: &str,
        progress: Option<&RankProgress>,
    ) -> Option<Result<RendezvousResponse, StateError>> {
        crate::decisions::rendezvous::heartbeat_rank_here(
            self.liveness(),
            id,
            rank,
            attempt_id,
            progress,
            self.lease.as_millis() as u64,
            self.clock.now_ms(),
            self.clock.monotonic_ms(),
        )
    }

    /// Takes a controller's progress report here when the run is live and
    /// this head's own and the board of its current attempt exists (the
    /// actor creates it at the run's first report): recorded while the run
    /// is RUNNING, and a sign of life of the run, like its heartbeat (see
    /// [`Runs::report_progress`](crate::decisions::state::Runs::report_progress)).
    /// `None`: the actor decides it (a first report, another attempt, an
    /// unknown, ended or foreign run), and its answer names what is wrong.
    pub(crate) fn report_progress(
        &self,
        id: &RunId,
        report: &ProgressReport,
    ) -> Option<Result<ProgressResponse, StateError>> {
        let board =
            self.liveness().progress(id).filter(|b| b.reporter() == Reporter::Controller)?;
        if report.attempt_id.as_deref().is_some_and(|a| a != board.attempt_id()) {
            return None;
        }
        let beat = self.liveness().beat(id).filter(|beat| beat.takes_heartbeats())?;
        let now = self.clock.now_ms();
        let recorded = beat.status() == RunStatus::Running;
        let taken = if recorded {
            board.report_ranks(id, &report.ranks, now)
        } else {
            board.check_ranks(id, &report.ranks)
        };
        if let Err(err) = taken {
            return Some(Err(err));
        }
        beat.raise(now, self.clock.monotonic_ms());
        self.shared.note_heartbeat(id, now);
        let lease_ms = self.lease.as_millis() as u64;
        Some(Ok(ProgressResponse::new(board.attempt_id(), board.world_size(), recorded, lease_ms)))
    }

    /// Why the head cannot serve, if it cannot: its supervisor gave up on
    /// the state actor, or the actor has taken no turn for longer than
    /// three lease sweeps (it is wedged: its sweep comes every period).
    pub(crate) fn unhealthy(&self) -> Option<StateError> {
        if let Some(reason) = self.shared.gave_up.borrow().clone() {
            return Some(StateError::unavailable(format!("the state actor stopped: {reason}")));
        }
        let quiet = self.shared.liveness.actor_turns.since_last();
        (quiet > self.quiet_limit).then(|| {
            StateError::unavailable(format!(
                "the state actor has taken no turn for {} s",
                quiet.as_secs()
            ))
        })
    }
}
