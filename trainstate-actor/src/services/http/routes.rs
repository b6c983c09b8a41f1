//! The handlers of the HTTP API. Each answers with a document type of
//! `trainstate_schema::api`, serialized once.

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, StreamExt};
use std::sync::Arc;
use trainstate_client::api::{
    AttemptRequest, Cursor, ErrorCode, HealthResponse, HeartbeatResponse, LinksResponse, ListQuery,
    MetricsQuery, MetricsResponse, ProgressReport, ProgressResponse, RayWriteQuery,
    RegisterMinimalResponse, RegisterRequest, RegisterResponse, StatusRequest, VersionResponse,
};

use trainstate_client::api::{StacksRequest, StacksResponse};
use trainstate_client::{NewAttempt, RunDocument, RunQuery, StateError};
use trainstate_schema::{NewRun, RunId, TrainRunInfo, ray_v2};

use super::AppState;
use super::answer::CHUNK_BYTES;
use super::auth::{Grant, check_cluster};
use super::body::{JsonBody, QueryParams};
use crate::engine::error::ApiError;
use crate::engine::supervisor::{Found, RayWrite, StateService};

fn run_id(text: &str) -> Result<RunId, ApiError> {
    RunId::parse(text).map_err(|e| ApiError::invalid("id", e.rule().to_string()))
}

/// A document served as it was generated, with its media type.
fn document(text: String, media_type: &'static str) -> Response {
    let mut response = text.into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(media_type));
    response
}

/// An answer serialized once into a buffer of about its size.
fn sized_json(answer: &impl serde::Serialize, capacity: usize) -> Response {
    let mut body = Vec::with_capacity(capacity);
    serde_json::to_writer(&mut body, answer).expect("API answers serialize");
    ([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response()
}

/// The runs an unpaged listing reads from the actor at a time.
const LISTING_PAGE: usize = 500;

/// Where the runs of a listing come from.
enum Source {
    /// One page, already read: shared references to the stored runs.
    Page(std::vec::IntoIter<RunDocument>),
    /// Every run, read from the committed view a page at a time as the
    /// client reads: each page is the state of its moment (as paging with
    /// a cursor is), and a slow reader holds one page, never the view.
    All { service: Arc<StateService>, page: std::vec::IntoIter<RunDocument>, next: Option<Cursor> },
}

impl Source {
    async fn next(&mut self) -> Result<Option<RunDocument>, StateError> {
        match self {
            Source::Page(runs) => Ok(runs.next()),
            Source::All { service, page, next } => loop {
                if let Some(run) = page.next() {
                    return Ok(Some(run));
                }
                let Some(cursor) = next.take() else { return Ok(None) };
                let more = service.list_runs(&RunQuery::new().limit(LISTING_PAGE).after(cursor))?;
                *page = more.runs.into_iter();
                *next = more.next_cursor;
            },
        }
    }
}

/// How each run of a listing is written.
#[derive(Clone, Copy)]
enum Shape {
    /// As stored (with its heartbeat time).
    Stored,
    /// As Ray's Train V2 route answers it: a `DecoratedTrainRun`.
    RayV2,
}

/// A listing written a chunk at a time: `prefix`, the runs, `suffix`.
struct Listing {
    source: Source,
    shape: Shape,
    prefix: Option<String>,
    /// `None` once written: the listing is complete.
    suffix: Option<String>,
    first: bool,
}

impl Listing {
    fn new(source: Source, shape: Shape, prefix: &str, suffix: String) -> Self {
        Self { source, shape, prefix: Some(prefix.to_owned()), suffix: Some(suffix), first: true }
    }

    /// The next chunk (about [`CHUNK_BYTES`]); `None` when complete.
    async fn chunk(&mut self) -> Result<Option<Vec<u8>>, StateError> {
        if self.suffix.is_none() {
            return Ok(None);
        }
        let mut buf = Vec::new();
        if let Some(prefix) = self.prefix.take() {
            buf.extend_from_slice(prefix.as_bytes());
        }
        while buf.len() < CHUNK_BYTES {
            let run = match self.source.next().await {
                Ok(Some(run)) => run,
                Ok(None) => {
                    buf.extend_from_slice(self.suffix.take().unwrap_or_default().as_bytes());
                    break;
                }
                Err(err) => {
                    self.suffix = None;
                    return Err(err);
                }
            };
            if !std::mem::take(&mut self.first) {
                buf.push(b',');
            }
            let written = match self.shape {
                Shape::Stored => serde_json::to_writer(&mut buf, &run),
                Shape::RayV2 => {
                    let run = run.parse().inspect_err(|_| self.suffix = None)?;
                    serde_json::to_writer(&mut buf, &ray_v2::DecoratedTrainRun::of(&run))
                }
            };
            written.expect("API answers serialize");
        }
        Ok(Some(buf))
    }
}

/// Answers `listing`, written as the client reads it. Its first chunk is
/// ready before the answer starts (so an error before it is an error
/// answer); the rest is produced only as the socket takes bytes, under
/// the budget of answer bytes in flight: 503 `overloaded` when that
/// budget cannot take the first chunk. An error after the answer started
/// (the actor stopped between pages) ends the answer unfinished, so a
/// client never takes a cut listing for a whole one.
async fn stream_listing(app: &AppState, mut listing: Listing) -> Result<Response, ApiError> {
    let first = listing.chunk().await?.unwrap_or_default();
    let first = app.budget.try_take(first).map_err(|_| {
        ApiError::new(
            ErrorCode::Overloaded,
            format!(
                "slow clients hold {} bytes of answers not yet read, the limit; retry",
                app.budget.in_use()
            ),
        )
    })?;
    let json = [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))];
    if listing.suffix.is_none() {
        return Ok((json, Body::from(first)).into_response());
    }
    let budget = app.budget.clone();
    let rest = stream::unfold(listing, move |mut listing| {
        let budget = budget.clone();
        async move {
            match listing.chunk().await {
                Ok(Some(chunk)) => Some((Ok(budget.take(chunk).await), listing)),
                Ok(None) => None,
                Err(err) => Some((Err(std::io::Error::other(err.to_string())), listing)),
            }
        }
    });
    let body = stream::iter([Ok(first)]).chain(rest);
    Ok((json, Body::from_stream(body)).into_response())
}

