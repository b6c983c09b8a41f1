//! The handlers of the HTTP API. Each answers with a document type of
//! `trainstate_schema::api`, serialized once.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use trainstate_client::api::{
    AttemptRequest, HealthResponse, HeartbeatResponse, LinksResponse, ListQuery,
    RayRunListResponse, RegisterRequest, RegisterResponse, RunListResponse, StatusRequest,
    VersionResponse,
};
use trainstate_client::{NewAttempt, RunDocument, RunQuery, StateError};
use trainstate_schema::{NewRun, RunId, TrainRunInfo, ray_v2};

use super::AppState;
use super::body::{JsonBody, QueryParams};
use super::error::ApiError;

fn run_id(text: &str) -> Result<RunId, ApiError> {
    RunId::parse(text).map_err(|e| ApiError::invalid("id", e.rule().to_string()))
}

/// A document served as it was generated, with its media type.
fn document(text: String, media_type: &'static str) -> Response {
    let mut response = text.into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(media_type));
    response
}

/// An answer serialized once into a buffer of about its size: a listing is
/// mostly its runs' stored text, copied once.
fn sized_json(answer: &impl serde::Serialize, capacity: usize) -> Response {
    let mut body = Vec::with_capacity(capacity);
    serde_json::to_writer(&mut body, answer).expect("API answers serialize");
    ([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response()
}

/// The bytes of a list of runs, about.
fn runs_len(runs: &[RunDocument]) -> usize {
    runs.iter().map(|r| r.approximate_len() + 1).sum::<usize>() + 128
}

pub(crate) async fn list_runs(
    State(app): State<AppState>,
    QueryParams(params): QueryParams<ListQuery>,
) -> Result<Response, ApiError> {
    let page = app.handle.list(RunQuery::try_from(params)?).await?;
    let capacity = runs_len(&page.runs);
    let total = page.total as u64;
    Ok(sized_json(&RunListResponse::new(page.runs, page.next_cursor, total), capacity))
}

/// Ray 2.60's route: every retained run, newest first, unpaged.
pub(crate) async fn list_runs_ray(State(app): State<AppState>) -> Result<Response, ApiError> {
    let page = app.handle.list(RunQuery::all()).await?;
    let capacity = runs_len(&page.runs);
    Ok(sized_json(&RayRunListResponse::new(page.runs), capacity))
}

/// Ray 2.60's Train V2 route: every retained run as a `DecoratedTrainRun`.
pub(crate) async fn list_runs_ray_v2(
    State(app): State<AppState>,
) -> Result<Json<ray_v2::TrainRunsResponse>, ApiError> {
    let page = app.handle.list(RunQuery::all()).await?;
    let runs = page
        .runs
        .iter()
        .map(|doc| doc.parse().map(|run| ray_v2::DecoratedTrainRun::of(&run)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(ray_v2::TrainRunsResponse::new(runs)))
}

pub(crate) async fn upsert_ray_run(
    State(app): State<AppState>,
    Path(id): Path<String>,
    JsonBody(run): JsonBody<ray_v2::TrainRun>,
) -> Result<Json<RunDocument>, ApiError> {
    if run.id != id {
        return Err(ApiError::invalid("id", "must be the run id of the path"));
    }
    Ok(Json(app.handle.upsert_ray_run(run).await?))
}

pub(crate) async fn upsert_ray_attempt(
    State(app): State<AppState>,
    Path((id, attempt_id)): Path<(String, String)>,
    JsonBody(attempt): JsonBody<ray_v2::TrainRunAttempt>,
) -> Result<Json<RunDocument>, ApiError> {
    if attempt.run_id != id {
        return Err(ApiError::invalid("run_id", "must be the run id of the path"));
    }
    if attempt.attempt_id != attempt_id {
        return Err(ApiError::invalid("attempt_id", "must be the attempt id of the path"));
    }
    Ok(Json(app.handle.upsert_ray_attempt(attempt).await?))
}

pub(crate) async fn get_run(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let run = app.handle.get(run_id(&id)?).await?;
    Ok(sized_json(&run, run.approximate_len()))
}

pub(crate) async fn register_run(
    State(app): State<AppState>,
    JsonBody(draft): JsonBody<RegisterRequest>,
) -> Result<(StatusCode, Json<RegisterResponse<RunDocument>>), ApiError> {
    let run = NewRun::try_from(draft).map_err(StateError::from)?;
    let registration = app.handle.register(run).await?;
    let status = if registration.created { StatusCode::CREATED } else { StatusCode::OK };
    let lease_ms = registration.lease.as_millis() as u64;
    Ok((status, Json(RegisterResponse::new(registration.run, lease_ms, registration.created))))
}

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
    Path(id): Path<String>,
    JsonBody(run): JsonBody<TrainRunInfo>,
) -> Result<Json<RunDocument>, ApiError> {
    let id = run_id(&id)?;
    if *run.id() != id {
        return Err(ApiError::invalid("id", "the run's id differs from the path's".to_owned()));
    }
    Ok(Json(app.handle.forward(run).await?))
}

pub(crate) async fn heartbeat(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<HeartbeatResponse>, ApiError> {
    let lease = app.handle.heartbeat(run_id(&id)?).await?;
    Ok(Json(HeartbeatResponse::new(lease.as_millis() as u64)))
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
        crate::STORE_SCHEMA_VERSION,
    ))
}

pub(crate) async fn links(State(app): State<AppState>) -> Json<LinksResponse> {
    Json(app.config.links.clone())
}

pub(crate) async fn healthz(State(app): State<AppState>) -> Result<Json<HealthResponse>, ApiError> {
    // The actor answers a cheap read: it is alive and not wedged.
    app.handle.list(RunQuery::new().limit(1)).await?;
    Ok(Json(HealthResponse::ok()))
}

pub(crate) async fn metrics(State(app): State<AppState>) -> Response {
    let text = app.metrics.render(&app.service);
    let mut response = text.into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(super::metrics::CONTENT_TYPE));
    response
}

pub(crate) async fn not_found() -> ApiError {
    ApiError::not_found("no such route; see /openapi.json")
}

pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        trainstate_client::api::ErrorCode::MethodNotAllowed,
        "this route does not take that method; see /openapi.json",
    )
}
