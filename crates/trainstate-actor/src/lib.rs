//! The trainstate state actor and head service.
//!
//! This crate will hold the `TrainStateActor`: the run state machine, the
//! SQLite store with group commit, retention, liveness sweeps and
//! supervision; and the head service (HTTP API, live events, web page) with
//! the `trainstate` binary. It is a skeleton until the state-actor work
//! lands.
