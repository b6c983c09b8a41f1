//! The one JSON error shape of the API, and how every failure maps to it.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use trainstate_client::StateError;
use trainstate_client::api::{ErrorBody, ErrorResponse};

/// An error answer: `{"error": {"code", "message", "field"}}`.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    body: ErrorBody,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        Self { status, body: ErrorBody::new(code, message, None) }
    }

    pub(crate) fn field(mut self, field: impl Into<String>) -> Self {
        self.body.field = Some(field.into());
        self
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid", message).field(field)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub(crate) fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid bearer token is required (Authorization: Bearer <token>)",
        )
    }
}

impl From<StateError> for ApiError {
    fn from(err: StateError) -> Self {
        let status = match &err {
            StateError::NotFound { .. } => StatusCode::NOT_FOUND,
            StateError::Conflict { .. } | StateError::IllegalTransition { .. } => {
                StatusCode::CONFLICT
            }
            StateError::Invalid { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            StateError::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        };
        Self { status, body: ErrorBody::from(&err) }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_string(&ErrorResponse { error: self.body })
            .expect("an error body serializes");
        let mut response = (self.status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        match self.status {
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
