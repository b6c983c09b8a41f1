//! The SQLite store: schema, migrations, load and batched commits.

use std::borrow::Cow;
use std::collections::HashMap;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OpenFlags, OptionalExtension, ToSql, params};
use trainstate_schema::api::{MetricPoint, MetricSeries, MetricsQuery, StackCapture};
use trainstate_schema::{ActorStatus, RunId, RunStatus, TrainRunInfo};

use super::columns::{StoredColumns, check};
use super::load::{Loaded, StoredRow, log_quarantined, parse_rows};
use super::metrics::{
    HISTORY_POINT_BYTES, HistoryBound, LastProgress, MetricBatch, MetricReader, SeriesState,
    attempts_giving_way, into_series,
};
use super::private;
use super::stacks::{CaptureReader, StoredCapture, assemble, parse_header};
use super::{
    ChangedRun, Committed, Feed, JobChanges, Position, Store, TOKEN_COLUMNS, TokenRow,
    token_from_columns,
};
use crate::decisions::change::StoreOp;
use crate::decisions::record::{RunColumns, RunRecord};
use crate::decisions::tokens::StoredToken;
use crate::store::config::Synchronous;
use crate::store::error::StoreError;

/// One step of the store's schema.
enum Migration {
    /// SQL to run.
    Sql(&'static str),
    /// A rewrite of the stored runs.
    Rewrite(fn(&rusqlite::Transaction<'_>) -> rusqlite::Result<()>),
}

/// The schema migrations, in order. `PRAGMA user_version` is the number
/// applied. Append, never edit.
const MIGRATIONS: &[Migration] = &[
    // 1: runs as canonical JSON, with the columns the order and retention need.
    Migration::Sql(
        "CREATE TABLE runs (
        id TEXT PRIMARY KEY NOT NULL,
        start_time_ms INTEGER NOT NULL,
        end_time_ms INTEGER,
        run_status TEXT NOT NULL,
        json TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX runs_by_start ON runs (start_time_ms DESC, id DESC);",
    ),
    // 2: each commit's sequence number on the runs it changed, and the
    // positions of forwarding, so a head resumes forwarding where it was.
    // Runs stored before are at 1, after position 0: all are forwarded.
    Migration::Sql(
        "ALTER TABLE runs ADD COLUMN seq INTEGER NOT NULL DEFAULT 1;
    CREATE INDEX runs_by_seq ON runs (seq, id);
    CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) WITHOUT ROWID;
    INSERT INTO meta (key, value) VALUES ('seq', 1);
    CREATE TABLE forward_positions (
        target TEXT PRIMARY KEY NOT NULL,
        seq INTEGER NOT NULL,
        id TEXT NOT NULL
    ) WITHOUT ROWID;",
    ),
    // 3: Ray Train V2's lifecycle: every attempt states its status, the
    // workers of an ended run are DEAD, `run_status` holds the full status.
    Migration::Rewrite(upgrade_to_v2_lifecycle),
    // 4: bearer tokens: the SHA-256 hash of each secret (never the secret),
    // its scopes (`read,write`), the cluster it is bound to, when it was
    // created and revoked.
    Migration::Sql(
        "CREATE TABLE tokens (
        id TEXT PRIMARY KEY NOT NULL,
        name TEXT,
        scopes TEXT NOT NULL,
        cluster TEXT,
        secret_sha256 TEXT NOT NULL UNIQUE,
        created_at_ms INTEGER NOT NULL,
        revoked_at_ms INTEGER
    ) WITHOUT ROWID;",
    ),
    // 5: the fields the actor indexes in columns of their own beside the
    // JSON, with the check that they describe it (`store/columns.rs`), so
    // a load builds records without parsing the JSON.
    Migration::Rewrite(add_index_columns),
    // 6: metric histories (`store/metrics.rs`): where each series of a
    // run's attempt stands, and the points it keeps, by the order in which
    // they were offered to it.
    Migration::Sql(
        "CREATE TABLE metric_series (
        id INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL,
        attempt_id TEXT NOT NULL,
        name TEXT NOT NULL,
        stride INTEGER NOT NULL,
        seen INTEGER NOT NULL,
        kept INTEGER NOT NULL,
        UNIQUE (run_id, attempt_id, name)
    );
    CREATE TABLE metric_points (
        series_id INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        rank INTEGER NOT NULL,
        step INTEGER NOT NULL,
        value REAL NOT NULL,
        PRIMARY KEY (series_id, seq)
    ) WITHOUT ROWID;",
    ),
    // 7: the events of each run that each notification target delivered
    // (their ids, a JSON array), so a run that changes again is not told
    // of twice; a run's rows go with the run.
    Migration::Sql(
        "CREATE TABLE notify_delivered (
        run_id TEXT NOT NULL,
        target TEXT NOT NULL,
        events TEXT NOT NULL,
        PRIMARY KEY (run_id, target)
    ) WITHOUT ROWID;",
    ),
    // 8: the last progress of each run's ranks, kept when their board goes
    // away (the run ended, or started another attempt): the attempt it is
    // of and `rank_progress` as served, in JSON; a run's row goes with the
    // run.
    Migration::Sql(
        "CREATE TABLE run_progress (
        run_id TEXT PRIMARY KEY NOT NULL,
        attempt_id TEXT NOT NULL,
        progress TEXT NOT NULL
    ) WITHOUT ROWID;",
    ),
    // 9: stack captures (`store/stacks.rs`): one header row per capture of
    // a run (the capture with no ranks, as JSON, and the bytes the whole
    // capture keeps) and one row per rank of it (its stack, as JSON); a
    // run's rows go with the run.
    Migration::Sql(
        "CREATE TABLE stack_captures (
        run_id TEXT NOT NULL,
        capture_id INTEGER NOT NULL,
        bytes INTEGER NOT NULL,
        header TEXT NOT NULL,
        PRIMARY KEY (run_id, capture_id)
    ) WITHOUT ROWID;
    CREATE TABLE stack_ranks (
        run_id TEXT NOT NULL,
        capture_id INTEGER NOT NULL,
        rank INTEGER NOT NULL,
        stack TEXT NOT NULL,
        PRIMARY KEY (run_id, capture_id, rank)
    ) WITHOUT ROWID;",
    ),
    // 10: a token's expiry (Unix ms on the head's clock; null: never) and,
    // for one created with an idempotency key, the key's hash (unique), the
    // request's hash and the secret sealed by the key. Tokens stored before
    // never expire and have no key.
    Migration::Sql(
        "ALTER TABLE tokens ADD COLUMN expires_at_ms INTEGER;
    ALTER TABLE tokens ADD COLUMN idempotency_key_sha256 TEXT;
    ALTER TABLE tokens ADD COLUMN request_sha256 TEXT;
    ALTER TABLE tokens ADD COLUMN secret_sealed TEXT;
    CREATE UNIQUE INDEX tokens_by_idempotency_key ON tokens (idempotency_key_sha256);",
    ),
];

