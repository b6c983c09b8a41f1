//! Where runs are kept: the store's configuration, a value, never the
//! environment.

use std::path::PathBuf;

/// Where runs are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreConfig {
    /// A SQLite database file (WAL mode). Durable: a write is acknowledged
    /// only once committed.
    Sqlite {
        /// The database file; its directory must exist.
        path: PathBuf,
        /// SQLite's `synchronous` level.
        synchronous: Synchronous,
    },
    /// Memory only: nothing survives the process.
    InMemory,
    /// A PostgreSQL database, which several heads may share. Durable: a
    /// write is acknowledged only once committed. Needs the `postgres`
    /// feature to open.
    Postgres(PostgresConfig),
}

/// Where a PostgreSQL store is, and how it is reached.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresConfig {
    /// A libpq-style URL, `postgres://user:password@host:port/database`
    /// (`?options=-c%20search_path%3Dname` keeps trainstate's tables in a
    /// schema of their own; TLS is not supported: use a local socket or a
    /// trusted network).
    pub url: String,
    /// The most connections the head opens for commits and reads (one more
    /// listens for other heads' changes and holds the sweep lock).
    pub pool_size: usize,
}

impl PostgresConfig {
    /// The database at `url`, with a pool of 4 connections.
    pub fn new(url: impl Into<String>) -> Self {
        Self { url: url.into(), pool_size: 4 }
    }

    /// The URL with its password hidden, for logs and messages.
    pub fn redacted_url(&self) -> String {
        redact_password(&self.url)
    }
}

impl std::fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &self.redacted_url())
            .field("pool_size", &self.pool_size)
            .finish()
    }
}

/// `scheme://user:password@host/...` with the password replaced by `***`.
pub(crate) fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return url.to_owned() };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user_info, host)) => match user_info.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}{tail}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

/// SQLite's `synchronous` level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Synchronous {
    /// `FULL`: a commit survives power loss. The default.
    #[default]
    Full,
    /// `NORMAL`: in WAL mode, a commit survives a process crash but the last
    /// commits may be lost on power loss.
    Normal,
}
