//! The services: what faces the world. The HTTP API and the page,
//! notifications and forwarding, and the head that composes them.
//!
//! **Wing invariant:** services reach the engine only through
//! [`StateService`](crate::StateService); nothing here names the writer, the
//! view or the store.

#[cfg(feature = "forward")]
pub mod forward;
#[cfg(feature = "server")]
pub(crate) mod head;
#[cfg(feature = "server")]
pub mod http;
#[cfg(feature = "notify")]
pub mod notify;