/// Every run, newest first, unpaged: the first page read now, the rest as
/// the client reads.
async fn every_run(app: &AppState) -> Result<Source, ApiError> {
    let service = app.service.clone();
    let first = service.list_runs(&RunQuery::new().limit(LISTING_PAGE))?;
    Ok(Source::All { service, page: first.runs.into_iter(), next: first.next_cursor })
}

pub(crate) async fn list_runs(
    State(app): State<AppState>,
    QueryParams(params): QueryParams<ListQuery>,
) -> Result<Response, ApiError> {
    let page = app.service.list_runs(&RunQuery::try_from(params)?)?;
    let next_cursor = serde_json::to_string(&page.next_cursor).expect("a cursor serializes");
    let suffix = format!("],\"next_cursor\":{next_cursor},\"total\":{}}}", page.total);
    let listing = Listing::new(
        Source::Page(page.runs.into_iter()),
        Shape::Stored,
        "{\"train_runs\":[",
        suffix,
    );
    stream_listing(&app, listing).await
}

/// Ray 2.60's route: every retained run, newest first, unpaged.
pub(crate) async fn list_runs_ray(State(app): State<AppState>) -> Result<Response, ApiError> {
    let source = every_run(&app).await?;
    let listing = Listing::new(source, Shape::Stored, "{\"train_runs\":[", "]}".to_owned());
    stream_listing(&app, listing).await
}

/// Ray 2.60's Train V2 route: every retained run as a `DecoratedTrainRun`.
pub(crate) async fn list_runs_ray_v2(State(app): State<AppState>) -> Result<Response, ApiError> {
    let source = every_run(&app).await?;
    let listing = Listing::new(source, Shape::RayV2, "{\"train_runs\":[", "]}".to_owned());
    stream_listing(&app, listing).await
}