/// The columns a run's row keeps beside its JSON, in the order
/// [`index_values`] gives their values.
const INDEX_COLUMNS: &str = "job_id, name, controller_actor_id, cluster, node_ids, node_ips, \
     lost_controller, leased, json_check";

/// The values of [`INDEX_COLUMNS`] for `columns` and their `check`.
fn index_values<'a>(columns: &'a RunColumns<'_>, check: &'a u32) -> [&'a dyn ToSql; 9] {
    [
        &columns.job_id,
        &columns.name,
        &columns.controller_actor_id,
        &columns.cluster,
        &columns.node_ids,
        &columns.node_ips,
        &columns.lost_controller,
        &columns.leased,
        check,
    ]
}

/// Calls `write` with a run's 14 values: id, start, end, status, its JSON
/// as one text, then those of [`INDEX_COLUMNS`], whose check covers that
/// very text.
fn bind_run<T>(
    record: &RunRecord,
    write: impl FnOnce(&[&dyn ToSql]) -> rusqlite::Result<T>,
) -> rusqlite::Result<T> {
    let id = record.id.as_str();
    let text = record.stored_text();
    let json: &str = &text;
    let columns = record.columns();
    let check = check(id, &columns, json);
    let start = record.start_time_ms as i64;
    let end = record.end_time_ms.map(|t| t as i64);
    let status = record.status.as_str();
    let [a, b, c, d, e, f, g, h, i] = index_values(&columns, &check);
    write(&[&id, &start, &end, &status, &json, a, b, c, d, e, f, g, h, i])
}

/// The columns of a row read by [`SqliteStore::load_rows`] (from its third
/// column on), or `None` when it has none (no check).
fn read_columns(row: &rusqlite::Row<'_>) -> rusqlite::Result<Option<StoredColumns>> {
    let Some(check) = row.get::<_, Option<u32>>(13)? else { return Ok(None) };
    let Some(status) = RunStatus::parse(row.get_ref(4)?.as_str()?) else { return Ok(None) };
    let text = |i| row.get::<_, String>(i).map(Cow::Owned);
    let columns = RunColumns {
        start_time_ms: row.get::<_, i64>(2)? as u64,
        end_time_ms: row.get::<_, Option<i64>>(3)?.map(|t| t as u64),
        status,
        job_id: text(5)?,
        name: text(6)?,
        controller_actor_id: text(7)?,
        cluster: row.get::<_, Option<String>>(8)?.map(Cow::Owned),
        node_ids: text(9)?,
        node_ips: text(10)?,
        lost_controller: row.get(11)?,
        leased: row.get(12)?,
    };
    Ok(Some(StoredColumns { columns, check }))
}

/// Adds the index columns and fills them from every stored run's JSON. A
/// run that does not parse keeps none: the load parses it and names it.
fn add_index_columns(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "ALTER TABLE runs ADD COLUMN job_id TEXT;
        ALTER TABLE runs ADD COLUMN name TEXT;
        ALTER TABLE runs ADD COLUMN controller_actor_id TEXT;
        ALTER TABLE runs ADD COLUMN cluster TEXT;
        ALTER TABLE runs ADD COLUMN node_ids TEXT;
        ALTER TABLE runs ADD COLUMN node_ips TEXT;
        ALTER TABLE runs ADD COLUMN lost_controller INTEGER;
        ALTER TABLE runs ADD COLUMN leased INTEGER;
        ALTER TABLE runs ADD COLUMN json_check INTEGER;",
    )?;
    let mut select = tx.prepare("SELECT CAST(id AS TEXT), json FROM runs")?;
    let mut rows = select.query([])?;
    let mut update = tx.prepare(&format!(
        "UPDATE runs SET ({INDEX_COLUMNS}) = (?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) WHERE id = ?1"
    ))?;
    while let Some(row) = rows.next()? {
        let (Some(id), Ok(json)) = (row.get::<_, Option<String>>(0)?, row.get::<_, String>(1))
        else {
            continue;
        };
        let Ok(record) = RunRecord::from_stored(json.clone()) else { continue };
        let columns = record.columns();
        let check = check(&id, &columns, &json);
        let mut values: Vec<&dyn ToSql> = vec![&id];
        values.extend(index_values(&columns, &check));
        update.execute(values.as_slice())?;
    }
    Ok(())
}

/// Rewrites every stored run in today's canonical form: attempts with
/// their (derived) statuses, and the workers of ended runs marked DEAD. A
/// run that does not parse is left as it is, for the load to report.
fn upgrade_to_v2_lifecycle(tx: &rusqlite::Transaction<'_>) -> rusqlite::Result<()> {
    let rows: Vec<(String, String)> = tx
        .prepare("SELECT id, json FROM runs")?
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?
        .collect::<Result<_, _>>()?;
    let mut update = tx.prepare("UPDATE runs SET json = ?2, run_status = ?3 WHERE id = ?1")?;
    for (id, json) in rows {
        let Ok(run) = serde_json::from_str::<TrainRunInfo>(&json) else { continue };
        let mut draft = run.into_draft();
        if draft.run_status.is_terminal() {
            for worker in &mut draft.workers {
                worker.status = ActorStatus::Dead;
            }
        }
        let Ok(run) = draft.validate() else { continue };
        let json = serde_json::to_string(&run).expect("a validated run serializes");
        update.execute(params![id, json, run.status().as_str()])?;
    }
    Ok(())
}

/// SQLite's page cache, in KiB.
const CACHE_KIB: u32 = 512;

/// The schema version this build writes.
pub(crate) const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// A durable store in one SQLite file.
pub(crate) struct SqliteStore {
    conn: Connection,
    path: PathBuf,
    /// Runs that do not load are moved aside instead of refusing the store.
    quarantine: bool,
}

