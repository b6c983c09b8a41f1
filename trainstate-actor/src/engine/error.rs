//! The errors of the engine: a launch's ([`LaunchError`], which wraps the
//! store's [`StoreError`]) and, with the `server` feature, the one JSON
//! error shape of the HTTP API and how every failure maps to it
//! (`ApiError`).

pub(crate) use crate::store::error::StoreError;

#[cfg(feature = "server")]
pub(crate) use api::ApiError;

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
