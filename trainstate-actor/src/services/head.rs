//! The head, composed in one place: the data directory's lock, the
//! listener, the state actor, the HTTP service, and forwarding and
//! notifying once the stored runs are loaded. The binary's `serve` and
//! the tests start this one composition.
//!
//! ```no_run
//! # async fn example() -> Result<(), trainstate_actor::HeadError> {
//! use trainstate_actor::{Head, HeadConfig, StateConfig};
//! use trainstate_actor::http::HttpConfig;
//!
//! let config = HeadConfig::new(StateConfig::in_memory(), HttpConfig::default())
//!     .with_address("127.0.0.1:0".parse().unwrap());
//! let head = Head::start(config).await?;
//! println!("serving on {}", head.address());
//! head.shutdown().await?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::engine::config::{StateConfig, StoreConfig};
use crate::engine::supervisor::{DataDirLock, StateService, launch_state_actor};
#[cfg(feature = "forward")]
use crate::services::forward::{ForwardConfig, Forwarder, start_forwarding};
use crate::services::http::{HttpConfig, Load, load_channel, serve_while_loading};
#[cfg(feature = "notify")]
use crate::services::notify::{Notifier, NotifyConfig, start_notifying};

/// Why a head did not start, or stopped in error.
#[derive(Debug, Clone)]
pub struct HeadError {
    message: String,
}

impl HeadError {
    fn new(message: impl Into<String>) -> Self {
        Self { message: message.into() }
    }
}

impl fmt::Display for HeadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for HeadError {}

/// Where a head listens.
#[derive(Debug)]
enum Listen {
    Address(SocketAddr),
    Listener(TcpListener),
}

/// What a head is made of: the state actor's configuration, the HTTP
/// service's, where it listens, and, optionally, a hub to forward to and
/// targets to notify.
#[derive(Debug)]
pub struct HeadConfig {
    state: StateConfig,
    http: HttpConfig,
    listen: Listen,
    allow_empty_store: bool,
    #[cfg(feature = "forward")]
    forward: Option<ForwardConfig>,
    #[cfg(feature = "notify")]
    notify: Option<NotifyConfig>,
}

impl HeadConfig {
    /// A head of `state` served as `http` says, on a free loopback port.
    pub fn new(state: StateConfig, http: HttpConfig) -> Self {
        Self {
            state,
            http,
            listen: Listen::Address(SocketAddr::from(([127, 0, 0, 1], 0))),
            allow_empty_store: false,
            #[cfg(feature = "forward")]
            forward: None,
            #[cfg(feature = "notify")]
            notify: None,
        }
    }

    /// Listens on `address`.
    pub fn with_address(mut self, address: SocketAddr) -> Self {
        self.listen = Listen::Address(address);
        self
    }

    /// Serves on a listener already bound.
    pub fn with_listener(mut self, listener: TcpListener) -> Self {
        self.listen = Listen::Listener(listener);
        self
    }

    /// Starts even when the SQLite store an earlier head opened in this
    /// data directory is missing or empty (`--allow-empty-store`).
    pub fn with_allow_empty_store(mut self, allow: bool) -> Self {
        self.allow_empty_store = allow;
        self
    }

    /// Forwards the runs to a hub once they are loaded.
    #[cfg(feature = "forward")]
    pub fn with_forward(mut self, forward: Option<ForwardConfig>) -> Self {
        self.forward = forward;
        self
    }

    /// Notifies targets once the runs are loaded.
    #[cfg(feature = "notify")]
    pub fn with_notify(mut self, notify: Option<NotifyConfig>) -> Self {
        self.notify = notify;
        self
    }
}

/// Stops a head (or one still loading): its server stops accepting, and
/// what is queued is committed.
#[derive(Debug, Clone)]
pub struct HeadStopper {
    stop: Arc<watch::Sender<bool>>,
}

impl HeadStopper {
    /// Asks the head to stop.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// Resolves once the head is asked to stop.
    fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut stop = self.stop.subscribe();
        async move {
            let _ = stop.wait_for(|stop| *stop).await;
        }
    }
}