pub(crate) async fn upsert_ray_run(
    State(app): State<AppState>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<RayWriteQuery>,
    JsonBody(run): JsonBody<ray_v2::TrainRun>,
) -> Result<Json<RunDocument>, ApiError> {
    if run.id != id {
        return Err(ApiError::invalid("id", "must be the run id of the path"));
    }
    Ok(Json(ray_write(&app, RayWrite::Run(Box::new(run)), query.at_ms).await?))
}

pub(crate) async fn upsert_ray_attempt(
    State(app): State<AppState>,
    Path((id, attempt_id)): Path<(String, String)>,
    QueryParams(query): QueryParams<RayWriteQuery>,
    JsonBody(attempt): JsonBody<ray_v2::TrainRunAttempt>,
) -> Result<Json<RunDocument>, ApiError> {
    if attempt.run_id != id {
        return Err(ApiError::invalid("run_id", "must be the run id of the path"));
    }
    if attempt.attempt_id != attempt_id {
        return Err(ApiError::invalid("attempt_id", "must be the attempt id of the path"));
    }
    Ok(Json(ray_write(&app, RayWrite::Attempt(Box::new(attempt)), query.at_ms).await?))
}

/// How many times a V2 write is prepared before the actor is left to
/// decide it in its turn: each time, the run changed in between.
const RAY_PREPARATIONS: usize = 3;

/// A Ray Train V2 write, converted and validated off the actor's turn:
/// on a blocking thread, against the committed version of its run. The
/// actor only checks that the run is still that version and applies it;
/// if the run changed in between, the write is prepared again, and after
/// [`RAY_PREPARATIONS`] tries the actor decides it itself.
async fn ray_write(
    app: &AppState,
    write: RayWrite,
    at_ms: Option<u64>,
) -> Result<RunDocument, StateError> {
    let write = Arc::new(write);
    for _ in 0..RAY_PREPARATIONS {
        let (prepared, bytes) = app.service.prepare_ray_write(write.clone(), at_ms).await?;
        if let Some(stored) = app.handle.upsert_ray_prepared(prepared, bytes).await? {
            return Ok(stored);
        }
    }
    // Changed under every preparation: the actor decides it in its turn.
    // (Every preparation has returned its share of the write.)
    match Arc::try_unwrap(write) {
        Ok(RayWrite::Run(run)) => app.handle.upsert_ray_run_at(*run, at_ms).await,
        Ok(RayWrite::Attempt(attempt)) => app.handle.upsert_ray_attempt_at(*attempt, at_ms).await,
        Err(_) => Err(StateError::unavailable("the write is still being prepared")),
    }
}

pub(crate) async fn get_run(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = run_id(&id)?;
    let run = match app.service.find_run(&id) {
        Found::Run(run) => run,
        Found::Missing => return Err(StateError::NotFound { id }.into()),
        // Perhaps another head has just committed it: the actor reads the
        // store before it answers.
        Found::AskTheActor => app.handle.get(id.clone()).await?,
    };
    // An ended run serves its ranks' last progress, kept in the store
    // when their board went away (a read that may block for a moment).
    let run = match app.service.ended_attempt(&id) {
        Some(attempt) if run.rank_progress().is_none() => {
            match app.service.last_progress(id, attempt).await? {
                Some(progress) => run.with_rank_progress(progress),
                None => run,
            }
        }
        _ => run,
    };
    Ok(sized_json(&run, run.approximate_len()))
}

pub(crate) async fn get_run_metrics(
    State(app): State<AppState>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<MetricsQuery>,
) -> Result<Json<MetricsResponse>, ApiError> {
    let id = run_id(&id)?;
    // Histories are read from the store, which may block for a moment.
    Ok(Json(app.service.metric_histories(id, query).await?))
}

