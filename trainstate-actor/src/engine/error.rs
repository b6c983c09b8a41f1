//! The errors of trainstate-actor: the store's ([`StoreError`]), a
//! launch's ([`LaunchError`]) and, with the `server` feature, the one JSON
//! error shape of the HTTP API and how every failure maps to it
//! (`ApiError`).

use std::path::PathBuf;

#[cfg(feature = "server")]
pub(crate) use api::ApiError;

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

/// The one JSON error shape of the API, and how every failure maps to it.
#[cfg(feature = "server")]
mod api {
    use axum::Json;
    use axum::http::{HeaderValue, StatusCode, header};
    use axum::response::{IntoResponse, Response};
    use trainstate_client::StateError;
    use trainstate_client::api::{ErrorBody, ErrorCode, ErrorResponse};

    /// An error answer: `{"error": {"code", "message", "field"}}`, with the
    /// HTTP status of its code.
    #[derive(Debug)]
    pub(crate) struct ApiError {
        body: ErrorBody,
    }

    impl ApiError {
        pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
            Self { body: ErrorBody::new(code, message) }
        }

        pub(crate) fn bad_request(message: impl Into<String>) -> Self {
            Self::new(ErrorCode::BadRequest, message)
        }

        pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
            Self { body: ErrorBody::new(ErrorCode::Invalid, message).with_field(field) }
        }

        /// The error another head answered with, as it is.
        #[cfg(feature = "postgres")]
        pub(crate) fn from_body(body: ErrorBody) -> Self {
            Self { body }
        }

        pub(crate) fn not_found(message: impl Into<String>) -> Self {
            Self::new(ErrorCode::NotFound, message)
        }

        /// The same error, blaming `field`.
        pub(crate) fn with_field(mut self, field: impl Into<String>) -> Self {
            self.body = self.body.with_field(field);
            self
        }

        pub(crate) fn unauthorized() -> Self {
            Self::new(
                ErrorCode::Unauthorized,
                "a valid bearer token is required (Authorization: Bearer <token>)",
            )
        }
    }

    impl From<StateError> for ApiError {
        fn from(err: StateError) -> Self {
            Self { body: err.to_error_body() }
        }
    }

    impl IntoResponse for ApiError {
        fn into_response(self) -> Response {
            let status = StatusCode::from_u16(self.body.code.http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut response = (status, Json(ErrorResponse::new(self.body))).into_response();
            let headers = response.headers_mut();
            match status {
                StatusCode::UNAUTHORIZED => {
                    headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
                }
                StatusCode::SERVICE_UNAVAILABLE => {
                    headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
                }
                _ => {}
            }
            response
        }
    }
}
