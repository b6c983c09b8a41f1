//! The handlers of the node ledger's routes: the nodes seen under runs,
//! one node with the runs behind its counts, and the suspects as a
//! scheduler's exclude list.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use trainstate_client::api::{
    DEFAULT_NODE_WINDOW_MS, ErrorCode, NodeDetailResponse, NodeQuery, NodesFormat, NodesQuery,
    parse_time_ms, validate_node_name,
};

use super::AppState;
use super::body::QueryParams;
use crate::engine::error::ApiError;

/// The start of the window: `since` as given, or the default window
/// before now.
fn since_ms(app: &AppState, since: Option<&str>) -> Result<u64, ApiError> {
    match since {
        Some(text) => parse_time_ms(text).map_err(|reason| ApiError::invalid("since", reason)),
        None => Ok(app.service.now_ms().saturating_sub(DEFAULT_NODE_WINDOW_MS)),
    }
}

/// A name a query or path gave, checked as a node name.
fn checked<'a>(field: &str, text: Option<&'a str>) -> Result<Option<&'a str>, ApiError> {
    if let Some(text) = text {
        validate_node_name(field, text)
            .map_err(|e| ApiError::invalid(e.field(), e.rule().to_string()))?;
    }
    Ok(text)
}

pub(crate) async fn list_nodes(
    State(app): State<AppState>,
    QueryParams(query): QueryParams<NodesQuery>,
) -> Result<Response, ApiError> {
    let since_ms = since_ms(&app, query.since.as_deref())?;
    let cluster = checked("cluster", query.cluster.as_deref())?;
    let mut answer = app.service.nodes(since_ms, cluster);
    if query.suspect == Some(true) || query.format == Some(NodesFormat::Exclude) {
        answer.nodes.retain(|node| node.suspect);
    }
    if query.format == Some(NodesFormat::Exclude) {
        // One name once, whatever the clusters it is a suspect in.
        let mut seen = std::collections::HashSet::new();
        let names: Vec<&str> = answer
            .nodes
            .iter()
            .map(|node| node.node.as_str())
            .filter(|n| seen.insert(*n))
            .collect();
        let mut text = names.join(",");
        text.push('\n');
        let mut response = text.into_response();
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
        return Ok(response);
    }
    Ok(Json(answer).into_response())
}

pub(crate) async fn get_node(
    State(app): State<AppState>,
    Path(node): Path<String>,
    QueryParams(query): QueryParams<NodeQuery>,
) -> Result<Json<NodeDetailResponse>, ApiError> {
    checked("node", Some(&node))?;
    let since_ms = since_ms(&app, query.since.as_deref())?;
    let cluster = checked("cluster", query.cluster.as_deref())?;
    app.service.node(&node, cluster, since_ms).map(Json).ok_or_else(|| {
        ApiError::new(
            ErrorCode::NotFound,
            format!("node {node:?} was never seen under a retained run"),
        )
    })
}
