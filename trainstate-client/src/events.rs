//! Change events: what the state actor announces after each commit.

use tokio::sync::broadcast;
use trainstate_schema::RunId;

use crate::protocol::RunDocument;

pub use trainstate_schema::api::EventKind;

/// One committed change, in commit order.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StateEvent {
    /// Position in the stream: consecutive, starting at 1 when the actor starts.
    pub seq: u64,
    /// What happened.
    pub kind: EventKind,
    /// The run it happened to.
    pub run_id: RunId,
    /// The run after the change; `None` when it was evicted or deleted.
    pub run: Option<RunDocument>,
}

impl StateEvent {
    /// An event; `seq` is assigned when it is published.
    pub fn new(seq: u64, kind: EventKind, run_id: RunId, run: Option<RunDocument>) -> Self {
        Self { seq, kind, run_id, run }
    }
}

/// A live stream of events.
#[derive(Debug)]
#[non_exhaustive]
pub struct Subscription {
    /// Events committed after the subscription, in order. A receiver that
    /// falls behind gets `Lagged` and must resynchronise from a snapshot.
    pub receiver: broadcast::Receiver<StateEvent>,
    /// The events after the requested sequence number that were already
    /// committed, oldest first; `None` when they are no longer kept (or no
    /// sequence number was given), in which case the caller takes a fresh
    /// snapshot.
    pub backlog: Option<Vec<StateEvent>>,
    /// The sequence number of the last event committed before the
    /// subscription: the receiver's first event is `last_seq + 1`.
    pub last_seq: u64,
}

impl Subscription {
    /// A subscription.
    pub fn new(
        receiver: broadcast::Receiver<StateEvent>,
        backlog: Option<Vec<StateEvent>>,
        last_seq: u64,
    ) -> Self {
        Self { receiver, backlog, last_seq }
    }
}
