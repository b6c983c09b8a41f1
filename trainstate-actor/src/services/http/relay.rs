//! The rendezvous on a shared store: any head takes any rank's request, one
//! head decides it.
//!
//! A rendezvous group (the ranks that joined, their heartbeats and ends, the
//! join deadline, the failure window) lives in the memory of one state
//! actor. With several heads on one PostgreSQL store, the head that sweeps
//! (the holder of the sweep lock) owns every group. Another head relays the
//! rendezvous requests it receives through the database: it inserts the
//! call into `trainstate_rendezvous_calls`, the owning head claims it,
//! answers it through its own actor and writes the answer into the row,
//! which the relaying head hands to its client as if it had answered
//! itself. So two ranks whose joins reach different heads form one group,
//! ends through different heads count in one place, and a rank heartbeat
//! reaches the group wherever it lands.
//!
//! A call is checked (key, body) on the head that received it, so a bad
//! request is refused at once. A call nobody answers within
//! [`RELAY_TIMEOUT`] (no head holds the sweep lock, or the database is
//! away) is answered 503 `unavailable`: the rank retries, and every
//! rendezvous request is idempotent, so a call answered late is harmless.
//! When the owning head changes, its successor knows what a restarted head
//! knows (`docs/rendezvous.md`, "A restart of the head").

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, Semaphore, oneshot};
use tokio_postgres::NoTls;
use trainstate_client::api::{ErrorBody, RendezvousResponse};
use trainstate_client::{StateError, StateHandle};

use super::rendezvous::RendezvousCall;
use crate::store::config::PostgresConfig;

/// How long a relaying head waits for the owner's answer.
pub(crate) const RELAY_TIMEOUT: Duration = Duration::from_secs(10);

/// The channel on which a relaying head announces a call (`NOTIFY`).
const CALLS_CHANNEL: &str = "trainstate_rendezvous_calls";

/// How often the owning head looks for calls it was not notified of, and
/// a relaying head for answers while it waits for some.
const OWNER_POLL: Duration = Duration::from_secs(1);
const ANSWER_POLL: Duration = Duration::from_millis(20);

/// A claimed call not answered within this long is claimed again (its
/// claimer died or lost the sweep lock).
const RECLAIM_AFTER_S: i32 = 30;

/// Rows older than this are deleted: their callers gave up long ago.
const FORGET_AFTER_S: i32 = 300;

/// The most calls the owner answers at once.
const MAX_CALLS_IN_FLIGHT: usize = 256;

/// A call's answer, as the owning head gave it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RelayedAnswer {
    /// The rendezvous answered.
    Ok(RendezvousResponse),
    /// It refused, with this error.
    Err(ErrorBody),
}

/// The relay of one head: relays its rendezvous calls while another head
/// owns the groups, and answers the calls of the others while it owns them.
pub(crate) struct RendezvousRelay {
    pool: Pool,
    /// True while this head sweeps, and so owns every group.
    sweeper: Arc<AtomicBool>,
    /// The callers waiting for an answer, by call id.
    waiting: Mutex<HashMap<i64, oneshot::Sender<String>>>,
    /// Wakes the answer poller when a caller starts waiting.
    waiter_added: Notify,
    /// Wakes the owner when a call is announced.
    call_announced: Arc<Notify>,
}

impl RendezvousRelay {
    /// A relay on the database of `config`, started on the current Tokio
    /// runtime: it answers other heads' calls through `handle` while
    /// `sweeper` is set. Its tasks end when the relay is dropped.
    pub(crate) fn start(
        config: &PostgresConfig,
        sweeper: Arc<AtomicBool>,
        handle: StateHandle,
    ) -> Result<Arc<Self>, String> {
        let pg_config = tokio_postgres::Config::from_str(&config.url)
            .map_err(|e| format!("not a PostgreSQL URL: {e}"))?;
        let manager = Manager::from_config(
            pg_config.clone(),
            NoTls,
            ManagerConfig { recycling_method: RecyclingMethod::Fast },
        );
        let pool = Pool::builder(manager)
            .max_size(4)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(RELAY_TIMEOUT))
            .create_timeout(Some(RELAY_TIMEOUT))
            .build()
            .map_err(|e| e.to_string())?;
        let relay = Arc::new(Self {
            pool,
            sweeper,
            waiting: Mutex::default(),
            waiter_added: Notify::new(),
            call_announced: Arc::new(Notify::new()),
        });
        tokio::spawn(listen_for_calls(Arc::downgrade(&relay), pg_config));
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
        let text = serde_json::to_string(call).expect("a call serializes");
        let unavailable = |what: &str, err: &dyn std::fmt::Display| {
            StateError::unavailable(format!(
                "cannot relay the rendezvous request to the head that holds it ({what}: {err}); retry"
            ))
        };
        let id: i64 = {
            let client = self.pool.get().await.map_err(|e| unavailable("database", &e))?;
            let row = client
                .query_one(
                    "WITH call AS (
                         INSERT INTO trainstate_rendezvous_calls (call) VALUES ($1) RETURNING id
                     )
                     SELECT id, pg_notify($2, '') FROM call",
                    &[&text, &CALLS_CHANNEL],
                )
                .await
                .map_err(|e| unavailable("database", &e))?;
            row.get(0)
        };
        let (tx, rx) = oneshot::channel();
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).insert(id, tx);
        self.waiter_added.notify_one();
        match tokio::time::timeout(RELAY_TIMEOUT, rx).await {
            Ok(Ok(answer)) => serde_json::from_str(&answer).map_err(|e| StateError::Protocol {
                reason: format!("a relayed rendezvous answer does not parse: {e}"),
            }),
            _ => {
                self.waiting.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                if let Ok(client) = self.pool.get().await {
                    let _ = client
                        .execute("DELETE FROM trainstate_rendezvous_calls WHERE id = $1", &[&id])
                        .await;
                }
                Err(StateError::unavailable(format!(
                    "no head answered the rendezvous request within {} s (the head that holds the groups may be changing); retry",
                    RELAY_TIMEOUT.as_secs()
                )))
            }
        }
    }
}

