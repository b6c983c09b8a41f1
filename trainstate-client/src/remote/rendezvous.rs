//! The rendezvous over HTTP.

use std::time::Duration;

use trainstate_schema::RunId;

use super::{Call, Remote, parse};
use crate::api::{RankEndRequest, RankHeartbeatRequest, RendezvousResponse};
use crate::error::StateError;
use crate::rendezvous::{Join, RankEnd, RendezvousMessage};

impl Remote {
    /// Answers one rendezvous request over HTTP.
    pub(super) async fn rendezvous(&self, message: RendezvousMessage, timeout: Duration) {
        match message {
            RendezvousMessage::Join { join, reply } => {
                let _ = reply.send(self.join(&join, timeout).await);
            }
            RendezvousMessage::Heartbeat { id, rank, attempt_id, reply } => {
                let _ = reply.send(self.heartbeat_rank(&id, rank, attempt_id, timeout).await);
            }
            RendezvousMessage::End { id, rank, end, reply } => {
                let _ = reply.send(self.end_rank(&id, rank, end, timeout).await);
            }
        }
    }

    async fn join(&self, join: &Join, timeout: Duration) -> Result<RendezvousResponse, StateError> {
        // The key matches a pattern that needs no escaping in a path.
        let path = format!("/api/train/rendezvous/{}/join", join.key);
        let call = Call::post(path, &join.to_request(), None);
        parse(&self.send(call, timeout).await?)
    }

    async fn heartbeat_rank(
        &self,
        id: &RunId,
        rank: u32,
        attempt_id: String,
        timeout: Duration,
    ) -> Result<RendezvousResponse, StateError> {
        let path = format!("/api/train/runs/{id}/ranks/{rank}/heartbeat");
        let call = Call::post(path, &RankHeartbeatRequest::new(attempt_id), Some(id));
        parse(&self.send(call, timeout).await?)
    }

    async fn end_rank(
        &self,
        id: &RunId,
        rank: u32,
        end: RankEnd,
        timeout: Duration,
    ) -> Result<RendezvousResponse, StateError> {
        let path = format!("/api/train/runs/{id}/ranks/{rank}/end");
        let call = Call::post(path, &RankEndRequest::from(end), Some(id));
        parse(&self.send(call, timeout).await?)
    }
}
