//! The head service: the HTTP API in front of the state actor.
//!
//! Every answer is JSON (but `/metrics`, the event stream and the page);
//! every error has one shape, `{"error": {"code", "message", "field"}}`,
//! axum's own rejections, unknown routes and wrong methods included.

mod admission;
mod answer;
mod auth;
mod body;
mod body_budget;
mod events;
mod goodput;
mod loading;
mod metrics;
mod nodes;
mod rendezvous;
mod routes;
mod tls;
mod web;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, on};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tower_http::cors::{AllowOrigin, CorsLayer};
use trainstate_client::StateHandle;
use trainstate_client::api::ErrorCode;
use trainstate_schema::routes::{HttpMethod, Operation};

pub use self::loading::{DEFAULT_LOAD_HOLD, Load, LoadWatch, load_channel};
use self::loading::{LoadState, Phase};
use self::metrics::HttpMetrics;
pub use self::tls::{ServerTls, TlsFileError};
use crate::engine::error::ApiError;
use crate::engine::supervisor::StateService;

/// The default limit of a request body: a run of 32,768 workers fits.
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// The default deadline of a request (event streams excepted).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The default bound on concurrent event subscribers.
pub const DEFAULT_MAX_SUBSCRIBERS: usize = 256;

/// The default time a client has to send a request's headers; hyper starts
/// the same timer when a kept-alive connection waits for its next request,
/// so it is also the idle timeout of a connection between requests.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The default bound on open connections (well under a 1,024-descriptor limit).
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// The default bound on open connections from one client (an IPv4 address
/// or an IPv6 /64): a node of 8 ranks, each with its own connections and a
/// watcher's, its controller, a dashboard's event streams and a CLI use
/// well under it, while one client holds at most an eighth of
/// [`DEFAULT_MAX_CONNECTIONS`].
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 64;

/// The default time a request body may send nothing before it is cut off
/// (408): the header-read timeout's value.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The default bound on the bytes of request bodies received and being
/// handled at once, across all connections, counting each body's bytes past
/// its first [`BODY_BYTES_OUTSIDE_BUDGET`] as they arrive: 256 MiB (sixteen
/// bodies at the default body limit).
pub const DEFAULT_MAX_BODY_BYTES_IN_FLIGHT: usize = 256 << 20;

/// The first bytes of every request body, which the shared body budget does
/// not count: a rank heartbeat, a status change or an ordinary registration
/// never waits on (nor is refused by) the budget that large uploads share.
/// At most [`HttpConfig::max_connections`] times this (32 MiB by default)
/// is held outside the budget.
pub const BODY_BYTES_OUTSIDE_BUDGET: usize = 64 * 1024;

/// The default bound on the bytes of large answers (listings, event-stream
/// snapshots) produced and not yet taken by their clients' sockets, across
/// all connections: 256 MiB.
pub const DEFAULT_MAX_ANSWER_BYTES: usize = 256 * 1024 * 1024;

/// The default bound on the ranks `/metrics` shows one by one
/// (`trainstate_rank_step`, `trainstate_rank_last_advance_timestamp_seconds`):
/// none, so that a head tracking 10,000-rank runs never floods a scraper
/// unless asked.
pub const DEFAULT_PROMETHEUS_RANK_SERIES: usize = 0;

