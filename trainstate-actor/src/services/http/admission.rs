//! Which connections are served: at most [`super::HttpConfig::max_connections`]
//! open at once, and at most [`super::HttpConfig::max_connections_per_client`]
//! of them from one client. A client over its own limit is closed at once,
//! so that one address re-opening hundreds of half-sent connections cannot
//! take the places other clients wait for.
//!
//! When the places run low (fewer than one in [`RESERVE_SHARE`] free), the
//! connections that are *waiting* (no request in flight: kept alive and
//! idle between requests, or opened and still sending their first
//! request's headers) for at least [`SHED_AFTER`] give way to new ones,
//! one per connection accepted: first those of the client holding the most
//! connections, and among them the one waiting longest. A connection with
//! a request in flight (an event stream included) is never closed for
//! room, so many addresses each re-opening slow connections cannot keep
//! another client out for longer than about [`SHED_AFTER`].

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};

use crate::decisions::log_throttle::LogThrottle;

/// How long a connection must have waited without a request in flight
/// before it may be closed to make room: long enough for any client that
/// means to send a request to have sent its headers.
pub(crate) const SHED_AFTER: Duration = Duration::from_secs(1);

/// Places run low when fewer than one in this many are free.
pub(crate) const RESERVE_SHARE: usize = 16;

/// How often the acceptor, finding no place free, looks again for a
/// waiting connection to close.
pub(crate) const SHED_RETRY: Duration = Duration::from_millis(100);

/// The connections open now, in all and by client.
pub(crate) struct Admission {
    places: Arc<Semaphore>,
    reserve: usize,
    clients: Arc<Clients>,
}

/// A place among the open connections, taken before a connection is
/// accepted (further clients wait in the listen backlog).
pub(crate) struct Place {
    permit: OwnedSemaphorePermit,
    clients: Arc<Clients>,
}

/// An accepted connection's place and its client's share; both are given
/// back when it is dropped.
pub(crate) struct Admitted {
    _permit: OwnedSemaphorePermit,
    share: ClientShare,
    /// Fires when the connection is closed to make room.
    pub(crate) shed: oneshot::Receiver<()>,
}

/// One connection's standing among the open ones.
struct ClientShare {
    clients: Arc<Clients>,
    key: ClientKey,
    id: u64,
}

/// What the acceptor knows of one open connection.
struct Open {
    client: ClientKey,
    /// Requests in flight (an HTTP/1.1 connection serves one at a time).
    in_flight: u32,
    /// Since when no request has been in flight.
    waiting_since: Instant,
    /// Taken when the connection is chosen to make room.
    shed: Option<oneshot::Sender<()>>,
}

struct Clients {
    max_per_client: usize,
    next_id: AtomicU64,
    state: Mutex<OpenConnections>,
    refusals: Mutex<LogThrottle>,
    sheds: Mutex<LogThrottle>,
}

#[derive(Default)]
struct OpenConnections {
    by_client: HashMap<ClientKey, usize>,
    open: HashMap<u64, Open>,
}

/// Who a client is for the limit: its IPv4 address, or the /64 of its
/// IPv6 address (one host is commonly given a whole /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ClientKey {
    V4([u8; 4]),
    V6Prefix([u8; 8]),
}

/// The address a request came from, in its extensions.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub(crate) IpAddr);

impl std::fmt::Display for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::V4(octets) => std::net::Ipv4Addr::from(*octets).fmt(f),
            Self::V6Prefix(prefix) => {
                let mut octets = [0; 16];
                octets[..8].copy_from_slice(prefix);
                write!(f, "{}/64", std::net::Ipv6Addr::from(octets))
            }
        }
    }
}

impl ClientKey {
    pub(crate) fn of(ip: IpAddr) -> Self {
        match ip.to_canonical() {
            IpAddr::V4(v4) => Self::V4(v4.octets()),
            IpAddr::V6(v6) => {
                let octets = v6.octets();
                let mut prefix = [0; 8];
                prefix.copy_from_slice(&octets[..8]);
                Self::V6Prefix(prefix)
            }
        }
    }
}

impl Admission {
    pub(crate) fn new(max_connections: usize, max_per_client: usize) -> Self {
        let max_connections = max_connections.max(1);
        Self {
            places: Arc::new(Semaphore::new(max_connections)),
            reserve: max_connections.div_ceil(RESERVE_SHARE),
            clients: Arc::new(Clients {
                max_per_client: max_per_client.max(1),
                next_id: AtomicU64::new(0),
                state: Mutex::default(),
                refusals: Mutex::default(),
                sheds: Mutex::default(),
            }),
        }
    }