/// Keeps the database at `path` and its WAL and shared-memory files
/// readable and writable by their owner alone (`0600`): they hold every
/// run and the hashes of the head's tokens. A missing database is created
/// so before SQLite opens it, and SQLite gives the WAL and shared-memory
/// files it creates the database's mode; files an earlier version left
/// open to others are tightened (see [`private::owner_only`]).
fn owner_only_store(path: &Path) {
    let created = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path);
    if let Err(err) = created
        && err.kind() != std::io::ErrorKind::AlreadyExists
    {
        // SQLite says why it cannot create the database, naming it.
        tracing::debug!(store = %path.display(), error = %err, "cannot create the store file");
    }
    private::owner_only(path);
    for suffix in ["-wal", "-shm"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        private::owner_only(Path::new(&name));
    }
}

/// Where runs that do not load are moved by `--quarantine-corrupt`.
pub(crate) const QUARANTINE_TABLE: &str = "quarantined_runs";

impl SqliteStore {
    /// Opens (creating if missing) and migrates the database at `path`.
    pub(crate) fn open(path: &Path, synchronous: Synchronous) -> Result<Self, StoreError> {
        let at = |source| StoreError::Sqlite { path: path.to_path_buf(), source };
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        owner_only_store(path);
        let mut conn = Connection::open_with_flags(path, flags).map_err(at)?;
        let mode: String =
            conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0)).map_err(at)?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError::NoWal { path: path.to_path_buf(), mode });
        }
        let level = match synchronous {
            Synchronous::Full => "FULL",
            Synchronous::Normal => "NORMAL",
        };
        // Reads are served from memory, so SQLite's page cache only helps
        // inserts: a small one keeps the head's memory near its runs' bytes.
        conn.execute_batch(&format!(
            "PRAGMA synchronous = {level}; PRAGMA busy_timeout = 5000; PRAGMA cache_size = -{CACHE_KIB};"
        ))
            .map_err(at)?;
        migrate(&mut conn).map_err(|e| match e {
            MigrateError::Sqlite(source) => at(source),
            MigrateError::Newer(found) => StoreError::NewerSchema {
                path: path.to_path_buf(),
                found,
                supported: SCHEMA_VERSION,
            },
        })?;
        // The WAL and shared-memory files exist now.
        owner_only_store(path);
        Ok(Self { conn, path: path.to_path_buf(), quarantine: false })
    }

    /// Moves runs that do not load aside instead of refusing the store.
    pub(crate) fn quarantining(mut self, quarantine: bool) -> Self {
        self.quarantine = quarantine;
        self
    }

    /// Moves the runs `corrupt` (id, why) into [`QUARANTINE_TABLE`], in one
    /// transaction, and logs each.
    fn quarantine(&mut self, corrupt: &[(String, String)]) -> Result<(), rusqlite::Error> {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let tx = self.conn.transaction()?;
        tx.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS {QUARANTINE_TABLE} (
                id TEXT NOT NULL,
                json TEXT,
                reason TEXT NOT NULL,
                quarantined_at_ms INTEGER NOT NULL
            )"
        ))?;
        {
            let mut keep = tx.prepare(&format!(
                "INSERT INTO {QUARANTINE_TABLE} (id, json, reason, quarantined_at_ms)
                 SELECT id, CAST(json AS TEXT), ?2, ?3 FROM runs WHERE id = ?1"
            ))?;
            let mut remove = tx.prepare("DELETE FROM runs WHERE id = ?1")?;
            for (id, reason) in corrupt {
                keep.execute(params![id, reason, now_ms])?;
                remove.execute(params![id])?;
            }
        }
        tx.commit()?;
        log_quarantined(corrupt, QUARANTINE_TABLE);
        Ok(())
    }

    fn at(&self) -> impl Fn(rusqlite::Error) -> StoreError + '_ {
        |source| StoreError::Sqlite { path: self.path.clone(), source }
    }

    /// Every stored run, read in the store's order and made into records
    /// meanwhile (see [`parse_rows`]).
    fn load_rows(&self) -> Result<Loaded, rusqlite::Error> {
        let mut stmt = self.conn.prepare(&format!(
            "SELECT CAST(id AS TEXT), json, start_time_ms, end_time_ms, run_status, {INDEX_COLUMNS}
             FROM runs"
        ))?;
        parse_rows(|sink| {
            let mut rows = stmt.query([])?;
            while let Some(row) = rows.next()? {
                let id = row.get::<_, Option<String>>(0)?.unwrap_or_default();
                let json = match row.get_ref(1)? {
                    rusqlite::types::ValueRef::Text(text) => Ok(text),
                    other => {
                        Err(format!("its JSON column holds {:?}, not text", other.data_type()))
                    }
                };
                // Columns of the wrong type count as none: the JSON is parsed.
                let columns = read_columns(row).ok().flatten();
                sink(StoredRow { id, version: None, json, columns });
            }
            Ok(())
        })
    }

    /// Writes the columns of runs read from their JSON again (with their
    /// JSON, as it is served), so that the next load need not parse them;
    /// their commit sequence is left as it is, since nothing changed.
    fn index_again(&mut self, records: &[Arc<RunRecord>]) -> Result<(), rusqlite::Error> {
        let tx = self.conn.transaction()?;
        {
            let mut update = tx.prepare(&format!(
                "UPDATE runs SET start_time_ms = ?2, end_time_ms = ?3, run_status = ?4, json = ?5,
                 ({INDEX_COLUMNS}) = (?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14) WHERE id = ?1"
            ))?;
            for record in records {
                bind_run(record, |values| update.execute(values).map(drop))?;
            }
        }
        tx.commit()
    }

    /// Applies `ops` in one transaction.
    fn commit_ops<'a>(
        &mut self,
        ops: impl Iterator<Item = &'a StoreOp>,
    ) -> Result<(), rusqlite::Error> {
        let tx = self.conn.transaction()?;
        {
            let seq: i64 = tx.query_row(
                "UPDATE meta SET value = value + 1 WHERE key = 'seq' RETURNING value",
                [],
                |row| row.get(0),
            )?;
            let mut put = tx.prepare_cached(&format!(
                "INSERT OR REPLACE INTO runs
                 (id, start_time_ms, end_time_ms, run_status, json, {INDEX_COLUMNS}, seq)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)"
            ))?;
            let mut delete = tx.prepare_cached("DELETE FROM runs WHERE id = ?1")?;
            let mut delete_points = tx.prepare_cached(
                "DELETE FROM metric_points WHERE series_id IN
                 (SELECT id FROM metric_series WHERE run_id = ?1)",
            )?;
            let mut delete_series =
                tx.prepare_cached("DELETE FROM metric_series WHERE run_id = ?1")?;
            let mut forget = tx.prepare_cached("DELETE FROM notify_delivered WHERE run_id = ?1")?;
            let mut forget_progress =
                tx.prepare_cached("DELETE FROM run_progress WHERE run_id = ?1")?;
            let mut forget_captures =
                tx.prepare_cached("DELETE FROM stack_captures WHERE run_id = ?1")?;
            let mut forget_ranks =
                tx.prepare_cached("DELETE FROM stack_ranks WHERE run_id = ?1")?;
            let mut stored = tx.prepare_cached("SELECT 1 FROM runs WHERE id = ?1")?;
            let mut put_capture = tx.prepare_cached(
                "INSERT OR REPLACE INTO stack_captures (run_id, capture_id, bytes, header)
                 VALUES (?1, ?2, ?3, ?4)",
            )?;
            let mut put_rank = tx.prepare_cached(
                "INSERT OR REPLACE INTO stack_ranks (run_id, capture_id, rank, stack)
                 VALUES (?1, ?2, ?3, ?4)",
            )?;
            let mut drop_capture = tx.prepare_cached(
                "DELETE FROM stack_captures WHERE run_id = ?1 AND capture_id = ?2",
            )?;
            let mut drop_ranks =
                tx.prepare_cached("DELETE FROM stack_ranks WHERE run_id = ?1 AND capture_id = ?2")?;
            for op in ops {
                match op {
                    StoreOp::Put(record) => bind_run(record, |values| {
                        let mut values = values.to_vec();
                        values.push(&seq);
                        put.execute(values.as_slice()).map(drop)
                    })?,
                    StoreOp::Delete(id) => {
                        delete.execute(params![id.as_str()])?;
                        delete_points.execute(params![id.as_str()])?;
                        delete_series.execute(params![id.as_str()])?;
                        forget.execute(params![id.as_str()])?;
                        forget_progress.execute(params![id.as_str()])?;
                        forget_captures.execute(params![id.as_str()])?;
                        forget_ranks.execute(params![id.as_str()])?;
                    }
                    StoreOp::PutCapture(rows) => {
                        let run = rows.run_id.as_str();
                        if !stored.exists(params![run])? {
                            continue;
                        }
                        let capture = rows.capture_id as i64;
                        put_capture.execute(params![
                            run,
                            capture,
                            rows.bytes as i64,
                            rows.header
                        ])?;
                        for (rank, stack) in &rows.ranks {
                            put_rank.execute(params![run, capture, rank, stack])?;
                        }
                    }
                    StoreOp::DropCapture { run_id, capture_id } => {
                        drop_capture.execute(params![run_id.as_str(), *capture_id as i64])?;
                        drop_ranks.execute(params![run_id.as_str(), *capture_id as i64])?;
                    }
                }
            }
        }
        tx.commit()
    }

    /// Adds the points of `batches` in one transaction (see
    /// [`Store::append_metrics`]); answers the bytes of histories each run
    /// written to keeps now.
    fn append_points(
        &mut self,
        batches: &[MetricBatch],
        bound: HistoryBound,
    ) -> Result<Vec<(RunId, u64)>, rusqlite::Error> {
        let tx = self.conn.transaction()?;
        let mut kept_by_run: HashMap<RunId, u64> = HashMap::new();
        {
            let mut attempts = tx.prepare_cached(
                "SELECT attempt_id, SUM(kept) FROM metric_series WHERE run_id = ?1
                 GROUP BY attempt_id ORDER BY MIN(id)",
            )?;
            let mut drop_points = tx.prepare_cached(
                "DELETE FROM metric_points WHERE series_id IN
                 (SELECT id FROM metric_series WHERE run_id = ?1 AND attempt_id = ?2)",
            )?;
            let mut drop_series = tx.prepare_cached(
                "DELETE FROM metric_series WHERE run_id = ?1 AND attempt_id = ?2",
            )?;
            let mut stored = tx.prepare_cached("SELECT 1 FROM runs WHERE id = ?1")?;
            let mut states = tx.prepare_cached(
                "SELECT id, name, stride, seen, kept FROM metric_series
                 WHERE run_id = ?1 AND attempt_id = ?2",
            )?;
            let mut new_series = tx.prepare_cached(
                "INSERT INTO metric_series (run_id, attempt_id, name, stride, seen, kept)
                 VALUES (?1, ?2, ?3, 1, 0, 0) RETURNING id",
            )?;
            let mut save = tx.prepare_cached(
                "UPDATE metric_series SET stride = ?2, seen = ?3, kept = ?4 WHERE id = ?1",
            )?;
            let mut thin = tx.prepare_cached(
                "DELETE FROM metric_points WHERE series_id = ?1 AND seq % ?2 != 0",
            )?;
            let mut insert = tx.prepare_cached(
                "INSERT OR REPLACE INTO metric_points (series_id, seq, rank, step, value)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            let mut keep_progress = tx.prepare_cached(
                "INSERT OR REPLACE INTO run_progress (run_id, attempt_id, progress)
                 VALUES (?1, ?2, ?3)",
            )?;
            for batch in batches {
                let (run, attempt) = (batch.run_id.as_str(), &*batch.attempt_id);
                if !stored.exists(params![run])? {
                    continue;
                }
                if let Some(progress) = &batch.last_progress {
                    keep_progress.execute(params![run, attempt, &**progress])?;
                }
                let mut series: HashMap<String, (i64, SeriesState, bool)> = states
                    .query_map(params![run, attempt], |row| {
                        let state = SeriesState {
                            stride: row.get::<_, i64>(2)? as u64,
                            seen: row.get::<_, i64>(3)? as u64,
                            kept: row.get::<_, i64>(4)? as u64,
                        };
                        Ok((row.get::<_, String>(1)?, (row.get::<_, i64>(0)?, state, false)))
                    })?
                    .collect::<Result<_, _>>()?;
                for named in &batch.points {
                    if !series.contains_key(&*named.name) {
                        let id: i64 = new_series
                            .query_row(params![run, attempt, &*named.name], |row| row.get(0))?;
                        series.insert(named.name.to_string(), (id, SeriesState::default(), true));
                    }
                    let (id, state, changed) =
                        series.get_mut(&*named.name).expect("inserted above if it was missing");
                    let offer = state.offer();
                    *changed = true;
                    if let Some(stride) = offer.thin_to {
                        thin.execute(params![*id, stride as i64])?;
                    }
                    if let Some(seq) = offer.insert {
                        let point = &named.point;
                        insert.execute(params![
                            *id,
                            seq as i64,
                            point.rank,
                            point.step as i64,
                            point.value
                        ])?;
                    }
                }
                for (id, state, changed) in series.values() {
                    if *changed {
                        let (stride, seen, kept) =
                            (state.stride as i64, state.seen as i64, state.kept as i64);
                        save.execute(params![*id, stride, seen, kept])?;
                    }
                }
                // The run's histories, all attempts together, within the bound.
                let kept: Vec<(String, u64)> = attempts
                    .query_map(params![run], |row| {
                        Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?.max(0) as u64))
                    })?
                    .collect::<Result<_, _>>()?;
                let gone = attempts_giving_way(&kept, attempt, bound);
                for old in &gone {
                    drop_points.execute(params![run, old])?;
                    drop_series.execute(params![run, old])?;
                }
                let left = kept.iter().filter(|(a, _)| !gone.contains(&a.as_str())).map(|(_, k)| k);
                kept_by_run.insert(batch.run_id.clone(), left.sum());
            }
        }
        tx.commit()?;
        Ok(kept_by_run.into_iter().map(|(run, kept)| (run, kept * HISTORY_POINT_BYTES)).collect())
    }
}

