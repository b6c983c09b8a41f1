//! The supervisor of the state actor, and how the actor is launched, found
//! and shut down.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SpawnErr, SupervisionEvent};
use tokio::sync::oneshot;
use trainstate_client::{StateHandle, StateMessage, get_state_actor_named};

use crate::engine::actor::{ActorArgs, TrainStateActor};
use crate::engine::config::StateConfig;
use crate::engine::error::LaunchError;
// The change feed, as services reach it: through this door.
#[cfg_attr(not(any(feature = "forward", feature = "notify")), allow(unused_imports))]
pub(crate) use crate::engine::feed::{
    Feed, FeedContext, FeedCounters, FeedHandle, Item, QueuePolicy, RunItems, SendOne, Sent, Sink,
};
use crate::engine::stats::Feeds;
use crate::engine::stats::StoreStats;
use crate::engine::writer::{Published, Writer};

/// What a rendezvous request is, for the services that receive one (see
/// [`StateService::rendezvous`]).
#[cfg(feature = "server")]
pub(crate) use crate::decisions::rendezvous_call::RendezvousCall;

/// More restarts than this within [`RESTART_WINDOW`] and the supervisor gives up.
const MAX_RESTARTS: usize = 10;
const RESTART_WINDOW: Duration = Duration::from_secs(10);

/// The supervisor's registry name for a state actor named `name`.
pub(crate) fn supervisor_name(name: &str) -> String {
    format!("{name}.supervisor")
}

pub(crate) enum SupervisorMessage {
    /// Answers once the supervisor (and so its first actor) has started.
    Ready(RpcReplyPort<Arc<Writer>>),
    /// Drains the actor, commits everything queued, and stops.
    Shutdown(RpcReplyPort<()>),
}

pub(crate) struct StateSupervisor;

pub(crate) struct SupervisorState {
    config: StateConfig,
    writer: Arc<Writer>,
    child: Option<ActorRef<StateMessage>>,
    shutting_down: bool,
    restarts: VecDeque<Instant>,
}

impl Actor for StateSupervisor {
    type Msg = SupervisorMessage;
    type State = SupervisorState;
    type Arguments = StateConfig;

    async fn pre_start(
        &self,
        myself: ActorRef<SupervisorMessage>,
        config: StateConfig,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let writer = Arc::new(Writer::start(&config)?);
        let mut state = SupervisorState {
            config,
            writer,
            child: None,
            shutting_down: false,
            restarts: VecDeque::new(),
        };
        state.spawn_child(&myself).await?;
        Ok(state)
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<SupervisorMessage>,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        if let Some(child) = state.child.take() {
            child.stop(Some("supervisor stopped".into()));
        }
        let writer = state.writer.clone();
        let _ = tokio::task::spawn_blocking(move || writer.close()).await;
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<SupervisorMessage>,
        message: SupervisorMessage,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SupervisorMessage::Ready(reply) => {
                let _ = reply.send(state.writer.clone());
            }
            SupervisorMessage::Shutdown(reply) => {
                state.shutting_down = true;
                if let Some(child) = state.child.take() {
                    // Handle every queued request, then stop.
                    let _ = child.drain_and_wait(None).await;
                }
                let writer = state.writer.clone();
                let _ = tokio::task::spawn_blocking(move || writer.close()).await;
                let _ = reply.send(());
                myself.stop(Some("shut down".into()));
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<SupervisorMessage>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        let (cell, why) = match &event {
            SupervisionEvent::ActorFailed(cell, err) => (cell, err.to_string()),
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell, reason.clone().unwrap_or_else(|| "stopped".into()))
            }
            _ => return Ok(()),
        };
        let is_child = state.child.as_ref().is_some_and(|c| c.get_id() == cell.get_id());
        if !is_child || state.shutting_down {
            return Ok(());
        }
        state.child = None;
        let now = Instant::now();
        state.restarts.retain(|at| now.duration_since(*at) < RESTART_WINDOW);
        if state.restarts.len() >= MAX_RESTARTS {
            state.give_up(
                &myself,
                format!(
                    "the state actor failed {} times within {RESTART_WINDOW:?} (last: {why})",
                    MAX_RESTARTS + 1
                ),
            );
            return Ok(());
        }
        tracing::error!(reason = %why, "state actor stopped; restarting it from the store");
        state.restarts.push_back(now);
        state.writer.shared.actor_restarts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Err(err) = state.spawn_child(&myself).await {
            state.give_up(&myself, format!("the state actor could not be restarted: {err}"));
        }
        Ok(())
    }
}