/// The default time open connections get to finish after shutdown begins;
/// then they are closed, whatever their clients do.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// How the HTTP API is served.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct HttpConfig {
    /// The head's own bearer token, with every scope. With it, the head
    /// checks a token on every route but the open ones (reads only with
    /// `protect_reads`), and serves the token routes (see `http::auth`).
    pub token: Option<String>,
    /// Reads need a token with the scope `read` too. The page then takes
    /// it from its URL.
    pub protect_reads: bool,
    /// The largest request body accepted.
    pub max_body_bytes: usize,
    /// The deadline of each request (event streams excepted).
    pub request_timeout: Duration,
    /// The most concurrent event subscribers.
    pub max_subscribers: usize,
    /// Origins allowed by CORS; none means CORS is off.
    pub cors_origins: Vec<String>,
    /// How long a client may take to send a request's headers, and how long
    /// a kept-alive connection may wait idle for its next request.
    pub header_read_timeout: Duration,
    /// The most open connections; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// The most open connections from one client (an IPv4 address, or an
    /// IPv6 /64); one more is closed at once.
    pub max_connections_per_client: usize,
    /// The most bytes of request bodies received and being handled at once,
    /// counting each body's bytes past its first
    /// [`BODY_BYTES_OUTSIDE_BUDGET`] as they arrive; a body that would pass
    /// it gets 503 `overloaded`.
    pub max_body_bytes_in_flight: usize,
    /// How long a request body may send nothing before it is cut off with
    /// 408 `request_timeout` (its bytes released).
    pub body_read_timeout: Duration,
    /// How long connections get to finish once shutdown begins.
    pub shutdown_grace: Duration,
    /// The most bytes of listings and event-stream snapshots produced and
    /// not yet taken by slow clients, across all connections; past it a
    /// listing is refused with 503 `overloaded` and a stream waits.
    pub max_answer_bytes: usize,
    /// Serve any `Host`, even without a token (`--insecure`). Otherwise a
    /// head without a token serves only `Host` values naming it (loopback
    /// names and its listen address): a guard against DNS rebinding.
    pub allow_any_host: bool,
    /// URL templates of links out to logs and metrics, checked by
    /// `trainstate_client::links::check_template` (with its `cli` feature).
    pub links: trainstate_client::api::LinksResponse,
    /// The longest a request waits for the stored runs to be loaded (see
    /// [`serve_while_loading`]); past it, 503 `unavailable`.
    pub load_hold: Duration,
    /// Serve HTTPS with this certificate and key instead of plain HTTP.
    /// Each handshake must end within [`HttpConfig::header_read_timeout`].
    pub tls: Option<Arc<ServerTls>>,
    /// The most ranks `/metrics` shows one by one, each as a series of
    /// `trainstate_rank_step` and of
    /// `trainstate_rank_last_advance_timestamp_seconds`; the ranks past it
    /// are counted in `trainstate_rank_series_omitted`. 0 (the default):
    /// none.
    pub prometheus_rank_series: usize,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            token: None,
            protect_reads: false,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_subscribers: DEFAULT_MAX_SUBSCRIBERS,
            cors_origins: Vec::new(),
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_client: DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
            max_body_bytes_in_flight: DEFAULT_MAX_BODY_BYTES_IN_FLIGHT,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            max_answer_bytes: DEFAULT_MAX_ANSWER_BYTES,
            allow_any_host: false,
            links: trainstate_client::api::LinksResponse::default(),
            load_hold: DEFAULT_LOAD_HOLD,
            tls: None,
            prometheus_rank_series: DEFAULT_PROMETHEUS_RANK_SERIES,
        }
    }
}

