//! The decisions: what the head decides, as pure functions of its state and
//! the time it is given. The run state machine, the rendezvous, health, the
//! liveness and progress boards, the records a store keeps, tokens and
//! clocks.
//!
//! **Wing invariant:** no I/O and no channels; nothing here imports the
//! engine, the store or the services.

pub(crate) mod captures;
pub(crate) mod change;
pub(crate) mod clock;
pub(crate) mod goodput;
pub(crate) mod health;
pub(crate) mod liveness;
pub(crate) mod log_sample;
pub(crate) mod log_throttle;
pub(crate) mod nodes;
pub(crate) mod progress;
pub(crate) mod record;
pub(crate) mod rendezvous;
pub(crate) mod rendezvous_call;
pub(crate) mod retention;
pub(crate) mod stacks;
pub(crate) mod stall_abort;
pub(crate) mod stall_window;
pub(crate) mod state;
pub(crate) mod time_text;
pub(crate) mod tokens;