pub(crate) async fn get_run_stacks(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<StacksResponse>, ApiError> {
    let id = run_id(&id)?;
    // Captures are read from the store, never through the actor's turn.
    Ok(Json(app.service.stacks(id).await?))
}

pub(crate) async fn post_run_stacks(
    State(app): State<AppState>,
    Path(id): Path<String>,
    JsonBody(request): JsonBody<StacksRequest>,
) -> Result<Response, ApiError> {
    let id = run_id(&id)?;
    let opens = request.capture_id.is_none() && request.ranks.is_empty();
    let capture = app.handle.post_stacks(&id, request).await?;
    let status = if opens { StatusCode::ACCEPTED } else { StatusCode::OK };
    Ok((status, Json(capture)).into_response())
}

pub(crate) async fn register_run(
    State(app): State<AppState>,
    headers: HeaderMap,
    JsonBody(draft): JsonBody<RegisterRequest>,
) -> Result<Response, ApiError> {
    let run = NewRun::try_from(draft).map_err(StateError::from)?;
    let minimal = prefers_minimal(&headers).then(|| run.run().id().clone());
    // The body's length sizes the call's deadline: the run is not
    // serialized again to count its bytes.
    let registration = match content_length(&headers) {
        Some(bytes) => app.handle.register_received(run, bytes).await?,
        None => app.handle.register(run).await?,
    };
    let status = if registration.created { StatusCode::CREATED } else { StatusCode::OK };
    let lease_ms = registration.lease.as_millis() as u64;
    if let Some(id) = minimal {
        let answer = RegisterMinimalResponse::new(id, lease_ms, registration.created);
        let mut response = (status, sized_json(&answer, 128)).into_response();
        response.headers_mut().insert(PREFERENCE_APPLIED, HeaderValue::from_static(RETURN_MINIMAL));
        return Ok(response);
    }
    Ok((status, Json(RegisterResponse::new(registration.run, lease_ms, registration.created)))
        .into_response())
}

/// The `Content-Length` of a request, when it has one.
fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// `Preference-Applied` (RFC 7240 §3).
const PREFERENCE_APPLIED: HeaderName = HeaderName::from_static("preference-applied");

/// The preference for an answer without the resource (RFC 7240 §4.2).
const RETURN_MINIMAL: &str = "return=minimal";

/// True when a `Prefer` header asks for `return=minimal` (RFC 7240: the
/// preferences of every `Prefer` header, comma-separated, each possibly
/// with parameters after `;`; names and the token value case-insensitive,
/// the value possibly quoted).
fn prefers_minimal(headers: &HeaderMap) -> bool {
    headers
        .get_all(PREFER)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|preference| preference.split(';').next())
        .filter_map(|preference| preference.split_once('='))
        .any(|(name, value)| {
            name.trim().eq_ignore_ascii_case("return")
                && value.trim().trim_matches('"').eq_ignore_ascii_case("minimal")
        })
}

/// `Prefer` (RFC 7240 §2).
const PREFER: HeaderName = HeaderName::from_static("prefer");

pub(crate) async fn set_status(
    State(app): State<AppState>,
    Path(id): Path<String>,
    JsonBody(request): JsonBody<StatusRequest>,
) -> Result<Json<RunDocument>, ApiError> {
    let id = run_id(&id)?;
    Ok(Json(app.handle.set_status(id, request.into()).await?))
}

pub(crate) async fn start_attempt(
    State(app): State<AppState>,
    Path(id): Path<String>,
    JsonBody(request): JsonBody<AttemptRequest>,
) -> Result<Json<RunDocument>, ApiError> {
    let id = run_id(&id)?;
    let attempt = NewAttempt::try_from(request)?;
    Ok(Json(app.handle.start_attempt(id, attempt).await?))
}

pub(crate) async fn forward_run(
    State(app): State<AppState>,
    grant: Option<Extension<Grant>>,
    Path(id): Path<String>,
    JsonBody(run): JsonBody<TrainRunInfo>,
) -> Result<Json<RunDocument>, ApiError> {
    let id = run_id(&id)?;
    if *run.id() != id {
        return Err(ApiError::invalid("id", "the run's id differs from the path's".to_owned()));
    }
    if let Some(Extension(grant)) = &grant {
        // Whose run the id is on the hub is the actor's to decide: a run is
        // keyed by its cluster and its id, so another cluster's run never
        // stands in the way, and is never changed.
        check_cluster(Some(grant), run.cluster())?;
    }
    Ok(Json(app.handle.forward(run).await?))
}

pub(crate) async fn heartbeat(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    let id = run_id(&id)?;
    let lease = match app.service.heartbeat(&id) {
        Some(lease) => lease,
        None => app.handle.heartbeat(id).await?,
    };
    Ok(Json(HeartbeatResponse::new(lease.as_millis() as u64)))
}