/// A head that listens and serves `/healthz` while its stored runs load:
/// every other request waits for [`Listening::loaded`].
#[derive(Debug)]
pub struct Listening {
    address: SocketAddr,
    tls: bool,
    stopper: HeadStopper,
    server: JoinHandle<std::io::Result<()>>,
    load: Load,
    lock: Option<DataDirLock>,
    state: StateConfig,
    #[cfg(feature = "forward")]
    forward: Option<ForwardConfig>,
    #[cfg(feature = "notify")]
    notify: Option<NotifyConfig>,
}

/// A running head: its address, its state service, and a graceful stop.
#[derive(Debug)]
pub struct Head {
    address: SocketAddr,
    tls: bool,
    stopper: HeadStopper,
    server: JoinHandle<std::io::Result<()>>,
    service: Arc<StateService>,
    /// Held until the head has stopped.
    _lock: Option<DataDirLock>,
    #[cfg(feature = "forward")]
    forwarder: Option<Forwarder>,
    #[cfg(feature = "notify")]
    notifier: Option<Notifier>,
}

impl Head {
    /// Starts a head and waits until its stored runs are loaded.
    pub async fn start(config: HeadConfig) -> Result<Head, HeadError> {
        match Self::listen(config).await?.loaded().await? {
            Some(head) => Ok(head),
            None => Err(HeadError::new("the head stopped before its stored runs were loaded")),
        }
    }

    /// Takes the data directory's lock (a SQLite store of its own), listens
    /// and serves while the stored runs load.
    pub async fn listen(config: HeadConfig) -> Result<Listening, HeadError> {
        let lock = match &config.state.store {
            StoreConfig::Sqlite { path, .. } => {
                Some(DataDirLock::take(path, config.allow_empty_store).map_err(HeadError::new)?)
            }
            // A shared store needs none: heads take turns there.
            _ => None,
        };
        let listener = match config.listen {
            Listen::Listener(listener) => listener,
            Listen::Address(address) => TcpListener::bind(address)
                .await
                .map_err(|e| HeadError::new(format!("cannot listen on {address}: {e}")))?,
        };
        let address = listener.local_addr().map_err(|e| HeadError::new(e.to_string()))?;
        let stopper = HeadStopper { stop: Arc::new(watch::channel(false).0) };
        let tls = config.http.tls.is_some();
        // Serving starts before the stored runs are loaded: `/healthz`
        // answers at once (`"loaded": false`) and every other request
        // waits for the load.
        let (load, loading) = load_channel();
        let server =
            tokio::spawn(serve_while_loading(listener, loading, config.http, stopper.stopped()));
        let store = match &config.state.store {
            StoreConfig::Sqlite { .. } => "sqlite",
            StoreConfig::InMemory => "memory",
            #[allow(unreachable_patterns)]
            _ => "postgres",
        };
        tracing::info!(address = %address, store, cluster = ?config.state.cluster, "listening; loading the stored runs");
        Ok(Listening {
            address,
            tls,
            stopper,
            server,
            load,
            lock,
            state: config.state,
            #[cfg(feature = "forward")]
            forward: config.forward,
            #[cfg(feature = "notify")]
            notify: config.notify,
        })
    }

    /// The address it listens on.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Its URL: `http://` or `https://` and its address.
    pub fn url(&self) -> String {
        url(self.tls, self.address)
    }

    /// Its state service.
    pub fn service(&self) -> &Arc<StateService> {
        &self.service
    }

    /// What stops it, for a signal handler.
    pub fn stopper(&self) -> HeadStopper {
        self.stopper.clone()
    }

    /// Stops it gracefully and waits: see [`Head::wait`].
    pub async fn shutdown(self) -> Result<(), HeadError> {
        self.stopper.stop();
        self.wait().await
    }