impl HttpConfig {
    /// Makes `token` the head's own token (every scope) and checks tokens.
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token;
        self
    }

    /// Requires the token for reads too.
    pub fn with_protected_reads(mut self, protect: bool) -> Self {
        self.protect_reads = protect;
        self
    }

    /// Sets the body size limit.
    pub fn with_max_body_bytes(mut self, max: usize) -> Self {
        self.max_body_bytes = max;
        self
    }

    /// Sets the request deadline.
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets the bound on event subscribers.
    pub fn with_max_subscribers(mut self, max: usize) -> Self {
        self.max_subscribers = max;
        self
    }

    /// Serves these link templates (check each with
    /// `trainstate_client::links::check_template` first, with its `cli` feature).
    pub fn with_links(mut self, links: trainstate_client::api::LinksResponse) -> Self {
        self.links = links;
        self
    }

    /// Sets the header-read (and keep-alive idle) timeout.
    pub fn with_header_read_timeout(mut self, timeout: Duration) -> Self {
        self.header_read_timeout = timeout;
        self
    }

    /// Sets the bound on open connections.
    pub fn with_max_connections(mut self, max: usize) -> Self {
        self.max_connections = max;
        self
    }

    /// Sets the bound on open connections from one client.
    pub fn with_max_connections_per_client(mut self, max: usize) -> Self {
        self.max_connections_per_client = max;
        self
    }

    /// Sets the bound on the bytes of request bodies received and handled
    /// at once.
    pub fn with_max_body_bytes_in_flight(mut self, max: usize) -> Self {
        self.max_body_bytes_in_flight = max;
        self
    }

    /// Sets how long a request body may send nothing before it is cut off.
    pub fn with_body_read_timeout(mut self, timeout: Duration) -> Self {
        self.body_read_timeout = timeout;
        self
    }

    /// Sets the time connections get to finish once shutdown begins.
    pub fn with_shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    /// Sets the bound on answer bytes held for slow clients.
    pub fn with_max_answer_bytes(mut self, max: usize) -> Self {
        self.max_answer_bytes = max;
        self
    }

    /// Serves any `Host` even without a token.
    pub fn with_any_host(mut self, allow: bool) -> Self {
        self.allow_any_host = allow;
        self
    }

    /// Sets the longest a request waits for the stored runs to be loaded.
    pub fn with_load_hold(mut self, hold: Duration) -> Self {
        self.load_hold = hold;
        self
    }

    /// Serves HTTPS with `tls` (plain HTTP without). Keep the `Arc` to
    /// [`ServerTls::reload`] the certificate while serving.
    pub fn with_tls(mut self, tls: Option<Arc<ServerTls>>) -> Self {
        self.tls = tls;
        self
    }

    /// Shows at most `max` ranks one by one on `/metrics` (see
    /// [`HttpConfig::prometheus_rank_series`]).
    pub fn with_prometheus_rank_series(mut self, max: usize) -> Self {
        self.prometheus_rank_series = max;
        self
    }

    /// Allows these origins by CORS.
    pub fn with_cors_origins(mut self, origins: Vec<String>) -> Self {
        self.cors_origins = origins;
        self
    }
}

/// Checks one CORS origin as a browser sends it in `Origin`:
/// `http(s)://host[:port]`, no path, no wildcard. `*` is refused rather
/// than taken to mean "any": name the origins that may call the API.
pub fn check_cors_origin(origin: &str) -> Result<HeaderValue, String> {
    if origin == "*" {
        return Err("a wildcard is not allowed: list each origin (https://host[:port])".into());
    }
    let rest = origin
        .strip_prefix("https://")
        .or_else(|| origin.strip_prefix("http://"))
        .ok_or("an origin starts with http:// or https://")?;
    let valid = !rest.is_empty()
        && rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'));
    if !valid {
        return Err("an origin is scheme://host[:port], without path, query or spaces".into());
    }
    HeaderValue::from_str(origin).map_err(|e| e.to_string())
}

/// Documents generated once at start from the Rust types.
pub(crate) struct Documents {
    schemas: Vec<(&'static str, String)>,
    openapi: String,
}

impl Documents {
    fn generate() -> Self {
        let pretty = trainstate_schema::openapi::to_document_text;
        Self {
            schemas: trainstate_schema::openapi::wire_schemas()
                .into_iter()
                .map(|(name, schema)| (name, pretty(schema.as_value())))
                .collect(),
            openapi: pretty(&trainstate_schema::openapi::document()),
        }
    }

    fn schema(&self, name: &str) -> Option<&str> {
        self.schemas.iter().find(|(n, _)| *n == name).map(|(_, s)| s.as_str())
    }

    fn schema_names(&self) -> Vec<&'static str> {
        self.schemas.iter().map(|(n, _)| *n).collect()
    }
}

/// What every handler and middleware reads: shared behind one `Arc`, so
/// that the per-request copies axum makes of the state (one per
/// middleware layer and handler) cost one reference count each.
#[derive(Clone)]
pub(crate) struct AppState(Arc<App>);

impl std::ops::Deref for AppState {
    type Target = App;

    fn deref(&self) -> &App {
        &self.0
    }
}

pub(crate) struct App {
    service: Arc<StateService>,
    auth: Arc<auth::Auth>,
    handle: StateHandle,
    config: Arc<HttpConfig>,
    metrics: Arc<HttpMetrics>,
    subscribers: Arc<Semaphore>,
    bodies: body_budget::BodyBudget,
    budget: answer::AnswerBudget,
    listen: Option<std::net::SocketAddr>,
    documents: Arc<Documents>,
    shutdown: watch::Receiver<bool>,
}

