//! The helpers every trainstate test shares, and the benchmark driver can:
//!
//! - [`Head`]: `trainstate serve` as a child process on a free port, started
//!   once it prints `listening on`, stopped with SIGTERM and a deadline,
//!   then SIGKILL;
//! - [`eventually`]: waiting for a condition, with a deadline that only
//!   ends a hung test;
//! - [`runs`]: valid runs and workers, built the same way everywhere;
//! - [`fill`]: a store filled with runs through any [`StateHandle`]
//!   (a local actor's, or a remote head's).
//!
//! It depends on the contract and the client only, never on the head's
//! crate: it drives a head from outside, as a black box.
//!
//! [`StateHandle`]: trainstate_client::StateHandle

mod eventually;
mod fill;
mod head;
pub mod runs;

pub use eventually::{Outcome, POLL, eventually};
pub use fill::fill;
pub use head::{Head, Refused, STOP_GRACE, Serve};

/// What a wait that must end by itself is given: it only ends a hung test,
/// no passing run comes near it.
pub const HANG: std::time::Duration = std::time::Duration::from_secs(60);
