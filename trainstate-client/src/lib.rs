//! The message protocol of the trainstate state actor and [`StateHandle`],
//! the one typed async API to it.
//!
//! The state actor (in `trainstate-actor`) is a singleton registered under a
//! well-known name. [`get_state_actor`] finds it and never launches one: a
//! controller on a worker node must not start the head's actor.
//!
//! ```no_run
//! # async fn example(run: trainstate_schema::TrainRunInfo) -> Result<(), trainstate_client::StateError> {
//! use trainstate_client::{StatusUpdate, get_state_actor};
//!
//! let Some(state) = get_state_actor() else {
//!     // No state actor in this process: run-state tracking is off.
//!     return Ok(());
//! };
//! let registration = state.register(run.clone()).await?;
//! println!("lease: {:?}", registration.lease);
//! state.set_status(run.id().clone(), StatusUpdate::finished()).await?;
//! # Ok(()) }
//! ```
//!
//! Every call has a deadline ([`StateHandle::with_timeout`]). A handle
//! survives restarts of the actor: it looks the actor up again by name.
//!
//! # Features
//!
//! - `http` (default): [`StateHandle::connect`], the same API over the head
//!   service's HTTP API (plain HTTP, with reqwest).
//! - `rustls`: HTTPS for the remote handle (rustls, with the aws-lc-rs
//!   crypto provider): the system's roots, or only given CAs
//!   ([`StateHandle::connect_with_ca`], [`TrustedCas`]). Off by default, so
//!   that a controller reaching its head over plain HTTP builds no TLS
//!   stack; without it an `https://` URL is refused, naming the feature.
//! - `cli`: `cli`, the client commands of the `trainstate` binary (`runs
//!   list|show`, `token create|list|revoke`, with clap), and `links`,
//!   the operator's link templates they fill. Turns on `rustls`.
//! - `ray-export`: `ray_export`, Ray Train V2's export events ingested
//!   into a head through a [`StateHandle`] (`trainstate ingest
//!   ray-export`); its guarantees are in `docs/ray.md`.
//! - `schemars`: [`RunDocument`] implements `schemars::JsonSchema` (as a
//!   run's schema).
//!
//! The route table and the OpenAPI document are the contract's:
//! `trainstate_schema::routes` and `trainstate_schema::openapi`.

pub mod api;
#[cfg(feature = "cli")]
pub mod cli;
mod clock;
mod document;
mod error;
mod events;
mod handle;
#[cfg(feature = "cli")]
pub mod links;
mod protocol;
mod query;
#[cfg(feature = "ray-export")]
pub mod ray_export;
#[cfg(feature = "http")]
mod remote;
mod rendezvous;

pub use clock::{Clock, ManualClock, SystemClock};
pub use document::{RunDocument, RunJson};
pub use error::{Reply, StateError};
pub use events::{EventKind, StateEvent, Subscription};
pub use handle::{
    DEADLINE_PER_MIB, DEFAULT_CALL_TIMEOUT, StateHandle, deadline_allowance, get_state_actor,
    get_state_actor_named,
};
pub use protocol::{
    DEFAULT_STATE_ACTOR_NAME, NewAttempt, PreparedChange, Registration, StateMessage, StatusUpdate,
};
pub use query::{Cursor, MAX_PAGE_LIMIT, RunPage, RunQuery};
#[cfg(feature = "rustls")]
pub use remote::tls::TrustedCas;
pub use rendezvous::{Join, MAX_ABORT_AFTER_MS, RankEnd, RendezvousMessage};
