//! The handler of the fleet's goodput: every retained run's time, summed
//! by cluster, node or run name.

use axum::Json;
use axum::extract::State;
use trainstate_client::api::{ErrorCode, GoodputQuery, GoodputResponse};

use super::AppState;
use super::body::QueryParams;
use crate::engine::error::ApiError;

pub(crate) async fn get_goodput(
    State(_app): State<AppState>,
    QueryParams(_query): QueryParams<GoodputQuery>,
) -> Result<Json<GoodputResponse>, ApiError> {
    Err(ApiError::new(ErrorCode::Unavailable, "the fleet's goodput is not counted yet"))
}