/// Reads metric histories on a read-only connection of its own: under WAL
/// it never waits for the writer, nor the writer for it.
struct SqliteMetricReader {
    conn: Mutex<Connection>,
}

impl MetricReader for SqliteMetricReader {
    fn read(
        &self,
        run: &RunId,
        attempt: &str,
        query: &MetricsQuery,
    ) -> Result<Vec<MetricSeries>, String> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let mut stmt = conn
            .prepare_cached(
                "SELECT s.name, p.rank, p.step, p.value
                 FROM metric_series s JOIN metric_points p ON p.series_id = s.id
                 WHERE s.run_id = ?1 AND s.attempt_id = ?2
                   AND (?3 IS NULL OR s.name = ?3) AND (?4 IS NULL OR p.rank = ?4)
                   AND (?5 IS NULL OR p.step >= ?5) AND (?6 IS NULL OR p.step <= ?6)
                 ORDER BY s.name, p.seq",
            )
            .map_err(|e| e.to_string())?;
        let step = |s: Option<u64>| s.map(|s| s.min(i64::MAX as u64) as i64);
        let rows = stmt
            .query_map(
                params![
                    run.as_str(),
                    attempt,
                    query.name,
                    query.rank,
                    step(query.from_step),
                    step(query.to_step)
                ],
                |row| {
                    let point =
                        MetricPoint::new(row.get(1)?, row.get::<_, i64>(2)? as u64, row.get(3)?);
                    Ok((row.get::<_, String>(0)?, point))
                },
            )
            .map_err(|e| e.to_string())?;
        let rows: Vec<_> = rows.collect::<Result<_, _>>().map_err(|e| e.to_string())?;
        Ok(into_series(rows))
    }

    fn last_progress(&self, run: &RunId) -> Result<Option<LastProgress>, String> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let mut stmt = conn
            .prepare_cached("SELECT attempt_id, progress FROM run_progress WHERE run_id = ?1")
            .map_err(|e| e.to_string())?;
        stmt.query_row(params![run.as_str()], |row| {
            Ok(LastProgress { attempt_id: row.get(0)?, json: row.get(1)? })
        })
        .optional()
        .map_err(|e| e.to_string())
    }

    fn history_bytes(&self) -> Result<Vec<(RunId, u64)>, String> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let mut stmt = conn
            .prepare_cached("SELECT run_id, SUM(kept) FROM metric_series GROUP BY run_id")
            .map_err(|e| e.to_string())?;
        let rows: Vec<(String, i64)> = stmt
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .and_then(|rows| rows.collect())
            .map_err(|e| e.to_string())?;
        Ok(rows
            .into_iter()
            .filter_map(|(run, kept)| {
                Some((RunId::parse(&run).ok()?, kept.max(0) as u64 * HISTORY_POINT_BYTES))
            })
            .collect())
    }
}

