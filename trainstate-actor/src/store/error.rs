//! What a store answers when it cannot do what it was asked:
//! [`StoreError`], by kind (SQLite, PostgreSQL, a damaged record, a store
//! that cannot do this at all, the writer thread gone).

use std::path::PathBuf;

/// The store could not be opened or used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// SQLite failed on the database file.
    #[error("store {path}: {source}")]
    Sqlite {
        /// The database file.
        path: PathBuf,
        /// SQLite's error.
        #[source]
        source: rusqlite::Error,
    },
    /// The database was written by a newer trainstate.
    #[error(
        "store {path} has schema version {found}, newer than the {supported} this trainstate supports; \
         upgrade trainstate or point it at another data directory"
    )]
    NewerSchema {
        /// The database file.
        path: PathBuf,
        /// The schema version found.
        found: u32,
        /// The newest schema version this build knows.
        supported: u32,
    },
    /// SQLite refused WAL mode (for example on a network file system).
    #[error("store {path}: SQLite refused WAL mode (journal mode is {mode})")]
    NoWal {
        /// The database file.
        path: PathBuf,
        /// The journal mode SQLite kept.
        mode: String,
    },
    /// A stored run does not parse: the file was changed by something else.
    #[error("store holds a run that does not parse: {0}")]
    Corrupt(String),
    /// A stored run does not load (its row was damaged): the store is
    /// refused, naming the run and how to start without it.
    #[error(
        "store {store}: run {id} does not load ({reason}){more}; nothing was changed. \
         Restore the store from a backup, or start with --quarantine-corrupt \
         (StateConfig::with_quarantine_corrupt) to move such runs aside into the table \
         {table} (kept, not deleted) and start without them",
        more = match others { 0 => String::new(), n => format!(", and {n} more run(s) do not load either") }
    )]
    CorruptRun {
        /// The database file or URL (password hidden).
        store: String,
        /// The id the run is stored under.
        id: String,
        /// Why it does not load.
        reason: String,
        /// How many other runs do not load either.
        others: usize,
        /// Where `--quarantine-corrupt` would move them.
        table: &'static str,
    },
    /// The thread that writes the store could not start, or has stopped.
    #[error("the store writer {0}")]
    Writer(&'static str),
    /// This build cannot open such a store.
    #[error("cannot open the store: {0}")]
    Unsupported(&'static str),
    /// PostgreSQL could not be reached or refused a statement.
    #[error("PostgreSQL store {url}: {message}")]
    Postgres {
        /// The database, password hidden.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// SQLite refused or failed a statement on an open store.
    #[error(transparent)]
    SqliteStatement(#[from] rusqlite::Error),
    /// PostgreSQL refused or failed a statement on an open store, or did
    /// not answer in time (its causes, in one line).
    #[error("{0}")]
    PostgresStatement(String),
    /// A stored record (a token, a run's id) is damaged: something else
    /// changed the store.
    #[error("{0}")]
    CorruptRecord(String),
    /// The store keeps no cursors of feeds (memory only): nothing can be
    /// forwarded or notified from it.
    #[error("an in-memory store keeps no positions to forward or notify from")]
    NoCursors,
    /// A token with the same idempotency key is stored already (another
    /// creation with that key came first).
    #[error("a token with this idempotency key is stored already")]
    DuplicateIdempotencyKey,
    /// A fault injected by a test ("the disk is full").
    #[error("injected fault: {0}")]
    Injected(&'static str),
    /// The PostgreSQL database was migrated by a newer trainstate.
    #[error(
        "PostgreSQL store {url} has schema version {found}, newer than the {supported} this trainstate supports; \
         upgrade trainstate or point it at another database"
    )]
    NewerPostgresSchema {
        /// The database, password hidden.
        url: String,
        /// The schema version found.
        found: u32,
        /// The newest schema version this build knows.
        supported: u32,
    },
}
