//! The trainstate state actor: a durable, supervised singleton that keeps
//! every training run.
//!
//! [`launch_state_actor`] starts it on the head: a detached supervisor, the
//! store (SQLite in WAL mode, or memory only) with its writer thread, and the
//! `TrainStateActor` registered under a well-known name. Every other part of
//! the process reaches it through a [`trainstate_client::StateHandle`].
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use trainstate_actor::{StateConfig, launch_state_actor};
//!
//! let service = launch_state_actor(StateConfig::sqlite("trainstate.db")).await?;
//! let state = service.handle();
//! let page = state.list(Default::default()).await?;
//! println!("{} runs", page.total);
//! service.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! The guarantees (ordering, durability, idempotency, restarts, retention,
//! liveness) are written down in `docs/state-actor.md`.
//!
//! # Features
//!
//! - `cli` (default): the `trainstate` binary (`serve`, `runs`, `schema`);
//!   turns on `server`. Its `serve --demo` drives simulated runs through a
//!   `StateHandle`.
//! - `server`: the head service, `http::serve`: the HTTP API, live events
//!   and the web page (axum); and `Head`, the whole head composed in one
//!   place (the data directory's lock, the listener, the state actor, the
//!   HTTP service, forwarding and notifying), which `serve` starts.
//! - `postgres` (with `cli`): the PostgreSQL store,
//!   [`StateConfig::postgres`], which several heads can share.
//! - `forward` (with `cli`): [`forward::start_forwarding`], a head sending
//!   its runs to a hub.
//! - `notify` (with `cli`): [`notify::start_notifying`], a head telling
//!   webhooks, Slack and Alertmanager of runs that error, end, stall or
//!   restart.
//! - `fault-injection`: test-only hooks (`Faults`) that make the actor
//!   panic, fail a commit or hold the store writer. Never enable it in
//!   production.

mod decisions;
mod engine;
mod services;
mod store;

#[doc(hidden)]
pub use engine::bench_support;
#[cfg(feature = "forward")]
pub use services::forward;
#[cfg(feature = "server")]
pub use services::head::{Head, HeadConfig, HeadError, HeadStopper, Listening};
#[cfg(feature = "server")]
pub use services::http;
#[cfg(feature = "notify")]
pub use services::notify;

pub use decisions::clock::{Clock, ManualClock, SystemClock};
pub use decisions::rendezvous::{
    ECHO_MESSAGES, ECHO_TIE_MS, ECHO_WINDOW_MS, FAILURE_WINDOW_MS, HARDWARE_MESSAGES,
};
pub use engine::config::STORE_SCHEMA_VERSION;
pub use engine::config::{
    DEFAULT_EVENT_BACKLOG, DEFAULT_EVENT_BACKLOG_BYTES, DEFAULT_HEALTH_TICK, DEFAULT_LEASE,
    DEFAULT_MAX_IN_FLIGHT_WRITES, DEFAULT_MAX_RETAINED_BYTES, DEFAULT_MAX_RUNS,
    DEFAULT_STALL_AFTER, HISTORY_POINT_BYTES, PostgresConfig, Retention, StateConfig, StoreConfig,
    Synchronous,
};
pub use engine::error::LaunchError;
#[cfg(feature = "fault-injection")]
pub use engine::faults::Faults;
pub use engine::stats::StoreStats;
pub use engine::supervisor::{
    StateService, get_or_launch_state_actor, launch_state_actor, shutdown_state_actor,
};
pub use store::error::StoreError;