impl CaptureReader for SqliteMetricReader {
    fn captures(&self, run: &RunId) -> Result<Vec<StackCapture>, String> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        // One snapshot for the headers and their ranks.
        let tx = conn.unchecked_transaction().map_err(|e| e.to_string())?;
        let headers: Vec<(i64, String)> = tx
            .prepare_cached(
                "SELECT capture_id, header FROM stack_captures WHERE run_id = ?1
                 ORDER BY capture_id DESC",
            )
            .and_then(|mut stmt| {
                stmt.query_map(params![run.as_str()], |row| Ok((row.get(0)?, row.get(1)?)))?
                    .collect()
            })
            .map_err(|e| e.to_string())?;
        let mut ranks = tx
            .prepare_cached(
                "SELECT stack FROM stack_ranks WHERE run_id = ?1 AND capture_id = ?2 ORDER BY rank",
            )
            .map_err(|e| e.to_string())?;
        let mut captures = Vec::with_capacity(headers.len());
        for (capture_id, header) in headers {
            let rows: Vec<String> = ranks
                .query_map(params![run.as_str(), capture_id], |row| row.get(0))
                .and_then(|rows| rows.collect())
                .map_err(|e| e.to_string())?;
            captures.push(assemble(&header, rows)?);
        }
        Ok(captures)
    }

    fn capture_index(&self) -> Result<Vec<StoredCapture>, String> {
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner());
        let mut stmt = conn
            .prepare_cached("SELECT CAST(run_id AS TEXT), bytes, header FROM stack_captures")
            .map_err(|e| e.to_string())?;
        let rows: Vec<(String, i64, String)> = stmt
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
            .and_then(|rows| rows.collect())
            .map_err(|e| e.to_string())?;
        rows.into_iter()
            .filter_map(|(run, bytes, header)| {
                let run_id = RunId::parse(&run).ok()?;
                Some(parse_header(&header).map(|header| StoredCapture {
                    run_id,
                    bytes: bytes.max(0) as u64,
                    header,
                }))
            })
            .collect()
    }
}

impl Store for SqliteStore {
    fn load(&mut self) -> Result<Vec<Arc<RunRecord>>, StoreError> {
        let Loaded { records, mut corrupt, from_json } = self.load_rows().map_err(self.at())?;
        if !from_json.is_empty() {
            // Only rows changed outside trainstate lack columns that
            // describe them (the migration gave every other row its own).
            match self.index_again(&from_json) {
                Ok(()) => tracing::warn!(
                    runs = from_json.len(),
                    store = %self.path.display(),
                    "stored runs whose columns did not describe their JSON were read from the JSON; their columns are written again"
                ),
                Err(err) => tracing::warn!(
                    runs = from_json.len(),
                    error = %err,
                    "stored runs were read from their JSON, but their columns could not be written again"
                ),
            }
        }
        if corrupt.is_empty() {
            return Ok(records);
        }
        if self.quarantine {
            self.quarantine(&corrupt).map_err(self.at())?;
            return Ok(records);
        }
        let others = corrupt.len() - 1;
        let (id, reason) = corrupt.swap_remove(0);
        Err(StoreError::CorruptRun {
            store: self.path.display().to_string(),
            id,
            reason,
            others,
            table: QUARANTINE_TABLE,
        })
    }

