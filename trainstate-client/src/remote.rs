//! The remote transport of `StateHandle`: the head service's HTTP API.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::time::Instant;
use trainstate_schema::{RunId, RunStatus, TrainRunInfo};

use crate::api::{AttemptRequest, ErrorResponse, HeartbeatResponse, StatusRequest};
use crate::error::StateError;
use crate::protocol::{NewAttempt, Registration, RunDocument, StatusUpdate};
use crate::query::{Cursor, RunPage, RunQuery};

/// The first wait before retrying; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

pub(crate) struct Remote {
    base: String,
    token: Option<String>,
    client: reqwest::Client,
}

/// A request of the API. Every write of the API is idempotent, so every
/// request may be retried.
struct Call<'a> {
    method: Method,
    path: String,
    query: Vec<(&'static str, String)>,
    body: Option<Vec<u8>>,
    run_id: Option<&'a RunId>,
}

impl Remote {
    pub(crate) fn new(base: &str, token: Option<String>) -> Result<Self, StateError> {
        let base = base.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(StateError::invalid("url", "must start with http:// or https://"));
        }
        let client = reqwest::Client::builder()
            .build()
            .map_err(|e| StateError::unavailable(format!("cannot build an HTTP client: {e}")))?;
        Ok(Self { base, token, client })
    }

    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// Sends `call`, retrying with backoff while the head is unreachable or
    /// busy, until `timeout` has passed.
    async fn send(&self, call: Call<'_>, timeout: Duration) -> Result<Vec<u8>, StateError> {
        let deadline = Instant::now() + timeout;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let mut request = self
                .client
                .request(call.method.clone(), format!("{}{}", self.base, call.path))
                .query(&call.query);
            if let Some(token) = &self.token {
                request = request.bearer_auth(token);
            }
            if let Some(body) = &call.body {
                request = request.header("content-type", "application/json").body(body.clone());
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            let attempt = tokio::time::timeout(remaining, async {
                let response = request.send().await?;
                let status = response.status();
                let bytes = response.bytes().await?;
                Ok::<_, reqwest::Error>((status, bytes))
            })
            .await;
            let error = match attempt {
                Err(_) => return Err(StateError::Timeout { after: timeout }),
                Ok(Ok((status, bytes))) if status.is_success() => return Ok(bytes.to_vec()),
                Ok(Ok((status, bytes))) => error_of(status, &bytes, call.run_id),
                Ok(Err(err)) => StateError::unavailable(format!("{}: {err}", self.base)),
            };
            let retryable =
                matches!(error, StateError::Unavailable { .. } | StateError::Overloaded { .. });
            if !retryable || Instant::now() + backoff >= deadline {
                return Err(error);
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    pub(crate) async fn register(
        &self,
        run: &TrainRunInfo,
        timeout: Duration,
    ) -> Result<Registration, StateError> {
        #[derive(Deserialize)]
        struct Answer {
            run: Box<RawValue>,
            lease_ms: u64,
            created: bool,
        }
        let body = serde_json::to_vec(run).expect("a run serializes");
        let call = Call {
            method: Method::POST,
            path: "/api/train/runs".into(),
            query: vec![],
            body: Some(body),
            run_id: Some(run.id()),
        };
        let answer: Answer = parse(&self.send(call, timeout).await?)?;
        Ok(Registration::new(
            document(&answer.run),
            Duration::from_millis(answer.lease_ms),
            answer.created,
        ))
    }

    pub(crate) async fn set_status(
        &self,
        id: &RunId,
        update: StatusUpdate,
        timeout: Duration,
    ) -> Result<RunDocument, StateError> {
        let body = serde_json::to_vec(&StatusRequest::from(update)).expect("serializes");
        let call = Call {
            method: Method::POST,
            path: format!("/api/train/runs/{id}/status"),
            query: vec![],
            body: Some(body),
            run_id: Some(id),
        };
        run_document(&self.send(call, timeout).await?)
    }

    pub(crate) async fn start_attempt(
        &self,
        id: &RunId,
        attempt: NewAttempt,
        timeout: Duration,
    ) -> Result<RunDocument, StateError> {
        let body = serde_json::to_vec(&AttemptRequest::from(attempt)).expect("serializes");
        let call = Call {
            method: Method::POST,
            path: format!("/api/train/runs/{id}/attempts"),
            query: vec![],
            body: Some(body),
            run_id: Some(id),
        };
        run_document(&self.send(call, timeout).await?)
    }

    pub(crate) async fn heartbeat(
        &self,
        id: &RunId,
        timeout: Duration,
    ) -> Result<Duration, StateError> {
        let call = Call {
            method: Method::POST,
            path: format!("/api/train/runs/{id}/heartbeat"),
            query: vec![],
            body: Some(b"{}".to_vec()),
            run_id: Some(id),
        };
        let answer: HeartbeatResponse = parse(&self.send(call, timeout).await?)?;
        Ok(Duration::from_millis(answer.lease_ms))
    }

    pub(crate) async fn get(
        &self,
        id: &RunId,
        timeout: Duration,
    ) -> Result<RunDocument, StateError> {
        let call = Call {
            method: Method::GET,
            path: format!("/api/train/runs/{id}"),
            query: vec![],
            body: None,
            run_id: Some(id),
        };
        run_document(&self.send(call, timeout).await?)
    }

    pub(crate) async fn delete(&self, id: &RunId, timeout: Duration) -> Result<(), StateError> {
        let call = Call {
            method: Method::DELETE,
            path: format!("/api/train/runs/{id}"),
            query: vec![],
            body: None,
            run_id: Some(id),
        };
        self.send(call, timeout).await.map(drop)
    }

    pub(crate) async fn list(
        &self,
        query: RunQuery,
        timeout: Duration,
    ) -> Result<RunPage, StateError> {
        #[derive(Deserialize)]
        struct Answer {
            train_runs: Vec<Box<RawValue>>,
            #[serde(default)]
            next_cursor: Option<String>,
            #[serde(default)]
            total: Option<usize>,
        }
        let (path, mut params) = match query.limit {
            Some(limit) => ("/api/train/runs", vec![("limit", limit.to_string())]),
            None => ("/api/train/v2/runs", vec![]),
        };
        if query.limit.is_some() {
            if !query.statuses.is_empty() {
                let statuses: Vec<&str> = query.statuses.iter().map(|s| s.as_str()).collect();
                params.push(("status", statuses.join(",")));
            }
            let optional = [
                ("job_id", query.job_id),
                ("name", query.name_contains),
                ("node_id", query.node_id),
                ("node_ip", query.node_ip),
                ("cursor", query.cursor.map(|c| c.encode())),
            ];
            params.extend(optional.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));
        } else if !query.statuses.is_empty()
            || query.job_id.is_some()
            || query.name_contains.is_some()
            || query.node_id.is_some()
            || query.node_ip.is_some()
        {
            return Err(StateError::invalid(
                "limit",
                "an unpaged listing takes no filters over HTTP",
            ));
        }
        let call = Call {
            method: Method::GET,
            path: path.into(),
            query: params,
            body: None,
            run_id: None,
        };
        let answer: Answer = parse(&self.send(call, timeout).await?)?;
        let total = answer.total.unwrap_or(answer.train_runs.len());
        let next_cursor = answer.next_cursor.as_deref().map(Cursor::decode).transpose()?;
        let runs = answer.train_runs.iter().map(|raw| document(raw)).collect();
        Ok(RunPage::new(runs, next_cursor, total))
    }
}

fn parse<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, StateError> {
    serde_json::from_slice(bytes)
        .map_err(|e| StateError::unavailable(format!("the head answered unreadable JSON: {e}")))
}

fn document(raw: &RawValue) -> RunDocument {
    RunDocument::new(raw.get().into(), None)
}

fn run_document(bytes: &[u8]) -> Result<RunDocument, StateError> {
    let raw: Box<RawValue> = parse(bytes)?;
    Ok(document(&raw))
}

/// The typed error of an error answer.
fn error_of(status: StatusCode, bytes: &[u8], run_id: Option<&RunId>) -> StateError {
    let Ok(ErrorResponse { error }) = serde_json::from_slice::<ErrorResponse>(bytes) else {
        return StateError::unavailable(format!("the head answered {status}"));
    };
    let id = || run_id.cloned().unwrap_or_else(|| RunId::parse("unknown").expect("valid"));
    match error.code.as_str() {
        "not_found" if run_id.is_some() => StateError::NotFound { id: id() },
        "conflict" => StateError::Conflict { id: id(), reason: error.message },
        "illegal_transition" => StateError::IllegalTransition {
            id: id(),
            from: error.from.unwrap_or(RunStatus::Running),
            to: error.to.unwrap_or(RunStatus::Running),
            reason: error.message,
        },
        "overloaded" | "too_many_subscribers" => StateError::Overloaded { in_flight: 0 },
        "unauthorized" => StateError::Unauthorized { reason: error.message },
        "invalid" | "bad_request" | "unsupported_media_type" | "payload_too_large" => {
            StateError::Invalid {
                field: error.field.unwrap_or_else(|| "body".into()),
                message: error.message,
            }
        }
        _ => StateError::unavailable(format!("the head answered {status}: {}", error.message)),
    }
}
