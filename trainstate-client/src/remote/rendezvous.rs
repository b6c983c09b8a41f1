//! The rendezvous over HTTP.

use std::time::Duration;

use trainstate_schema::RunId;
use trainstate_schema::routes::Operation;

use super::{Call, Remote, parse};
use crate::api::{RankEndRequest, RankHeartbeatRequest, RendezvousResponse};
use crate::error::StateError;
use crate::rendezvous::{Join, RankEnd, RendezvousMessage};

impl Remote {
    /// Answers one rendezvous request over HTTP.
    pub(super) async fn rendezvous(&self, message: RendezvousMessage, timeout: Duration) {
        match message {
            // The head this is sent to sees the client's address itself.
            RendezvousMessage::Join { join, client: _, reply } => {
                let _ = reply.send(self.join(&join, timeout).await);
            }
            RendezvousMessage::Heartbeat { id, rank, attempt_id, progress, reply } => {
                let mut request = RankHeartbeatRequest::new(attempt_id);
                request.progress = progress.map(|p| *p);
                let _ = reply.send(self.heartbeat_rank(&id, rank, &request, timeout).await);
            }
            RendezvousMessage::End { id, rank, end, reply } => {
                let _ = reply.send(self.end_rank(&id, rank, end, timeout).await);
            }
        }
    }

    async fn join(&self, join: &Join, timeout: Duration) -> Result<RendezvousResponse, StateError> {
        let call = Call::to(Operation::JoinRendezvous, &[("key", &join.key)], None)
            .body(&join.to_request());
        parse(&self.send(call, timeout).await?)
    }

    async fn heartbeat_rank(
        &self,
        id: &RunId,
        rank: u32,
        request: &RankHeartbeatRequest,
        timeout: Duration,
    ) -> Result<RendezvousResponse, StateError> {
        let rank = rank.to_string();
        let params = [("id", id.as_str()), ("rank", rank.as_str())];
        let call = Call::to(Operation::HeartbeatRank, &params, Some(id)).body(request);
        parse(&self.send(call, timeout).await?)
    }

    async fn end_rank(
        &self,
        id: &RunId,
        rank: u32,
        end: RankEnd,
        timeout: Duration,
    ) -> Result<RendezvousResponse, StateError> {
        let rank = rank.to_string();
        let params = [("id", id.as_str()), ("rank", rank.as_str())];
        let call = Call::to(Operation::EndRank, &params, Some(id)).body(&RankEndRequest::from(end));
        parse(&self.send(call, timeout).await?)
    }
}
