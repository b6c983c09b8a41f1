//! Tests of trainstate-client on its own, without a head: one binary, one
//! module per concern. The remote handle's retry is tested against a real
//! HTTP server on loopback that answers what the test scripts.

mod errors;
mod rendezvous;
mod retry;
mod scripted;
