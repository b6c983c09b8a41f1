//! The PostgreSQL store: several heads on one database.
//!
//! - **Commits are ordered across heads** by one row, `trainstate_meta`:
//!   every write transaction first increments its `seq` (a sequence table),
//!   which holds the row's lock until COMMIT. So transactions of all heads
//!   commit one after another, each with the next sequence number, and a
//!   reader that sees number *n* committed sees every number before it.
//! - **Stale writes are refused.** Under that lock, a transaction reads the
//!   stored version of every run it puts and checks it against the version
//!   the change was decided on; a job with a mismatch writes nothing (see
//!   [`super`]). Deletes are of ended runs, which nothing revives, so they
//!   need no check.
//! - **Other heads follow** the change log, `trainstate_changes` (sequence
//!   number, run, event kind): woken by `NOTIFY` after each commit, and by
//!   a tick every second in case a notification was missed (a reconnect).
//!   The log keeps the last [`CHANGES_KEPT`] commits; a head further behind
//!   loads everything again.
//! - **One head sweeps:** the one that holds the session advisory lock
//!   `hashtext(current_schema() || '.trainstate.sweep')`, on the connection
//!   that listens. It is released when that head's connection ends (a kill
//!   closes it), and another head takes it within a second.
//! - **Heartbeats** stay out of durable storage: each head shares the ones
//!   it received (every second) in an `UNLOGGED` table, which the sweeping
//!   head reads before it sweeps.
//!
//! Every table is prefixed `trainstate_` and lives in the connection's
//! current schema; heads that use different schemas (`search_path`) of one
//! database are separate deployments (the lock and channel names include
//! the schema).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use deadpool_postgres::GenericClient;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::StreamExt;
use tokio::runtime::Runtime;
use tokio_postgres::{AsyncMessage, NoTls};
use trainstate_schema::api::{MetricPoint, MetricSeries, MetricsQuery, StackCapture};
use trainstate_schema::{RunId, RunStatus};

use super::columns::{StoredColumns, check};
use super::load::{Loaded, StoredRow, log_quarantined, parse_rows};
use super::metrics::{
    HISTORY_POINT_BYTES, HistoryBound, LastProgress, MetricBatch, MetricReader, SeriesState,
    attempts_giving_way, into_series,
};
use super::stacks::{CaptureReader, StoredCapture, assemble, parse_header};
use super::{
    ChangedRun, Committed, Feed, Followed, JobChanges, Position, SharedStore, SharedStoreHandle,
    Store, TOKEN_COLUMNS, TokenRow, event_kind, token_from_columns,
};
use crate::decisions::change::{RemoteChange, StoreOp};
use crate::decisions::record::{RunColumns, RunRecord};
use crate::decisions::tokens::StoredToken;
use crate::store::config::PostgresConfig;
use crate::store::error::StoreError;

/// The schema migrations, in order; `trainstate_version.version` is the
/// number applied. Append, never edit.
const MIGRATIONS: &[&str] = &[
    // 1: runs as canonical JSON with the columns order, filters, retention
    // and following need; the sequence row; the change log; heartbeats
    // (never durable); forwarding positions.
    "CREATE TABLE trainstate_meta (
        singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
        seq BIGINT NOT NULL,
        pruned_through BIGINT NOT NULL
    );
    INSERT INTO trainstate_meta (seq, pruned_through) VALUES (0, 0);
    CREATE TABLE trainstate_runs (
        id TEXT PRIMARY KEY,
        start_time_ms BIGINT NOT NULL,
        end_time_ms BIGINT,
        run_status TEXT NOT NULL,
        cluster TEXT,
        version BIGINT NOT NULL,
        seq BIGINT NOT NULL,
        json TEXT NOT NULL
    );
    CREATE INDEX trainstate_runs_by_start ON trainstate_runs (start_time_ms DESC, id DESC);
    CREATE INDEX trainstate_runs_by_cluster ON trainstate_runs (cluster, start_time_ms DESC, id DESC);
    CREATE INDEX trainstate_runs_by_seq ON trainstate_runs (seq, id);
    CREATE TABLE trainstate_changes (
        seq BIGINT NOT NULL,
        n INTEGER NOT NULL,
        run_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        PRIMARY KEY (seq, n)
    );
    CREATE UNLOGGED TABLE trainstate_heartbeats (
        run_id TEXT PRIMARY KEY,
        last_heard_ms BIGINT NOT NULL
    );
    CREATE TABLE trainstate_forward_positions (
        target TEXT PRIMARY KEY,
        seq BIGINT NOT NULL,
        id TEXT NOT NULL
    );",
    // 2: the rendezvous calls one head relays to the head that owns the
    // groups (`store/relay.rs`); transient, so never durable.
    "CREATE UNLOGGED TABLE trainstate_rendezvous_calls (
        id BIGSERIAL PRIMARY KEY,
        call TEXT NOT NULL,
        answer TEXT,
        claimed_at TIMESTAMPTZ,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now()
    );",
    // 3: bearer tokens: the SHA-256 hash of each secret (never the secret),
    // its scopes (`read,write`), the cluster it is bound to, when it was
    // created and revoked. Every head reads them (see `Store::tokens`).
    "CREATE TABLE trainstate_tokens (
        id TEXT PRIMARY KEY,
        name TEXT,
        scopes TEXT NOT NULL,
        cluster TEXT,
        secret_sha256 TEXT NOT NULL UNIQUE,
        created_at_ms BIGINT NOT NULL,
        revoked_at_ms BIGINT
    );",
    // 4: the fields the actor indexes in columns of their own beside the
    // JSON, with the check that they describe it (`store/columns.rs`), so
    // a load builds records without parsing the JSON. Runs stored before
    // have none: the first load reads them from their JSON and writes them.
    "ALTER TABLE trainstate_runs
        ADD COLUMN job_id TEXT,
        ADD COLUMN name TEXT,
        ADD COLUMN controller_actor_id TEXT,
        ADD COLUMN node_ids TEXT,
        ADD COLUMN node_ips TEXT,
        ADD COLUMN lost_controller BOOLEAN,
        ADD COLUMN leased BOOLEAN,
        ADD COLUMN json_check BIGINT;",
    // 5: metric histories (`store/metrics.rs`): where each series of a
    // run's attempt stands, and the points it keeps, by the order in which
    // they were offered to it.
    "CREATE TABLE trainstate_metric_series (
        id BIGSERIAL PRIMARY KEY,
        run_id TEXT NOT NULL,
        attempt_id TEXT NOT NULL,
        name TEXT NOT NULL,
        stride BIGINT NOT NULL,
        seen BIGINT NOT NULL,
        kept BIGINT NOT NULL,
        UNIQUE (run_id, attempt_id, name)
    );
    CREATE TABLE trainstate_metric_points (
        series_id BIGINT NOT NULL,
        seq BIGINT NOT NULL,
        rank INTEGER NOT NULL,
        step BIGINT NOT NULL,
        value DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (series_id, seq)
    );",
    // 6: the events of each run that each notification target delivered
    // (their ids, a JSON array), so a run that changes again is not told
    // of twice; a run's rows go with the run.
    "CREATE TABLE trainstate_notify_delivered (
        run_id TEXT NOT NULL,
        target TEXT NOT NULL,
        events TEXT NOT NULL,
        PRIMARY KEY (run_id, target)
    );",
    // 7: the last progress of each run's ranks, kept when their board goes
    // away (the run ended, or started another attempt): the attempt it is
    // of and `rank_progress` as served, in JSON; a run's row goes with the
    // run.
    "CREATE TABLE trainstate_run_progress (
        run_id TEXT PRIMARY KEY,
        attempt_id TEXT NOT NULL,
        progress TEXT NOT NULL
    );",
    // 8: stack captures (`store/stacks.rs`): one header row per capture of
    // a run (the capture with no ranks, as JSON, and the bytes the whole
    // capture keeps) and one row per rank of it; a run's rows go with the
    // run.
    "CREATE TABLE trainstate_stack_captures (
        run_id TEXT NOT NULL,
        capture_id BIGINT NOT NULL,
        bytes BIGINT NOT NULL,
        header TEXT NOT NULL,
        PRIMARY KEY (run_id, capture_id)
    );
    CREATE TABLE trainstate_stack_ranks (
        run_id TEXT NOT NULL,
        capture_id BIGINT NOT NULL,
        rank BIGINT NOT NULL,
        stack TEXT NOT NULL,
        PRIMARY KEY (run_id, capture_id, rank)
    );",
    // 9: a token's expiry (Unix ms on the head's clock; null: never) and,
    // for one created with an idempotency key, the key's hash (unique), the
    // request's hash and the secret sealed by the key. Tokens stored before
    // never expire and have no key.
    "ALTER TABLE trainstate_tokens
        ADD COLUMN expires_at_ms BIGINT,
        ADD COLUMN idempotency_key_sha256 TEXT UNIQUE,
        ADD COLUMN request_sha256 TEXT,
        ADD COLUMN secret_sealed TEXT;",
];

