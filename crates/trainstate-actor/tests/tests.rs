//! Integration tests of the state actor: one binary, one module per concern.

mod common;
mod durability;
mod lifecycle;
mod listing;
mod liveness;
mod singleton;