impl SupervisorState {
    /// Stops for good: logs why, tells whoever waits on
    /// [`StateService::gave_up`], and stops (closing the store after what is
    /// queued). Nothing answers requests any more: the process should exit.
    fn give_up(&mut self, myself: &ActorRef<SupervisorMessage>, reason: String) {
        tracing::error!(reason = %reason, "giving up on the state actor");
        self.writer.shared.gave_up.send_replace(Some(reason.clone()));
        myself.stop(Some(reason));
    }

    async fn spawn_child(
        &mut self,
        myself: &ActorRef<SupervisorMessage>,
    ) -> Result<(), ActorProcessingErr> {
        let name = self.config.name.clone();
        // The old actor's name is released as it exits; allow that a moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let args = ActorArgs { config: self.config.clone(), writer: self.writer.clone() };
            match Actor::spawn_linked(Some(name.clone()), TrainStateActor, args, myself.get_cell())
                .await
            {
                Ok((child, _)) => {
                    self.child = Some(child);
                    return Ok(());
                }
                Err(SpawnErr::ActorAlreadyRegistered(_)) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                // Why it failed (a store that does not load), not ractor's
                // wrapping of it, which speaks of a panic.
                Err(SpawnErr::StartupFailed(why)) => return Err(why),
                Err(err) => return Err(err.into()),
            }
        }
    }
}

/// A running state actor with its supervisor and store, as launched by this
/// process.
pub struct StateService {
    handle: StateHandle,
    supervisor: ActorRef<SupervisorMessage>,
    shared: Arc<Published>,
    writer: Arc<Writer>,
    /// The actor's clock, for work done for it off its turn.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    clock: Arc<dyn crate::decisions::clock::Clock>,
    /// Test-only fault hooks, for work done off the actor's turn.
    #[cfg(feature = "fault-injection")]
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    faults: Arc<crate::engine::faults::Faults>,
    /// Reads and heartbeats answered without the actor's turn.
    #[cfg_attr(not(feature = "server"), allow(dead_code))]
    reader: crate::engine::reader::Reader,
    /// On a shared store, once started (see
    /// [`relay_rendezvous_calls`](Self::relay_rendezvous_calls)): relays
    /// rendezvous calls to the head that owns the groups, and answers the
    /// other heads' calls while this head owns them.
    #[cfg(feature = "postgres")]
    relay: std::sync::Mutex<Option<Arc<crate::engine::relay::RendezvousRelay>>>,
}

impl std::fmt::Debug for StateService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateService").field("handle", &self.handle).finish()
    }
}

impl StateService {
    /// A handle to the actor.
    pub fn handle(&self) -> StateHandle {
        self.handle.clone()
    }

    /// Starts feeding `sink` the committed changes, from its durable
    /// cursor (see [`crate::engine::feed`]); stop it with
    /// [`FeedHandle::stop`].
    #[cfg_attr(not(any(feature = "forward", feature = "notify")), allow(dead_code))]
    pub(crate) fn follow_changes<S: Sink>(&self, sink: S) -> FeedHandle {
        crate::engine::feed::follow(self.writer.clone(), sink)
    }

