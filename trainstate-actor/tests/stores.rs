//! The stores the shared behaviour tests run on, and the macro that runs
//! a test on each.
//!
//! PostgreSQL tests use the database that `TRAINSTATE_TEST_POSTGRES_URL`
//! names (`.ci/run` starts a throwaway cluster and sets it), one fresh
//! schema per test. Without it they are ignored (the build script sets
//! `has_postgres` only when it is set), except under `CI=true`, where they
//! run and fail.

use std::sync::atomic::{AtomicUsize, Ordering};

use trainstate_actor::StateConfig;

use crate::common::unique_name;

/// Where a test keeps its runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Store {
    /// A SQLite file in a temporary directory.
    Sqlite,
    /// A fresh schema of the test database.
    Postgres,
}

/// The URL of the test database. A test that needs it is marked
/// `#[cfg_attr(not(has_postgres), ignore = ...)]`, so it only runs where
/// the variable was set when it was built, or under `CI=true`, where a
/// missing one fails here.
pub(crate) fn postgres_url() -> String {
    match std::env::var("TRAINSTATE_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "TRAINSTATE_TEST_POSTGRES_URL is not set: it names the PostgreSQL database of these \
             tests (.ci/run starts one)"
        ),
    }
}

/// An empty store of one kind, which every [`config`](Fresh::config)
/// opens again (for restarts) and which several heads may share.
pub(crate) struct Fresh {
    name: String,
    dir: tempfile::TempDir,
    url: Option<String>,
}

impl Store {
    /// A fresh, empty store.
    pub(crate) async fn fresh(self, what: &str) -> Fresh {
        let dir = tempfile::tempdir().unwrap();
        let url = match self {
            Store::Sqlite => None,
            Store::Postgres => Some(fresh_schema(&postgres_url()).await),
        };
        Fresh { name: unique_name(what), dir, url }
    }
}

impl Fresh {
    /// The configuration of the test's actor on this store.
    pub(crate) fn config(&self) -> StateConfig {
        self.config_named(&self.name)
    }

    /// The configuration of another actor (another head) on the same store.
    pub(crate) fn config_named(&self, name: &str) -> StateConfig {
        let config = match &self.url {
            Some(url) => StateConfig::postgres(url.clone()),
            None => StateConfig::sqlite(self.dir.path().join("state.db")),
        };
        config.with_name(name.to_owned())
    }

    /// The PostgreSQL URL of this store's schema.
    pub(crate) fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }

    /// The SQLite file of this store.
    pub(crate) fn sqlite_path(&self) -> std::path::PathBuf {
        self.dir.path().join("state.db")
    }

    /// A scratch directory that lives as long as the store.
    pub(crate) fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }
}

/// Creates an empty schema in the test database and returns a URL whose
/// connections use it.
pub(crate) async fn fresh_schema(url: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let schema = format!(
        "t_{}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst),
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos()
    );
    let client = connect(url).await;
    client.batch_execute(&format!("CREATE SCHEMA {schema}")).await.unwrap();
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}options=-c%20search_path%3D{schema}")
}

/// A plain connection to `url`, for setting tests up.
pub(crate) async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("cannot connect to the test database: {e}"));
    tokio::spawn(connection);
    client
}

/// Runs each test on SQLite and on PostgreSQL: `mod name { sqlite, postgres }`.
/// The body gets the store kind as `$store`; the PostgreSQL test is ignored
/// where no test database was configured (see [`postgres_url`]). Tests run on tokio's
/// current-thread runtime, or its multi-thread one after `multi_thread:`.
macro_rules! on_both_stores {
    (multi_thread: $($tests:tt)*) => {
        $crate::stores::on_both_stores!(@with (flavor = "multi_thread", worker_threads = 2) $($tests)*);
    };
    (@with $flavor:tt $(
        $(#[doc = $doc:literal])*
        async fn $name:ident($store:ident) $body:block
    )*) => {$(
        $(#[doc = $doc])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn body($store: $crate::stores::Store) $body

            #[tokio::test $flavor]
            async fn sqlite() {
                body($crate::stores::Store::Sqlite).await
            }

            #[tokio::test $flavor]
            #[cfg_attr(not(has_postgres), ignore = "needs TRAINSTATE_TEST_POSTGRES_URL")]
            async fn postgres() {
                body($crate::stores::Store::Postgres).await
            }
        }
    )*};
    ($($tests:tt)*) => {
        $crate::stores::on_both_stores!(@with () $($tests)*);
    };
}
pub(crate) use on_both_stores;
