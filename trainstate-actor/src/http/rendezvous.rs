//! The handlers of the rendezvous routes: joins, rank heartbeats, rank ends.

use axum::Json;
use axum::extract::{Path, State};
use trainstate_client::api::{
    JoinRequest, RENDEZVOUS_KEY_PATTERN, RankEndRequest, RankHeartbeatRequest, RendezvousResponse,
    is_rendezvous_key,
};
use trainstate_client::{Join, RankEnd};
use trainstate_schema::RunId;

use super::AppState;
use super::body::JsonBody;
use super::error::ApiError;

fn run_and_rank(id: &str, rank: &str) -> Result<(RunId, u32), ApiError> {
    let id = RunId::parse(id).map_err(|e| ApiError::invalid("id", e.rule().to_string()))?;
    let digits = !rank.is_empty() && rank.len() <= 5 && rank.bytes().all(|b| b.is_ascii_digit());
    let rank = digits
        .then(|| rank.parse::<u32>().ok())
        .flatten()
        .ok_or_else(|| ApiError::invalid("rank", "must be a world rank: 0 to 99999"))?;
    Ok((id, rank))
}

pub(crate) async fn join(
    State(app): State<AppState>,
    Path(key): Path<String>,
    JsonBody(request): JsonBody<JoinRequest>,
) -> Result<Json<RendezvousResponse>, ApiError> {
    if !is_rendezvous_key(&key) {
        return Err(ApiError::invalid("key", format!("must match {RENDEZVOUS_KEY_PATTERN}")));
    }
    let join = Join::from_request(&key, request)?;
    Ok(Json(app.handle.join_rendezvous(join).await?))
}

pub(crate) async fn heartbeat_rank(
    State(app): State<AppState>,
    Path((id, rank)): Path<(String, String)>,
    JsonBody(request): JsonBody<RankHeartbeatRequest>,
) -> Result<Json<RendezvousResponse>, ApiError> {
    let (id, rank) = run_and_rank(&id, &rank)?;
    Ok(Json(app.handle.heartbeat_rank(id, rank, request.attempt_id).await?))
}

pub(crate) async fn end_rank(
    State(app): State<AppState>,
    Path((id, rank)): Path<(String, String)>,
    JsonBody(request): JsonBody<RankEndRequest>,
) -> Result<Json<RendezvousResponse>, ApiError> {
    let (id, rank) = run_and_rank(&id, &rank)?;
    let end = RankEnd::try_from(request)?;
    Ok(Json(app.handle.end_rank(id, rank, end).await?))
}
