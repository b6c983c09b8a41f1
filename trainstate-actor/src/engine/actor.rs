//! `TrainStateActor`: the ractor actor that owns the working state.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::oneshot;
use trainstate_client::{RendezvousMessage, Reply, StateError, StateMessage};
use trainstate_schema::RunId;
use trainstate_schema::api::StacksResponse;

use crate::decisions::captures::Captures;
use crate::decisions::health::HealthSweep;
use crate::decisions::rendezvous::{Reaction, Rendezvous};
use crate::decisions::state::{Change, Outcome, PreparedRayWrite, RayWrite, Runs, is_foreign};
use crate::engine::config::StateConfig;
use crate::engine::writer::{WriteJob, Writer};

/// The state actor. One per process, registered under the configured name
/// and supervised by `StateSupervisor`.
pub(crate) struct TrainStateActor;

pub(crate) struct ActorArgs {
    pub(crate) config: StateConfig,
    pub(crate) writer: Arc<Writer>,
}

pub(crate) struct ActorState {
    runs: Runs,
    /// Rendezvous groups and ranks: memory only.
    rendezvous: Rendezvous,
    /// The health decisions of the lease sweep.
    health: HealthSweep,
    /// Each run's stack captures, and the one it waits for.
    captures: Captures,
    config: StateConfig,
    writer: Arc<Writer>,
    /// When the previous sweep ran (or the actor started), on the
    /// monotonic clock: a sweep much later than its period shows that the
    /// head was not running.
    last_sweep_mono_ms: u64,
    /// The writer's generation (failed commits) the working state has
    /// taken in; every write is stamped with it.
    generation: u64,
}

