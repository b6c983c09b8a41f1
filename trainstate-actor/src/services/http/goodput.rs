//! The handler of the fleet's goodput: every retained run's time, summed
//! by cluster, node or run name, answered off the actor's turn from the
//! committed view.

use axum::Json;
use axum::extract::State;
use trainstate_client::api::{GoodputQuery, GoodputResponse};

use super::AppState;
use super::body::QueryParams;
use crate::engine::error::ApiError;

pub(crate) async fn get_goodput(
    State(app): State<AppState>,
    QueryParams(query): QueryParams<GoodputQuery>,
) -> Result<Json<GoodputResponse>, ApiError> {
    Ok(Json(app.service.goodput(&query)?))
}