    /// Waits for a place among the open connections. While none is free,
    /// a waiting connection is closed to make room as soon as one has
    /// waited [`SHED_AFTER`].
    pub(crate) async fn place(&self) -> Place {
        loop {
            if let Ok(permit) = self.places.clone().try_acquire_owned() {
                return Place { permit, clients: self.clients.clone() };
            }
            self.clients.shed_one(Instant::now());
            tokio::select! {
                permit = self.places.clone().acquire_owned() => {
                    let permit = permit.expect("the places are never closed");
                    return Place { permit, clients: self.clients.clone() };
                }
                () = tokio::time::sleep(SHED_RETRY) => {}
            }
        }
    }

    /// After a connection is accepted: when places run low, closes one
    /// waiting connection to make room for the next.
    pub(crate) fn make_room(&self) {
        if self.places.available_permits() < self.reserve {
            self.clients.shed_one(Instant::now());
        }
    }
}

impl Place {
    /// Admits a connection from `peer` into this place, or `None` (the
    /// place is given back, and the caller closes the connection) when the
    /// client already has its most open connections.
    pub(crate) fn admit(self, peer: IpAddr) -> Option<Admitted> {
        let key = ClientKey::of(peer);
        let clients = self.clients;
        let id = clients.next_id.fetch_add(1, Ordering::Relaxed);
        let (shed_tx, shed) = oneshot::channel();
        {
            let mut state = clients.lock();
            let count = state.by_client.entry(key).or_insert(0);
            if *count >= clients.max_per_client {
                drop(state);
                clients.refused(peer);
                return None;
            }
            *count += 1;
            state.open.insert(
                id,
                Open {
                    client: key,
                    in_flight: 0,
                    waiting_since: Instant::now(),
                    shed: Some(shed_tx),
                },
            );
        }
        Some(Admitted { _permit: self.permit, share: ClientShare { clients, key, id }, shed })
    }
}

impl Admitted {
    /// What the connection's requests report to: see [`Requests`].
    pub(crate) fn requests(&self) -> Requests {
        Requests { clients: self.share.clients.clone(), id: self.share.id }
    }
}

/// The handle a connection's service reports its requests' starts and
/// ends to, so that the acceptor knows which connections are waiting.
#[derive(Clone)]
pub(crate) struct Requests {
    clients: Arc<Clients>,
    id: u64,
}

impl Requests {
    /// A request starts: the connection is no longer waiting. `None` when
    /// the connection was just chosen to make room (the request is then
    /// refused unserved, and the connection closes).
    pub(crate) fn start(&self) -> Option<InFlight> {
        let mut state = self.clients.lock();
        let open = state.open.get_mut(&self.id)?;
        // Taken: the connection was chosen to make room.
        open.shed.as_ref()?;
        open.in_flight += 1;
        Some(InFlight { requests: self.clone() })
    }
}

/// A request in flight on a connection; its end (the response's body sent
/// or given up) is counted when this is dropped.
pub(crate) struct InFlight {
    requests: Requests,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut state = self.requests.clients.lock();
        if let Some(open) = state.open.get_mut(&self.requests.id) {
            open.in_flight = open.in_flight.saturating_sub(1);
            if open.in_flight == 0 {
                open.waiting_since = Instant::now();
            }
        }
    }
}

impl Clients {
    fn lock(&self) -> std::sync::MutexGuard<'_, OpenConnections> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Closes one connection that has waited [`SHED_AFTER`] by `now`
    /// without a request in flight: of the client holding the most open
    /// connections, the one waiting longest. Returns whether one was.
    fn shed_one(&self, now: Instant) -> bool {
        let mut state = self.lock();
        let OpenConnections { by_client, open } = &mut *state;
        let chosen = open
            .iter()
            .filter(|(_, c)| {
                c.in_flight == 0
                    && c.shed.is_some()
                    && now.saturating_duration_since(c.waiting_since) >= SHED_AFTER
            })
            .max_by_key(|(id, c)| {
                let held = by_client.get(&c.client).copied().unwrap_or(0);
                (held, std::cmp::Reverse(c.waiting_since), std::cmp::Reverse(**id))
            })
            .map(|(id, _)| *id);
        let Some(shed) = chosen.and_then(|id| open.get_mut(&id)).and_then(|c| c.shed.take()) else {
            return false;
        };
        drop(state);
        let _ = shed.send(());
        let mut log = self.sheds.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(due) = log.failed(now, 1, "") {
            tracing::warn!(
                closed = due.count,
                "closed connections waiting without a request to make room \
                 (--max-connections nearly full; one line per 5s at most)"
            );
        }
        true
    }