impl Actor for TrainStateActor {
    type Msg = StateMessage;
    type State = ActorState;
    type Arguments = ActorArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<StateMessage>,
        args: ActorArgs,
    ) -> Result<ActorState, ActorProcessingErr> {
        #[cfg(feature = "fault-injection")]
        args.config.faults.wait_while_load_held().await;
        let started = std::time::Instant::now();
        let records = args.writer.load().await?;
        let read = started.elapsed();
        // Loaded after every write queued before: whatever failed is not in it.
        let generation = args.writer.shared.generation.load(Ordering::SeqCst);
        let now = args.config.clock.now_ms();
        let mono = args.config.clock.monotonic_ms();
        let liveness = args.writer.shared.liveness.clone();
        let mut runs = Runs::load_at(
            records,
            now,
            Some(mono),
            args.config.lease,
            args.config.retention,
            liveness.clone(),
        );
        runs.exempt_foreign(args.config.cluster.as_deref());
        let captures = load_captures(&args.writer, &mut runs).await;
        tracing::info!(
            runs = runs.len(),
            name = %args.config.name,
            store_ms = read.as_millis() as u64,
            total_ms = started.elapsed().as_millis() as u64,
            "state actor started"
        );
        args.writer.shared.liveness.actor_turns.turn();
        myself.send_interval(args.config.sweep_every(), || {
            let (tx, _unanswered) = oneshot::channel();
            StateMessage::SweepLeases { reply: tx.into() }
        });
        myself.send_interval(args.config.health_every(), || {
            let (tx, _unanswered) = oneshot::channel();
            StateMessage::DecideHealth { reply: tx.into() }
        });
        Ok(ActorState {
            runs,
            rendezvous: Rendezvous::new(liveness, args.config.cluster.clone()),
            health: HealthSweep::new(args.config.stall_after_ms()),
            captures,
            config: args.config,
            writer: args.writer,
            last_sweep_mono_ms: mono,
            generation,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<StateMessage>,
        message: StateMessage,
        state: &mut ActorState,
    ) -> Result<(), ActorProcessingErr> {
        #[cfg(feature = "fault-injection")]
        state.config.faults.wait_while_actor_held().await;
        state.writer.shared.liveness.actor_turns.turn();
        let now = state.config.clock.now_ms();
        state.runs.set_monotonic(state.config.clock.monotonic_ms());
        state.runs.set_wall(now);
        state.catch_up(now);
        match message {
            StateMessage::Register { run, reply, .. } => {
                state.before_write()?;
                let run = match state.config.cluster.as_deref() {
                    Some(cluster) => run.in_cluster(cluster).map_err(StateError::from),
                    None => Ok(*run),
                };
                let outcome = match run {
                    Ok(run) => {
                        let id = run.run().id().clone();
                        state
                            .admit()
                            .and_then(|()| state.owned(&id))
                            .and_then(|()| state.runs.register(run, now))
                    }
                    Err(err) => Err(err),
                };
                state.write(outcome, reply);
            }
            StateMessage::SetStatus { id, update, reply } => {
                state.before_write()?;
                state.find(&id, now).await;
                state.settle_health(&id, now);
                let outcome = state
                    .admit()
                    .and_then(|()| state.owned(&id))
                    .and_then(|()| written_at(update.at_ms, now))
                    .and_then(|at| state.runs.set_status(&id, update, at));
                state.write(outcome, reply);
            }
            StateMessage::StartAttempt { id, attempt, reply } => {
                state.before_write()?;
                state.find(&id, now).await;
                let outcome = state
                    .admit()
                    .and_then(|()| state.owned(&id))
                    .and_then(|()| state.runs.start_attempt(&id, attempt, now));
                state.write(outcome, reply);
            }
            StateMessage::UpsertRayRun { run, at_ms, reply } => {
                state.before_write()?;
                let outcome = state
                    .admit()
                    .and_then(|()| written_at(at_ms, now))
                    .and_then(|at| state.runs.upsert_ray(&RayWrite::Run(run), at, now));
                state.write(outcome, reply);
            }
            StateMessage::UpsertRayAttempt { attempt, at_ms, reply } => {
                state.before_write()?;
                let outcome = state
                    .admit()
                    .and_then(|()| written_at(at_ms, now))
                    .and_then(|at| state.runs.upsert_ray(&RayWrite::Attempt(attempt), at, now));
                state.write(outcome, reply);
            }
            StateMessage::UpsertRayPrepared { prepared, reply, .. } => {
                state.before_write()?;
                // Decided off this turn; only whether the run is still the
                // version it was decided on is checked here.
                let Some(prepared) = prepared.into_inner::<PreparedRayWrite>() else {
                    let _ = reply.send(Err(StateError::unavailable("not a prepared V2 write")));
                    return Ok(());
                };
                match state.admit().map(|()| state.runs.apply_prepared(prepared)) {
                    Err(err) => {
                        let _ = reply.send(Err(err));
                    }
                    Ok(None) => {
                        let _ = reply.send(Ok(None));
                    }
                    Ok(Some(outcome)) => state.write(outcome.map(|o| o.map(Some)), reply),
                }
            }
            StateMessage::Delete { id, reply } => {
                state.before_write()?;
                state.find(&id, now).await;
                let outcome = state.admit().and_then(|()| state.runs.delete(&id));
                state.write(outcome, reply);
            }
            StateMessage::Forward { run, reply } => {
                state.before_write()?;
                // A run another head of a shared store stored first makes
                // this write stale, and its retry a repeat: no need to look.
                let home = state.config.cluster.clone();
                let outcome = state.admit().and_then(|()| state.runs.upsert(*run, home.as_deref()));
                state.write(outcome, reply);
            }
            StateMessage::SweepLeases { reply } => {
                state.before_write()?;
                state.notice_stall(now);
                if !state.writer.shared.sweeps() {
                    // Another head sharing the store sweeps, and owns the
                    // rendezvous groups: what this head knew of them goes
                    // stale, and is forgotten, as by a restart.
                    state.rendezvous = Rendezvous::new(
                        state.writer.shared.liveness.clone(),
                        state.config.cluster.clone(),
                    );
                    state.health = HealthSweep::new(state.config.stall_after_ms());
                    let _ = reply.send(Ok(Vec::new()));
                    return Ok(());
                }
                if state.writer.shared.shared_store.is_some() {
                    // Every head's heartbeats and changes count.
                    state.writer.sync(true).await;
                    state.absorb(now);
                    state.runs.finish_shared_read(now);
                }
                // Health first: a stall that ended before a run does is
                // written before the run's end.
                let mut change = Change { ops: Vec::new(), events: Vec::new(), answer: Vec::new() };
                let liveness = &state.writer.shared.liveness;
                state.health.sweep(liveness, &mut state.runs, now, &mut change);
                state.captures.open_for_stalls(&mut state.runs, liveness, now, &mut change);
                state.captures.sweep(&mut state.runs, liveness, now, &mut change);
                let leases = state.runs.sweep(now);
                change.ops.extend(leases.ops);
                change.events.extend(leases.events);
                change.answer = leases.answer;
                let view = &state.writer.shared.view;
                state.rendezvous.sweep(&mut state.runs, view, now, &mut change);
                state.rendezvous.order_ends(&state.runs, None);
                if !change.answer.is_empty() {
                    tracing::warn!(count = change.answer.len(), sample = %crate::decisions::log_sample::sample(&change.answer), "aborted runs whose controller stopped heartbeating");
                }
                state.write(Ok(Outcome::Changed(change)), reply);
            }
            StateMessage::DecideHealth { reply } => {
                state.before_write()?;
                if !state.writer.shared.sweeps() {
                    let _ = reply.send(Ok(0));
                    return Ok(());
                }
                let mut change = Change { ops: Vec::new(), events: Vec::new(), answer: 0 };
                let liveness = &state.writer.shared.liveness;
                change.answer = state.health.tick(liveness, &mut state.runs, now, &mut change);
                state.captures.open_for_stalls(&mut state.runs, liveness, now, &mut change);
                state.captures.sweep(&mut state.runs, liveness, now, &mut change);
                state.rendezvous.order_ends(&state.runs, None);
                if change.ops.is_empty() {
                    let _ = reply.send(Ok(change.answer));
                } else {
                    state.write(Ok(Outcome::Changed(change)), reply);
                }
            }
            StateMessage::Heartbeat { id, reply } => {
                state.find(&id, now).await;
                let answer = state.owned(&id).and_then(|()| state.runs.heartbeat(&id, now));
                if answer.is_ok() {
                    state.writer.shared.note_heartbeat(&id, now);
                }
                let _ = reply.send(answer);
            }
            StateMessage::ReportProgress { id, report, reply } => {
                state.find(&id, now).await;
                let answer =
                    state.owned(&id).and_then(|()| state.runs.report_progress(&id, &report, now));
                if answer.is_ok() {
                    state.writer.shared.note_heartbeat(&id, now);
                }
                let _ = reply.send(answer);
            }
            StateMessage::Get { id, reply } => {
                let missing = {
                    let view = state.writer.shared.view.read().unwrap_or_else(|e| e.into_inner());
                    view.get(&id).is_none()
                };
                if missing && state.writer.shared.shared_store.is_some() {
                    // Perhaps another head has just registered it.
                    state.writer.sync(false).await;
                    state.absorb(now);
                }
                let view = state.writer.shared.view.read().unwrap_or_else(|e| e.into_inner());
                let answer = match view.get(&id) {
                    Some(record) => Ok(state.writer.shared.liveness.decorate(
                        record,
                        record.document(state.runs.heartbeat_of(record)),
                        now,
                    )),
                    None => Err(StateError::NotFound { id }),
                };
                drop(view);
                let _ = reply.send(answer);
            }
            StateMessage::List { query, reply } => {
                let answer = query.check().map(|()| {
                    let view = state.writer.shared.view.read().unwrap_or_else(|e| e.into_inner());
                    view.list(&query, |record| state.runs.heartbeat_of(record))
                });
                let _ = reply.send(answer);
            }
            StateMessage::Goodput { query, reply } => {
                let now_ms = state.config.clock.now_ms();
                let view = state.writer.shared.view.read().unwrap_or_else(|e| e.into_inner());
                let _ = reply.send(view.goodput_of(&query, now_ms));
            }
            StateMessage::Subscribe { after_seq, reply } => {
                let shared = &state.writer.shared;
                let view = shared.view.read().unwrap_or_else(|e| e.into_inner());
                let subscription = view.subscribe(&shared.events, after_seq);
                drop(view);
                let _ = reply.send(Ok(subscription));
            }
            StateMessage::GetStacks { id, reply } => {
                let shared = &state.writer.shared;
                let missing = {
                    let view = shared.view.read().unwrap_or_else(|e| e.into_inner());
                    view.get(&id).is_none()
                };
                if missing && shared.shared_store.is_some() {
                    // Perhaps another head has just registered it.
                    state.writer.sync(false).await;
                    state.absorb(now);
                }
                let known = {
                    let view = state.writer.shared.view.read().unwrap_or_else(|e| e.into_inner());
                    view.get(&id).is_some()
                };
                if known {
                    // The store is read on a blocking thread, never on the turn.
                    let reader = state.writer.shared.metric_reader.clone();
                    tokio::task::spawn_blocking(move || {
                        let answer = reader
                            .captures(&id)
                            .map(|captures| StacksResponse::new(id, captures))
                            .map_err(|e| {
                                StateError::unavailable(format!("cannot read stack captures: {e}"))
                            });
                        let _ = reply.send(answer);
                    });
                } else {
                    let _ = reply.send(Err(StateError::NotFound { id }));
                }
            }
            StateMessage::PostStacks { id, request, reply } => {
                state.before_write()?;
                state.find(&id, now).await;
                let liveness = &state.writer.shared.liveness;
                let outcome = state.admit().and_then(|()| state.owned(&id)).and_then(|()| {
                    state.captures.post(&id, *request, &mut state.runs, liveness, now)
                });
                state.write(outcome, reply);
                // A capture that completes names the stall's suspects.
                state.rendezvous.order_ends(&state.runs, Some(&id));
            }
            StateMessage::Rendezvous(message) => {
                state.before_write()?;
                let ended = match &message {
                    RendezvousMessage::End { id, .. } => Some(id.clone()),
                    _ => None,
                };
                let joined = matches!(message, RendezvousMessage::Join { .. });
                if let Some(id) = &ended {
                    state.settle_health(id, now);
                }
                let admitted = state.admit();
                let lease_ms = state.config.lease.as_millis() as u64;
                let view = &state.writer.shared.view;
                match state.rendezvous.handle(
                    message,
                    &mut state.runs,
                    view,
                    admitted,
                    lease_ms,
                    now,
                ) {
                    Reaction::Answer(reply, answer) => {
                        let _ = reply.send(answer);
                    }
                    Reaction::Write(reply, outcome) => state.write(outcome, reply),
                }
                if let Some(id) = &ended {
                    // A rank's end may end the run, or its stall.
                    state.rendezvous.order_ends(&state.runs, Some(id));
                } else if joined {
                    // A join again after a restart of the head may say
                    // again what the run asked for when it stalls.
                    state.rendezvous.order_ends(&state.runs, None);
                }
                if state.rendezvous.take_wakeup() {
                    // A failure window opened: its cause is decided by the
                    // sweep after it, not a whole sweep period later.
                    for window_ms in [
                        crate::decisions::rendezvous::FAILURE_WINDOW_MS,
                        crate::decisions::rendezvous::ECHO_WINDOW_MS,
                    ] {
                        let window = Duration::from_millis(window_ms + 50);
                        myself.send_after(window, || {
                            let (tx, _unanswered) = oneshot::channel();
                            StateMessage::SweepLeases { reply: tx.into() }
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

impl ActorState {
    /// Before a sweep: if it comes much later than its period (see
    /// [`crate::decisions::clock::late_sweep`]), the head was not running and could
    /// not hear heartbeats, so every live run and every assembling
    /// rendezvous group gets a fresh lease from now, as after a restart,
    /// instead of being aborted for the head's own silence.
    fn notice_stall(&mut self, now: u64) {
        let mono = self.config.clock.monotonic_ms();
        let previous = std::mem::replace(&mut self.last_sweep_mono_ms, mono);
        let period = self.config.sweep_every();
        if let Some(gap_ms) = crate::decisions::clock::late_sweep(previous, mono, period) {
            let renewed = self.runs.renew_leases(now);
            let groups = self.rendezvous.renew_deadlines(mono);
            tracing::warn!(
                stalled_s = gap_ms as f64 / 1000.0,
                sweep_period_s = period.as_secs_f64(),
                runs = renewed,
                rendezvous_groups = groups,
                "the head was not running (its lease sweep came late): every live run gets a fresh lease from now"
            );
        }
    }

    /// Before each decision: takes in what the writer reported and, after
    /// a failed commit, puts the committed runs back into the working state
    /// (the failed writes, and those decided after them, are refused).
    fn catch_up(&mut self, now: u64) {
        // Read before the inbox and the view: a failure after this read
        // refuses what is decided now, so the working state can never be
        // behind the generation its writes are stamped with.
        let generation = self.writer.shared.generation.load(Ordering::SeqCst);
        let histories = self.absorb(now);
        if generation != self.generation {
            let committed = {
                let view = self.writer.shared.view.read().unwrap_or_else(|e| e.into_inner());
                view.records()
            };
            let home = self.config.cluster.as_deref();
            let restored = self.runs.restore(committed, now, home);
            // The health last written may be one of the failed writes.
            self.health = HealthSweep::new(self.config.stall_after_ms());
            // The failed commit itself is logged (as an error) by the writer.
            tracing::debug!(
                runs = restored,
                "a commit failed: its runs are back to their committed versions"
            );
            self.generation = generation;
        }
        // Metric histories count against the retained bytes: when a flush
        // brought them past the bound, the oldest ended runs go now, with
        // their histories, not at the next registration.
        if histories && self.writer.shared.sweeps() && self.runs.over_capacity() {
            let change = self.runs.evict_excess();
            let (tx, _unanswered) = oneshot::channel();
            self.write(Ok(Outcome::Changed(change)), tx.into());
        }
    }

    /// Takes in what the writer reported: other heads' changes, refused
    /// writes' stored versions, other heads' heartbeats, the bytes of
    /// histories a flush left. True when the latter were among them.
    fn absorb(&mut self, now: u64) -> bool {
        let home = self.config.cluster.as_deref();
        let mut histories = false;
        for item in self.writer.shared.take_inbox() {
            histories |= matches!(item, crate::decisions::change::Absorb::Histories(_));
            self.runs.absorb(item, now, home);
        }
        histories
    }

    /// Before deciding on a run this head does not know: with a shared
    /// store, another head may have just registered it.
    async fn find(&mut self, id: &RunId, now: u64) {
        if self.writer.shared.shared_store.is_some() && self.runs.record(id).is_none() {
            self.writer.sync(false).await;
            self.absorb(now);
        }
    }

    /// Refuses a change to a run of another cluster: it changes only
    /// through forwarding from its own head.
    fn owned(&self, id: &RunId) -> Result<(), StateError> {
        match self.runs.record(id) {
            Some(record) if is_foreign(record, self.config.cluster.as_deref()) => {
                Err(StateError::Conflict {
                    id: id.clone(),
                    reason: format!(
                        "the run belongs to cluster {:?}; it changes only through its own head, which forwards it here",
                        record.cluster.as_deref().unwrap_or("")
                    ),
                })
            }
            _ => Ok(()),
        }
    }

    /// Checks run before every write: injected faults. (A failed commit
    /// costs no restart: see [`ActorState::catch_up`].)
    fn before_write(&self) -> Result<(), ActorProcessingErr> {
        #[cfg(feature = "fault-injection")]
        if self.config.faults.take_panic() {
            panic!("injected fault: the state actor panics while handling a write");
        }
        Ok(())
    }

    /// Before a write that may end run `id`: writes the end of its stall
    /// first when a rank advanced after it (see [`HealthSweep::settle`]),
    /// so the run never ends with a stall that had already ended.
    fn settle_health(&mut self, id: &RunId, now: u64) {
        if !self.writer.shared.sweeps() {
            return;
        }
        let mut change = Change { ops: Vec::new(), events: Vec::new(), answer: () };
        let liveness = &self.writer.shared.liveness;
        self.health.settle(liveness, &mut self.runs, id, now, &mut change);
        if !change.ops.is_empty() {
            let (tx, _unanswered) = oneshot::channel();
            self.write(Ok(Outcome::Changed(change)), tx.into());
        }
    }

    /// Refuses a write when too many are in flight.
    fn admit(&self) -> Result<(), StateError> {
        let in_flight = self.writer.shared.in_flight.load(Ordering::SeqCst);
        if in_flight >= self.config.max_in_flight_writes {
            return Err(StateError::Overloaded { in_flight: Some(in_flight as u64) });
        }
        Ok(())
    }

    /// Answers a write once it is committed. A repeat that changes nothing
    /// still waits behind the writes before it, so no answer ever shows a
    /// run that is not yet durable.
    fn write<T: Send + 'static>(&self, outcome: Result<Outcome<T>, StateError>, reply: Reply<T>) {
        let job = match outcome {
            Err(err) => {
                let _ = reply.send(Err(err));
                return;
            }
            Ok(Outcome::Unchanged(answer)) => WriteJob {
                decided_at: self.generation,
                ops: Vec::new(),
                events: Vec::new(),
                done: Box::new(move |result| {
                    let _ = reply.send(result.map(|()| answer));
                }),
            },
            Ok(Outcome::Changed(change)) => {
                let answer = change.answer;
                WriteJob {
                    decided_at: self.generation,
                    ops: change.ops,
                    events: change.events,
                    done: Box::new(move |result| {
                        let _ = reply.send(result.map(|()| answer));
                    }),
                }
            }
        };
        self.writer.submit(job);
    }
}

/// The stack captures the store keeps, read at the actor's start on the
/// store's reader (a connection of its own): their index, and the captures
/// still pending whole, which complete at their deadline. Each run's
/// captured bytes, and the bytes of its metric histories, count against
/// the retained bytes.
async fn load_captures(writer: &Arc<Writer>, runs: &mut Runs) -> Captures {
    let reader = writer.shared.metric_reader.clone();
    let histories = {
        let reader = reader.clone();
        tokio::task::spawn_blocking(move || reader.history_bytes()).await
    };
    match histories {
        Ok(Ok(bytes)) => {
            for (id, bytes) in bytes {
                runs.set_history_bytes(&id, bytes);
            }
        }
        Ok(Err(err)) => tracing::error!(error = %err, "cannot read the stored metric histories"),
        Err(err) => tracing::error!(error = %err, "cannot read the stored metric histories"),
    }
    let read = tokio::task::spawn_blocking(move || {
        let index = reader.capture_index()?;
        let mut pending = Vec::new();
        for stored in &index {
            if stored.header.state == trainstate_schema::api::CaptureState::Pending {
                let whole = reader.captures(&stored.run_id)?;
                pending.extend(
                    whole
                        .into_iter()
                        .filter(|c| c.capture_id == stored.header.capture_id)
                        .map(|c| (stored.run_id.clone(), c)),
                );
            }
        }
        Ok::<_, String>((index, pending))
    })
    .await;
    let mut captures = Captures::default();
    match read {
        Ok(Ok((index, pending))) => {
            let index = index.into_iter().map(|s| (s.run_id, s.bytes, s.header));
            for (id, bytes) in captures.load(index, pending) {
                runs.set_capture_bytes(&id, bytes);
            }
        }
        Ok(Err(err)) => tracing::error!(error = %err, "cannot read the stored stack captures"),
        Err(err) => tracing::error!(error = %err, "cannot read the stored stack captures"),
    }
    captures
}

/// When a write's change happened: the time its writer gave (`at_ms`,
/// checked like every time a client writes: a time in seconds or
/// nanoseconds, or one more than a day ahead of the head's clock, is
/// refused), or now. The state machine takes it as the
/// write's time: what the run's status history records, and the end it
/// stamps on a run that ends without one.
pub(crate) fn written_at(at_ms: Option<u64>, now_ms: u64) -> Result<u64, StateError> {
    match at_ms {
        Some(at) => {
            trainstate_schema::validate_time("at_ms", at)?;
            crate::decisions::state::not_ahead_of("at_ms", at, now_ms)?;
            Ok(at)
        }
        None => Ok(now_ms),
    }
}