    /// Reads the durable cursor of `feed` (saving where a new one starts):
    /// fails if the store keeps none (memory only) or cannot be read.
    #[cfg_attr(not(feature = "notify"), allow(dead_code))]
    pub(crate) async fn check_feed(&self, feed: &Feed) -> Result<(), crate::store::StoreError> {
        self.writer.load_cursor(feed).await.map(drop)
    }

    /// The feeds of the committed changes and their counters.
    #[cfg_attr(not(any(feature = "forward", feature = "notify")), allow(dead_code))]
    pub(crate) fn feeds(&self) -> &Feeds {
        &self.shared.feeds
    }

    /// True while this head sweeps leases and retention: always with a
    /// store of its own; with a shared store, for one head at a time.
    pub fn is_sweeper(&self) -> bool {
        self.shared.sweeps()
    }

    /// The store other heads share (where it is, and the flag that is set
    /// while this head holds its sweep lock); `None` for a store of its own.
    #[cfg_attr(not(all(feature = "server", feature = "postgres")), allow(dead_code))]
    pub(crate) fn shared_store(&self) -> Option<&crate::store::SharedStoreHandle> {
        self.shared.shared_store.as_ref()
    }

    /// On a shared store, starts relaying rendezvous calls between this
    /// head and the one that owns the groups (once; a server calls it as it
    /// starts serving). Until [`shutdown`](Self::shutdown), this head then
    /// relays the calls it receives while another head owns the groups, and
    /// answers the other heads' calls while it owns them. With a store of
    /// its own, nothing to do.
    #[cfg(feature = "server")]
    pub(crate) fn relay_rendezvous_calls(&self) {
        #[cfg(feature = "postgres")]
        if let Some(store) = self.shared_store() {
            let mut relay = self.relay.lock().unwrap_or_else(|e| e.into_inner());
            if relay.is_none() {
                *relay = crate::engine::relay::RendezvousRelay::start(store, self.handle())
                    .inspect_err(|err| tracing::error!("the rendezvous relay cannot start: {err}"))
                    .ok();
            }
        }
    }

    /// Answers a rendezvous call (a join, a rank heartbeat, a rank end):
    /// here, when this head owns the rendezvous groups (always with a store
    /// of its own); otherwise checked here and relayed to the head that
    /// owns them, whose answer it is.
    #[cfg(feature = "server")]
    pub(crate) async fn rendezvous(
        &self,
        call: RendezvousCall,
    ) -> Result<trainstate_client::api::RendezvousResponse, crate::engine::error::ApiError> {
        #[cfg(feature = "postgres")]
        {
            let relay = self.relay.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(relay) = relay.filter(|relay| !relay.owns()) {
                // Refused here, by the head the client reached, before it is relayed.
                call.check()?;
                return match relay.call(&call).await? {
                    crate::decisions::rendezvous_call::RelayedAnswer::Ok(response) => Ok(response),
                    crate::decisions::rendezvous_call::RelayedAnswer::Err(body) => {
                        Err(crate::engine::error::ApiError::from_body(body))
                    }
                };
            }
        }
        Ok(crate::engine::relay::answer_here(call, &self.reader, &self.handle).await?)
    }

    /// Counters of the store.
    pub fn store_stats(&self) -> Arc<StoreStats> {
        self.shared.stats.clone()
    }