    fn refused(&self, peer: IpAddr) {
        let mut log = self.refusals.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(due) = log.failed(Instant::now(), 1, &peer.to_string()) {
            tracing::warn!(
                refused = due.count,
                last_client = %due.last_error,
                "closed connections from clients that already had {} open \
                 (--max-connections-per-client; one line per 5s at most)",
                self.max_per_client
            );
        }
    }
}

impl Drop for ClientShare {
    fn drop(&mut self) {
        let mut state = self.clients.lock();
        state.open.remove(&self.id);
        if let Some(count) = state.by_client.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                state.by_client.remove(&self.key);
            }
        }
    }
}

/// A connection's service that reports its requests to [`Requests`]: a
/// request is in flight from its start until its response's body has been
/// sent (or given up), so an event stream counts as one long request.
/// It also puts the connection's [`Peer`] in each request's extensions.
pub(crate) struct Tracked<S> {
    inner: S,
    requests: Requests,
    peer: Peer,
}

impl<S> Tracked<S> {
    pub(crate) fn new(inner: S, requests: Requests, peer: IpAddr) -> Self {
        Self { inner, requests, peer: Peer(peer) }
    }
}

impl<S> hyper::service::Service<axum::http::Request<hyper::body::Incoming>> for Tracked<S>
where
    S: hyper::service::Service<
            axum::http::Request<hyper::body::Incoming>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        >,
    S::Future: Send + 'static,
{
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = std::pin::Pin<
        Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send + 'static>,
    >;

    fn call(&self, mut request: axum::http::Request<hyper::body::Incoming>) -> Self::Future {
        request.extensions_mut().insert(self.peer);
        let Some(in_flight) = self.requests.start() else {
            // Chosen to make room just as this request arrived: it is not
            // served, and the connection closes.
            return Box::pin(async { Ok(closed_for_room()) });
        };
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response
                .map(|body| axum::body::Body::new(TrackedBody { body, _in_flight: in_flight })))
        })
    }
}

/// A response's body that ends its request's flight when it is dropped
/// (sent whole, or given up). It tells hyper its size as the body it wraps
/// does, so that a sized answer keeps its `content-length` (not chunked).
struct TrackedBody {
    body: axum::body::Body,
    _in_flight: InFlight,
}

impl axum::body::HttpBody for TrackedBody {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// The answer to a request that arrived on a connection just chosen to
/// make room: nothing was done; the client retries on a new connection.
fn closed_for_room() -> axum::response::Response {
    use axum::response::IntoResponse as _;

    let mut response = super::ApiError::new(
        trainstate_schema::api::ErrorCode::Unavailable,
        "this connection was closed to make room for others (--max-connections nearly full); \
         nothing was done; retry on a new connection"
            .to_owned(),
    )
    .into_response();
    response
        .headers_mut()
        .insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_client_over_its_limit_is_refused_and_others_are_not() {
        let admission = Admission::new(10, 2);
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let first = admission.place().await.admit(a).unwrap();
        let _second = admission.place().await.admit(a).unwrap();
        assert!(admission.place().await.admit(a).is_none());
        // The refused place was given back: eight remain for others.
        assert_eq!(admission.places.available_permits(), 8);
        let _other = admission.place().await.admit(b).unwrap();
        drop(first);
        assert!(admission.place().await.admit(a).is_some());
    }

    #[tokio::test]
    async fn room_is_made_by_the_waiting_connection_of_the_client_holding_most() {
        let admission = Admission::new(10, 5);
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let mut a1 = admission.place().await.admit(a).unwrap();
        let mut a2 = admission.place().await.admit(a).unwrap();
        let mut b1 = admission.place().await.admit(b).unwrap();
        let clients = admission.clients.clone();
        // Nothing has waited long enough yet.
        assert!(!clients.shed_one(Instant::now()));
        let later = Instant::now() + SHED_AFTER;
        // A request in flight is never closed for room: a1's is.
        let in_flight = a1.requests().start().unwrap();
        assert!(clients.shed_one(later));
        assert!(a2.shed.try_recv().is_ok(), "a holds the most: its waiting one goes");
        assert!(a1.shed.try_recv().is_err() && b1.shed.try_recv().is_err());
        // A request arriving on a connection chosen to make room is refused.
        assert!(a2.requests().start().is_none());
        drop(in_flight);
        let later = Instant::now() + SHED_AFTER;
        assert!(clients.shed_one(later));
        assert!(a1.shed.try_recv().is_ok() || b1.shed.try_recv().is_ok());
    }

    #[test]
    fn ipv6_clients_are_counted_by_their_64_prefix_and_mapped_ipv4_as_ipv4() {
        let key = |s: &str| ClientKey::of(s.parse().unwrap());
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff::9"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("::ffff:10.0.0.1"), key("10.0.0.1"));
        assert_ne!(key("10.0.0.1"), key("10.0.0.2"));
    }
}