/// A controller's progress report: taken on the connection when the board
/// of the run's current attempt exists (see [`StateService::report_progress`]),
/// else by the actor, which creates it.
pub(crate) async fn report_progress(
    State(app): State<AppState>,
    Path(id): Path<String>,
    JsonBody(report): JsonBody<ProgressReport>,
) -> Result<Json<ProgressResponse>, ApiError> {
    let id = run_id(&id)?;
    report.check().map_err(StateError::from)?;
    if let Some(answer) = app.service.report_progress(&id, &report) {
        return Ok(Json(answer?));
    }
    let ranks = report.ranks.into_iter().map(|entry| (entry.rank, entry.progress)).collect();
    Ok(Json(app.handle.report_progress(&id, report.attempt_id, ranks).await?))
}

pub(crate) async fn delete_run(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    app.handle.delete(run_id(&id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub(crate) async fn schema(
    State(app): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let name = name.strip_suffix(".schema.json").or(name.strip_suffix(".json")).unwrap_or(&name);
    let text = app.documents.schema(name).ok_or_else(|| {
        ApiError::not_found(format!(
            "no wire type named {name:?}; known: {}",
            app.documents.schema_names().join(", ")
        ))
    })?;
    Ok(document(text.to_owned(), "application/schema+json"))
}

pub(crate) async fn openapi(State(app): State<AppState>) -> Response {
    document(app.documents.openapi.clone(), "application/json")
}

pub(crate) async fn version() -> Json<VersionResponse> {
    Json(VersionResponse::new(
        env!("CARGO_PKG_VERSION").to_owned(),
        trainstate_schema::WIRE_SCHEMA_VERSION.to_owned(),
        crate::engine::config::STORE_SCHEMA_VERSION,
    ))
}

pub(crate) async fn links(State(app): State<AppState>) -> Json<LinksResponse> {
    Json(app.config.links.clone())
}

/// `GET /api/notify`: each notification target and how its delivery goes.
pub(crate) async fn notify(
    State(app): State<AppState>,
) -> Json<trainstate_client::api::NotifyResponse> {
    #[cfg(feature = "notify")]
    let targets = {
        let targets = app.service.notify_targets();
        targets.iter().map(|stats| stats.info()).collect()
    };
    #[cfg(not(feature = "notify"))]
    let targets = {
        let _ = app;
        Vec::new()
    };
    Json(trainstate_client::api::NotifyResponse::new(targets))
}

pub(crate) async fn healthz(State(app): State<AppState>) -> Result<Json<HealthResponse>, ApiError> {
    // Never through the actor's mailbox, which a burst of writes may fill:
    // the supervisor has not given up on the actor, and the actor takes
    // turns (its lease sweep comes every period).
    if let Some(err) = app.service.unhealthy() {
        return Err(err.into());
    }
    Ok(Json(HealthResponse::ok()))
}

pub(crate) async fn metrics(State(app): State<AppState>) -> Response {
    let load = super::metrics::HttpLoad {
        streams: app.config.max_subscribers - app.subscribers.available_permits(),
        answer_bytes: app.budget.in_use(),
        request_bodies: app.bodies.bodies(),
        budgeted_body_bytes: app.bodies.charged_bytes(),
    };
    let text = app.metrics.render(&app.service, &load, app.config.prometheus_rank_series);
    let mut response = text.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(super::metrics::CONTENT_TYPE));
    response
}

/// The answer to a path no route has: `no_such_route`, never `not_found`,
/// so that a client whose URL is wrong (a path before `/api`, a typo) is
/// never told that a run does not exist.
pub(crate) async fn no_such_route(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        trainstate_client::api::ErrorCode::NoSuchRoute,
        format!(
            "no such route: {method} {}; the head serves its API under /api at the root of its \
             address (see /openapi.json)",
            trainstate_schema::text::first_chars(uri.path(), 256)
        ),
    )
}

pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        trainstate_client::api::ErrorCode::MethodNotAllowed,
        "this route does not take that method; see /openapi.json",
    )
}