    fn commit(&mut self, jobs: &[JobChanges<'_>]) -> Result<Committed, StoreError> {
        match self.commit_ops(jobs.iter().flat_map(|job| job.ops.iter())) {
            Ok(()) => Ok(Committed::default()),
            Err(err) => {
                // SQLite rolls back a transaction it cannot commit (a full
                // disk, an I/O error) or leaves it open; either way the
                // connection is left with none, ready for the next commit.
                if !self.conn.is_autocommit() {
                    let _ = self.conn.execute_batch("ROLLBACK");
                }
                Err(err.into())
            }
        }
    }

    fn append_metrics(
        &mut self,
        batches: &[MetricBatch],
        bound: HistoryBound,
    ) -> Result<Vec<(RunId, u64)>, StoreError> {
        self.append_points(batches, bound).map_err(|err| {
            if !self.conn.is_autocommit() {
                let _ = self.conn.execute_batch("ROLLBACK");
            }
            err.into()
        })
    }

    fn metric_reader(&mut self) -> Result<Arc<dyn MetricReader>, StoreError> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let conn = Connection::open_with_flags(&self.path, flags).map_err(self.at())?;
        // As small a page cache as the writer's: reads of histories are
        // occasional, and the head's memory stays near its runs' bytes.
        conn.execute_batch(&format!(
            "PRAGMA busy_timeout = 5000; PRAGMA cache_size = -{CACHE_KIB};"
        ))
        .map_err(self.at())?;
        Ok(Arc::new(SqliteMetricReader { conn: Mutex::new(conn) }))
    }

    fn changes_after(
        &mut self,
        feed: &Feed,
        after: &Position,
        limit: usize,
    ) -> Result<Vec<ChangedRun>, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT r.seq, r.id, r.json, d.events FROM runs r
             LEFT JOIN notify_delivered d ON d.run_id = r.id AND d.target = ?4
             WHERE (r.seq, r.id) > (?1, ?2)
             ORDER BY r.seq, r.id LIMIT ?3",
        )?;
        // A feed that keeps no delivered events matches no record.
        let target = feed.target();
        let rows =
            stmt.query_map(params![after.seq as i64, after.id, limit as i64, target], |row| {
                Ok(ChangedRun {
                    at: Position { seq: row.get::<_, i64>(0)? as u64, id: row.get(1)? },
                    json: row.get(2)?,
                    delivered: row.get(3)?,
                })
            })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    fn load_cursor(&mut self, feed: &Feed) -> Result<Position, StoreError> {
        let key = feed.key();
        let position = |row: &rusqlite::Row<'_>| {
            Ok(Position { seq: row.get::<_, i64>(0)? as u64, id: row.get(1)? })
        };
        let saved = self
            .conn
            .query_row("SELECT seq, id FROM forward_positions WHERE target = ?1", [&key], position)
            .optional()?;
        if let Some(saved) = saved {
            return Ok(saved);
        }
        let Feed::Notify(_) = feed else { return Ok(Position::default()) };
        let latest = self
            .conn
            .query_row("SELECT seq, id FROM runs ORDER BY seq DESC, id DESC LIMIT 1", [], position)
            .optional()?
            .unwrap_or_default();
        save_cursor(&mut self.conn, feed, &latest, &[])?;
        Ok(latest)
    }

    fn save_cursor(
        &mut self,
        feed: &Feed,
        at: &Position,
        delivered: &[(String, String)],
    ) -> Result<(), StoreError> {
        // A transaction that fails is rolled back when it is dropped.
        Ok(save_cursor(&mut self.conn, feed, at, delivered)?)
    }

    fn tokens(&mut self) -> Result<Vec<StoredToken>, StoreError> {
        self.select_tokens("", params![])
    }

    fn insert_token(&mut self, token: &StoredToken) -> Result<(), StoreError> {
        let row = TokenRow::of(token);
        self.conn
            .execute(
                &format!(
                    "INSERT INTO tokens ({TOKEN_COLUMNS})
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
                ),
                params![
                    row.id,
                    row.name,
                    row.scopes,
                    row.cluster,
                    row.hash,
                    row.created_at_ms,
                    row.revoked_at_ms,
                    row.expires_at_ms,
                    row.idempotency_key_sha256,
                    row.request_sha256,
                    row.secret_sealed,
                ],
            )
            .map(drop)
            .map_err(StoreError::from)
    }

    fn revoke_token(&mut self, id: &str, at_ms: u64) -> Result<Option<StoredToken>, StoreError> {
        self.conn.execute(
            "UPDATE tokens SET revoked_at_ms = ?2 WHERE id = ?1 AND revoked_at_ms IS NULL",
            params![id, at_ms as i64],
        )?;
        Ok(self.select_tokens("WHERE id = ?1", params![id])?.pop())
    }
}

impl SqliteStore {
    /// The tokens `filter` (a `WHERE` clause, or nothing) selects, oldest first.
    fn select_tokens(
        &self,
        filter: &str,
        params: &[&dyn rusqlite::ToSql],
    ) -> Result<Vec<StoredToken>, StoreError> {
        let mut stmt = self.conn.prepare_cached(&format!(
            "SELECT {TOKEN_COLUMNS} FROM tokens {filter} ORDER BY created_at_ms, id"
        ))?;
        let rows = stmt.query_map(params, |row| {
            Ok(TokenRow {
                id: row.get(0)?,
                name: row.get(1)?,
                scopes: row.get(2)?,
                cluster: row.get(3)?,
                hash: row.get(4)?,
                created_at_ms: row.get(5)?,
                revoked_at_ms: row.get(6)?,
                expires_at_ms: row.get(7)?,
                idempotency_key_sha256: row.get(8)?,
                request_sha256: row.get(9)?,
                secret_sealed: row.get(10)?,
            })
        })?;
        rows.map(|row| token_from_columns(row?)).collect()
    }
}

enum MigrateError {
    Sqlite(rusqlite::Error),
    Newer(u32),
}

