//! The SQLite store: schema, migrations, load and batched commits.

use std::path::Path;
use std::sync::Arc;

use rusqlite::{Connection, OpenFlags, params};
use trainstate_schema::RunId;

use crate::config::Synchronous;
use crate::errors::StoreError;
use crate::record::RunRecord;

/// The schema migrations, in order. `PRAGMA user_version` is the number
/// applied. Append, never edit.
const MIGRATIONS: &[&str] = &[
    // 1: runs as canonical JSON, with the columns the order and retention need.
    "CREATE TABLE runs (
        id TEXT PRIMARY KEY NOT NULL,
        start_time_ms INTEGER NOT NULL,
        end_time_ms INTEGER,
        run_status TEXT NOT NULL,
        json TEXT NOT NULL
    ) WITHOUT ROWID;
    CREATE INDEX runs_by_start ON runs (start_time_ms DESC, id DESC);",
];

/// SQLite's page cache, in KiB.
const CACHE_KIB: u32 = 512;

/// The schema version this build writes.
pub(crate) const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// One change to the store.
#[derive(Debug, Clone)]
pub(crate) enum StoreOp {
    /// Insert or replace a run.
    Put(Arc<RunRecord>),
    /// Remove a run.
    Delete(RunId),
}

/// A durable store in one SQLite file.
pub(crate) struct SqliteStore {
    conn: Connection,
}

impl SqliteStore {
    /// Opens (creating if missing) and migrates the database at `path`.
    pub(crate) fn open(path: &Path, synchronous: Synchronous) -> Result<Self, StoreError> {
        let at = |source| StoreError::Sqlite { path: path.to_path_buf(), source };
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX;
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
        Ok(Self { conn })
    }

    /// Every stored run's JSON.
    pub(crate) fn load(&self) -> Result<Vec<String>, rusqlite::Error> {
        let mut stmt = self.conn.prepare("SELECT json FROM runs")?;
        let rows = stmt.query_map([], |row| row.get::<_, String>(0))?;
        rows.collect()
    }

    /// Applies `ops` in one transaction.
    pub(crate) fn commit<'a>(
        &mut self,
        ops: impl Iterator<Item = &'a StoreOp>,
    ) -> Result<(), rusqlite::Error> {
        let tx = self.conn.transaction()?;
        {
            let mut put = tx.prepare_cached(
                "INSERT OR REPLACE INTO runs (id, start_time_ms, end_time_ms, run_status, json)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            let mut delete = tx.prepare_cached("DELETE FROM runs WHERE id = ?1")?;
            for op in ops {
                match op {
                    StoreOp::Put(record) => {
                        put.execute(params![
                            record.id.as_str(),
                            record.start_time_ms as i64,
                            record.end_time_ms.map(|t| t as i64),
                            record.status.as_str(),
                            record.json.get(),
                        ])?;
                    }
                    StoreOp::Delete(id) => {
                        delete.execute(params![id.as_str()])?;
                    }
                }
            }
        }
        tx.commit()
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

fn migrate(conn: &mut Connection) -> Result<(), MigrateError> {
    let version: u32 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    if version > SCHEMA_VERSION {
        return Err(MigrateError::Newer(version));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as u32)?;
        tx.commit()?;
    }
    Ok(())
}