/// The columns a load reads, in the order [`stored_row`] takes them.
const LOAD_COLUMNS: &str = "id, version, json, start_time_ms, end_time_ms, run_status, job_id, \
     name, controller_actor_id, cluster, node_ids, node_ips, lost_controller, leased, json_check";

/// The schema version this build writes.
pub(crate) const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// How many commits the change log keeps for heads that follow it.
pub(crate) const CHANGES_KEPT: u64 = 100_000;

/// How often a head looks for changes it was not notified of, shares its
/// heartbeats, and (if it does not sweep) tries to take the sweep lock.
const TICK: Duration = Duration::from_secs(1);

/// How long opening the store waits for the database to answer.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest one statement or transaction may take before the head gives
/// up on it (and reloads).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

const SWEEP_LOCK: &str =
    "SELECT pg_try_advisory_lock(hashtext(current_schema() || '.trainstate.sweep'))";

type PgError = String;

/// An error with its causes: tokio-postgres says only "db error" and keeps
/// PostgreSQL's own message in its source.
fn pg(err: impl std::error::Error) -> PgError {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
        source = source.and_then(std::error::Error::source);
    }
    text
}

/// A store in a PostgreSQL database that other heads may share.
pub(crate) struct PgStore {
    runtime: Runtime,
    pool: Pool,
    url: String,
    channel: String,
    /// This head's id in notifications, so it skips its own.
    head: u64,
    /// The sequence number of the last commit this head has taken in.
    last_seen: u64,
    /// The sweep lock's flag, and whether the head is shutting down.
    handle: SharedStoreHandle,
    /// The listener's wake-ups, until the writer takes them.
    wakeups: Option<mpsc::Receiver<()>>,
    /// Runs that do not load are moved aside instead of refusing the store.
    quarantine: bool,
}

/// Where runs that do not load are moved by `--quarantine-corrupt`.
const QUARANTINE_TABLE: &str = "trainstate_quarantined_runs";

impl PgStore {
    /// Connects, migrates, and starts the listener that wakes whoever
    /// follows this store (see [`SharedStore::take_wakeups`]) when other
    /// heads commit, and that holds the sweep lock while this head sweeps.
    pub(crate) fn open(config: &PostgresConfig) -> Result<Self, StoreError> {
        let url = config.redacted_url();
        let fail = |message: String| StoreError::Postgres { url: url.clone(), message };
        let pg_config = tokio_postgres::Config::from_str(&config.url)
            .map_err(|e| fail(format!("not a PostgreSQL URL: {e}")))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("trainstate-postgres")
            .enable_all()
            .build()
            .map_err(|e| fail(format!("cannot start its runtime: {e}")))?;
        let manager = Manager::from_config(
            pg_config.clone(),
            NoTls,
            ManagerConfig { recycling_method: RecyclingMethod::Fast },
        );
        let pool = Pool::builder(manager)
            .max_size(config.pool_size.max(1))
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .build()
            .map_err(|e| fail(e.to_string()))?;
        let schema = runtime.block_on(async {
            let deadline = Instant::now() + OPEN_TIMEOUT;
            let client = loop {
                match pool.get().await {
                    Ok(client) => break client,
                    Err(err) if Instant::now() < deadline => {
                        tracing::warn!(url = %url, error = %err, "waiting for PostgreSQL");
                        tokio::time::sleep(Duration::from_millis(250)).await;
                    }
                    Err(err) => return Err(fail(format!("cannot connect: {err}"))),
                }
            };
            migrate(&client, &url).await?;
            let row =
                client.query_one("SELECT current_schema()", &[]).await.map_err(|e| fail(pg(e)))?;
            Ok::<_, StoreError>(row.get::<_, Option<String>>(0).unwrap_or_default())
        })?;
        let channel: String = format!("trainstate.{schema}").chars().take(63).collect();
        let head = crate::decisions::record::versions::next();
        let handle = SharedStoreHandle::new(config.clone());
        // One wake-up pending is enough: the follow it starts reads them all.
        let (wake, wakeups) = mpsc::sync_channel(1);
        let (ready, is_ready) = mpsc::channel();
        runtime.spawn(listen(pg_config, channel.clone(), head, wake, handle.clone(), ready));
        // The first head to start sweeps from its first moment on.
        let _ = is_ready.recv_timeout(OPEN_TIMEOUT);
        tracing::info!(url = %url, schema = %schema, "PostgreSQL store open");
        Ok(Self {
            runtime,
            pool,
            url,
            channel,
            head,
            last_seen: 0,
            handle,
            wakeups: Some(wakeups),
            quarantine: false,
        })
    }

    /// Moves runs that do not load aside instead of refusing the store.
    pub(crate) fn quarantining(mut self, quarantine: bool) -> Self {
        self.quarantine = quarantine;
        self
    }

    /// Moves the runs `corrupt` (id, why) into [`QUARANTINE_TABLE`], in one
    /// transaction, and logs each. Other heads find them gone at their next
    /// load; no change is announced (they could not load them either).
    fn quarantine(&self, corrupt: &[(String, String)]) -> Result<(), PgError> {
        let pool = self.pool.clone();
        let ids: Vec<&str> = corrupt.iter().map(|(id, _)| id.as_str()).collect();
        let reasons: Vec<&str> = corrupt.iter().map(|(_, why)| why.as_str()).collect();
        self.block_on("quarantining runs", async move {
            let mut client = pool.get().await.map_err(pg)?;
            let tx = client.transaction().await.map_err(pg)?;
            tx.batch_execute(&format!(
                "SET LOCAL client_min_messages = warning;
                 CREATE TABLE IF NOT EXISTS {QUARANTINE_TABLE} (
                     id TEXT NOT NULL,
                     json TEXT,
                     reason TEXT NOT NULL,
                     quarantined_at TIMESTAMPTZ NOT NULL DEFAULT now()
                 )"
            ))
            .await
            .map_err(pg)?;
            tx.execute(
                &format!(
                    "INSERT INTO {QUARANTINE_TABLE} (id, json, reason)
                     SELECT r.id, r.json, q.reason
                     FROM trainstate_runs r JOIN UNNEST($1::text[], $2::text[]) AS q(id, reason)
                         ON r.id = q.id"
                ),
                &[&ids, &reasons],
            )
            .await
            .map_err(pg)?;
            tx.execute("DELETE FROM trainstate_runs WHERE id = ANY($1)", &[&ids])
                .await
                .map_err(pg)?;
            tx.commit().await.map_err(pg)
        })?;
        log_quarantined(corrupt, QUARANTINE_TABLE);
        Ok(())
    }

    /// Writes the columns of runs read from their JSON (stored before the
    /// columns existed, or changed outside trainstate), so that the next
    /// load need not parse them. Only a run still at the version read is
    /// written, and neither its version nor its commit sequence changes:
    /// its content is the same, so no other head needs to hear of it. A
    /// failure only costs the next load the same parsing.
    fn index_again(&self, records: &[Arc<RunRecord>]) {
        let pool = self.pool.clone();
        let mut puts = Puts::default();
        records.iter().for_each(|record| puts.push(record));
        let written = self.block_on("indexing runs", async move {
            let client = pool.get().await.map_err(pg)?;
            client
                .execute(
                    "UPDATE trainstate_runs r SET json = t.json, job_id = t.job_id,
                         name = t.name, controller_actor_id = t.controller_actor_id,
                         node_ids = t.node_ids, node_ips = t.node_ips,
                         lost_controller = t.lost_controller, leased = t.leased,
                         json_check = t.json_check
                     FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[],
                                 $6::text[], $7::text[], $8::text[], $9::bool[], $10::bool[],
                                 $11::bigint[])
                         AS t(id, version, json, job_id, name, controller_actor_id, node_ids,
                              node_ips, lost_controller, leased, json_check)
                     WHERE r.id = t.id AND r.version = t.version",
                    &[
                        &puts.id,
                        &puts.version,
                        &puts.json,
                        &puts.job_id,
                        &puts.name,
                        &puts.controller_actor_id,
                        &puts.node_ids,
                        &puts.node_ips,
                        &puts.lost_controller,
                        &puts.leased,
                        &puts.check,
                    ],
                )
                .await
                .map_err(pg)
        });
        match written {
            Ok(runs) => tracing::info!(
                runs,
                url = %self.url,
                "stored runs without columns that describe them were read from their JSON; their columns are written"
            ),
            Err(error) => tracing::warn!(
                runs = records.len(),
                %error,
                "stored runs were read from their JSON, but their columns could not be written"
            ),
        }
    }

    /// [`block_on`](Self::block_on), for what the rest of the head asks:
    /// an error is PostgreSQL's.
    fn call<T>(
        &self,
        what: &str,
        future: impl Future<Output = Result<T, PgError>>,
    ) -> Result<T, StoreError> {
        self.block_on(what, future).map_err(StoreError::PostgresStatement)
    }

    fn block_on<T>(
        &self,
        what: &str,
        future: impl Future<Output = Result<T, PgError>>,
    ) -> Result<T, PgError> {
        self.runtime.block_on(async {
            match tokio::time::timeout(CALL_TIMEOUT, future).await {
                Ok(result) => result,
                Err(_) => Err(format!("{what} took longer than {CALL_TIMEOUT:?}")),
            }
        })
    }
}

