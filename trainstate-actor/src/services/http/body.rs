//! Request bodies and query strings: every rejection in the JSON error shape.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header;
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use serde_json::error::Category;

use trainstate_client::api::ErrorCode;

use crate::engine::error::ApiError;

/// A JSON body: `application/json`, within the size limit, well-formed,
/// of the right shape. Errors: 415, 413, 400 (syntax, bad UTF-8), 422
/// (wrong type or missing field, naming its path).
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let is_json = request
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"));
        if !is_json {
            return Err(ApiError::new(
                ErrorCode::UnsupportedMediaType,
                "the body must be JSON with Content-Type: application/json",
            ));
        }
        let bytes = Bytes::from_request(request, state).await.map_err(|rejection| {
            if rejection.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(ErrorCode::PayloadTooLarge, "the body is over the size limit")
            } else {
                ApiError::bad_request(format!("cannot read the body: {rejection}"))
            }
        })?;
        parse(&bytes).map(JsonBody)
    }
}

/// Parses JSON, naming the path of a structural error.
///
/// The common case, a well-formed body, is parsed once without tracking
/// paths; only a body that fails is parsed again to name where.
///
/// Every body the API takes is one JSON object: a document that is not an
/// object is refused before it is read (serde's derived `Deserialize` would
/// take a struct from an array, field by position), and so are bytes after
/// the document, by both parses.
pub(crate) fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    // Any other non-object is refused by the parse itself: a struct is
    // never taken from a number, string, boolean or null.
    if first == Some(&b'[') {
        return Err(ApiError::invalid("body", "must be a JSON object"));
    }
    if let Ok(parsed) = serde_json::from_slice(bytes) {
        return Ok(parsed);
    }
    let deserializer = &mut serde_json::Deserializer::from_slice(bytes);
    let parsed: Result<T, _> = serde_path_to_error::deserialize(&mut *deserializer);
    let parsed = match parsed {
        // The fast parse failed on what follows the document.
        Ok(parsed) => {
            return deserializer.end().map(|()| parsed).map_err(|err| {
                ApiError::bad_request(format!("the body is not valid JSON: {err}"))
            });
        }
        Err(err) => Err::<T, _>(err),
    };
    parsed.map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        match inner.classify() {
            Category::Data => {
                let field = if path == "." { "body".to_owned() } else { path };
                ApiError::invalid(field, inner.to_string())
            }
            Category::Syntax | Category::Eof | Category::Io => {
                ApiError::bad_request(format!("the body is not valid JSON: {inner}"))
            }
        }
    })
}

/// A query string, parsed into `T`. A parameter of the wrong form is a 422
/// naming the parameter.
pub(crate) struct QueryParams<T>(pub(crate) T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for QueryParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        let query = parts.uri.query().unwrap_or_default();
        let deserializer =
            serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(deserializer).map(QueryParams).map_err(|err| {
            let field = err.path().to_string();
            let field = if field == "." { "query".to_owned() } else { field };
            ApiError::invalid(field, err.into_inner().to_string())
        })
    }
}
