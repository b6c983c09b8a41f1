//! The web page: self-contained HTML, CSS and JavaScript in the binary.
//! `contract.js` is generated (`cargo xtask codegen`) from the route table
//! and `trainstate-schema`: the page's script takes its paths, statuses,
//! event kinds, error statuses and limits from it.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

const INDEX_HTML: &str = include_str!("../../../web/index.html");
const APP_JS: &str = include_str!("../../../web/app.js");
const STYLE_CSS: &str = include_str!("../../../web/style.css");
const CONTRACT_JS: &str = include_str!("../../../web/contract.js");

/// `GET /` and `GET /runs/{id}`: the page (it reads the run from its URL).
pub(crate) async fn page() -> Response {
    asset(INDEX_HTML, "text/html; charset=utf-8")
}

/// `GET /app.js`.
pub(crate) async fn script() -> Response {
    asset(APP_JS, "text/javascript; charset=utf-8")
}

/// `GET /style.css`.
pub(crate) async fn style() -> Response {
    asset(STYLE_CSS, "text/css; charset=utf-8")
}

/// `GET /contract.js`.
pub(crate) async fn contract() -> Response {
    asset(CONTRACT_JS, "text/javascript; charset=utf-8")
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