/// Serves the API on `listener` until `shutdown` completes; then stops
/// accepting, ends open event streams, and gives the connections in flight
/// [`HttpConfig::shutdown_grace`] to finish before closing them, whatever
/// their clients do. The state actor is not stopped: that is the caller's
/// next step.
///
/// Each connection is HTTP/1.1 with hyper's header-read timeout (which also
/// bounds a kept-alive connection's idle wait); at most
/// [`HttpConfig::max_connections`] are open at once, and further clients wait
/// in the listen backlog until one closes; a connection from a client that
/// already has [`HttpConfig::max_connections_per_client`] open is closed at
/// once. When places run low, connections waiting without a request (idle
/// or still sending their headers) give way to new ones (see the
/// `admission` module).
pub async fn serve(
    listener: TcpListener,
    service: Arc<StateService>,
    config: HttpConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (load, watch) = load_channel();
    load.loaded(service);
    serve_while_loading(listener, watch, config, shutdown).await
}

/// [`serve`] for a head whose state actor is still being launched (its
/// stored runs loading): serves at once, and until `load` says the launch
/// is done, answers `GET /healthz` itself (`"loaded": false`) and holds
/// every other request, then hands it to the API once loaded, so that no
/// client sees a partial state. A request held longer than
/// [`HttpConfig::load_hold`], or held when the launch fails, or when
/// shutdown begins first, is answered 503 `unavailable` (`Retry-After: 1`).
pub async fn serve_while_loading(
    listener: TcpListener,
    load: LoadWatch,
    config: HttpConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::server::graceful::GracefulShutdown;
    use hyper_util::service::TowerToHyperService;

    let (stop, stopping) = watch::channel(false);
    let grace = config.shutdown_grace;
    let hold = config.load_hold;
    let admission =
        admission::Admission::new(config.max_connections, config.max_connections_per_client);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(config.header_read_timeout);
    let listen = listener.local_addr().ok();
    let transport = tls::Transport::new(config.tls.clone(), config.header_read_timeout);
    let (phase_tx, phase) = watch::channel(Phase::Loading);
    let load_state = load.rx.clone();
    let launched = match load.loaded_now() {
        Some(service) => {
            phase_tx.send_replace(Phase::Ready(router(service, config, stopping.clone(), listen)));
            None
        }
        // Builds the router once the launch is done.
        None => {
            let stopping = stopping.clone();
            Some(tokio::spawn(async move {
                let next = match load.outcome().await {
                    Ok(service) => Phase::Ready(router(service, config, stopping, listen)),
                    Err(reason) => Phase::Failed(reason),
                };
                phase_tx.send_replace(next);
            }))
        }
    };
    let graceful = GracefulShutdown::new();
    let mut tasks = tokio::task::JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        while tasks.try_join_next().is_some() {}
        let place = tokio::select! {
            place = admission.place() => place,
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of descriptors, or the peer gave up: wait a moment
                    // (as hyper and axum do) instead of spinning.
                    tracing::warn!("accepting a connection failed: {err}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // A client over its own limit is closed at once (`stream` dropped).
        let Some(mut admitted) = place.admit(peer.ip()) else { continue };
        admission.make_room();
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(transport.io(stream));
        let requests = admitted.requests();
        let ready = phase.borrow().router();
        if let Some(app) = ready {
            let service =
                admission::Tracked::new(TowerToHyperService::new(app), requests, peer.ip());
            let connection = graceful.watch(http.serve_connection(io, service));
            tasks.spawn(async move {
                // Closed to make room: dropping the connection closes it.
                tokio::select! {
                    _ = connection => {}
                    _ = &mut admitted.shed => {}
                }
                drop(admitted);
            });
        } else {
            // Opened while the runs load: each request waits for the router.
            let (phase, stopping) = (phase.clone(), stopping.clone());
            let held = hyper::service::service_fn(move |request| {
                loading::held(phase.clone(), stopping.clone(), hold, request)
            });
            let service = admission::Tracked::new(held, requests, peer.ip());
            let connection = graceful.watch(http.serve_connection(io, service));
            tasks.spawn(async move {
                tokio::select! {
                    _ = connection => {}
                    _ = &mut admitted.shed => {}
                }
                drop(admitted);
            });
        }
    }
    if let Some(launched) = launched {
        // A launch decided before shutdown (a failure, say) reaches the
        // requests held for it; one still running is given up.
        if matches!(*load_state.borrow(), LoadState::Loading) {
            launched.abort();
        } else {
            let _ = launched.await;
        }
    }
    drop(listener);
    let _ = stop.send(true);
    let open = tasks.len();
    if tokio::time::timeout(grace, graceful.shutdown()).await.is_err() {
        tracing::warn!(
            connections = tasks.len(),
            "connections still open after the {grace:?} shutdown grace; closing them"
        );
    } else if open > 0 {
        tracing::info!(connections = open, "open connections finished");
    }
    tasks.shutdown().await;
    Ok(())
}

fn router(
    service: Arc<StateService>,
    config: HttpConfig,
    shutdown: watch::Receiver<bool>,
    listen: Option<std::net::SocketAddr>,
) -> Router {
    // On a shared store, rendezvous calls go to the head that owns the groups.
    service.relay_rendezvous_calls();
    let auth = Arc::new(auth::Auth::new(config.token.as_deref(), config.protect_reads));
    auth::refresh_while_shared(&auth, &service, shutdown.clone());
    let state = AppState(Arc::new(App {
        auth,
        handle: service.handle(),
        service,
        subscribers: Arc::new(Semaphore::new(config.max_subscribers)),
        bodies: body_budget::BodyBudget::new(
            config.max_body_bytes_in_flight,
            config.body_read_timeout,
        ),
        budget: answer::AnswerBudget::new(config.max_answer_bytes),
        listen,
        metrics: Arc::default(),
        documents: Arc::new(Documents::generate()),
        config: Arc::new(config),
        shutdown,
    }));
    let mut timed = Router::new();
    let mut untimed = Router::new();
    for (path, timed_route, method_router) in method_routers() {
        if timed_route {
            timed = timed.route(path, method_router);
        } else {
            untimed = untimed.route(path, method_router);
        }
    }
    let timed = timed.route_layer(middleware::from_fn_with_state(state.clone(), deadline));
    let mut app = timed
        .merge(untimed)
        .route_layer(middleware::from_fn(remember_route))
        .fallback(routes::no_such_route)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), bound_bodies))
        .layer(middleware::from_fn_with_state(state.clone(), auth::authorize))
        .layer(middleware::from_fn_with_state(state.clone(), check_host))
        .layer(middleware::from_fn_with_state(state.clone(), measure));
    if !state.config.cors_origins.is_empty() {
        let origins: Vec<HeaderValue> = state
            .config
            .cors_origins
            .iter()
            .filter_map(|o| match check_cors_origin(o) {
                Ok(origin) => Some(origin),
                Err(err) => {
                    tracing::warn!(origin = %o, "CORS origin ignored: {err}");
                    None
                }
            })
            .collect();
        app = app.layer(
            CorsLayer::new()
                .allow_origin(AllowOrigin::list(origins))
                .allow_methods([Method::GET, Method::POST, Method::PUT, Method::DELETE])
                .allow_headers([header::CONTENT_TYPE, header::AUTHORIZATION]),
        );
    }
    app.with_state(state)
}

