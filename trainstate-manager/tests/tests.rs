//! Integration tests of the manager: one binary, one module per concern.
//! Several are ported from Ray Train's tests of its `TrainRunStateManager`.

mod common;
mod deadlines;
mod heartbeat;
mod no_actor;
mod probe;
mod progress;
mod recovery;
mod registration;
mod stacks;
