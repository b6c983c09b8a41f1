//! The handlers of the rendezvous routes: joins, rank heartbeats, rank ends.
//!
//! Each request becomes a [`RendezvousCall`], which the head's
//! [`StateService::rendezvous`](crate::engine::supervisor::StateService::rendezvous)
//! answers: here, or, on a shared store whose groups another head owns,
//! through that head (`engine/relay.rs`).

use axum::extract::{Path, State};
use axum::{Extension, Json};
use trainstate_client::api::{
    JoinRequest, RENDEZVOUS_KEY_PATTERN, RankEndRequest, RankHeartbeatRequest, RendezvousResponse,
    is_rendezvous_key,
};

use super::AppState;
use super::admission::{ClientKey, Peer};
use super::body::JsonBody;
use crate::engine::error::ApiError;
use crate::engine::supervisor::RendezvousCall;

fn rank_of(rank: &str) -> Result<u32, ApiError> {
    let digits = !rank.is_empty() && rank.len() <= 5 && rank.bytes().all(|b| b.is_ascii_digit());
    digits
        .then(|| rank.parse::<u32>().ok())
        .flatten()
        .ok_or_else(|| ApiError::invalid("rank", "must be a world rank: 0 to 99999"))
}

/// Answers `call` here, or through the head that owns the groups.
async fn answer(
    app: &AppState,
    call: RendezvousCall,
) -> Result<Json<RendezvousResponse>, ApiError> {
    Ok(Json(app.service.rendezvous(call).await?))
}

pub(crate) async fn join(
    State(app): State<AppState>,
    Path(key): Path<String>,
    peer: Option<Extension<Peer>>,
    JsonBody(request): JsonBody<JoinRequest>,
) -> Result<Json<RendezvousResponse>, ApiError> {
    if !is_rendezvous_key(&key) {
        return Err(ApiError::invalid("key", format!("must match {RENDEZVOUS_KEY_PATTERN}")));
    }
    // Waiting groups are shared out by the address a join came from.
    let client = peer.map(|Extension(Peer(ip))| ClientKey::of(ip).to_string());
    answer(&app, RendezvousCall::Join { key, request: Box::new(request), client }).await
}

pub(crate) async fn heartbeat_rank(
    State(app): State<AppState>,
    Path((id, rank)): Path<(String, String)>,
    JsonBody(request): JsonBody<RankHeartbeatRequest>,
) -> Result<Json<RendezvousResponse>, ApiError> {
    let rank = rank_of(&rank)?;
    answer(&app, RendezvousCall::Heartbeat { id, rank, request }).await
}

pub(crate) async fn end_rank(
    State(app): State<AppState>,
    Path((id, rank)): Path<(String, String)>,
    JsonBody(request): JsonBody<RankEndRequest>,
) -> Result<Json<RendezvousResponse>, ApiError> {
    let rank = rank_of(&rank)?;
    answer(&app, RendezvousCall::End { id, rank, request }).await
}
