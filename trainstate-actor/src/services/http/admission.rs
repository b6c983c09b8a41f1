//! Which connections are served: at most [`super::HttpConfig::max_connections`]
//! open at once, and at most [`super::HttpConfig::max_connections_per_client`]
//! of them from one client. A client over its own limit is closed at once,
//! so that one address re-opening hundreds of half-sent connections cannot
//! take the places other clients wait for.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::decisions::log_throttle::LogThrottle;

/// The connections open now, in all and by client.
pub(crate) struct Admission {
    places: Arc<Semaphore>,
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
    _client: ClientShare,
}

/// One client's count of open connections.
struct ClientShare {
    clients: Arc<Clients>,
    key: ClientKey,
}

struct Clients {
    max_per_client: usize,
    open: Mutex<HashMap<ClientKey, usize>>,
    refusals: Mutex<LogThrottle>,
}

/// Who a client is for the limit: its IPv4 address, or the /64 of its
/// IPv6 address (one host is commonly given a whole /64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ClientKey {
    V4([u8; 4]),
    V6Prefix([u8; 8]),
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
        Self {
            places: Arc::new(Semaphore::new(max_connections.max(1))),
            clients: Arc::new(Clients {
                max_per_client: max_per_client.max(1),
                open: Mutex::default(),
                refusals: Mutex::default(),
            }),
        }
    }

    /// Waits for a place among the open connections.
    pub(crate) async fn place(&self) -> Place {
        let permit =
            self.places.clone().acquire_owned().await.expect("the places are never closed");
        Place { permit, clients: self.clients.clone() }
    }
}

impl Place {
    /// Admits a connection from `peer` into this place, or `None` (the
    /// place is given back, and the caller closes the connection) when the
    /// client already has its most open connections.
    pub(crate) fn admit(self, peer: IpAddr) -> Option<Admitted> {
        let key = ClientKey::of(peer);
        let clients = self.clients;
        {
            let mut open = clients.open.lock().unwrap_or_else(|e| e.into_inner());
            let count = open.entry(key).or_insert(0);
            if *count >= clients.max_per_client {
                drop(open);
                clients.refused(peer);
                return None;
            }
            *count += 1;
        }
        Some(Admitted { _permit: self.permit, _client: ClientShare { clients, key } })
    }
}

impl Clients {
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
        let mut open = self.clients.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = open.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.key);
            }
        }
    }
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

    #[test]
    fn ipv6_clients_are_counted_by_their_64_prefix_and_mapped_ipv4_as_ipv4() {
        let key = |s: &str| ClientKey::of(s.parse().unwrap());
        assert_eq!(key("2001:db8:1:2::1"), key("2001:db8:1:2:ffff::9"));
        assert_ne!(key("2001:db8:1:2::1"), key("2001:db8:1:3::1"));
        assert_eq!(key("::ffff:10.0.0.1"), key("10.0.0.1"));
        assert_ne!(key("10.0.0.1"), key("10.0.0.2"));
    }
}