/// Keeps a connection that listens for announced calls and wakes the
/// owner's loop on each (the loop also looks every [`OWNER_POLL`], for a
/// notification missed while the connection was down).
async fn listen_for_calls(relay: Weak<RendezvousRelay>, config: tokio_postgres::Config) {
    use futures_util::StreamExt;
    loop {
        let Some(announced) = relay.upgrade().map(|r| r.call_announced.clone()) else { return };
        if let Ok((client, mut connection)) = config.connect(NoTls).await {
            let wake = announced.clone();
            let driver = tokio::spawn(async move {
                let mut messages =
                    futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                while let Some(Ok(message)) = messages.next().await {
                    if matches!(message, tokio_postgres::AsyncMessage::Notification(_)) {
                        wake.notify_one();
                    }
                }
            });
            if client.batch_execute(&format!("LISTEN {CALLS_CHANNEL}")).await.is_ok() {
                // Wakes now and then to notice that the relay was dropped.
                while relay.strong_count() > 0 && !driver.is_finished() {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            driver.abort();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Hands each waiting caller its answer once the owner wrote it.
async fn deliver_answers(relay: Weak<RendezvousRelay>) {
    loop {
        let Some(this) = relay.upgrade() else { return };
        let ids: Vec<i64> =
            this.waiting.lock().unwrap_or_else(|e| e.into_inner()).keys().copied().collect();
        if ids.is_empty() {
            // Wakes now and then to notice that the relay was dropped.
            let _ =
                tokio::time::timeout(Duration::from_secs(1), this.waiter_added.notified()).await;
            continue;
        }
        if let Ok(client) = this.pool.get().await {
            let answered = client
                .query(
                    "DELETE FROM trainstate_rendezvous_calls
                     WHERE id = ANY($1) AND answer IS NOT NULL
                     RETURNING id, answer",
                    &[&ids],
                )
                .await;
            if let Ok(rows) = answered {
                let mut waiting = this.waiting.lock().unwrap_or_else(|e| e.into_inner());
                for row in rows {
                    if let Some(caller) = waiting.remove(&row.get::<_, i64>(0)) {
                        let _ = caller.send(row.get(1));
                    }
                }
            }
        }
        drop(this);
        tokio::time::sleep(ANSWER_POLL).await;
    }
}

/// While this head owns the groups, claims the calls other heads relayed
/// and answers them through its actor.
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
        more = false;
        let Some(this) = relay.upgrade() else { return };
        if !this.owns() {
            continue;
        }
        let room = in_flight.available_permits().min(MAX_CALLS_IN_FLIGHT) as i64;
        if room == 0 {
            // Every slot is busy: look again as soon as one is free.
            drop(in_flight.acquire().await);
            more = true;
            continue;
        }
        let Ok(client) = this.pool.get().await else { continue };
        polls += 1;
        if polls.is_multiple_of(256) {
            let _ = client
                .execute(
                    "DELETE FROM trainstate_rendezvous_calls
                     WHERE created_at < now() - make_interval(secs => $1)",
                    &[&f64::from(FORGET_AFTER_S)],
                )
                .await;
        }
        let claimed = client
            .query(
                "UPDATE trainstate_rendezvous_calls SET claimed_at = now()
                 WHERE id IN (
                     SELECT id FROM trainstate_rendezvous_calls
                     WHERE answer IS NULL
                       AND (claimed_at IS NULL
                            OR claimed_at < now() - make_interval(secs => $1))
                     ORDER BY id LIMIT $2
                     FOR UPDATE SKIP LOCKED)
                 RETURNING id, call",
                &[&f64::from(RECLAIM_AFTER_S), &room],
            )
            .await;
        let Ok(mut rows) = claimed else { continue };
        more = rows.len() as i64 == room;
        rows.sort_by_key(|row| row.get::<_, i64>(0));
        for row in rows {
            let id: i64 = row.get(0);
            let text: String = row.get(1);
            let Ok(permit) = in_flight.clone().acquire_owned().await else { return };
            let (pool, handle) = (this.pool.clone(), handle.clone());
            tokio::spawn(async move {
                let answer = match serde_json::from_str::<RendezvousCall>(&text) {
                    Ok(call) => match call.apply(&handle).await {
                        Ok(response) => RelayedAnswer::Ok(response),
                        Err(err) => RelayedAnswer::Err(err.to_error_body()),
                    },
                    Err(err) => RelayedAnswer::Err(
                        StateError::Protocol {
                            reason: format!("a relayed rendezvous call does not parse: {err}"),
                        }
                        .to_error_body(),
                    ),
                };
                let answer = serde_json::to_string(&answer).expect("an answer serializes");
                if let Ok(client) = pool.get().await {
                    let _ = client
                        .execute(
                            "UPDATE trainstate_rendezvous_calls SET answer = $2 WHERE id = $1",
                            &[&id, &answer],
                        )
                        .await;
                }
                drop(permit);
            });
        }
    }
}