/// The router's routes, one per path of the route table, each with the
/// handlers of its methods and whether it has a request deadline.
fn method_routers() -> Vec<(&'static str, bool, MethodRouter<AppState>)> {
    let mut by_path: Vec<(&'static str, bool, MethodRouter<AppState>)> = Vec::new();
    for route in trainstate_schema::routes::routes() {
        let method_router = handler(route.operation, method_filter(route.method));
        match by_path.iter_mut().find(|(path, ..)| *path == route.path) {
            Some((_, timed, existing)) => {
                assert_eq!(*timed, route.timed, "one path, one deadline policy: {}", route.path);
                *existing = std::mem::take(existing).merge(method_router);
            }
            None => by_path.push((route.path, route.timed, method_router)),
        }
    }
    by_path
}

fn method_filter(method: HttpMethod) -> MethodFilter {
    match method {
        HttpMethod::Get => MethodFilter::GET,
        HttpMethod::Post => MethodFilter::POST,
        HttpMethod::Put => MethodFilter::PUT,
        HttpMethod::Delete => MethodFilter::DELETE,
        other => panic!("the head serves no {other:?} route"),
    }
}

/// The handler of each operation of the route table.
fn handler(operation: Operation, filter: MethodFilter) -> MethodRouter<AppState> {
    match operation {
        Operation::ListRuns => on(filter, routes::list_runs),
        Operation::RegisterRun => on(filter, routes::register_run),
        Operation::ListRunsRay => on(filter, routes::list_runs_ray),
        Operation::ListRunsRayV2 => on(filter, routes::list_runs_ray_v2),
        Operation::UpsertRayRun => on(filter, routes::upsert_ray_run),
        Operation::UpsertRayAttempt => on(filter, routes::upsert_ray_attempt),
        Operation::GetRun => on(filter, routes::get_run),
        Operation::GetRunMetrics => on(filter, routes::get_run_metrics),
        Operation::GetRunStacks => on(filter, routes::get_run_stacks),
        Operation::PostRunStacks => on(filter, routes::post_run_stacks),
        Operation::DeleteRun => on(filter, routes::delete_run),
        Operation::SetRunStatus => on(filter, routes::set_status),
        Operation::StartRunAttempt => on(filter, routes::start_attempt),
        Operation::HeartbeatRun => on(filter, routes::heartbeat),
        Operation::ReportProgress => on(filter, routes::report_progress),
        Operation::ForwardRun => on(filter, routes::forward_run),
        Operation::RunEvents => on(filter, events::events),
        Operation::GetSchema => on(filter, routes::schema),
        Operation::GetOpenApi => on(filter, routes::openapi),
        Operation::GetVersion => on(filter, routes::version),
        Operation::GetLinks => on(filter, routes::links),
        Operation::GetNotify => on(filter, routes::notify),
        Operation::ListNodes => on(filter, nodes::list_nodes),
        Operation::GetNode => on(filter, nodes::get_node),
        Operation::GetGoodput => on(filter, goodput::get_goodput),
        Operation::Health => on(filter, routes::healthz),
        Operation::Metrics => on(filter, routes::metrics),
        Operation::Page | Operation::RunPage | Operation::NodesPage | Operation::GoodputPage => {
            on(filter, web::page)
        }
        Operation::PageScript => on(filter, web::script),
        Operation::PageStyle => on(filter, web::style),
        Operation::PageContract => on(filter, web::contract),
        Operation::JoinRendezvous => on(filter, rendezvous::join),
        Operation::HeartbeatRank => on(filter, rendezvous::heartbeat_rank),
        Operation::EndRank => on(filter, rendezvous::end_rank),
        Operation::CreateToken => on(filter, auth::create_token),
        Operation::ListTokens => on(filter, auth::list_tokens),
        Operation::RevokeToken => on(filter, auth::revoke_token),
        other => panic!("the route table names {other:?}, which has no handler"),
    }
}

/// Answers 503 `timeout` in the JSON shape when a request takes longer than
/// allowed: the request deadline, plus [`trainstate_client::deadline_allowance`]
/// for the body its `Content-Length` announces (a large document gets a
/// deadline that fits it). A write that timed out may have taken effect:
/// the deadline does not cancel it.
async fn deadline(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let body_bytes = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .unwrap_or(0)
        .min(app.config.max_body_bytes as u64);
    let limit = app.config.request_timeout + trainstate_client::deadline_allowance(body_bytes);
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(
            ErrorCode::Timeout,
            format!(
                "the request took longer than {limit:?}; a write may have taken effect \
                 (repeating it is safe: every write is idempotent)"
            ),
        )
        .into_response(),
    }
}

