//! The message protocol of the trainstate state actor and `StateHandle`,
//! the one typed async API to it.
//!
//! This crate will hold the messages the `TrainStateActor` answers, the
//! typed errors of the protocol, `StateHandle` (local, over an in-process
//! actor reference, or remote, over HTTP behind a feature) and
//! `get_state_actor()`, which finds the running actor and never launches one.
//! It is a skeleton until the state-actor work lands.