impl From<rusqlite::Error> for MigrateError {
    fn from(err: rusqlite::Error) -> Self {
        Self::Sqlite(err)
    }
}

/// [`Store::save_cursor`] in one transaction.
fn save_cursor(
    conn: &mut Connection,
    feed: &Feed,
    at: &Position,
    delivered: &[(String, String)],
) -> Result<(), rusqlite::Error> {
    let tx = conn.transaction()?;
    tx.execute(
        "INSERT OR REPLACE INTO forward_positions (target, seq, id) VALUES (?1, ?2, ?3)",
        params![feed.key(), at.seq as i64, at.id],
    )?;
    if let Some(target) = feed.target() {
        let mut record = tx.prepare_cached(
            "INSERT OR REPLACE INTO notify_delivered (run_id, target, events)
             SELECT ?1, ?2, ?3 WHERE EXISTS (SELECT 1 FROM runs WHERE id = ?1)",
        )?;
        let mut forget =
            tx.prepare_cached("DELETE FROM notify_delivered WHERE run_id = ?1 AND target = ?2")?;
        for (run_id, events) in delivered {
            if events == "[]" {
                forget.execute(params![run_id, target])?;
            } else {
                record.execute(params![run_id, target, events])?;
            }
        }
    }
    tx.commit()
}

