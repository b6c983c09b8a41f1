//! The engine: what runs the decisions. The supervisor and the actor that
//! decide writes one at a time, the writer thread that commits them, the
//! committed view and the reader that answers a connection from it.
//!
//! **Wing invariant:** the rest of the head reaches the engine only through
//! [`StateService`](supervisor::StateService) and the configuration it is
//! launched with.

pub(crate) mod actor;
#[doc(hidden)]
pub mod bench_support;
pub(crate) mod config;
pub(crate) mod error;
#[cfg(feature = "fault-injection")]
pub(crate) mod faults;
pub(crate) mod feed;
pub(crate) mod reader;
pub(crate) mod relay;
pub(crate) mod stats;
pub(crate) mod supervisor;
pub(crate) mod view;
pub(crate) mod writer;
