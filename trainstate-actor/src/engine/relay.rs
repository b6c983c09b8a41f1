//! The rendezvous on a shared store: any head takes any rank's request, one
//! head decides it.
//!
//! A rendezvous group (the ranks that joined, their heartbeats and ends, the
//! join deadline, the failure window) lives in the memory of one state
//! actor. With several heads on one PostgreSQL store, the head that sweeps
//! (the holder of the sweep lock) owns every group. Another head relays the
//! rendezvous requests it receives through the database: it inserts the
//! call into `trainstate_rendezvous_calls` (`store/relay.rs`), the owning
//! head claims it, answers it through its own actor and writes the answer
//! into the row, which the relaying head hands to its client as if it had
//! answered itself. So two ranks whose joins reach different heads form one
//! group, ends through different heads count in one place, and a rank
//! heartbeat reaches the group wherever it lands.
//!
//! A call is checked (key, body) on the head that received it, so a bad
//! request is refused at once. A call nobody answers within
//! [`RELAY_TIMEOUT`] (no head holds the sweep lock, or the database is
//! away) is answered 503 `unavailable`: the rank retries, and every
//! rendezvous request is idempotent, so a call answered late is harmless.
//! When the owning head changes, its successor knows what a restarted head
//! knows (`docs/rendezvous.md`, "A restart of the head").

#[cfg(feature = "postgres")]
use std::collections::HashMap;
#[cfg(feature = "postgres")]
use std::sync::atomic::{AtomicBool, Ordering};
#[cfg(feature = "postgres")]
use std::sync::{Arc, Mutex, Weak};
#[cfg(feature = "postgres")]
use std::time::Duration;

#[cfg(feature = "postgres")]
use tokio::sync::{Notify, Semaphore, oneshot};
use trainstate_client::api::RendezvousResponse;
use trainstate_client::{Join, RankEnd, StateError, StateHandle};

#[cfg(feature = "postgres")]
use crate::decisions::rendezvous_call::RelayedAnswer;
use crate::decisions::rendezvous_call::{RendezvousCall, run_id};
#[cfg(feature = "postgres")]
use crate::store::SharedStoreHandle;
#[cfg(feature = "postgres")]
use crate::store::relay::{CallId, RelayError, RelayTable};

/// Answers `call` here: a rank heartbeat is taken without the actor's turn
/// when this head tracks the rank's group; everything else, and a heartbeat
/// of a group this head does not track, is decided by the actor (which
/// names what is wrong).
#[cfg(feature = "server")]
pub(crate) async fn answer_here(
    call: RendezvousCall,
    reader: &crate::engine::reader::Reader,
    handle: &StateHandle,
) -> Result<RendezvousResponse, StateError> {
    if let RendezvousCall::Heartbeat { id, rank, request } = &call {
        let id = run_id(id)?;
        crate::decisions::rendezvous_call::check_progress(request)?;
        let progress = request.progress.as_ref();
        if let Some(answer) = reader.heartbeat_rank(&id, *rank, &request.attempt_id, progress) {
            return answer;
        }
    }
    apply(call, handle).await
}

/// Answers `call` through the actor of `handle`.
#[cfg_attr(not(any(feature = "server", feature = "postgres")), allow(dead_code))]
async fn apply(
    call: RendezvousCall,
    handle: &StateHandle,
) -> Result<RendezvousResponse, StateError> {
    match call {
        RendezvousCall::Join { key, request, client } => {
            handle.join_rendezvous_from(Join::from_request(&key, *request)?, client).await
        }
        RendezvousCall::Heartbeat { id, rank, request } => match request.progress {
            Some(progress) => {
                let id = run_id(&id)?;
                handle.heartbeat_rank_with_progress(id, rank, request.attempt_id, progress).await
            }
            None => handle.heartbeat_rank(run_id(&id)?, rank, request.attempt_id).await,
        },
        RendezvousCall::End { id, rank, request } => {
            handle.end_rank(run_id(&id)?, rank, RankEnd::try_from(request)?).await
        }
    }
}

/// How long a relaying head waits for the owner's answer.
#[cfg(feature = "postgres")]
pub(crate) const RELAY_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the owning head looks for calls it was not notified of, and
/// a relaying head for answers while it waits for some.
#[cfg(feature = "postgres")]
const OWNER_POLL: Duration = Duration::from_secs(1);
#[cfg(feature = "postgres")]
const ANSWER_POLL: Duration = Duration::from_millis(20);

/// The most calls the owner answers at once.
#[cfg(feature = "postgres")]
const MAX_CALLS_IN_FLIGHT: usize = 256;

/// What a waiting caller is handed: the owner's answer, or why it does not
/// parse.
#[cfg(feature = "postgres")]
type Delivered = Result<RelayedAnswer, RelayError>;

/// The relay of one head: relays its rendezvous calls while another head
/// owns the groups, and answers the calls of the others while it owns them.
#[cfg(feature = "postgres")]
pub(crate) struct RendezvousRelay {
    table: RelayTable,
    /// True while this head sweeps, and so owns every group.
    sweeper: Arc<AtomicBool>,
    /// The callers waiting for an answer, by call id.
    waiting: Mutex<HashMap<CallId, oneshot::Sender<Delivered>>>,
    /// Wakes the answer poller when a caller starts waiting.
    waiter_added: Notify,
    /// Wakes the owner when a call is announced.
    call_announced: Arc<Notify>,
}

