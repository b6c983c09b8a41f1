//! What a rendezvous request is, whichever head decides it: the call a
//! route received (its path parameters and body), the checks any head makes
//! before it is decided, and the answer the deciding head gives. Calls and
//! answers travel as JSON between heads on a shared store.

use serde::{Deserialize, Serialize};
use trainstate_client::api::{
    ErrorBody, JoinRequest, RankEndRequest, RankHeartbeatRequest, RendezvousResponse,
};
use trainstate_client::{Join, RankEnd, StateError};
use trainstate_schema::RunId;

/// One rendezvous request, as its route received it (its path parameters
/// and its body).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "route", rename_all = "snake_case")]
pub(crate) enum RendezvousCall {
    /// `POST /api/rendezvous/{key}/join`.
    Join {
        /// The rendezvous key.
        key: String,
        /// The join (boxed: it is the largest call).
        request: Box<JoinRequest>,
        /// The client address the receiving head saw (see
        /// [`trainstate_client::RendezvousMessage::Join`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        client: Option<String>,
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
    #[cfg_attr(not(all(feature = "server", feature = "postgres")), allow(dead_code))]
    pub(crate) fn check(&self) -> Result<(), StateError> {
        match self {
            Self::Join { key, request, .. } => {
                Join::from_request(key, (**request).clone()).map(drop)
            }
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
}

/// A call's answer, as the deciding head gave it.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) enum RelayedAnswer {
    /// The rendezvous answered.
    Ok(RendezvousResponse),
    /// It refused, with this error.
    Err(ErrorBody),
}

/// Checks a heartbeat's progress report, before either path takes it.
#[cfg_attr(not(feature = "server"), allow(dead_code))]
pub(crate) fn check_progress(request: &RankHeartbeatRequest) -> Result<(), StateError> {
    match &request.progress {
        Some(progress) => progress.check().map_err(StateError::from),
        None => Ok(()),
    }
}

/// The run a call names, or why its id is refused.
pub(crate) fn run_id(id: &str) -> Result<RunId, StateError> {
    RunId::parse(id).map_err(|e| StateError::invalid("id", e.rule().to_string()))
}
