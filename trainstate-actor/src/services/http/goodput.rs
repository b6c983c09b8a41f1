//! The handler of the fleet's goodput: every retained run's time, summed
//! by cluster, node or run name, answered off the actor's turn from the
//! committed view.

use axum::Json;
use axum::extract::State;
use trainstate_client::api::{
    DEFAULT_GOODPUT_WINDOW_MS, GoodputQuery, GoodputResponse, parse_time_ms,
};

use trainstate_schema::validate_name;

use super::AppState;
use super::body::QueryParams;
use crate::engine::error::ApiError;

pub(crate) async fn get_goodput(
    State(app): State<AppState>,
    QueryParams(query): QueryParams<GoodputQuery>,
) -> Result<Json<GoodputResponse>, ApiError> {
    let since_ms = match query.since.as_deref() {
        Some(text) => parse_time_ms(text).map_err(|reason| ApiError::invalid("since", reason))?,
        None => app.service.now_ms().saturating_sub(DEFAULT_GOODPUT_WINDOW_MS),
    };
    if let Some(cluster) = query.cluster.as_deref() {
        validate_name("cluster", cluster)
            .map_err(|e| ApiError::invalid(e.field(), e.rule().to_string()))?;
    }
    let by = query.by.unwrap_or_default();
    Ok(Json(app.service.goodput(since_ms, by, query.cluster.as_deref())))
}
