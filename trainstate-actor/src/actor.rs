//! `TrainStateActor`: the ractor actor that owns the working state.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::sync::oneshot;
use trainstate_client::{Reply, StateError, StateMessage};

use crate::config::StateConfig;
use crate::rendezvous::{Reaction, Rendezvous};
use crate::state::{Outcome, Runs};
use crate::writer::{WriteJob, Writer};

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
    config: StateConfig,
    writer: Arc<Writer>,
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
        let records = args.writer.load().await?;
        let now = args.config.clock.now_ms();
        let runs = Runs::load(records, now, args.config.lease, args.config.retention);
        tracing::info!(runs = runs.len(), name = %args.config.name, "state actor started");
        myself.send_interval(args.config.sweep_every(), || {
            let (tx, _unanswered) = oneshot::channel();
            StateMessage::SweepLeases { reply: tx.into() }
        });
        Ok(ActorState {
            runs,
            rendezvous: Rendezvous::default(),
            config: args.config,
            writer: args.writer,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<StateMessage>,
        message: StateMessage,
        state: &mut ActorState,
    ) -> Result<(), ActorProcessingErr> {
        let now = state.config.clock.now_ms();
        match message {
            StateMessage::Register { run, reply } => {
                state.before_write()?;
                let outcome = state.admit().and_then(|()| state.runs.register(*run, now));
                state.write(outcome, reply);
            }
            StateMessage::SetStatus { id, update, reply } => {
                state.before_write()?;
                let outcome = state.admit().and_then(|()| state.runs.set_status(&id, update, now));
                state.write(outcome, reply);
            }
            StateMessage::StartAttempt { id, attempt, reply } => {
                state.before_write()?;
                let outcome =
                    state.admit().and_then(|()| state.runs.start_attempt(&id, attempt, now));
                state.write(outcome, reply);
            }
            StateMessage::UpsertRayRun { run, reply } => {
                state.before_write()?;
                let outcome = state.admit().and_then(|()| state.runs.upsert_ray_run(*run, now));
                state.write(outcome, reply);
            }
            StateMessage::UpsertRayAttempt { attempt, reply } => {
                state.before_write()?;
                let outcome =
                    state.admit().and_then(|()| state.runs.upsert_ray_attempt(*attempt, now));
                state.write(outcome, reply);
            }
            StateMessage::Delete { id, reply } => {
                state.before_write()?;
                let outcome = state.admit().and_then(|()| state.runs.delete(&id));
                state.write(outcome, reply);
            }
            StateMessage::SweepLeases { reply } => {
                state.before_write()?;
                let mut change = state.runs.sweep(now);
                let view = &state.writer.shared.view;
                state.rendezvous.sweep(&mut state.runs, view, now, &mut change);
                if !change.answer.is_empty() {
                    tracing::warn!(runs = ?change.answer, "aborted runs whose controller stopped heartbeating");
                }
                state.write(Ok(Outcome::Changed(change)), reply);
            }
            StateMessage::Heartbeat { id, reply } => {
                let _ = reply.send(state.runs.heartbeat(&id, now));
            }
            StateMessage::Get { id, reply } => {
                let view = state.writer.shared.view.read().unwrap_or_else(|e| e.into_inner());
                let answer = match view.get(&id) {
                    Some(record) => Ok(state
                        .rendezvous
                        .decorate(&id, record.document(state.runs.heartbeat_of(record)))),
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
            StateMessage::Subscribe { after_seq, reply } => {
                let shared = &state.writer.shared;
                let view = shared.view.read().unwrap_or_else(|e| e.into_inner());
                let subscription = view.subscribe(&shared.events, after_seq);
                drop(view);
                let _ = reply.send(Ok(subscription));
            }
            StateMessage::Rendezvous(message) => {
                state.before_write()?;
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
                    Reaction::Ignore => {}
                }
            }
            _ => {}
        }
        Ok(())
    }
}

impl ActorState {
    /// Checks run before every write: injected faults, and a store that
    /// failed to commit (the actor then fails, and its supervisor restarts it
    /// from the store).
    fn before_write(&self) -> Result<(), ActorProcessingErr> {
        #[cfg(feature = "fault-injection")]
        if self.config.faults.take_panic() {
            panic!("injected fault: the state actor panics while handling a write");
        }
        if self.writer.shared.poisoned.load(Ordering::SeqCst) {
            return Err("the store failed to commit; restarting to reload it".into());
        }
        Ok(())
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
                ops: Vec::new(),
                events: Vec::new(),
                done: Box::new(move |result| {
                    let _ = reply.send(result.map(|()| answer));
                }),
            },
            Ok(Outcome::Changed(change)) => {
                let answer = change.answer;
                WriteJob {
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
