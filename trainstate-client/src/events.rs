//! Change events: what the state actor announces after each commit.

use tokio::sync::broadcast;
use trainstate_schema::RunId;

use crate::document::RunDocument;

pub use trainstate_schema::api::EventKind;

/// One committed change, in commit order.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StateEvent {
    /// Position in the stream: increasing by one per event, from the
    /// head's epoch (the Unix time in microseconds when its view was made),
    /// so an id from an earlier process is below every id of a later one.
    /// A reload of the store skips one number (no event has it): what
    /// changed then was announced by no event, so nothing before it can be
    /// resumed from.
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
    /// falls behind gets `Lagged` and must resynchronise: subscribe again
    /// after the last event it handled (the backlog, if still kept), or
    /// else list every run and then skip every event at or below the new
    /// subscription's `last_seq`. A receiver holds up to 4,096 events
    /// (with the runs they carry) while it lags: read it, or drop it.
    pub receiver: broadcast::Receiver<StateEvent>,
    /// The events after the requested sequence number that were already
    /// committed, oldest first; `None` when they are no longer kept (the
    /// backlog is bounded by count and by bytes), when the number is not
    /// one of this head's (another process's, or in the future), or when
    /// none was given, in which case the caller takes a fresh snapshot.
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
