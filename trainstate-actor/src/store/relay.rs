//! The table through which heads on one PostgreSQL store relay rendezvous
//! calls to the head that owns the groups (`engine/relay.rs` decides who
//! owns and waits for answers; this file keeps the rows).
//!
//! A relaying head inserts its call into `trainstate_rendezvous_calls` (its
//! DDL is migration 2 of `store/postgres.rs`) and announces it on
//! [`CALLS_CHANNEL`]; the owning head claims calls, answers each in its row,
//! and the relaying head takes the answer, deleting the row. The table is
//! `UNLOGGED`: a call lives for seconds, and a lost one is retried by its
//! rank.

use std::str::FromStr;
use std::sync::Weak;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, NoTls};

use crate::decisions::rendezvous_call::{RelayedAnswer, RendezvousCall};

/// The channel on which a relaying head announces a call (`NOTIFY`).
const CALLS_CHANNEL: &str = "trainstate_rendezvous_calls";

/// A claimed call not answered within this long is claimed again (its
/// claimer died or lost the sweep lock).
const RECLAIM_AFTER_S: i32 = 30;

/// Rows older than this are deleted: their callers gave up long ago.
const FORGET_AFTER_S: i32 = 300;

/// The connections the relay keeps at most.
const RELAY_POOL_SIZE: usize = 4;