    /// Waits until it is stopped (by its [`HeadStopper`], or because the
    /// state actor was given up on), then stops forwarding and notifying
    /// and commits what is queued. Fails if the state actor was given up on.
    pub async fn wait(self) -> Result<(), HeadError> {
        let served = self.server.await;
        #[cfg(feature = "forward")]
        if let Some(forwarder) = self.forwarder {
            forwarder.stop().await;
        }
        #[cfg(feature = "notify")]
        if let Some(notifier) = self.notifier {
            notifier.stop().await;
        }
        tracing::info!("stopped accepting; committing what is queued");
        self.service.shutdown().await;
        served
            .map_err(|e| HeadError::new(format!("serving: {e}")))?
            .map_err(|e| HeadError::new(format!("serving: {e}")))?;
        if let Some(reason) = self.service.failure() {
            return Err(HeadError::new(format!("the state actor was given up on: {reason}")));
        }
        tracing::info!("shut down cleanly");
        Ok(())
    }
}

fn url(tls: bool, address: SocketAddr) -> String {
    format!("{}://{address}", if tls { "https" } else { "http" })
}

impl Listening {
    /// The address it listens on.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Its URL: `http://` or `https://` and its address.
    pub fn url(&self) -> String {
        url(self.tls, self.address)
    }

    /// What stops it, for a signal handler.
    pub fn stopper(&self) -> HeadStopper {
        self.stopper.clone()
    }

    /// Launches the state actor (loading the stored runs), then starts
    /// forwarding and notifying when configured. `None` when the head was
    /// stopped before the runs were loaded: nothing was served from the
    /// store, so nothing was written.
    pub async fn loaded(self) -> Result<Option<Head>, HeadError> {
        let Listening { address, tls, stopper, server, load, lock, state, .. } = self;
        #[cfg(feature = "forward")]
        let forward = self.forward;
        #[cfg(feature = "notify")]
        let notify = self.notify;
        let launched = tokio::select! {
            launched = launch_state_actor(state) => Some(launched),
            () = stopper.stopped() => None,
        };
        let service = match launched {
            Some(Ok(service)) => Arc::new(service),
            Some(Err(err)) => {
                // Held requests get 503 naming why.
                let message = err.to_string();
                load.failed(message.clone());
                stopper.stop();
                let _ = server.await;
                return Err(HeadError::new(message));
            }
            None => {
                // The launch is dropped (the store closed after reading),
                // held requests get 503.
                server
                    .await
                    .map_err(|e| HeadError::new(format!("serving: {e}")))?
                    .map_err(|e| HeadError::new(format!("serving: {e}")))?;
                drop(load);
                tracing::info!("stopped before the stored runs were loaded; nothing was written");
                return Ok(None);
            }
        };
        load.loaded(service.clone());
        if let Some(lock) = &lock {
            lock.mark_store_opened();
        }
        tracing::info!(
            runs = service.runs_by_status().iter().sum::<usize>(),
            "head service ready: every stored run is loaded"
        );
        #[cfg_attr(not(any(feature = "forward", feature = "notify")), allow(unused_mut))]
        let mut head = Head {
            address,
            tls,
            stopper,
            server,
            service,
            _lock: lock,
            #[cfg(feature = "forward")]
            forwarder: None,
            #[cfg(feature = "notify")]
            notifier: None,
        };
        #[cfg(feature = "forward")]
        if let Some(forward) = forward {
            match start_forwarding(&head.service, forward) {
                Ok(forwarder) => head.forwarder = Some(forwarder),
                Err(err) => {
                    let _ = head.shutdown().await;
                    return Err(HeadError::new(format!("--forward-to: {err}")));
                }
            }
        }
        #[cfg(feature = "notify")]
        if let Some(notify) = notify {
            match start_notifying(&head.service, notify).await {
                Ok(notifier) => head.notifier = Some(notifier),
                Err(err) => {
                    let _ = head.shutdown().await;
                    return Err(HeadError::new(err.to_string()));
                }
            }
        }
        // A state actor given up on answers nothing: stop, so that the
        // caller can exit non-zero and a service manager start it again.
        tokio::spawn({
            let (service, stopper) = (head.service.clone(), head.stopper.clone());
            async move {
                let reason = service.gave_up().await;
                tracing::error!(
                    reason = %reason,
                    "the state actor is gone for good; stopping so that the head can be restarted"
                );
                stopper.stop();
            }
        });
        Ok(Some(head))
    }
}
