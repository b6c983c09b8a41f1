//! The head's paths the benchmarks request, taken from the route table, so
//! that no benchmark spells a path of its own.

use std::collections::HashMap;
use std::sync::LazyLock;

use trainstate_schema::routes::{Operation, Route, routes};

static ROUTES: LazyLock<HashMap<Operation, Route>> =
    LazyLock::new(|| routes().into_iter().map(|route| (route.operation, route)).collect());

/// The path of `operation`, a route without path parameters.
pub(crate) fn path(operation: Operation) -> &'static str {
    ROUTES[&operation].path
}

/// The path of `operation` for the run `id`.
pub(crate) fn run_path(operation: Operation, id: impl std::fmt::Display) -> String {
    ROUTES[&operation].path_with(&[("id", &id.to_string())])
}

/// The path of `operation` for rank `rank` of the run `id`.
pub(crate) fn rank_path(operation: Operation, id: impl std::fmt::Display, rank: u32) -> String {
    ROUTES[&operation].path_with(&[("id", &id.to_string()), ("rank", &rank.to_string())])
}

/// The path of `operation` for the rendezvous key `key`.
pub(crate) fn key_path(operation: Operation, key: &str) -> String {
    ROUTES[&operation].path_with(&[("key", key)])
}

/// The path of `operation` for the node `node`.
pub(crate) fn node_path(operation: Operation, node: &str) -> String {
    ROUTES[&operation].path_with(&[("node", node)])
}

/// `GET /api/train/runs` with a query string.
pub(crate) fn runs_query(query: &str) -> String {
    format!("{}?{query}", path(Operation::ListRuns))
}