/// Applies the migrations this database lacks, one head at a time.
async fn migrate(client: &deadpool_postgres::Client, url: &str) -> Result<(), StoreError> {
    let fail = |e: tokio_postgres::Error| StoreError::Postgres {
        url: url.to_owned(),
        message: format!("migrating: {e}"),
    };
    client
        .batch_execute(
            "BEGIN;
             SET LOCAL client_min_messages = warning;
             SELECT pg_advisory_xact_lock(hashtext(current_schema() || '.trainstate.migrate'));
             CREATE TABLE IF NOT EXISTS trainstate_version (
                 singleton BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
                 version INTEGER NOT NULL
             );
             INSERT INTO trainstate_version (version) VALUES (0) ON CONFLICT DO NOTHING;",
        )
        .await
        .map_err(fail)?;
    let result = async {
        let found: i32 = client
            .query_one("SELECT version FROM trainstate_version", &[])
            .await
            .map_err(fail)?
            .get(0);
        let found = found.max(0) as u32;
        if found > SCHEMA_VERSION {
            return Err(StoreError::NewerPostgresSchema {
                url: url.to_owned(),
                found,
                supported: SCHEMA_VERSION,
            });
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
            client.batch_execute(sql).await.map_err(fail)?;
            client
                .execute("UPDATE trainstate_version SET version = $1", &[&((i + 1) as i32)])
                .await
                .map_err(fail)?;
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => client.batch_execute("COMMIT").await.map_err(fail),
        Err(err) => {
            let _ = client.batch_execute("ROLLBACK").await;
            Err(err)
        }
    }
}

/// Keeps a connection that listens for other heads' commits (waking
/// whoever follows the store, through `wake`) and tries, every [`TICK`], to
/// take the sweep lock, which it then holds for as long as the connection
/// lives. Stops when the head closes or nobody takes the wake-ups any more.
async fn listen(
    config: tokio_postgres::Config,
    channel: String,
    head: u64,
    wake: mpsc::SyncSender<()>,
    store: SharedStoreHandle,
    ready: mpsc::Sender<()>,
) {
    let sweeper = store.sweep_lock();
    // False once nobody follows: the listener stops.
    let wake = || -> bool {
        !store.is_closing()
            && !matches!(wake.try_send(()), Err(mpsc::TrySendError::Disconnected(())))
    };
    let mine = format!("{head}:");
    let mut backoff = Duration::from_millis(100);
    loop {
        match config.connect(NoTls).await {
            Ok((client, mut connection)) => {
                backoff = Duration::from_millis(100);
                let (notified, mut notifications) = tokio::sync::mpsc::unbounded_channel();
                let mine = mine.clone();
                let driver = tokio::spawn(async move {
                    let mut messages =
                        futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                    while let Some(message) = messages.next().await {
                        match message {
                            Ok(AsyncMessage::Notification(n))
                                if !n.payload().starts_with(&mine) =>
                            {
                                let _ = notified.send(());
                            }
                            Ok(_) => {}
                            Err(_) => break,
                        }
                    }
                });
                let listening = client
                    .batch_execute(&format!("LISTEN {}", quote_ident(&channel)))
                    .await
                    .is_ok();
                let mut connected = listening;
                if connected {
                    match client.query_one(SWEEP_LOCK, &[]).await {
                        Ok(row) => sweep_lock_taken(&sweeper, row.get(0)),
                        Err(_) => connected = false,
                    }
                }
                let _ = ready.send(());
                // What was committed while this head was not listening.
                connected &= wake();
                let mut tick = tokio::time::interval(TICK);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while connected {
                    tokio::select! {
                        got = notifications.recv() => {
                            if got.is_none() {
                                break;
                            }
                            while notifications.try_recv().is_ok() {}
                            connected = wake();
                        }
                        _ = tick.tick() => {
                            if !sweeper.load(Ordering::SeqCst) {
                                match client.query_one(SWEEP_LOCK, &[]).await {
                                    Ok(row) => sweep_lock_taken(&sweeper, row.get(0)),
                                    Err(_) => break,
                                }
                            }
                            // Shares heartbeats; follows a commit whose notification was missed.
                            connected = wake();
                        }
                    }
                }
                if sweeper.swap(false, Ordering::SeqCst) {
                    tracing::warn!("lost the connection that holds the sweep lock");
                }
                driver.abort();
                if store.is_closing() {
                    return;
                }
            }
            Err(err) => {
                let _ = ready.send(());
                tracing::warn!(error = %err, "cannot connect to PostgreSQL to listen; retrying");
            }
        }
        if store.is_closing() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

fn sweep_lock_taken(sweeper: &AtomicBool, taken: bool) {
    if taken && !sweeper.swap(true, Ordering::SeqCst) {
        tracing::info!("this head now sweeps leases and retention");
    }
}

/// `"name"`, quoted as an SQL identifier.
fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn run_id(text: &str) -> Result<RunId, PgError> {
    RunId::parse(text).map_err(|e| format!("stored run id {text:?}: {e}"))
}

/// A record read back with its stored version.
fn record(json: String, version: i64) -> Result<Arc<RunRecord>, PgError> {
    RunRecord::from_stored_version(json, version as u64)
}

/// A row of [`LOAD_COLUMNS`] as the load takes it.
fn stored_row(row: &tokio_postgres::Row) -> StoredRow<'_> {
    let version: i64 = row.get(1);
    let json: &str = row.get(2);
    // Columns of the wrong type count as none: the JSON is parsed.
    let columns = stored_columns(row).ok().flatten();
    StoredRow { id: row.get(0), version: Some(version as u64), json: Ok(json.as_bytes()), columns }
}

/// The columns of a row of [`LOAD_COLUMNS`], or `None` when it has none.
fn stored_columns(
    row: &tokio_postgres::Row,
) -> Result<Option<StoredColumns>, tokio_postgres::Error> {
    let Some(check) = row.try_get::<_, Option<i64>>(14)? else { return Ok(None) };
    let Some(status) = RunStatus::parse(row.try_get(5)?) else { return Ok(None) };
    let text = |i| row.try_get::<_, Option<String>>(i).map(|t| t.map(Cow::Owned));
    let (Some(job_id), Some(name), Some(controller_actor_id), Some(node_ids), Some(node_ips)) =
        (text(6)?, text(7)?, text(8)?, text(10)?, text(11)?)
    else {
        return Ok(None);
    };
    let (Some(lost_controller), Some(leased)) =
        (row.try_get::<_, Option<bool>>(12)?, row.try_get::<_, Option<bool>>(13)?)
    else {
        return Ok(None);
    };
    let columns = RunColumns {
        start_time_ms: row.try_get::<_, i64>(3)? as u64,
        end_time_ms: row.try_get::<_, Option<i64>>(4)?.map(|t| t as u64),
        status,
        lost_controller,
        leased,
        job_id,
        name,
        controller_actor_id,
        cluster: text(9)?,
        node_ids,
        node_ips,
    };
    Ok(Some(StoredColumns { columns, check: check as u32 }))
}

/// Changes committed with sequence numbers in `(after, before)`, each
/// with its run as stored now.
async fn read_changes(
    client: &impl GenericClient,
    after: u64,
    before: u64,
) -> Result<Vec<RemoteChange>, PgError> {
    let rows = client
        .query(
            "SELECT run_id, kind FROM trainstate_changes WHERE seq > $1 AND seq < $2 ORDER BY seq, n",
            &[&(after as i64), &(before as i64)],
        )
        .await
        .map_err(pg)?;
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<String> =
        rows.iter().map(|r| r.get::<_, String>(0)).collect::<HashSet<_>>().into_iter().collect();
    let stored = read_runs(client, &ids).await?;
    rows.iter()
        .map(|row| {
            let id: String = row.get(0);
            let kind: String = row.get(1);
            Ok(RemoteChange {
                kind: event_kind(&kind),
                record: stored.get(&id).cloned(),
                id: run_id(&id)?,
            })
        })
        .collect()
}

/// The stored versions of the runs `ids` (absent ones are missing).
async fn read_runs(
    client: &impl GenericClient,
    ids: &[String],
) -> Result<HashMap<String, Arc<RunRecord>>, PgError> {
    let rows = client
        .query("SELECT id, version, json FROM trainstate_runs WHERE id = ANY($1)", &[&ids])
        .await
        .map_err(pg)?;
    rows.into_iter()
        .map(|row| {
            let id = row.get::<_, String>(0);
            let record =
                record(row.get(2), row.get(1)).map_err(|e| format!("stored run {id}: {e}"))?;
            Ok((id, record))
        })
        .collect()
}

impl Store for PgStore {
    fn load(&mut self) -> Result<Vec<Arc<RunRecord>>, StoreError> {
        let pool = self.pool.clone();
        let mut warned = Instant::now() - OPEN_TIMEOUT;
        loop {
            let attempt = self.block_on("loading", async {
                let mut client = pool.get().await.map_err(pg)?;
                let tx = client
                    .build_transaction()
                    .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                    .read_only(true)
                    .start()
                    .await
                    .map_err(pg)?;
                let seq: i64 =
                    tx.query_one("SELECT seq FROM trainstate_meta", &[]).await.map_err(pg)?.get(0);
                let rows = tx
                    .query(&format!("SELECT {LOAD_COLUMNS} FROM trainstate_runs"), &[])
                    .await
                    .map_err(pg)?;
                tx.commit().await.map_err(pg)?;
                let loaded = parse_rows::<std::convert::Infallible>(|sink| {
                    rows.iter().map(stored_row).for_each(sink);
                    Ok(())
                })
                .unwrap_or_else(|never| match never {});
                Ok((seq as u64, loaded))
            });
            match attempt {
                Ok((seq, Loaded { records, mut corrupt, from_json })) => {
                    self.last_seen = seq;
                    if !from_json.is_empty() {
                        self.index_again(&from_json);
                    }
                    if corrupt.is_empty() {
                        return Ok(records);
                    }
                    if self.quarantine {
                        self.quarantine(&corrupt).map_err(|message| StoreError::Postgres {
                            url: self.url.clone(),
                            message,
                        })?;
                        return Ok(records);
                    }
                    let others = corrupt.len() - 1;
                    let (id, reason) = corrupt.swap_remove(0);
                    return Err(StoreError::CorruptRun {
                        store: self.url.clone(),
                        id,
                        reason,
                        others,
                        table: QUARANTINE_TABLE,
                    });
                }
                // A database that restarts or fails over comes back: wait
                // for it (writes meanwhile are answered Unavailable), unless
                // the head is shutting down.
                Err(err) if !self.handle.is_closing() => {
                    if warned.elapsed() >= Duration::from_secs(10) {
                        tracing::warn!(url = %self.url, error = %err, "cannot load from PostgreSQL; retrying");
                        warned = Instant::now();
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(err) => {
                    return Err(StoreError::Postgres { url: self.url.clone(), message: err });
                }
            }
        }
    }

    fn commit(&mut self, jobs: &[JobChanges<'_>]) -> Result<Committed, StoreError> {
        let pool = self.pool.clone();
        let last_seen = self.last_seen;
        let notify = (self.channel.clone(), self.head);
        let (committed, seen) = self.call("a commit", commit(pool, jobs, last_seen, notify))?;
        self.last_seen = seen;
        Ok(committed)
    }

    fn shared(&mut self) -> Option<&mut dyn SharedStore> {
        Some(self)
    }

    fn append_metrics(
        &mut self,
        batches: &[MetricBatch],
        bound: HistoryBound,
    ) -> Result<Vec<(RunId, u64)>, StoreError> {
        let pool = self.pool.clone();
        self.call("adding metric points", append_metrics(pool, batches, bound))
    }

    fn metric_reader(&mut self) -> Result<Arc<dyn MetricReader>, StoreError> {
        Ok(Arc::new(PgMetricReader {
            runtime: self.runtime.handle().clone(),
            pool: self.pool.clone(),
        }))
    }

    fn changes_after(
        &mut self,
        feed: &Feed,
        after: &Position,
        limit: usize,
    ) -> Result<Vec<ChangedRun>, StoreError> {
        let pool = self.pool.clone();
        let (seq, id) = (after.seq as i64, after.id.clone());
        // A feed that keeps no delivered events matches no record.
        let target = feed.target().map(str::to_owned);
        self.call("reading changed runs", async move {
            let client = pool.get().await.map_err(pg)?;
            let rows = client
                .query(
                    "SELECT r.seq, r.id, r.json, d.events FROM trainstate_runs r
                     LEFT JOIN trainstate_notify_delivered d ON d.run_id = r.id AND d.target = $4
                     WHERE (r.seq, r.id) > ($1, $2)
                     ORDER BY r.seq, r.id LIMIT $3",
                    &[&seq, &id, &(limit as i64), &target],
                )
                .await
                .map_err(pg)?;
            Ok(rows
                .into_iter()
                .map(|row| ChangedRun {
                    at: Position { seq: row.get::<_, i64>(0) as u64, id: row.get(1) },
                    json: row.get(2),
                    delivered: row.get(3),
                })
                .collect())
        })
    }

    fn load_cursor(&mut self, feed: &Feed) -> Result<Position, StoreError> {
        let pool = self.pool.clone();
        let key = feed.key();
        let from_latest = matches!(feed, Feed::Notify(_));
        self.call("reading a feed's position", async move {
            let client = pool.get().await.map_err(pg)?;
            if from_latest {
                // A target seen for the first time starts at the latest
                // change; of two heads that start it at once, the first
                // one's stays.
                client
                    .execute(
                        "INSERT INTO trainstate_forward_positions (target, seq, id)
                         SELECT $1, COALESCE(latest.seq, 0), COALESCE(latest.id, '')
                         FROM (SELECT 1) AS one LEFT JOIN LATERAL (
                             SELECT seq, id FROM trainstate_runs ORDER BY seq DESC, id DESC LIMIT 1
                         ) AS latest ON TRUE
                         ON CONFLICT (target) DO NOTHING",
                        &[&key],
                    )
                    .await
                    .map_err(pg)?;
            }
            let row = client
                .query_opt(
                    "SELECT seq, id FROM trainstate_forward_positions WHERE target = $1",
                    &[&key],
                )
                .await
                .map_err(pg)?;
            Ok(row
                .map(|row| Position { seq: row.get::<_, i64>(0) as u64, id: row.get(1) })
                .unwrap_or_default())
        })
    }

    fn save_cursor(
        &mut self,
        feed: &Feed,
        at: &Position,
        delivered: &[(String, String)],
    ) -> Result<(), StoreError> {
        let pool = self.pool.clone();
        let (key, target, seq, id) =
            (feed.key(), feed.target().map(str::to_owned), at.seq as i64, at.id.clone());
        let (kept, forgotten): (Vec<_>, Vec<_>) =
            delivered.iter().cloned().partition(|(_, events)| events != "[]");
        let (run_ids, events): (Vec<String>, Vec<String>) = kept.into_iter().unzip();
        let forgotten: Vec<String> = forgotten.into_iter().map(|(run_id, _)| run_id).collect();
        self.call("saving a feed's position", async move {
            let mut client = pool.get().await.map_err(pg)?;
            let tx = client.transaction().await.map_err(pg)?;
            tx.execute(
                "INSERT INTO trainstate_forward_positions (target, seq, id) VALUES ($1, $2, $3)
                 ON CONFLICT (target) DO UPDATE SET seq = EXCLUDED.seq, id = EXCLUDED.id
                 WHERE (trainstate_forward_positions.seq, trainstate_forward_positions.id)
                     < (EXCLUDED.seq, EXCLUDED.id)",
                &[&key, &seq, &id],
            )
            .await
            .map_err(pg)?;
            if let Some(target) = target {
                tx.execute(
                    "INSERT INTO trainstate_notify_delivered (run_id, target, events)
                     SELECT d.run_id, $1, d.events
                     FROM UNNEST($2::text[], $3::text[]) AS d(run_id, events)
                     JOIN trainstate_runs r ON r.id = d.run_id
                     ON CONFLICT (run_id, target) DO UPDATE SET events = EXCLUDED.events",
                    &[&target, &run_ids, &events],
                )
                .await
                .map_err(pg)?;
                tx.execute(
                    "DELETE FROM trainstate_notify_delivered WHERE target = $1 AND run_id = ANY($2)",
                    &[&target, &forgotten],
                )
                .await
                .map_err(pg)?;
            }
            tx.commit().await.map_err(pg)
        })
    }

    fn tokens(&mut self) -> Result<Vec<StoredToken>, StoreError> {
        let pool = self.pool.clone();
        self.call("reading the tokens", async move {
            let client = pool.get().await.map_err(pg)?;
            let rows = client
                .query(
                    &format!(
                        "SELECT {TOKEN_COLUMNS} FROM trainstate_tokens ORDER BY created_at_ms, id"
                    ),
                    &[],
                )
                .await
                .map_err(pg)?;
            rows.iter().map(token_of_row).collect()
        })
    }

    fn insert_token(&mut self, token: &StoredToken) -> Result<(), StoreError> {
        let pool = self.pool.clone();
        let row = TokenRow::of(token);
        self.call("storing a token", async move {
            let client = pool.get().await.map_err(pg)?;
            client
                .execute(
                    &format!(
                        "INSERT INTO trainstate_tokens ({TOKEN_COLUMNS})
                         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
                    ),
                    &[
                        &row.id,
                        &row.name,
                        &row.scopes,
                        &row.cluster,
                        &row.hash,
                        &row.created_at_ms,
                        &row.revoked_at_ms,
                        &row.expires_at_ms,
                        &row.idempotency_key_sha256,
                        &row.request_sha256,
                        &row.secret_sealed,
                    ],
                )
                .await
                .map_err(pg)?;
            Ok(())
        })
    }

    fn revoke_token(&mut self, id: &str, at_ms: u64) -> Result<Option<StoredToken>, StoreError> {
        let pool = self.pool.clone();
        let id = id.to_owned();
        self.call("revoking a token", async move {
            let client = pool.get().await.map_err(pg)?;
            client
                .execute(
                    "UPDATE trainstate_tokens SET revoked_at_ms = $2
                     WHERE id = $1 AND revoked_at_ms IS NULL",
                    &[&id, &(at_ms as i64)],
                )
                .await
                .map_err(pg)?;
            let row = client
                .query_opt(
                    &format!("SELECT {TOKEN_COLUMNS} FROM trainstate_tokens WHERE id = $1"),
                    &[&id],
                )
                .await
                .map_err(pg)?;
            row.as_ref().map(token_of_row).transpose()
        })
    }
}

impl SharedStore for PgStore {
    fn handle(&self) -> SharedStoreHandle {
        self.handle.clone()
    }

    fn take_wakeups(&mut self) -> Option<mpsc::Receiver<()>> {
        self.wakeups.take()
    }

    fn follow(&mut self) -> Result<Followed, StoreError> {
        let pool = self.pool.clone();
        let last_seen = self.last_seen;
        let (followed, seen) = self.call("following", async move {
            let mut client = pool.get().await.map_err(pg)?;
            let seq: i64 =
                client.query_one("SELECT seq FROM trainstate_meta", &[]).await.map_err(pg)?.get(0);
            if seq as u64 <= last_seen {
                return Ok((Followed::Changes(Vec::new()), last_seen));
            }
            let tx = client
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await
                .map_err(pg)?;
            let row = tx
                .query_one("SELECT seq, pruned_through FROM trainstate_meta", &[])
                .await
                .map_err(pg)?;
            let (seq, pruned) = (row.get::<_, i64>(0) as u64, row.get::<_, i64>(1) as u64);
            let followed = if pruned > last_seen {
                let rows =
                    tx.query("SELECT version, json FROM trainstate_runs", &[]).await.map_err(pg)?;
                let records = rows
                    .into_iter()
                    .map(|row| record(row.get(1), row.get(0)))
                    .collect::<Result<Vec<_>, _>>()?;
                Followed::Reload(records)
            } else {
                Followed::Changes(read_changes(&tx, last_seen, seq + 1).await?)
            };
            tx.commit().await.map_err(pg)?;
            Ok((followed, seq))
        })?;
        self.last_seen = seen;
        Ok(followed)
    }

    fn share_heartbeats(&mut self, beats: &[(RunId, u64)]) -> Result<(), StoreError> {
        let ids: Vec<&str> = beats.iter().map(|(id, _)| id.as_str()).collect();
        let times: Vec<i64> = beats.iter().map(|(_, at)| *at as i64).collect();
        let pool = self.pool.clone();
        self.call("sharing heartbeats", async move {
            let client = pool.get().await.map_err(pg)?;
            client
                .execute(
                    "INSERT INTO trainstate_heartbeats (run_id, last_heard_ms)
                     SELECT * FROM UNNEST($1::text[], $2::bigint[])
                     ON CONFLICT (run_id) DO UPDATE SET last_heard_ms =
                         GREATEST(trainstate_heartbeats.last_heard_ms, EXCLUDED.last_heard_ms)",
                    &[&ids, &times],
                )
                .await
                .map_err(pg)?;
            Ok(())
        })
    }

    fn shared_heartbeats(&mut self) -> Result<Vec<(RunId, u64)>, StoreError> {
        let pool = self.pool.clone();
        self.call("reading heartbeats", async move {
            let client = pool.get().await.map_err(pg)?;
            let rows = client
                .query("SELECT run_id, last_heard_ms FROM trainstate_heartbeats", &[])
                .await
                .map_err(pg)?;
            rows.into_iter()
                .map(|row| Ok((run_id(row.get(0))?, row.get::<_, i64>(1) as u64)))
                .collect()
        })
    }
}

/// A token from its row (see [`TOKEN_COLUMNS`]).
fn token_of_row(row: &tokio_postgres::Row) -> Result<StoredToken, String> {
    token_from_columns(TokenRow {
        id: row.get(0),
        name: row.get(1),
        scopes: row.get(2),
        cluster: row.get(3),
        hash: row.get(4),
        created_at_ms: row.get(5),
        revoked_at_ms: row.get(6),
        expires_at_ms: row.get(7),
        idempotency_key_sha256: row.get(8),
        request_sha256: row.get(9),
        secret_sealed: row.get(10),
    })
    .map_err(|e| e.to_string())
}

/// One transaction for a group of jobs: takes the next sequence number
/// (and so the turn among heads), catches up with other heads' commits,
/// refuses stale jobs, writes the rest with their change-log entries, and
/// notifies the other heads. Returns what it did and the sequence number
/// this head has now seen.
async fn commit(
    pool: Pool,
    jobs: &[JobChanges<'_>],
    last_seen: u64,
    (channel, head): (String, u64),
) -> Result<(Committed, u64), PgError> {
    let mut client = pool.get().await.map_err(pg)?;
    let tx = client.transaction().await.map_err(pg)?;
    let row = tx
        .query_one("UPDATE trainstate_meta SET seq = seq + 1 RETURNING seq, pruned_through", &[])
        .await
        .map_err(pg)?;
    let (seq, pruned) = (row.get::<_, i64>(0) as u64, row.get::<_, i64>(1) as u64);
    if pruned > last_seen {
        // The log no longer holds everything this head missed: it reloads.
        return Err("this head is too far behind the change log; reloading".into());
    }
    // Every commit before this one has finished: take the others' in.
    let remote =
        if seq > last_seen + 1 { read_changes(&tx, last_seen, seq).await? } else { Vec::new() };

    // The stored version of every run a put touches.
    let touched: Vec<String> = jobs
        .iter()
        .flat_map(|job| job.ops.iter())
        .filter_map(|op| match op {
            StoreOp::Put(record) => Some(record.id.as_str().to_owned()),
            _ => None,
        })
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let mut current: HashMap<String, u64> = HashMap::with_capacity(touched.len());
    if !touched.is_empty() {
        for row in tx
            .query("SELECT id, version FROM trainstate_runs WHERE id = ANY($1)", &[&touched])
            .await
            .map_err(pg)?
        {
            current.insert(row.get(0), row.get::<_, i64>(1) as u64);
        }
    }

    // Each job's puts must have been decided on the stored version (as left
    // by the jobs before it in this group).
    let mut stale = Vec::new();
    let mut net: HashMap<&str, Option<&Arc<RunRecord>>> = HashMap::new();
    let mut order: Vec<&str> = Vec::new();
    let mut log: Vec<(&str, &'static str)> = Vec::new();
    let mut captures: Vec<&StoreOp> = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let mut after: HashMap<&str, Option<u64>> = HashMap::new();
        let fresh = job.ops.iter().all(|op| match op {
            StoreOp::Put(record) => {
                let id = record.id.as_str();
                let stored = after.get(id).copied().unwrap_or_else(|| current.get(id).copied());
                let base = record.base.load(Ordering::Relaxed);
                let fresh = stored == (base != 0).then_some(base);
                after.insert(id, Some(record.version));
                fresh
            }
            StoreOp::Delete(id) => {
                after.insert(id.as_str(), None);
                true
            }
            // A capture is the head's own account of the run, not a version
            // of it: it is written after the runs of the same commit.
            StoreOp::PutCapture(_) | StoreOp::DropCapture { .. } => true,
        });
        if !fresh {
            stale.push(i);
            continue;
        }
        for (id, version) in after {
            match version {
                Some(version) => current.insert(id.to_owned(), version),
                None => current.remove(id),
            };
        }
        for op in job.ops {
            let (id, put) = match op {
                StoreOp::Put(record) => (record.id.as_str(), Some(record)),
                StoreOp::Delete(id) => (id.as_str(), None),
                StoreOp::PutCapture(_) | StoreOp::DropCapture { .. } => {
                    captures.push(op);
                    continue;
                }
            };
            if net.insert(id, put).is_none() {
                order.push(id);
            }
        }
        log.extend(job.events.iter().map(|e| (e.run_id.as_str(), e.kind.as_str())));
    }

    let stale_ids: Vec<String> = stale
        .iter()
        .flat_map(|&i| jobs[i].ops.iter())
        .map(|op| match op {
            StoreOp::Put(record) => record.id.as_str().to_owned(),
            StoreOp::Delete(id) => id.as_str().to_owned(),
            StoreOp::PutCapture(rows) => rows.run_id.as_str().to_owned(),
            StoreOp::DropCapture { run_id, .. } => run_id.as_str().to_owned(),
        })
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();

    if net.is_empty() && log.is_empty() && captures.is_empty() {
        // Nothing to write: give the sequence number back.
        let truth = truth_of(&tx, &stale_ids).await?;
        tx.rollback().await.map_err(pg)?;
        return Ok((Committed { remote, stale, truth }, seq - 1));
    }

    let mut puts = Puts::default();
    let mut deletes: Vec<&str> = Vec::new();
    let mut ended: Vec<&str> = Vec::new();
    for id in &order {
        match net[id] {
            Some(record) => {
                puts.push(record);
                if record.status.is_terminal() {
                    ended.push(id);
                }
            }
            None => {
                deletes.push(id);
                ended.push(id);
            }
        }
    }
    if !puts.id.is_empty() {
        tx.execute(
            "INSERT INTO trainstate_runs
                 (id, start_time_ms, end_time_ms, run_status, cluster, version, seq, json,
                  job_id, name, controller_actor_id, node_ids, node_ips, lost_controller,
                  leased, json_check)
             SELECT id, start_time_ms, end_time_ms, run_status, cluster, version, $1, json,
                 job_id, name, controller_actor_id, node_ids, node_ips, lost_controller,
                 leased, json_check
             FROM UNNEST($2::text[], $3::bigint[], $4::bigint[], $5::text[], $6::text[],
                         $7::bigint[], $8::text[], $9::text[], $10::text[], $11::text[],
                         $12::text[], $13::text[], $14::bool[], $15::bool[], $16::bigint[])
                 AS t(id, start_time_ms, end_time_ms, run_status, cluster, version, json,
                      job_id, name, controller_actor_id, node_ids, node_ips, lost_controller,
                      leased, json_check)
             ON CONFLICT (id) DO UPDATE SET
                 end_time_ms = EXCLUDED.end_time_ms,
                 run_status = EXCLUDED.run_status,
                 cluster = EXCLUDED.cluster,
                 version = EXCLUDED.version,
                 seq = EXCLUDED.seq,
                 json = EXCLUDED.json,
                 job_id = EXCLUDED.job_id,
                 name = EXCLUDED.name,
                 controller_actor_id = EXCLUDED.controller_actor_id,
                 node_ids = EXCLUDED.node_ids,
                 node_ips = EXCLUDED.node_ips,
                 lost_controller = EXCLUDED.lost_controller,
                 leased = EXCLUDED.leased,
                 json_check = EXCLUDED.json_check",
            &[
                &(seq as i64),
                &puts.id,
                &puts.start,
                &puts.end,
                &puts.status,
                &puts.cluster,
                &puts.version,
                &puts.json,
                &puts.job_id,
                &puts.name,
                &puts.controller_actor_id,
                &puts.node_ids,
                &puts.node_ips,
                &puts.lost_controller,
                &puts.leased,
                &puts.check,
            ],
        )
        .await
        .map_err(pg)?;
    }
    if !deletes.is_empty() {
        tx.execute("DELETE FROM trainstate_runs WHERE id = ANY($1)", &[&deletes])
            .await
            .map_err(pg)?;
        tx.execute(
            "DELETE FROM trainstate_metric_points WHERE series_id IN
             (SELECT id FROM trainstate_metric_series WHERE run_id = ANY($1))",
            &[&deletes],
        )
        .await
        .map_err(pg)?;
        tx.execute("DELETE FROM trainstate_metric_series WHERE run_id = ANY($1)", &[&deletes])
            .await
            .map_err(pg)?;
        tx.execute("DELETE FROM trainstate_notify_delivered WHERE run_id = ANY($1)", &[&deletes])
            .await
            .map_err(pg)?;
        tx.execute("DELETE FROM trainstate_run_progress WHERE run_id = ANY($1)", &[&deletes])
            .await
            .map_err(pg)?;
        tx.execute("DELETE FROM trainstate_stack_captures WHERE run_id = ANY($1)", &[&deletes])
            .await
            .map_err(pg)?;
        tx.execute("DELETE FROM trainstate_stack_ranks WHERE run_id = ANY($1)", &[&deletes])
            .await
            .map_err(pg)?;
    }
    for op in captures {
        write_capture(&tx, op).await.map_err(pg)?;
    }
    if !ended.is_empty() {
        tx.execute("DELETE FROM trainstate_heartbeats WHERE run_id = ANY($1)", &[&ended])
            .await
            .map_err(pg)?;
    }
    if !log.is_empty() {
        let n: Vec<i32> = (0..log.len() as i32).collect();
        let ids: Vec<&str> = log.iter().map(|(id, _)| *id).collect();
        let kinds: Vec<&str> = log.iter().map(|(_, kind)| *kind).collect();
        tx.execute(
            "INSERT INTO trainstate_changes (seq, n, run_id, kind)
             SELECT $1, * FROM UNNEST($2::int[], $3::text[], $4::text[])",
            &[&(seq as i64), &n, &ids, &kinds],
        )
        .await
        .map_err(pg)?;
    }
    if seq.is_multiple_of(1_000) && seq > CHANGES_KEPT {
        let through = (seq - CHANGES_KEPT) as i64;
        tx.execute("DELETE FROM trainstate_changes WHERE seq <= $1", &[&through])
            .await
            .map_err(pg)?;
        tx.execute(
            "UPDATE trainstate_meta SET pruned_through = GREATEST(pruned_through, $1)",
            &[&through],
        )
        .await
        .map_err(pg)?;
    }
    let truth = truth_of(&tx, &stale_ids).await?;
    tx.execute("SELECT pg_notify($1, $2)", &[&channel, &format!("{head}:{seq}")])
        .await
        .map_err(pg)?;
    tx.commit().await.map_err(pg)?;
    Ok((Committed { remote, stale, truth }, seq))
}

/// Adds the points of `batches` to their series in one transaction (see
/// [`Store::append_metrics`]): the series' states are read, the offers
/// decided here, and the points written in bulk; then each run's
/// histories are brought within `bound`. Answers the bytes of histories
/// each run written to keeps now.
async fn append_metrics(
    pool: Pool,
    batches: &[MetricBatch],
    bound: HistoryBound,
) -> Result<Vec<(RunId, u64)>, PgError> {
    let mut client = pool.get().await.map_err(pg)?;
    let tx = client.transaction().await.map_err(pg)?;
    // Points to write: series id, seq, rank, step, value.
    let mut points: Vec<(i64, i64, i32, i64, f64)> = Vec::new();
    let mut thins: Vec<(i64, i64)> = Vec::new();
    let (mut saved_ids, mut strides, mut seens, mut kepts) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for batch in batches {
        let (run, attempt) = (batch.run_id.as_str(), &*batch.attempt_id);
        let stored = tx
            .query_opt("SELECT 1 FROM trainstate_runs WHERE id = $1", &[&run])
            .await
            .map_err(pg)?;
        if stored.is_none() {
            continue;
        }
        if let Some(progress) = &batch.last_progress {
            tx.execute(
                "INSERT INTO trainstate_run_progress (run_id, attempt_id, progress)
                 VALUES ($1, $2, $3)
                 ON CONFLICT (run_id) DO UPDATE SET
                     attempt_id = EXCLUDED.attempt_id, progress = EXCLUDED.progress",
                &[&run, &attempt, &&**progress],
            )
            .await
            .map_err(pg)?;
        }
        if batch.points.is_empty() {
            continue;
        }
        let mut names: Vec<&str> = batch.points.iter().map(|p| &*p.name).collect();
        names.sort_unstable();
        names.dedup();
        tx.execute(
            "INSERT INTO trainstate_metric_series (run_id, attempt_id, name, stride, seen, kept)
             SELECT $1, $2, name, 1, 0, 0 FROM UNNEST($3::text[]) AS t(name)
             ON CONFLICT (run_id, attempt_id, name) DO NOTHING",
            &[&run, &attempt, &names],
        )
        .await
        .map_err(pg)?;
        let mut series: HashMap<String, (i64, SeriesState)> = HashMap::new();
        for row in tx
            .query(
                "SELECT id, name, stride, seen, kept FROM trainstate_metric_series
                 WHERE run_id = $1 AND attempt_id = $2 AND name = ANY($3)",
                &[&run, &attempt, &names],
            )
            .await
            .map_err(pg)?
        {
            let state = SeriesState {
                stride: row.get::<_, i64>(2) as u64,
                seen: row.get::<_, i64>(3) as u64,
                kept: row.get::<_, i64>(4) as u64,
            };
            series.insert(row.get(1), (row.get(0), state));
        }
        for named in &batch.points {
            let Some((id, state)) = series.get_mut(&*named.name) else { continue };
            let offer = state.offer();
            if let Some(stride) = offer.thin_to {
                // The points of this flush not written yet are thinned here.
                points.retain(|p| p.0 != *id || p.1 % stride as i64 == 0);
                thins.push((*id, stride as i64));
            }
            if let Some(seq) = offer.insert {
                let point = named.point;
                points.push((*id, seq as i64, point.rank as i32, point.step as i64, point.value));
            }
        }
        for (id, state) in series.values() {
            saved_ids.push(*id);
            strides.push(state.stride as i64);
            seens.push(state.seen as i64);
            kepts.push(state.kept as i64);
        }
    }
    for (id, stride) in &thins {
        tx.execute(
            "DELETE FROM trainstate_metric_points WHERE series_id = $1 AND seq % $2 != 0",
            &[id, stride],
        )
        .await
        .map_err(pg)?;
    }
    if !points.is_empty() {
        let ids: Vec<i64> = points.iter().map(|p| p.0).collect();
        let seqs: Vec<i64> = points.iter().map(|p| p.1).collect();
        let ranks: Vec<i32> = points.iter().map(|p| p.2).collect();
        let steps: Vec<i64> = points.iter().map(|p| p.3).collect();
        let values: Vec<f64> = points.iter().map(|p| p.4).collect();
        tx.execute(
            "INSERT INTO trainstate_metric_points (series_id, seq, rank, step, value)
             SELECT * FROM UNNEST($1::bigint[], $2::bigint[], $3::int[], $4::bigint[],
                                  $5::float8[])
             ON CONFLICT (series_id, seq) DO UPDATE SET
                 rank = EXCLUDED.rank, step = EXCLUDED.step, value = EXCLUDED.value",
            &[&ids, &seqs, &ranks, &steps, &values],
        )
        .await
        .map_err(pg)?;
    }
    if !saved_ids.is_empty() {
        tx.execute(
            "UPDATE trainstate_metric_series AS s SET stride = t.stride, seen = t.seen,
                 kept = t.kept
             FROM UNNEST($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[])
                 AS t(id, stride, seen, kept)
             WHERE s.id = t.id",
            &[&saved_ids, &strides, &seens, &kepts],
        )
        .await
        .map_err(pg)?;
    }
    // Each run's histories, all attempts together, within the bound: the
    // attempt written to last in this flush is the one never cut.
    let mut written: HashMap<&RunId, &str> = HashMap::new();
    for batch in batches.iter().filter(|b| !b.points.is_empty()) {
        written.insert(&batch.run_id, &batch.attempt_id);
    }
    let mut kept_by_run = Vec::with_capacity(written.len());
    for (run_id, attempt) in written {
        let run = run_id.as_str();
        let kept: Vec<(String, u64)> = tx
            .query(
                "SELECT attempt_id, SUM(kept)::bigint FROM trainstate_metric_series
                 WHERE run_id = $1 GROUP BY attempt_id ORDER BY MIN(id)",
                &[&run],
            )
            .await
            .map_err(pg)?
            .into_iter()
            .map(|row| (row.get::<_, String>(0), row.get::<_, i64>(1).max(0) as u64))
            .collect();
        let gone = attempts_giving_way(&kept, attempt, bound);
        if !gone.is_empty() {
            tx.execute(
                "DELETE FROM trainstate_metric_points WHERE series_id IN
                 (SELECT id FROM trainstate_metric_series
                  WHERE run_id = $1 AND attempt_id = ANY($2))",
                &[&run, &gone],
            )
            .await
            .map_err(pg)?;
            tx.execute(
                "DELETE FROM trainstate_metric_series WHERE run_id = $1 AND attempt_id = ANY($2)",
                &[&run, &gone],
            )
            .await
            .map_err(pg)?;
        }
        let left: u64 =
            kept.iter().filter(|(a, _)| !gone.contains(&a.as_str())).map(|(_, k)| k).sum();
        kept_by_run.push((run_id.clone(), left * HISTORY_POINT_BYTES));
    }
    tx.commit().await.map_err(pg)?;
    Ok(kept_by_run)
}

/// Reads metric histories with a connection of the store's pool, on the
/// store's runtime, from any thread but the runtime's own.
struct PgMetricReader {
    runtime: tokio::runtime::Handle,
    pool: Pool,
}

impl MetricReader for PgMetricReader {
    fn read(
        &self,
        run: &RunId,
        attempt: &str,
        query: &MetricsQuery,
    ) -> Result<Vec<MetricSeries>, String> {
        let pool = self.pool.clone();
        let step = |s: Option<u64>| s.map(|s| s.min(i64::MAX as u64) as i64);
        let (from, to) = (step(query.from_step), step(query.to_step));
        let rank = query.rank.map(|r| r as i32);
        let (run, attempt, name) = (run.as_str(), attempt, query.name.as_deref());
        self.runtime.block_on(async move {
            let read = async {
                let client = pool.get().await.map_err(pg)?;
                let rows = client
                    .query(
                        "SELECT s.name, p.rank, p.step, p.value
                         FROM trainstate_metric_series s
                         JOIN trainstate_metric_points p ON p.series_id = s.id
                         WHERE s.run_id = $1 AND s.attempt_id = $2
                           AND ($3::text IS NULL OR s.name = $3)
                           AND ($4::int IS NULL OR p.rank = $4)
                           AND ($5::bigint IS NULL OR p.step >= $5)
                           AND ($6::bigint IS NULL OR p.step <= $6)
                         ORDER BY s.name, p.seq",
                        &[&run, &attempt, &name, &rank, &from, &to],
                    )
                    .await
                    .map_err(pg)?;
                Ok::<_, PgError>(into_series(rows.into_iter().map(|row| {
                    let point = MetricPoint::new(
                        row.get::<_, i32>(1) as u32,
                        row.get::<_, i64>(2) as u64,
                        row.get(3),
                    );
                    (row.get::<_, String>(0), point)
                })))
            };
            match tokio::time::timeout(CALL_TIMEOUT, read).await {
                Ok(result) => result,
                Err(_) => {
                    Err(format!("reading metric histories took longer than {CALL_TIMEOUT:?}"))
                }
            }
        })
    }

    fn last_progress(&self, run: &RunId) -> Result<Option<LastProgress>, String> {
        let pool = self.pool.clone();
        let run = run.as_str();
        self.runtime.block_on(async move {
            let read = async {
                let client = pool.get().await.map_err(pg)?;
                let row = client
                    .query_opt(
                        "SELECT attempt_id, progress FROM trainstate_run_progress
                         WHERE run_id = $1",
                        &[&run],
                    )
                    .await
                    .map_err(pg)?;
                Ok::<_, PgError>(
                    row.map(|row| LastProgress { attempt_id: row.get(0), json: row.get(1) }),
                )
            };
            match tokio::time::timeout(CALL_TIMEOUT, read).await {
                Ok(result) => result,
                Err(_) => {
                    Err(format!("reading a run's last progress took longer than {CALL_TIMEOUT:?}"))
                }
            }
        })
    }

    fn history_bytes(&self) -> Result<Vec<(RunId, u64)>, String> {
        let pool = self.pool.clone();
        self.runtime.block_on(async move {
            let read = async {
                let client = pool.get().await.map_err(pg)?;
                let rows = client
                    .query(
                        "SELECT run_id, SUM(kept)::bigint FROM trainstate_metric_series
                         GROUP BY run_id",
                        &[],
                    )
                    .await
                    .map_err(pg)?;
                Ok::<_, PgError>(
                    rows.into_iter()
                        .filter_map(|row| {
                            let run = RunId::parse(&row.get::<_, String>(0)).ok()?;
                            let kept = row.get::<_, i64>(1).max(0) as u64;
                            Some((run, kept * HISTORY_POINT_BYTES))
                        })
                        .collect(),
                )
            };
            match tokio::time::timeout(CALL_TIMEOUT, read).await {
                Ok(result) => result,
                Err(_) => {
                    Err(format!("reading the histories' sizes took longer than {CALL_TIMEOUT:?}"))
                }
            }
        })
    }
}

/// Writes a capture's rows, or drops a capture, in `tx`; the rows of a run
/// that is not stored are not written.
async fn write_capture(tx: &impl GenericClient, op: &StoreOp) -> Result<(), tokio_postgres::Error> {
    match op {
        StoreOp::PutCapture(rows) => {
            let run = rows.run_id.as_str();
            let capture = rows.capture_id as i64;
            let written = tx
                .execute(
                    "INSERT INTO trainstate_stack_captures (run_id, capture_id, bytes, header)
                     SELECT $1, $2, $3, $4 WHERE EXISTS (SELECT 1 FROM trainstate_runs WHERE id = $1)
                     ON CONFLICT (run_id, capture_id) DO UPDATE SET
                         bytes = EXCLUDED.bytes, header = EXCLUDED.header",
                    &[&run, &capture, &(rows.bytes as i64), &rows.header],
                )
                .await?;
            if written == 0 || rows.ranks.is_empty() {
                return Ok(());
            }
            let ranks: Vec<i64> = rows.ranks.iter().map(|(rank, _)| i64::from(*rank)).collect();
            let stacks: Vec<&str> = rows.ranks.iter().map(|(_, stack)| stack.as_str()).collect();
            tx.execute(
                "INSERT INTO trainstate_stack_ranks (run_id, capture_id, rank, stack)
                 SELECT $1, $2, * FROM UNNEST($3::bigint[], $4::text[])
                 ON CONFLICT (run_id, capture_id, rank) DO UPDATE SET stack = EXCLUDED.stack",
                &[&run, &capture, &ranks, &stacks],
            )
            .await?;
        }
        StoreOp::DropCapture { run_id, capture_id } => {
            let (run, capture) = (run_id.as_str(), *capture_id as i64);
            tx.execute(
                "DELETE FROM trainstate_stack_captures WHERE run_id = $1 AND capture_id = $2",
                &[&run, &capture],
            )
            .await?;
            tx.execute(
                "DELETE FROM trainstate_stack_ranks WHERE run_id = $1 AND capture_id = $2",
                &[&run, &capture],
            )
            .await?;
        }
        StoreOp::Put(_) | StoreOp::Delete(_) => {}
    }
    Ok(())
}

impl CaptureReader for PgMetricReader {
    fn captures(&self, run: &RunId) -> Result<Vec<StackCapture>, String> {
        let pool = self.pool.clone();
        let run = run.as_str();
        self.runtime.block_on(async move {
            let read = async {
                let mut client = pool.get().await.map_err(pg)?;
                // One snapshot for the headers and their ranks.
                let tx = client
                    .build_transaction()
                    .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                    .read_only(true)
                    .start()
                    .await
                    .map_err(pg)?;
                let headers = tx
                    .query(
                        "SELECT capture_id, header FROM trainstate_stack_captures
                         WHERE run_id = $1 ORDER BY capture_id DESC",
                        &[&run],
                    )
                    .await
                    .map_err(pg)?;
                let mut captures = Vec::with_capacity(headers.len());
                for header in headers {
                    let capture_id: i64 = header.get(0);
                    let rows = tx
                        .query(
                            "SELECT stack FROM trainstate_stack_ranks
                             WHERE run_id = $1 AND capture_id = $2 ORDER BY rank",
                            &[&run, &capture_id],
                        )
                        .await
                        .map_err(pg)?;
                    let text: String = header.get(1);
                    captures.push(assemble(
                        &text,
                        rows.into_iter().map(|row| row.get::<_, String>(0)),
                    )?);
                }
                Ok::<_, PgError>(captures)
            };
            match tokio::time::timeout(CALL_TIMEOUT, read).await {
                Ok(result) => result,
                Err(_) => {
                    Err(format!("reading a run's captures took longer than {CALL_TIMEOUT:?}"))
                }
            }
        })
    }

    fn capture_index(&self) -> Result<Vec<StoredCapture>, String> {
        let pool = self.pool.clone();
        self.runtime.block_on(async move {
            let read = async {
                let client = pool.get().await.map_err(pg)?;
                let rows = client
                    .query("SELECT run_id, bytes, header FROM trainstate_stack_captures", &[])
                    .await
                    .map_err(pg)?;
                let mut index = Vec::with_capacity(rows.len());
                for row in rows {
                    let Ok(run_id) = RunId::parse(row.get::<_, &str>(0)) else { continue };
                    let header = parse_header(row.get::<_, &str>(2))?;
                    let bytes = row.get::<_, i64>(1).max(0) as u64;
                    index.push(StoredCapture { run_id, bytes, header });
                }
                Ok::<_, PgError>(index)
            };
            match tokio::time::timeout(CALL_TIMEOUT, read).await {
                Ok(result) => result,
                Err(_) => Err(format!("reading the captures took longer than {CALL_TIMEOUT:?}")),
            }
        })
    }
}

/// The stored version of each run in `ids` (`None` when there is none).
async fn truth_of(
    client: &impl GenericClient,
    ids: &[String],
) -> Result<Vec<(RunId, Option<Arc<RunRecord>>)>, PgError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let stored = read_runs(client, ids).await?;
    ids.iter().map(|id| Ok((run_id(id)?, stored.get(id).cloned()))).collect()
}

/// Columns of runs to put, one array per column.
#[derive(Default)]
struct Puts<'a> {
    id: Vec<&'a str>,
    start: Vec<i64>,
    end: Vec<Option<i64>>,
    status: Vec<&'a str>,
    cluster: Vec<Option<&'a str>>,
    version: Vec<i64>,
    json: Vec<String>,
    job_id: Vec<&'a str>,
    name: Vec<&'a str>,
    controller_actor_id: Vec<&'a str>,
    node_ids: Vec<&'a str>,
    node_ips: Vec<&'a str>,
    lost_controller: Vec<bool>,
    leased: Vec<bool>,
    check: Vec<i64>,
}

impl<'a> Puts<'a> {
    fn push(&mut self, record: &'a RunRecord) {
        let json = record.stored_text().into_owned();
        self.check.push(i64::from(check(record.id.as_str(), &record.columns(), &json)));
        self.id.push(record.id.as_str());
        self.start.push(record.start_time_ms as i64);
        self.end.push(record.end_time_ms.map(|t| t as i64));
        self.status.push(record.status.as_str());
        self.cluster.push(record.cluster.as_deref());
        self.version.push(record.version as i64);
        self.json.push(json);
        self.job_id.push(&record.job_id);
        self.name.push(&record.name);
        self.controller_actor_id.push(record.controller_actor_id());
        self.node_ids.push(record.node_ids.as_text());
        self.node_ips.push(record.node_ips.as_text());
        self.lost_controller.push(record.lost_controller);
        self.leased.push(record.leased);
    }
}
