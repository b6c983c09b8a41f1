//! The handlers of the HTTP API.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use trainstate_client::api::{StatusRequest, VersionResponse};
use trainstate_client::{Cursor, NewAttempt, RunDocument, RunQuery};
use trainstate_schema::{
    RunId, RunStatus, TrainRunInfoDraft, TrainWorkerInfo, TrainWorkerInfoDraft,
};

use super::AppState;
use super::body::{JsonBody, QueryParams};
use super::error::ApiError;

/// A JSON answer from text built without a second serialization.
fn json_text(status: StatusCode, text: String) -> Response {
    let mut response = (status, text).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn run_id(text: &str) -> Result<RunId, ApiError> {
    RunId::parse(text).map_err(|e| ApiError::invalid("id", e.rule().to_string()))
}

/// Appends `{"train_runs":[...]` (without the closing brace) to `out`.
fn write_train_runs(out: &mut String, runs: &[RunDocument]) {
    out.push_str("{\"train_runs\":");
    RunDocument::write_json_list(out, runs);
}

#[derive(Debug, Deserialize)]
pub(crate) struct ListParams {
    status: Option<String>,
    job_id: Option<String>,
    name: Option<String>,
    node_id: Option<String>,
    node_ip: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

pub(crate) async fn list_runs(
    State(app): State<AppState>,
    QueryParams(params): QueryParams<ListParams>,
) -> Result<Response, ApiError> {
    let mut query = RunQuery::new();
    if let Some(statuses) = params.status.filter(|s| !s.is_empty()) {
        query.statuses = statuses
            .split(',')
            .map(|s| {
                RunStatus::parse(s.trim()).ok_or_else(|| {
                    ApiError::invalid(
                        "status",
                        format!("unknown status {s:?}: use RUNNING, FINISHED, ERRORED or ABORTED"),
                    )
                })
            })
            .collect::<Result<_, _>>()?;
    }
    query.job_id = params.job_id;
    query.name_contains = params.name;
    query.node_id = params.node_id;
    query.node_ip = params.node_ip;
    if let Some(limit) = params.limit {
        let limit = limit
            .parse::<usize>()
            .map_err(|_| ApiError::invalid("limit", "must be an integer between 1 and 1000"))?;
        query.limit = Some(limit);
    }
    if let Some(cursor) = params.cursor {
        query.cursor = Some(Cursor::decode(&cursor)?);
    }
    let page = app.handle.list(query).await?;
    let mut out =
        String::with_capacity(page.runs.iter().map(|r| r.body().len() + 1).sum::<usize>() + 64);
    write_train_runs(&mut out, &page.runs);
    out.push_str(",\"next_cursor\":");
    match page.next_cursor {
        Some(cursor) => {
            out.push('"');
            out.push_str(&cursor.encode());
            out.push('"');
        }
        None => out.push_str("null"),
    }
    out.push_str(&format!(",\"total\":{}}}", page.total));
    Ok(json_text(StatusCode::OK, out))
}

/// Ray 2.60's route: every retained run, newest first, unpaged.
pub(crate) async fn list_runs_ray(State(app): State<AppState>) -> Result<Response, ApiError> {
    let page = app.handle.list(RunQuery::all()).await?;
    let mut out =
        String::with_capacity(page.runs.iter().map(|r| r.body().len() + 1).sum::<usize>() + 32);
    write_train_runs(&mut out, &page.runs);
    out.push('}');
    Ok(json_text(StatusCode::OK, out))
}

pub(crate) async fn get_run(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let run = app.handle.get(run_id(&id)?).await?;
    Ok(json_text(StatusCode::OK, run.to_json()))
}

pub(crate) async fn register_run(
    State(app): State<AppState>,
    JsonBody(mut draft): JsonBody<TrainRunInfoDraft>,
) -> Result<Response, ApiError> {
    crate::state::prepare_registration(&mut draft);
    let run = draft.validate().map_err(|e| ApiError::invalid(e.field(), e.rule().to_string()))?;
    let registration = app.handle.register(run).await?;
    let mut out = String::from("{\"run\":");
    registration.run.write_json(&mut out);
    out.push_str(&format!(
        ",\"lease_ms\":{},\"created\":{}}}",
        registration.lease.as_millis(),
        registration.created
    ));
    let status = if registration.created { StatusCode::CREATED } else { StatusCode::OK };
    Ok(json_text(status, out))
}

pub(crate) async fn set_status(
    State(app): State<AppState>,
    Path(id): Path<String>,
    JsonBody(request): JsonBody<StatusRequest>,
) -> Result<Response, ApiError> {
    let id = run_id(&id)?;
    let run = app.handle.set_status(id, request.into()).await?;
    Ok(json_text(StatusCode::OK, run.to_json()))
}

/// Body of `POST .../attempts`, read as drafts so a broken rule names its path.
#[derive(Debug, Deserialize)]
pub(crate) struct AttemptBody {
    attempt_id: String,
    start_time_ms: u64,
    workers: Vec<TrainWorkerInfoDraft>,
}

pub(crate) async fn start_attempt(
    State(app): State<AppState>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<AttemptBody>,
) -> Result<Response, ApiError> {
    let id = run_id(&id)?;
    let workers = body
        .workers
        .into_iter()
        .enumerate()
        .map(|(i, draft)| {
            TrainWorkerInfo::try_from(draft).map_err(|e| {
                ApiError::invalid(format!("workers[{i}].{}", e.field()), e.rule().to_string())
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let attempt = NewAttempt::new(body.attempt_id, body.start_time_ms, workers);
    let run = app.handle.start_attempt(id, attempt).await?;
    Ok(json_text(StatusCode::OK, run.to_json()))
}

pub(crate) async fn heartbeat(
    State(app): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let lease = app.handle.heartbeat(run_id(&id)?).await?;
    Ok(json_text(StatusCode::OK, format!("{{\"lease_ms\":{}}}", lease.as_millis())))
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
    let mut response = json_text(StatusCode::OK, text.to_owned());
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/schema+json"));
    Ok(response)
}

pub(crate) async fn openapi(State(app): State<AppState>) -> Response {
    json_text(StatusCode::OK, app.documents.openapi.clone())
}

pub(crate) async fn version() -> Json<VersionResponse> {
    Json(VersionResponse::new(
        env!("CARGO_PKG_VERSION").to_owned(),
        trainstate_schema::WIRE_SCHEMA_VERSION.to_owned(),
        crate::STORE_SCHEMA_VERSION,
    ))
}

pub(crate) async fn healthz(State(app): State<AppState>) -> Result<Response, ApiError> {
    // The actor answers a cheap read: it is alive and not wedged.
    app.handle.list(RunQuery::new().limit(1)).await?;
    Ok(json_text(StatusCode::OK, "{\"status\":\"ok\"}".to_owned()))
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
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method; see /openapi.json",
    )
}
