//! The handlers of the rendezvous routes: joins, rank heartbeats, rank ends.
//!
//! Each request becomes a [`RendezvousCall`], checked here and answered by
//! this head's actor, or, on a shared store whose groups another head owns,
//! relayed to that head (`relay.rs`).

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use trainstate_client::api::{
    JoinRequest, RENDEZVOUS_KEY_PATTERN, RankEndRequest, RankHeartbeatRequest, RendezvousResponse,
    is_rendezvous_key,
};
use trainstate_client::{Join, RankEnd, StateError, StateHandle};
use trainstate_schema::RunId;

use super::AppState;
use super::body::JsonBody;
use crate::engine::error::ApiError;

/// One rendezvous request, as its route received it (its path parameters
/// and its body).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "route", rename_all = "snake_case")]
pub(crate) enum RendezvousCall {
    /// `POST /api/rendezvous/{key}/join`.
    Join {
        /// The rendezvous key.
        key: String,
        /// The join.
        request: JoinRequest,
    },
    /// A rank's heartbeat.
    Heartbeat {
        /// The run.
        id: String,
        /// The world rank.
        rank: u32,
        /// The heartbeat.
        request: RankHeartbeatRequest,
    },
    /// A rank's end.
    End {
        /// The run.
        id: String,
        /// The world rank.
        rank: u32,
        /// The end.
        request: RankEndRequest,
    },
}

impl RendezvousCall {
    /// Checks the call as the head that receives it would, before it is
    /// relayed: a bad request is refused by the head the client reached.
    #[cfg(feature = "postgres")]
    pub(crate) fn check(&self) -> Result<(), StateError> {
        match self {
            Self::Join { key, request } => Join::from_request(key, request.clone()).map(drop),
            Self::Heartbeat { id, request, .. } => {
                run_id(id)?;
                check_progress(request)
            }
            Self::End { id, request, .. } => {
                run_id(id)?;
                RankEnd::try_from(request.clone()).map(drop)
            }
        }
    }

    /// Answers the call through the actor of `handle`.
    pub(crate) async fn apply(
        self,
        handle: &StateHandle,
    ) -> Result<RendezvousResponse, StateError> {
        match self {
            Self::Join { key, request } => {
                handle.join_rendezvous(Join::from_request(&key, request)?).await
            }
            Self::Heartbeat { id, rank, request } => match request.progress {
                Some(progress) => {
                    let id = run_id(&id)?;
                    handle
                        .heartbeat_rank_with_progress(id, rank, request.attempt_id, progress)
                        .await
                }
                None => handle.heartbeat_rank(run_id(&id)?, rank, request.attempt_id).await,
            },
            Self::End { id, rank, request } => {
                handle.end_rank(run_id(&id)?, rank, RankEnd::try_from(request)?).await
            }
        }
    }
}

/// Checks a heartbeat's progress report, before either path takes it.
fn check_progress(request: &RankHeartbeatRequest) -> Result<(), StateError> {
    match &request.progress {
        Some(progress) => progress.check().map_err(StateError::from),
        None => Ok(()),
    }
}

fn run_id(id: &str) -> Result<RunId, StateError> {
    RunId::parse(id).map_err(|e| StateError::invalid("id", e.rule().to_string()))
}

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
    #[cfg(feature = "postgres")]
    if let Some(relay) = app.relay.as_ref().filter(|relay| !relay.owns()) {
        // Refused here, by the head the client reached, before it is relayed.
        call.check()?;
        return match relay.call(&call).await? {
            super::relay::RelayedAnswer::Ok(response) => Ok(Json(response)),
            super::relay::RelayedAnswer::Err(body) => Err(ApiError::from_body(body)),
        };
    }
    if let RendezvousCall::Heartbeat { id, rank, request } = &call {
        // Taken here when this head tracks the rank's group; otherwise the
        // actor decides it (and names what is wrong).
        let id = run_id(id)?;
        check_progress(request)?;
        let reader = app.service.reader();
        let progress = request.progress.as_ref();
        if let Some(answer) = reader.heartbeat_rank(&id, *rank, &request.attempt_id, progress) {
            return Ok(Json(answer?));
        }
    }
    Ok(Json(call.apply(&app.handle).await?))
}

pub(crate) async fn join(
    State(app): State<AppState>,
    Path(key): Path<String>,
    JsonBody(request): JsonBody<JoinRequest>,
) -> Result<Json<RendezvousResponse>, ApiError> {
    if !is_rendezvous_key(&key) {
        return Err(ApiError::invalid("key", format!("must match {RENDEZVOUS_KEY_PATTERN}")));
    }
    answer(&app, RendezvousCall::Join { key, request }).await
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
