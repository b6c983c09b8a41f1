//! A head that serves while it loads its stored runs: `/healthz` answers at
//! once (`"loaded": false`), every other request is held until the load
//! completes and then answered by the router, so that no client sees a
//! partial listing or a 404 for a stored run.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::Method;
use axum::response::{IntoResponse, Json, Response};
use hyper::body::Incoming;
use tokio::sync::watch;
use trainstate_client::api::{ErrorCode, HealthResponse};

use crate::engine::error::ApiError;
use crate::engine::supervisor::StateService;

/// The longest a request that arrives while the head loads its stored runs
/// is held: past it, it is answered 503 `unavailable` with `Retry-After: 1`.
pub const DEFAULT_LOAD_HOLD: Duration = Duration::from_secs(30);

/// Where a head's launch (the store opened, every stored run loaded)
/// stands, as [`super::serve_while_loading`] sees it.
#[derive(Clone)]
pub(super) enum LoadState {
    Loading,
    Loaded(Arc<StateService>),
    Failed(Arc<str>),
}

/// The launch's side of a head that serves while it loads: say
/// [`Load::loaded`] with the launched service (requests held so far are
/// then answered), or [`Load::failed`] (they are answered 503
/// `unavailable`). Dropped without either, the launch counts as failed.
#[derive(Debug)]
pub struct Load {
    tx: watch::Sender<LoadState>,
}

/// The serving side of a [`Load`]: give it to [`super::serve_while_loading`].
#[derive(Debug)]
pub struct LoadWatch {
    pub(super) rx: watch::Receiver<LoadState>,
}

impl std::fmt::Debug for LoadState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Loading => f.write_str("Loading"),
            Self::Loaded(_) => f.write_str("Loaded"),
            Self::Failed(reason) => f.debug_tuple("Failed").field(reason).finish(),
        }
    }
}

/// A launch not yet done, and the watch that serves while it runs.
pub fn load_channel() -> (Load, LoadWatch) {
    let (tx, rx) = watch::channel(LoadState::Loading);
    (Load { tx }, LoadWatch { rx })
}

impl Load {
    /// The state actor is launched with every stored run loaded.
    pub fn loaded(&self, service: Arc<StateService>) {
        self.tx.send_replace(LoadState::Loaded(service));
    }

    /// The launch failed: held and later requests get 503 `unavailable`
    /// naming `reason`.
    pub fn failed(&self, reason: impl Into<String>) {
        self.tx.send_replace(LoadState::Failed(reason.into().into()));
    }
}

impl LoadWatch {
    /// The launch's outcome once it is known: the service, or why not.
    pub(super) async fn outcome(mut self) -> Result<Arc<StateService>, Arc<str>> {
        let state = self
            .rx
            .wait_for(|state| !matches!(state, LoadState::Loading))
            .await
            .map(|state| state.clone());
        match state {
            Ok(LoadState::Loaded(service)) => Ok(service),
            Ok(LoadState::Failed(reason)) => Err(reason),
            Ok(LoadState::Loading) | Err(_) => Err("the launch was abandoned".into()),
        }
    }

    /// The service, if the launch has completed already.
    pub(super) fn loaded_now(&self) -> Option<Arc<StateService>> {
        match &*self.rx.borrow() {
            LoadState::Loaded(service) => Some(service.clone()),
            _ => None,
        }
    }
}

/// What the HTTP service answers with: nothing yet, the router, or the
/// launch's failure.
#[derive(Clone)]
pub(super) enum Phase {
    Loading,
    Ready(Router),
    Failed(Arc<str>),
}

impl Phase {
    /// The router, once loaded.
    pub(super) fn router(&self) -> Option<Router> {
        match self {
            Self::Ready(router) => Some(router.clone()),
            _ => None,
        }
    }
}

/// Answers one request on a connection opened before the load completed.
pub(super) async fn held(
    mut phase: watch::Receiver<Phase>,
    mut stopping: watch::Receiver<bool>,
    hold: Duration,
    request: Request<Incoming>,
) -> Result<Response, Infallible> {
    use hyper::service::Service as _;

    let current = phase.borrow_and_update().clone();
    let router = match current {
        Phase::Ready(router) => router,
        Phase::Failed(reason) => return Ok(failed(&reason)),
        Phase::Loading
            if request.uri().path() == "/healthz"
                && matches!(*request.method(), Method::GET | Method::HEAD) =>
        {
            // Says only that the process serves: it touches no run.
            return Ok(Json(HealthResponse::loading()).into_response());
        }
        Phase::Loading => {
            tracing::debug!(
                method = %request.method(),
                path = request.uri().path(),
                "held until the stored runs are loaded"
            );
            let outcome = tokio::time::timeout(hold, async {
                tokio::select! {
                    // The launch's outcome first, when shutdown comes with it.
                    biased;
                    changed = phase.wait_for(|p| !matches!(p, Phase::Loading)) => {
                        changed.map(|p| p.clone()).ok()
                    }
                    _ = stopping.wait_for(|stop| *stop) => None,
                }
            })
            .await;
            match outcome {
                Ok(Some(Phase::Ready(router))) => router,
                Ok(Some(Phase::Failed(reason))) => return Ok(failed(&reason)),
                Ok(Some(Phase::Loading) | None) => return Ok(shutting_down()),
                Err(_) => return Ok(still_loading(hold)),
            }
        }
    };
    hyper_util::service::TowerToHyperService::new(router).call(request).await
}

fn still_loading(hold: Duration) -> Response {
    ApiError::new(
        ErrorCode::Unavailable,
        format!(
            "the head is still loading its stored runs (a request waits at most {hold:?} for \
             the load); retry after the Retry-After seconds, or wait until GET /healthz says \
             \"loaded\": true"
        ),
    )
    .into_response()
}

fn failed(reason: &str) -> Response {
    ApiError::new(
        ErrorCode::Unavailable,
        format!("the head could not load its stored runs and is stopping: {reason}"),
    )
    .into_response()
}

fn shutting_down() -> Response {
    ApiError::new(
        ErrorCode::Unavailable,
        "the head is shutting down before it loaded its stored runs; nothing was done: retry \
         once it is back",
    )
    .into_response()
}