/// Without a token, serves only `Host` values that name this head: a web
/// page on a rebinding name (`attacker.example` resolving to 127.0.0.1)
/// would otherwise read and write through the user's browser. Answers 421
/// `misdirected_request` (this head does not serve that authority) in the
/// JSON error shape. A request without `Host` (HTTP/1.0; no browser sends
/// one) is served. `--insecure` or a token lifts the check: with a token,
/// writes need it anyway.
async fn check_host(State(app): State<AppState>, request: Request, next: Next) -> Response {
    if app.config.token.is_some() || app.config.allow_any_host {
        return next.run(request).await;
    }
    let host = request.headers().get(header::HOST).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    match host {
        Some(host) if !host_names_listener(host, app.listen) => ApiError::new(
            ErrorCode::MisdirectedRequest,
            format!(
                "this head serves only its own names without a token (localhost, 127.0.0.1, \
                 [::1] or its listen address), not Host {host:?}; give it a token or --insecure"
            ),
        )
        .into_response(),
        _ => next.run(request).await,
    }
}

/// True when `host` (`name[:port]`) names a loopback address or `listen`'s.
fn host_names_listener(host: &str, listen: Option<std::net::SocketAddr>) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(name, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) { name } else { host }
        }),
    };
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if name == "localhost" || name.ends_with(".localhost") {
        return true;
    }
    match name.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback() || listen.is_some_and(|l| l.ip() == ip),
        Err(_) => false,
    }
}