#[cfg(feature = "postgres")]
#[cfg_attr(not(feature = "server"), allow(dead_code))]
impl RendezvousRelay {
    /// A relay on the shared `store`, started on the current Tokio runtime:
    /// it answers other heads' calls through `handle` while this head holds
    /// the store's sweep lock. Its tasks end when the relay is dropped.
    pub(crate) fn start(
        store: &SharedStoreHandle,
        handle: StateHandle,
    ) -> Result<Arc<Self>, RelayError> {
        let relay = Arc::new(Self {
            table: store.relay_table(RELAY_TIMEOUT)?,
            sweeper: store.sweep_lock(),
            waiting: Mutex::default(),
            waiter_added: Notify::new(),
            call_announced: Arc::new(Notify::new()),
        });
        tokio::spawn(relay.table.listen_for_calls(Arc::downgrade(&relay.call_announced)));
        tokio::spawn(deliver_answers(Arc::downgrade(&relay)));
        tokio::spawn(answer_calls(Arc::downgrade(&relay), handle));
        Ok(relay)
    }

    /// True while this head owns the groups: it answers calls itself.
    pub(crate) fn owns(&self) -> bool {
        self.sweeper.load(Ordering::SeqCst)
    }

    /// Relays `call` to the owning head and waits for its answer.
    pub(crate) async fn call(&self, call: &RendezvousCall) -> Result<RelayedAnswer, StateError> {
        let id = self.table.submit(call).await.map_err(|err| {
            StateError::unavailable(format!(
                "cannot relay the rendezvous request to the head that holds it ({err}); retry"
            ))
        })?;
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).insert(id, tx);
        self.waiter_added.notify_one();
        match tokio::time::timeout(RELAY_TIMEOUT, rx).await {
            Ok(Ok(answer)) => answer.map_err(|e| StateError::Protocol {
                reason: format!("a relayed rendezvous answer {e}"),
            }),
            _ => {
                self.waiting.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                let _ = self.table.withdraw(id).await;
                Err(StateError::unavailable(format!(
                    "no head answered the rendezvous request within {} s (the head that holds the groups may be changing); retry",
                    RELAY_TIMEOUT.as_secs()
                )))
            }
        }
    }
}

/// Hands each waiting caller its answer once the owner wrote it.
#[cfg(feature = "postgres")]
async fn deliver_answers(relay: Weak<RendezvousRelay>) {
    loop {
        let Some(this) = relay.upgrade() else { return };
        let ids: Vec<CallId> =
            this.waiting.lock().unwrap_or_else(|e| e.into_inner()).keys().copied().collect();
        if ids.is_empty() {
            // Wakes now and then to notice that the relay was dropped.
            let _ =
                tokio::time::timeout(Duration::from_secs(1), this.waiter_added.notified()).await;
            continue;
        }
        if let Ok(answers) = this.table.take_answers(&ids).await {
            let mut waiting = this.waiting.lock().unwrap_or_else(|e| e.into_inner());
            for (id, answer) in answers {
                if let Some(caller) = waiting.remove(&id) {
                    let _ = caller.send(answer);
                }
            }
        }
        drop(this);
        tokio::time::sleep(ANSWER_POLL).await;
    }
}

/// While this head owns the groups, claims the calls other heads relayed
/// and answers them through its actor.
#[cfg(feature = "postgres")]
async fn answer_calls(relay: Weak<RendezvousRelay>, handle: StateHandle) {
    let in_flight = Arc::new(Semaphore::new(MAX_CALLS_IN_FLIGHT));
    let mut polls: u64 = 0;
    // True when the last look claimed as many calls as it could: more may wait.
    let mut more = false;
    loop {
        let Some(announced) = relay.upgrade().map(|r| r.call_announced.clone()) else { return };
        if !more {
            let _ = tokio::time::timeout(OWNER_POLL, announced.notified()).await;
        }
        drop(announced);
        more = false;
        let Some(this) = relay.upgrade() else { return };
        if !this.owns() {
            continue;
        }
        let room = in_flight.available_permits().min(MAX_CALLS_IN_FLIGHT);
        if room == 0 {
            // Every slot is busy: look again as soon as one is free.
            drop(in_flight.acquire().await);
            more = true;
            continue;
        }
        polls += 1;
        if polls.is_multiple_of(256) {
            let _ = this.table.forget_stale().await;
        }
        let Ok(claimed) = this.table.claim(room).await else { continue };
        more = claimed.len() == room;
        for claimed in claimed {
            let Ok(permit) = in_flight.clone().acquire_owned().await else { return };
            let (table, handle) = (this.table.clone(), handle.clone());
            tokio::spawn(async move {
                let answer = match claimed.call {
                    Ok(call) => match apply(call, &handle).await {
                        Ok(response) => RelayedAnswer::Ok(response),
                        Err(err) => RelayedAnswer::Err(err.to_error_body()),
                    },
                    Err(err) => RelayedAnswer::Err(
                        StateError::Protocol { reason: format!("a relayed rendezvous call {err}") }
                            .to_error_body(),
                    ),
                };
                let _ = table.answer(claimed.id, &answer).await;
                drop(permit);
            });
        }
    }
}