    /// Writes handed to the store and not yet answered.
    pub fn in_flight_writes(&self) -> usize {
        self.shared.in_flight.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Committed runs, by status, in `RunStatus::ALL` order.
    pub fn runs_by_status(&self) -> [usize; trainstate_schema::RunStatus::ALL.len()] {
        self.shared.view.read().unwrap_or_else(|e| e.into_inner()).count_by_status()
    }

    /// Committed runs, by health, in `HealthState::ALL` order (a run with
    /// no health is in none).
    pub fn runs_by_health(&self) -> [usize; trainstate_schema::HealthState::ALL.len()] {
        self.shared.view.read().unwrap_or_else(|e| e.into_inner()).count_by_health()
    }

    /// Committed runs.
    pub fn run_count(&self) -> usize {
        self.shared.view.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Restarts of the state actor by its supervisor (after a panic).
    pub fn actor_restarts(&self) -> u64 {
        self.shared.actor_restarts.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// False from a failed commit until a commit succeeds again: writes are
    /// answered `Unavailable` meanwhile, reads are served.
    pub fn store_writable(&self) -> bool {
        self.shared.writable.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Why the supervisor gave up on the state actor, if it has.
    pub fn failure(&self) -> Option<String> {
        self.shared.gave_up.borrow().clone()
    }

    /// Resolves once the supervisor has given up on the state actor (it
    /// failed too often), with the reason. The service then answers nothing:
    /// a process should log the reason and exit non-zero, so that its
    /// service manager restarts it.
    pub async fn gave_up(&self) -> String {
        let mut changes = self.shared.gave_up.subscribe();
        let reason = match changes.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone(),
            // The sender lives as long as `self`.
            Err(_) => None,
        };
        match reason {
            Some(reason) => reason,
            None => std::future::pending().await,
        }
    }

    /// Current event subscribers.
    pub fn subscribers(&self) -> usize {
        self.shared.events.receiver_count()
    }

    /// Stops the actor after it has handled every queued request and the
    /// store has committed every queued write.
    pub async fn shutdown(&self) {
        // Other heads' calls are no longer answered here; the relay's tasks end.
        #[cfg(feature = "postgres")]
        drop(self.relay.lock().unwrap_or_else(|e| e.into_inner()).take());
        shutdown(&self.supervisor).await;
    }
}

async fn shutdown(supervisor: &ActorRef<SupervisorMessage>) {
    let (tx, rx) = oneshot::channel();
    if supervisor.send_message(SupervisorMessage::Shutdown(tx.into())).is_ok() {
        let _ = rx.await;
    }
    let _ = supervisor.get_cell().wait(None).await;
}

/// Launches the state actor under `config.name`: a detached supervisor
/// (linked to no caller), the store, and the actor. Fails if an actor of
/// that name already runs.
pub async fn launch_state_actor(config: StateConfig) -> Result<StateService, LaunchError> {
    let name = config.name.clone();
    let clock = config.clock.clone();
    let (lease, sweep_every) = (config.lease, config.sweep_every());
    #[cfg(feature = "fault-injection")]
    let faults = config.faults.clone();
    let (supervisor, _) = Actor::spawn(Some(supervisor_name(&name)), StateSupervisor, config)
        .await
        .map_err(|err| match err {
            SpawnErr::ActorAlreadyRegistered(_) => {
                LaunchError::Startup(format!("a state actor named {name:?} already runs"))
            }
            other => LaunchError::Startup(startup_reason(other)),
        })?;
    let writer = ready(&supervisor).await?;
    let shared = writer.shared.clone();
    let reader =
        crate::engine::reader::Reader::new(shared.clone(), clock.clone(), lease, sweep_every);
    Ok(StateService {
        handle: StateHandle::local(name),
        supervisor,
        shared,
        writer,
        clock,
        #[cfg(feature = "fault-injection")]
        faults,
        reader,
        #[cfg(feature = "postgres")]
        relay: std::sync::Mutex::default(),
    })
}

/// The state actor named `config.name` in this process, launched with
/// `config` if none runs yet. Race-safe: concurrent callers get handles to
/// one actor; a caller that loses the race for the name uses the winner's.
pub async fn get_or_launch_state_actor(config: StateConfig) -> Result<StateHandle, LaunchError> {
    let name = config.name.clone();
    if let Some(handle) = get_state_actor_named(&name) {
        return Ok(handle);
    }
    match Actor::spawn(Some(supervisor_name(&name)), StateSupervisor, config).await {
        Ok((supervisor, _)) => {
            ready(&supervisor).await?;
        }
        Err(SpawnErr::ActorAlreadyRegistered(_)) => {
            // Another caller won: wait until its supervisor has started.
            let winner = ActorRef::<SupervisorMessage>::where_is(supervisor_name(&name))
                .ok_or_else(|| {
                    LaunchError::Startup("the state actor stopped while starting".into())
                })?;
            ready(&winner).await?;
        }
        Err(other) => return Err(LaunchError::Startup(startup_reason(other))),
    }
    Ok(StateHandle::local(name))
}

/// Shuts down the state actor named `name` in this process, if one runs:
/// queued requests are handled and queued writes committed first.
pub async fn shutdown_state_actor(name: &str) -> bool {
    match ActorRef::<SupervisorMessage>::where_is(supervisor_name(name)) {
        Some(supervisor) => {
            shutdown(&supervisor).await;
            true
        }
        None => false,
    }
}

async fn ready(supervisor: &ActorRef<SupervisorMessage>) -> Result<Arc<Writer>, LaunchError> {
    let (tx, rx) = oneshot::channel();
    supervisor
        .send_message(SupervisorMessage::Ready(tx.into()))
        .map_err(|_| LaunchError::Startup("the state actor stopped while starting".into()))?;
    rx.await.map_err(|_| LaunchError::Startup("the state actor stopped while starting".into()))
}

fn startup_reason(err: SpawnErr) -> String {
    match err {
        SpawnErr::StartupFailed(inner) => inner.to_string(),
        other => other.to_string(),
    }
}

/// What the services name of the engine, handed out through this door.
#[cfg(feature = "server")]
pub(crate) use crate::{
    decisions::state::RayWrite,
    decisions::tokens::{
        Idempotency, SecretHash, StoredToken, check_request as check_token_request,
        constant_time_eq, hash_secret, idempotency_key_hash, new_id_and_secret, request_hash,
    },
    engine::reader::Found,
    engine::view::{Snapshot, Start},
    store::lock::DataDirLock,
};

/// A rank's progress: its world rank, its step, and when the step last
/// grew (in ms).
#[cfg(feature = "server")]
pub(crate) type RankPosition = (u32, u64, u64);

/// One subscriber's way into the committed event stream: the events after
/// a position, read from the view's backlog under its read lock.
#[cfg(feature = "server")]
pub(crate) struct EventFeed {
    shared: Arc<Published>,
}

#[cfg(feature = "server")]
impl EventFeed {
    /// At most `max` events after `position`, or, when the next one is no
    /// longer kept, a fresh snapshot to start over from.
    pub(crate) fn events_after(
        &self,
        position: u64,
        max: usize,
    ) -> Result<Vec<trainstate_client::StateEvent>, Snapshot> {
        let view = self.shared.view.read().unwrap_or_else(|e| e.into_inner());
        view.events_after(position, max).map_err(|_| view.snapshot())
    }
}

/// The door the HTTP service goes through: reads answered from the
/// committed view, token administration, the event stream and the
/// counters it shows. Each method hands out what it read, never the
/// engine's insides.
#[cfg(feature = "server")]
impl StateService {
    /// The run `id` as committed here, or where to look for it.
    pub(crate) fn find_run(&self, id: &trainstate_schema::RunId) -> Found {
        self.reader.get(id)
    }

    /// The attempt of an ended run whose ranks' last progress the store
    /// keeps, if `id` is such a run.
    pub(crate) fn ended_attempt(&self, id: &trainstate_schema::RunId) -> Option<String> {
        self.reader.ended_attempt(id)
    }

    /// The ranks' last progress of an ended attempt, read from the store on
    /// a blocking thread.
    pub(crate) async fn last_progress(
        &self,
        id: trainstate_schema::RunId,
        attempt: String,
    ) -> Result<
        Option<Arc<[Option<trainstate_schema::api::RankProgressServed>]>>,
        trainstate_client::StateError,
    > {
        let reader = self.reader.clone();
        tokio::task::spawn_blocking(move || reader.last_progress(&id, &attempt)).await.map_err(
            |e| {
                trainstate_client::StateError::unavailable(format!(
                    "reading the last progress failed: {e}"
                ))
            },
        )?
    }

    /// A run's metric histories, read from the store on a blocking thread.
    pub(crate) async fn metric_histories(
        &self,
        id: trainstate_schema::RunId,
        query: trainstate_client::api::MetricsQuery,
    ) -> Result<trainstate_client::api::MetricsResponse, trainstate_client::StateError> {
        let reader = self.reader.clone();
        tokio::task::spawn_blocking(move || reader.metrics(&id, &query)).await.map_err(|e| {
            trainstate_client::StateError::unavailable(format!(
                "reading metric histories failed: {e}"
            ))
        })?
    }

    /// A run's stack captures, read from the store on a blocking thread.
    pub(crate) async fn stacks(
        &self,
        id: trainstate_schema::RunId,
    ) -> Result<trainstate_client::api::StacksResponse, trainstate_client::StateError> {
        let reader = self.reader.clone();
        tokio::task::spawn_blocking(move || reader.stacks(&id)).await.map_err(|e| {
            trainstate_client::StateError::unavailable(format!(
                "reading stack captures failed: {e}"
            ))
        })?
    }

    /// One page of runs, from the committed view.
    pub(crate) fn list_runs(
        &self,
        query: &trainstate_client::RunQuery,
    ) -> Result<trainstate_client::RunPage, trainstate_client::StateError> {
        self.reader.list(query)
    }

    /// Takes a heartbeat on the connection when the run's liveness entry
    /// takes heartbeats; `None` leaves it to the actor.
    pub(crate) fn heartbeat(&self, id: &trainstate_schema::RunId) -> Option<Duration> {
        self.reader.heartbeat(id)
    }

    /// Takes a progress report on the connection when the board of the
    /// run's current attempt exists; `None` leaves it to the actor.
    pub(crate) fn report_progress(
        &self,
        id: &trainstate_schema::RunId,
        report: &trainstate_schema::api::ProgressReport,
    ) -> Option<Result<trainstate_schema::api::ProgressResponse, trainstate_client::StateError>>
    {
        self.reader.report_progress(id, report)
    }

    /// Why the head is unhealthy, if it is.
    pub(crate) fn unhealthy(&self) -> Option<trainstate_client::StateError> {
        self.reader.unhealthy()
    }

    /// A Ray Train V2 write, converted and validated off the actor's turn
    /// (on a blocking thread) against the committed version of its run,
    /// with the bytes it weighs: what `StateHandle::upsert_ray_prepared`
    /// takes.
    pub(crate) async fn prepare_ray_write(
        &self,
        write: Arc<RayWrite>,
        at_ms: Option<u64>,
    ) -> Result<(trainstate_client::PreparedChange, u64), trainstate_client::StateError> {
        let id = write.run_id()?;
        let base = self.shared.view.read().unwrap_or_else(|e| e.into_inner()).get(&id).cloned();
        let now = self.clock.now_ms();
        let at = crate::engine::actor::written_at(at_ms, now)?;
        #[cfg(feature = "fault-injection")]
        let faults = self.faults.clone();
        let (prepared, bytes) = tokio::task::spawn_blocking(move || {
            #[cfg(feature = "fault-injection")]
            faults.wait_while_ray_preparations_held();
            let bytes = match &*write {
                RayWrite::Run(run) => crate::decisions::state::json_len(run),
                RayWrite::Attempt(attempt) => crate::decisions::state::json_len(attempt),
            };
            crate::decisions::state::prepare_ray_write(base, &write, at, now).map(|p| (p, bytes))
        })
        .await
        .map_err(|e| {
            trainstate_client::StateError::unavailable(format!("preparing the write failed: {e}"))
        })??;
        Ok((trainstate_client::PreparedChange::new(prepared), bytes as u64))
    }

    /// The stored access tokens, revoked ones included.
    pub(crate) async fn tokens(&self) -> Result<Vec<StoredToken>, String> {
        self.writer.tokens().await
    }

    /// Stores a new access token; answers it as stored (with its time).
    pub(crate) async fn insert_token(&self, token: StoredToken) -> Result<StoredToken, String> {
        self.writer.insert_token(token).await
    }

    /// Revokes the token `id`; `None` when no token has that id.
    pub(crate) async fn revoke_token(&self, id: &str) -> Result<Option<StoredToken>, String> {
        self.writer.revoke_token(id).await
    }

    /// Follows the committed event stream after `after` (or from a
    /// snapshot): where to start, decided under the view's read lock, the
    /// feed to read on from, and the last sequence number published.
    pub(crate) fn follow_events(
        &self,
        after: Option<u64>,
    ) -> (EventFeed, Start, tokio::sync::watch::Receiver<u64>) {
        let (start, published) =
            self.shared.view.read().unwrap_or_else(|e| e.into_inner()).follow(after);
        (EventFeed { shared: self.shared.clone() }, start, published)
    }

    /// The head's time now (Unix ms).
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// The node ledger for the window from `since_ms`.
    pub(crate) fn nodes(
        &self,
        since_ms: u64,
        cluster: Option<&str>,
    ) -> trainstate_schema::api::NodeListResponse {
        self.shared.view.read().unwrap_or_else(|e| e.into_inner()).nodes(since_ms, cluster)
    }

    /// The fleet's goodput over `query`'s window to now, off the actor's
    /// turn; an error names the field of the query it is about.
    pub(crate) fn goodput(
        &self,
        query: &trainstate_schema::api::GoodputQuery,
    ) -> Result<trainstate_schema::api::GoodputResponse, trainstate_client::StateError> {
        let now_ms = self.clock.now_ms();
        let view = self.shared.view.read().unwrap_or_else(|e| e.into_inner());
        view.goodput_of(query, now_ms)
    }

    /// Each live run's goodput counted to now: id, name, cluster, goodput.
    pub(crate) fn live_goodput(&self) -> Vec<crate::engine::stats::LiveGoodput> {
        let now_ms = self.clock.now_ms();
        self.shared.view.read().unwrap_or_else(|e| e.into_inner()).live_goodput(now_ms)
    }

    /// One node of the ledger with the runs behind its counts.
    pub(crate) fn node(
        &self,
        node: &str,
        cluster: Option<&str>,
        since_ms: u64,
    ) -> Option<trainstate_schema::api::NodeDetailResponse> {
        self.shared.view.read().unwrap_or_else(|e| e.into_inner()).node(node, cluster, since_ms)
    }

    /// Events kept for subscribers that resume, and their bytes.
    pub(crate) fn event_backlog(&self) -> (usize, usize) {
        self.shared.view.read().unwrap_or_else(|e| e.into_inner()).backlog_usage()
    }

    /// Each live rank's progress, by run id then rank: (run id, rank,
    /// step, last advance in ms).
    pub(crate) fn rank_positions(&self) -> Vec<(trainstate_schema::RunId, Vec<RankPosition>)> {
        let mut boards = self.shared.liveness.progress_boards();
        boards.sort_by(|(a, _), (b, _)| a.as_str().cmp(b.as_str()));
        boards.into_iter().map(|(id, board)| (id, board.positions())).collect()
    }

    /// Each notification target's delivery counters, when the head notifies.
    #[cfg(feature = "notify")]
    pub(crate) fn notify_targets(&self) -> Vec<Arc<crate::engine::stats::NotifyStats>> {
        self.shared.feeds.notify.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The forwarding counters, when the head forwards.
    #[cfg(feature = "forward")]
    pub(crate) fn forwarding_stats(&self) -> Option<Arc<crate::engine::stats::ForwardStats>> {
        self.shared.feeds.forwarding.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