/// Refuses an announced body over the limit at once (413, before a byte of
/// it is read), and meters the body as it arrives (see [`body_budget`]): a
/// body whose next bytes would pass [`HttpConfig::max_body_bytes_in_flight`]
/// gets 503 `overloaded`, one that sends nothing for
/// [`HttpConfig::body_read_timeout`] gets 408 `request_timeout`; either
/// closes the connection (the rest of the body is not read), and nothing
/// was done for the request.
async fn bound_bodies(State(app): State<AppState>, request: Request, next: Next) -> Response {
    if matches!(*request.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        // Reads take no body; whatever is sent is never read.
        return next.run(request).await;
    }
    let length = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if length.is_some_and(|n| n > app.config.max_body_bytes as u64) {
        return ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!("the body is over the limit of {} bytes", app.config.max_body_bytes),
        )
        .into_response();
    }
    let has_body =
        length.is_some_and(|n| n > 0) || request.headers().contains_key(header::TRANSFER_ENCODING);
    if !has_body {
        return next.run(request).await;
    }
    let (request, charge) = app.bodies.meter(request);
    let response = next.run(request).await;
    let refused = match charge.refusal() {
        None => return response,
        Some(body_budget::Refusal::Overloaded) => ApiError::new(
            ErrorCode::Overloaded,
            format!(
                "{} bytes of request bodies are being received (each body's first {} bytes \
                 aside); nothing was done; retry",
                app.config.max_body_bytes_in_flight, BODY_BYTES_OUTSIDE_BUDGET
            ),
        ),
        Some(body_budget::Refusal::Idle) => ApiError::new(
            ErrorCode::RequestTimeout,
            format!(
                "the body sent nothing for {:?} (the body-read timeout); nothing was done; \
                 send the request again",
                app.config.body_read_timeout
            ),
        ),
    };
    let mut response = refused.into_response();
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Hands the matched route to [`measure`], which runs before routing.
async fn remember_route(request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().cloned();
    let mut response = next.run(request).await;
    if let Some(route) = route {
        response.extensions_mut().insert(route);
    }
    response
}

/// Counts requests by route and status code, and their latency.
async fn measure(State(app): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let response = next.run(request).await;
    let route = response.extensions().get::<MatchedPath>().map_or("unmatched", |p| p.as_str());
    app.metrics.record(route, response.status().as_u16(), started.elapsed());
    response
}

#[cfg(test)]
mod tests {
    use super::host_names_listener;

    #[test]
    fn hosts_that_name_the_listener() {
        let listen = Some("10.1.2.3:8266".parse().unwrap());
        for host in [
            "localhost",
            "LOCALHOST:8266",
            "app.localhost",
            "127.0.0.1:9",
            "[::1]:8266",
            "[::1]",
            "10.1.2.3:8266",
            "127.0.0.2",
        ] {
            assert!(host_names_listener(host, listen), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8266",
            "localhost.evil.example",
            "10.1.2.4",
            "[::2]:1",
            "",
            "127.0.0.1.nip.io",
        ] {
            assert!(!host_names_listener(host, listen), "{host}");
        }
    }
}