fn migrate(conn: &mut Connection) -> Result<(), MigrateError> {
    let version: u32 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(MigrateError::Newer(version));
    }
    for (i, migration) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let tx = conn.transaction()?;
        match migration {
            Migration::Sql(sql) => tx.execute_batch(sql)?,
            Migration::Rewrite(rewrite) => rewrite(&tx)?,
        }
        tx.pragma_update(None, "user_version", (i + 1) as u32)?;
        tx.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use trainstate_schema::{
        ActorStatus, NewRun, Resources, RunId, RunStatus, TrainRunInfoDraft, TrainWorkerInfoDraft,
    };

    use super::*;

    const T0: u64 = 1_760_000_000_000;

    fn record(id: &str, ended: bool, cluster: Option<&str>) -> Arc<RunRecord> {
        let mut draft = TrainRunInfoDraft {
            workers: vec![TrainWorkerInfoDraft {
                actor_id: format!("actor-{id}"),
                world_rank: 0,
                local_rank: 0,
                node_rank: 0,
                node_id: format!("node-{id}"),
                node_ip: "10.0.0.1".into(),
                pid: 100,
                gpu_ids: vec![],
                status: ActorStatus::Alive,
                resources: Resources::from_iter([("CPU", 1.0)]),
                worker_log_file_path: None,
                node_name: None,
            }],
            cluster: cluster.map(Into::into),
            ..TrainRunInfoDraft::new(id, format!("run-{id}"), "job", "ctrl", T0)
        };
        if ended {
            draft.run_status = RunStatus::Finished;
            draft.status = Some(RunStatus::Finished);
            draft.end_time_ms = Some(T0 + 1);
        }
        let run = NewRun::new(draft.validate().unwrap()).into_run(T0 + 2);
        RunRecord::new(&run).unwrap()
    }

    fn id(n: u8) -> String {
        format!("{n:032x}")
    }

    /// Every row's id, and whether it has a check.
    fn checked(conn: &Connection) -> Vec<(String, bool)> {
        let mut stmt =
            conn.prepare("SELECT id, json_check IS NOT NULL FROM runs ORDER BY id").unwrap();
        stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn a_notification_target_starts_at_the_latest_change_and_its_record_goes_with_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::open(&dir.path().join("s.db"), Synchronous::Full).unwrap();
        let put = |store: &mut SqliteStore, op: StoreOp| {
            store.commit(&[JobChanges { ops: &[op], events: &[] }]).unwrap();
        };
        put(&mut store, StoreOp::Put(record(&id(1), true, None)));
        put(&mut store, StoreOp::Put(record(&id(2), true, None)));
        let hook = Feed::Notify("hook".into());
        // A new target tells of what happens from now on: not runs 1 and 2.
        let start = store.load_cursor(&hook).unwrap();
        assert_eq!(start.id, id(2), "the run changed last");
        assert!(store.changes_after(&hook, &start, 10).unwrap().is_empty());
        assert_eq!(store.load_cursor(&hook).unwrap(), start, "saved at once");

        put(&mut store, StoreOp::Put(record(&id(3), true, None)));
        let changed = store.changes_after(&hook, &start, 10).unwrap();
        assert_eq!(changed.len(), 1);
        assert_eq!(changed[0].delivered, None);
        let delivered = vec![(id(3), r#"["x:FINISHED"]"#.to_owned())];
        store.save_cursor(&hook, &changed[0].at, &delivered).unwrap();
        assert_eq!(store.load_cursor(&hook).unwrap(), changed[0].at);
        let again = store.changes_after(&hook, &start, 10).unwrap();
        assert_eq!(again[0].delivered.as_deref(), Some(r#"["x:FINISHED"]"#));
        let other = store.changes_after(&Feed::Notify("other".into()), &start, 10).unwrap();
        assert_eq!(other[0].delivered, None, "a record is the target's own");

        // Deleted and stored again, the run has no record: it went with it.
        put(&mut store, StoreOp::Delete(RunId::parse(&id(3)).unwrap()));
        put(&mut store, StoreOp::Put(record(&id(3), true, None)));
        let back = store.changes_after(&hook, &start, 10).unwrap();
        assert_eq!(back[0].delivered, None);
        // A record of a run that is gone is not written.
        let gone = vec![(id(9), r#"["y:FINISHED"]"#.to_owned())];
        store.save_cursor(&hook, &back[0].at, &gone).unwrap();
        let rows: i64 = store
            .conn
            .query_row("SELECT COUNT(*) FROM notify_delivered", [], |row| row.get(0))
            .unwrap();
        assert_eq!(rows, 0);
    }

    #[test]
    fn a_forwarding_feed_starts_at_the_first_change_and_keeps_its_position_under_the_hub_url() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = SqliteStore::open(&dir.path().join("s.db"), Synchronous::Full).unwrap();
        let put = |store: &mut SqliteStore, op: StoreOp| {
            store.commit(&[JobChanges { ops: &[op], events: &[] }]).unwrap();
        };
        put(&mut store, StoreOp::Put(record(&id(1), true, None)));
        put(&mut store, StoreOp::Put(record(&id(2), true, None)));
        let hub = Feed::Forward("http://hub:8266".into());
        let start = store.load_cursor(&hub).unwrap();
        assert_eq!(start, Position::default(), "every stored run is forwarded");
        let changed = store.changes_after(&hub, &start, 10).unwrap();
        assert_eq!(changed.len(), 2);
        assert!(changed.iter().all(|run| run.delivered.is_none()));
        store.save_cursor(&hub, &changed[0].at, &[]).unwrap();
        // Where a head written before this cursor API kept it.
        let kept: (String, i64, String) = store
            .conn
            .query_row("SELECT target, seq, id FROM forward_positions", [], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })
            .unwrap();
        assert_eq!(kept, ("http://hub:8266".into(), changed[0].at.seq as i64, id(1)));
        assert_eq!(store.load_cursor(&hub).unwrap(), changed[0].at);
    }

    #[test]
    fn tokens_stored_before_expiry_and_idempotency_keys_open_and_never_expire() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trainstate.db");
        let hash = "ab".repeat(32);
        {
            // The store as the schema before the token columns (9) wrote it.
            let mut conn = Connection::open(&path).unwrap();
            for migration in &MIGRATIONS[..9] {
                let tx = conn.transaction().unwrap();
                match migration {
                    Migration::Sql(sql) => tx.execute_batch(sql).unwrap(),
                    Migration::Rewrite(rewrite) => rewrite(&tx).unwrap(),
                }
                tx.commit().unwrap();
            }
            conn.pragma_update(None, "user_version", 9).unwrap();
            conn.execute(
                "INSERT INTO tokens (id, name, scopes, cluster, secret_sha256, created_at_ms)
                 VALUES ('00000000000000aa', 'old', 'read', NULL, ?1, 5)",
                params![hash],
            )
            .unwrap();
        }
        let mut store = SqliteStore::open(&path, Synchronous::Full).unwrap();
        let tokens = store.tokens().unwrap();
        assert_eq!(tokens.len(), 1);
        assert_eq!((tokens[0].expires_at_ms, &tokens[0].idempotency), (None, &None));
        assert!(!tokens[0].expired(u64::MAX));
        assert_eq!(tokens[0].hash_hex(), hash);
    }

    #[test]
    fn a_store_of_the_previous_schema_gets_its_columns_once_and_loads_from_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trainstate.db");
        let runs = [record(&id(1), false, None), record(&id(2), true, Some("west"))];
        {
            // The store as the schema before the columns (version 4) wrote it.
            let mut conn = Connection::open(&path).unwrap();
            for migration in &MIGRATIONS[..4] {
                let tx = conn.transaction().unwrap();
                match migration {
                    Migration::Sql(sql) => tx.execute_batch(sql).unwrap(),
                    Migration::Rewrite(rewrite) => rewrite(&tx).unwrap(),
                }
                tx.commit().unwrap();
            }
            conn.pragma_update(None, "user_version", 4).unwrap();
            let mut put = conn
                .prepare(
                    "INSERT INTO runs (id, start_time_ms, end_time_ms, run_status, json, seq)
                     VALUES (?1, ?2, ?3, ?4, ?5, 1)",
                )
                .unwrap();
            for run in &runs {
                let (start, end) = (run.start_time_ms as i64, run.end_time_ms.map(|t| t as i64));
                let json = run.json().text();
                put.execute(params![run.id.as_str(), start, end, run.status.as_str(), json])
                    .unwrap();
            }
            put.execute(params![id(3), T0 as i64, None::<i64>, "RUNNING", "{\"id\": \"cut"])
                .unwrap();
        }

        let store = SqliteStore::open(&path, Synchronous::Full).unwrap();
        let version: u32 = store.conn.query_row("PRAGMA user_version", [], |r| r.get(0)).unwrap();
        assert_eq!(version, SCHEMA_VERSION);
        assert_eq!(
            checked(&store.conn),
            [(id(1), true), (id(2), true), (id(3), false)],
            "every run that parses has its columns; the damaged one has none"
        );
        let loaded = store.load_rows().unwrap();
        assert!(loaded.from_json.is_empty(), "every run is read from its columns");
        let mut records = loaded.records;
        records.sort_by(|a, b| a.id.cmp(&b.id));
        assert_eq!(records.len(), 2);
        for (loaded, run) in records.iter().zip(&runs) {
            assert_eq!(loaded.columns(), run.columns());
            assert_eq!(loaded.json().text(), run.json().text());
        }
        let [(damaged, reason)] = &loaded.corrupt[..] else { panic!("{:?}", loaded.corrupt) };
        assert_eq!(*damaged, id(3));
        assert!(reason.contains("EOF"), "the parser's reason, as before: {reason}");
        drop(store);

        // Once: a second open migrates nothing and the columns stay.
        let store = SqliteStore::open(&path, Synchronous::Full).unwrap();
        assert_eq!(checked(&store.conn), [(id(1), true), (id(2), true), (id(3), false)]);
    }

    #[test]
    fn a_row_whose_columns_do_not_describe_its_json_is_read_from_the_json_and_indexed_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("trainstate.db");
        let mut store = SqliteStore::open(&path, Synchronous::Full).unwrap();
        let runs = [record(&id(1), false, None), record(&id(2), true, None)];
        let ops: Vec<StoreOp> = runs.iter().cloned().map(StoreOp::Put).collect();
        store.commit_ops(ops.iter()).unwrap();
        store.conn.execute("UPDATE runs SET job_id = 'forged' WHERE id = ?1", [id(2)]).unwrap();

        let loaded = store.load_rows().unwrap();
        assert_eq!(loaded.records.len(), 2);
        let [from_json] = &loaded.from_json[..] else { panic!("one run read from its JSON") };
        assert_eq!(from_json.id.as_str(), id(2));
        assert_eq!(&*from_json.job_id, "job", "the JSON is the truth");

        let records = store.load().unwrap();
        assert!(records.iter().all(|r| &*r.job_id == "job"));
        let job: String = store
            .conn
            .query_row("SELECT job_id FROM runs WHERE id = ?1", [id(2)], |r| r.get(0))
            .unwrap();
        assert_eq!(job, "job", "the columns are written again");
        let again = store.load_rows().unwrap();
        assert!(again.from_json.is_empty() && again.corrupt.is_empty());
        let mut texts: Vec<_> =
            again.records.iter().map(|r| r.json().text().into_owned()).collect();
        texts.sort();
        let mut before: Vec<_> = runs.iter().map(|r| r.json().text().into_owned()).collect();
        before.sort();
        assert_eq!(texts, before, "with the same JSON");
    }
}
