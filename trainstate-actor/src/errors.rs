//! The errors of trainstate-actor.

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

/// The state actor could not be launched.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The actor failed to start.
    #[error("the state actor failed to start: {0}")]
    Startup(String),
}