/// Why the relay table could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RelayError {
    /// The store's URL does not parse.
    #[error("not a PostgreSQL URL: {0}")]
    Url(tokio_postgres::Error),
    /// The relay's connection pool could not be built.
    #[error("cannot build the relay's connection pool: {0}")]
    Pool(#[from] deadpool_postgres::BuildError),
    /// No connection to the database.
    #[error("database: {0}")]
    Connect(#[from] deadpool_postgres::PoolError),
    /// The database refused a statement.
    #[error("database: {0}")]
    Statement(#[from] tokio_postgres::Error),
    /// A stored call or answer does not parse.
    #[error("does not parse: {0}")]
    Damaged(#[from] serde_json::Error),
}

/// The id of a relayed call: its row.
pub(crate) type CallId = i64;

/// A call the owning head claimed, to answer with [`RelayTable::answer`].
pub(crate) struct ClaimedCall {
    /// Its row.
    pub(crate) id: CallId,
    /// The call, or why it does not parse.
    pub(crate) call: Result<RendezvousCall, RelayError>,
}

/// The relay's rows, through a pool of its own.
///
/// The pool is not the store's: the store's connections belong to the
/// writer thread's runtime and are sized for its commits, while the relay
/// runs on the server's runtime and holds a connection for each call in
/// flight, so sharing them would make rendezvous calls and commits wait
/// for each other.
#[derive(Clone)]
pub(crate) struct RelayTable {
    pool: Pool,
    config: tokio_postgres::Config,
}

impl RelayTable {
    /// The relay table of the store at `url`. Connects lazily, on the
    /// runtime that uses it; waits at most `wait` for a connection.
    pub(crate) fn open(url: &str, wait: Duration) -> Result<Self, RelayError> {
        let pg_config = tokio_postgres::Config::from_str(url).map_err(RelayError::Url)?;
        let manager = Manager::from_config(
            pg_config.clone(),
            NoTls,
            ManagerConfig { recycling_method: RecyclingMethod::Fast },
        );
        let pool = Pool::builder(manager)
            .max_size(RELAY_POOL_SIZE)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(wait))
            .create_timeout(Some(wait))
            .build()?;
        Ok(Self { pool, config: pg_config })
    }

    /// Stores `call` and announces it to the owning head; returns its id.
    pub(crate) async fn submit(&self, call: &RendezvousCall) -> Result<CallId, RelayError> {
        let text = serde_json::to_string(call)?;
        let client = self.pool.get().await?;
        let row = client
            .query_one(
                "WITH call AS (
                     INSERT INTO trainstate_rendezvous_calls (call) VALUES ($1) RETURNING id
                 )
                 SELECT id, pg_notify($2, '') FROM call",
                &[&text, &CALLS_CHANNEL],
            )
            .await?;
        Ok(row.get(0))
    }

    /// Deletes the call `id`: its caller gave up waiting.
    pub(crate) async fn withdraw(&self, id: CallId) -> Result<(), RelayError> {
        let client = self.pool.get().await?;
        client.execute("DELETE FROM trainstate_rendezvous_calls WHERE id = $1", &[&id]).await?;
        Ok(())
    }

    /// Takes the answers given so far to the calls `ids`, deleting their
    /// rows; a call not answered yet is not among them.
    pub(crate) async fn take_answers(
        &self,
        ids: &[CallId],
    ) -> Result<Vec<(CallId, Result<RelayedAnswer, RelayError>)>, RelayError> {
        let client = self.pool.get().await?;
        let rows = client
            .query(
                "DELETE FROM trainstate_rendezvous_calls
                 WHERE id = ANY($1) AND answer IS NOT NULL
                 RETURNING id, answer",
                &[&ids],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|row| {
                let answer: String = row.get(1);
                (row.get(0), serde_json::from_str(&answer).map_err(RelayError::from))
            })
            .collect())
    }

    /// Claims, in the order they came, at most `limit` calls that nobody
    /// answers: new ones, and ones claimed too long ago.
    pub(crate) async fn claim(&self, limit: usize) -> Result<Vec<ClaimedCall>, RelayError> {
        let client = self.pool.get().await?;
        let mut rows = client
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
                &[&f64::from(RECLAIM_AFTER_S), &(limit as i64)],
            )
            .await?;
        rows.sort_by_key(|row| row.get::<_, CallId>(0));
        Ok(rows
            .iter()
            .map(|row| {
                let call: String = row.get(1);
                ClaimedCall {
                    id: row.get(0),
                    call: serde_json::from_str(&call).map_err(RelayError::from),
                }
            })
            .collect())
    }

    /// Writes the answer to the call `id`, for its caller to take.
    pub(crate) async fn answer(
        &self,
        id: CallId,
        answer: &RelayedAnswer,
    ) -> Result<(), RelayError> {
        let text = serde_json::to_string(answer)?;
        let client = self.pool.get().await?;
        client
            .execute(
                "UPDATE trainstate_rendezvous_calls SET answer = $2 WHERE id = $1",
                &[&id, &text],
            )
            .await?;
        Ok(())
    }

    /// Deletes the calls whose callers gave up long ago.
    pub(crate) async fn forget_stale(&self) -> Result<(), RelayError> {
        let client = self.pool.get().await?;
        client
            .execute(
                "DELETE FROM trainstate_rendezvous_calls
                 WHERE created_at < now() - make_interval(secs => $1)",
                &[&f64::from(FORGET_AFTER_S)],
            )
            .await?;
        Ok(())
    }

    /// Keeps a connection that listens for announced calls and wakes
    /// `announced` on each, reconnecting when it drops. Ends once
    /// `announced` is gone (looked at every second).
    pub(crate) fn listen_for_calls(
        &self,
        announced: Weak<Notify>,
    ) -> impl Future<Output = ()> + Send + 'static {
        let config = self.config.clone();
        async move {
            while announced.strong_count() > 0 {
                if let Ok((client, mut connection)) = config.connect(NoTls).await {
                    let wake = announced.clone();
                    let driver = tokio::spawn(async move {
                        let mut messages =
                            futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                        while let Some(Ok(message)) = messages.next().await {
                            if matches!(message, AsyncMessage::Notification(_)) {
                                let Some(wake) = wake.upgrade() else { return };
                                wake.notify_one();
                            }
                        }
                    });
                    if client.batch_execute(&format!("LISTEN {CALLS_CHANNEL}")).await.is_ok() {
                        // Wakes now and then to notice that nobody listens any more.
                        while announced.strong_count() > 0 && !driver.is_finished() {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                    driver.abort();
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
