//! The documents of the head service's HTTP API (the protocol converts its
//! messages to and from them: `protocol.rs`).
//!
//! The documents themselves are defined once, data only, in
//! [`trainstate_schema::api`] and re-exported here; [`trainstate_schema::routes`] says
//! which route takes and answers which, and the OpenAPI document is
//! generated from both.

pub use trainstate_schema::api::*;
