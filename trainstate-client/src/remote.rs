//! The remote transport of `StateHandle`: the head service's HTTP API.

mod rendezvous;
pub(crate) mod tls;

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;
use trainstate_schema::routes::{HttpMethod, Operation, route};
use trainstate_schema::{RunId, TrainRunInfo, ray_v2};

use crate::api::{
    AttemptRequest, CreateTokenRequest, CreateTokenResponse, ErrorResponse, HeartbeatResponse,
    LinksResponse, ListQuery, ProgressReport, ProgressResponse, RayRunListResponse,
    RegisterResponse, RunListResponse, StatusRequest, TokenInfo, TokenListResponse,
    VersionResponse,
};
use crate::api::{
    GoodputQuery, GoodputResponse, NodeDetailResponse, NodeListResponse, NodeQuery, NodesQuery,
};
use crate::api::{StackCapture, StacksRequest, StacksResponse};
use crate::document::RunDocument;
use crate::error::StateError;
use crate::protocol::{NewAttempt, Registration, StateMessage, StatusUpdate};
use crate::query::{RunPage, RunQuery};

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
    query: Option<ListQuery>,
    /// Query parameters of routes other than the listing's.
    params: Vec<(&'static str, String)>,
    body: Option<Vec<u8>>,
    /// Headers of its own (an idempotency key), sent with every try.
    headers: Vec<(&'static str, String)>,
    run_id: Option<&'a RunId>,
}

impl<'a> Call<'a> {
    /// A request of `operation`: its method and path from the route table,
    /// the path's parameters filled with `params`.
    fn to(operation: Operation, params: &[(&str, &str)], run_id: Option<&'a RunId>) -> Self {
        let route = route(operation);
        let method = match route.method {
            HttpMethod::Get => Method::GET,
            HttpMethod::Post => Method::POST,
            HttpMethod::Put => Method::PUT,
            HttpMethod::Delete => Method::DELETE,
            _ => unreachable!("the API uses no other method"),
        };
        Self {
            method,
            path: route.path_with(params),
            query: None,
            params: Vec::new(),
            body: None,
            headers: Vec::new(),
            run_id,
        }
    }

    /// A request of `operation` on the run `id`.
    fn on_run(operation: Operation, id: &'a RunId) -> Self {
        Self::to(operation, &[("id", id.as_str())], Some(id))
    }

    /// The same request with this JSON body.
    fn body(mut self, body: &impl Serialize) -> Self {
        self.body = Some(serde_json::to_vec(body).expect("API documents serialize"));
        self
    }

    /// The same request with this query.
    fn query(mut self, query: ListQuery) -> Self {
        self.query = Some(query);
        self
    }

    /// The same request with the query parameter `name` when `value` is given.
    fn param(mut self, name: &'static str, value: Option<String>) -> Self {
        if let Some(value) = value {
            self.params.push((name, value));
        }
        self
    }

    /// The same request with the query of a Ray Train V2 write that says
    /// when its change happened
    /// ([`RayWriteQuery`](crate::api::RayWriteQuery)), if it says so.
    fn at(mut self, at_ms: Option<u64>) -> Self {
        if let Some(at) = at_ms {
            self.path.push_str(&format!("?at_ms={at}"));
        }
        self
    }
}

impl Remote {
    pub(crate) fn new(
        base: &str,
        token: Option<String>,
        #[cfg(feature = "rustls")] cas: Option<&tls::TrustedCas>,
    ) -> Result<Self, StateError> {
        let base = base.trim_end_matches('/').to_owned();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(StateError::invalid("url", "must start with http:// or https://"));
        }
        #[cfg(feature = "rustls")]
        let client = tls::client(&base, cas)?;
        #[cfg(not(feature = "rustls"))]
        let client = tls::client(&base)?;
        Ok(Self { base, token, client })
    }

    pub(crate) fn base(&self) -> &str {
        &self.base
    }

    /// Sends `call`, retrying with backoff while the head is unreachable or
    /// busy, until `timeout` has passed. A head whose TLS certificate is not
    /// trusted is answered at once (`unavailable`, saying so), not retried.
    async fn send(&self, call: Call<'_>, timeout: Duration) -> Result<Vec<u8>, StateError> {
        let deadline = Instant::now() + timeout;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let mut request =
                self.client.request(call.method.clone(), format!("{}{}", self.base, call.path));
            if let Some(query) = &call.query {
                request = request.query(query);
            }
            if !call.params.is_empty() {
                request = request.query(&call.params);
            }
            if let Some(token) = &self.token {
                request = request.bearer_auth(token);
            }
            for (name, value) in &call.headers {
                request = request.header(*name, value);
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
                Ok(Err(err)) => {
                    let (reason, final_now) = tls::transport_error(&self.base, &err);
                    if final_now {
                        return Err(StateError::unavailable(reason));
                    }
                    StateError::unavailable(reason)
                }
            };
            if !error.is_retryable() || Instant::now() + backoff >= deadline {
                return Err(error);
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Answers one message of the actor's protocol over HTTP, through the
    /// message's own reply port: the handle dispatches every call here or
    /// to the local actor, in one place.
    pub(crate) async fn answer(&self, message: StateMessage, timeout: Duration) {
        // A caller that gave up has dropped its receiver: nothing to tell it.
        match message {
            StateMessage::Register { run, reply, .. } => {
                let _ = reply.send(self.register(run.run(), timeout).await);
            }
            StateMessage::SetStatus { id, update, reply } => {
                let _ = reply.send(self.set_status(&id, update, timeout).await);
            }
            StateMessage::StartAttempt { id, attempt, reply } => {
                let _ = reply.send(self.start_attempt(&id, attempt, timeout).await);
            }
            StateMessage::UpsertRayRun { run, at_ms, reply } => {
                let _ = reply.send(self.upsert_ray_run(&run, at_ms, timeout).await);
            }
            StateMessage::UpsertRayAttempt { attempt, at_ms, reply } => {
                let _ = reply.send(self.upsert_ray_attempt(&attempt, at_ms, timeout).await);
            }
            StateMessage::Heartbeat { id, reply } => {
                let _ = reply.send(self.heartbeat(&id, timeout).await);
            }
            StateMessage::ReportProgress { id, report, reply } => {
                let _ = reply.send(self.report_progress(&id, &report, timeout).await);
            }
            StateMessage::Get { id, reply } => {
                let _ = reply.send(self.get(&id, timeout).await);
            }
            StateMessage::List { query, reply } => {
                let _ = reply.send(self.list(query, timeout).await);
            }
            StateMessage::Goodput { query, reply } => {
                let _ = reply.send(self.goodput(&query, timeout).await);
            }
            StateMessage::Delete { id, reply } => {
                let _ = reply.send(self.delete(&id, timeout).await);
            }
            StateMessage::Subscribe { reply, .. } => {
                let _ = reply.send(Err(local_only("subscriptions")));
            }
            StateMessage::Forward { run, reply } => {
                let _ = reply.send(self.forward(&run, timeout).await);
            }
            StateMessage::SweepLeases { reply } => {
                let _ = reply.send(Err(local_only("lease sweeps")));
            }
            StateMessage::DecideHealth { reply } => {
                let _ = reply.send(Err(local_only("health decisions")));
            }
            StateMessage::UpsertRayPrepared { reply, .. } => {
                let _ = reply.send(Err(local_only("prepared writes")));
            }
            StateMessage::Rendezvous(message) => self.rendezvous(message, timeout).await,
            StateMessage::GetStacks { id, reply } => {
                let _ = reply.send(self.run_stacks(&id, timeout).await);
            }
            StateMessage::PostStacks { id, request, reply } => {
                let _ = reply.send(self.post_stacks(&id, &request, timeout).await);
            }
        }
    }

    async fn post_stacks(
        &self,
        id: &RunId,
        request: &StacksRequest,
        timeout: Duration,
    ) -> Result<(StackCapture, bool), StateError> {
        let call = Call::on_run(Operation::PostRunStacks, id).body(request);
        let capture: StackCapture = parse(&self.send(call, timeout).await?)?;
        let opened = request.capture_id.is_none() && request.ranks.is_empty();
        Ok((capture, opened))
    }

    async fn run_stacks(
        &self,
        id: &RunId,
        timeout: Duration,
    ) -> Result<StacksResponse, StateError> {
        parse(&self.send(Call::on_run(Operation::GetRunStacks, id), timeout).await?)
    }

    async fn register(
        &self,
        run: &TrainRunInfo,
        timeout: Duration,
    ) -> Result<Registration, StateError> {
        let call = Call::to(Operation::RegisterRun, &[], Some(run.id())).body(run);
        let answer: RegisterResponse<RunDocument> = parse(&self.send(call, timeout).await?)?;
        Ok(Registration::new(answer.run, Duration::from_millis(answer.lease_ms), answer.created))
    }

    async fn set_status(
        &self,
        id: &RunId,
        update: StatusUpdate,
        timeout: Duration,
    ) -> Result<RunDocument, StateError> {
        let body = StatusRequest::from(update);
        let call = Call::on_run(Operation::SetRunStatus, id).body(&body);
        parse(&self.send(call, timeout).await?)
    }

    async fn start_attempt(
        &self,
        id: &RunId,
        attempt: NewAttempt,
        timeout: Duration,
    ) -> Result<RunDocument, StateError> {
        let body = AttemptRequest::from(attempt);
        let call = Call::on_run(Operation::StartRunAttempt, id).body(&body);
        parse(&self.send(call, timeout).await?)
    }

    async fn upsert_ray_run(
        &self,
        run: &ray_v2::TrainRun,
        at_ms: Option<u64>,
        timeout: Duration,
    ) -> Result<RunDocument, StateError> {
        let id = RunId::parse(&run.id).map_err(StateError::from)?;
        let call = Call::on_run(Operation::UpsertRayRun, &id).body(run).at(at_ms);
        parse(&self.send(call, timeout).await?)
    }

    async fn upsert_ray_attempt(
        &self,
        attempt: &ray_v2::TrainRunAttempt,
        at_ms: Option<u64>,
        timeout: Duration,
    ) -> Result<RunDocument, StateError> {
        let id = RunId::parse(&attempt.run_id).map_err(StateError::from)?;
        // The attempt id is the caller's text: encoded as one path segment.
        let params = [("id", id.as_str()), ("attempt_id", attempt.attempt_id.as_str())];
        let call =
            Call::to(Operation::UpsertRayAttempt, &params, Some(&id)).body(attempt).at(at_ms);
        parse(&self.send(call, timeout).await?)
    }

    pub(crate) async fn links(&self, timeout: Duration) -> Result<LinksResponse, StateError> {
        parse(&self.send(Call::to(Operation::GetLinks, &[], None), timeout).await?)
    }

    /// Every try carries the same idempotency key, so a retry after a lost
    /// answer (a timeout, a 503) answers the token the first try created.
    pub(crate) async fn create_token(
        &self,
        request: &CreateTokenRequest,
        idempotency_key: &str,
        timeout: Duration,
    ) -> Result<CreateTokenResponse, StateError> {
        let mut call = Call::to(Operation::CreateToken, &[], None).body(request);
        call.headers.push((crate::api::IDEMPOTENCY_KEY_HEADER, idempotency_key.to_owned()));
        parse(&self.send(call, timeout).await?)
    }

    pub(crate) async fn list_nodes(
        &self,
        query: &NodesQuery,
        timeout: Duration,
    ) -> Result<NodeListResponse, StateError> {
        let call = Call::to(Operation::ListNodes, &[], None)
            .param("since", query.since.clone())
            .param("suspect", query.suspect.map(|s| s.to_string()))
            .param("cluster", query.cluster.clone());
        parse(&self.send(call, timeout).await?)
    }

    pub(crate) async fn get_node(
        &self,
        node: &str,
        query: &NodeQuery,
        timeout: Duration,
    ) -> Result<NodeDetailResponse, StateError> {
        let call = Call::to(Operation::GetNode, &[("node", node)], None)
            .param("since", query.since.clone())
            .param("cluster", query.cluster.clone());
        parse(&self.send(call, timeout).await?)
    }

    pub(crate) async fn goodput(
        &self,
        query: &GoodputQuery,
        timeout: Duration,
    ) -> Result<GoodputResponse, StateError> {
        let call = Call::to(Operation::GetGoodput, &[], None)
            .param("since", query.since.clone())
            .param("by", query.by.map(|by| by.as_str().to_owned()))
            .param("cluster", query.cluster.clone());
        parse(&self.send(call, timeout).await?)
    }

    pub(crate) async fn list_tokens(
        &self,
        timeout: Duration,
    ) -> Result<TokenListResponse, StateError> {
        parse(&self.send(Call::to(Operation::ListTokens, &[], None), timeout).await?)
    }

    pub(crate) async fn revoke_token(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<TokenInfo, StateError> {
        let call = Call::to(Operation::RevokeToken, &[("id", id)], None);
        parse(&self.send(call, timeout).await?)
    }

    pub(crate) async fn version(&self, timeout: Duration) -> Result<VersionResponse, StateError> {
        let bytes = self.send(Call::to(Operation::GetVersion, &[], None), timeout).await?;
        serde_json::from_slice(&bytes).map_err(|_| StateError::Protocol {
            reason: format!(
                "GET {}/api/version answered what is not a trainstate head's version: {}",
                self.base,
                excerpt(&bytes)
            ),
        })
    }

    async fn forward(
        &self,
        run: &TrainRunInfo,
        timeout: Duration,
    ) -> Result<RunDocument, StateError> {
        let id = run.id();
        let call = Call::on_run(Operation::ForwardRun, id).body(run);
        parse(&self.send(call, timeout).await?)
    }

    async fn heartbeat(&self, id: &RunId, timeout: Duration) -> Result<Duration, StateError> {
        let call = Call::on_run(Operation::HeartbeatRun, id);
        let answer: HeartbeatResponse = parse(&self.send(call, timeout).await?)?;
        Ok(Duration::from_millis(answer.lease_ms))
    }

    async fn report_progress(
        &self,
        id: &RunId,
        report: &ProgressReport,
        timeout: Duration,
    ) -> Result<ProgressResponse, StateError> {
        let call = Call::on_run(Operation::ReportProgress, id).body(report);
        parse(&self.send(call, timeout).await?)
    }

    async fn get(&self, id: &RunId, timeout: Duration) -> Result<RunDocument, StateError> {
        let call = Call::on_run(Operation::GetRun, id);
        parse(&self.send(call, timeout).await?)
    }

    async fn delete(&self, id: &RunId, timeout: Duration) -> Result<(), StateError> {
        let call = Call::on_run(Operation::DeleteRun, id);
        self.send(call, timeout).await.map(drop)
    }

    async fn list(&self, query: RunQuery, timeout: Duration) -> Result<RunPage, StateError> {
        let Some(list_query) = query.to_list_query() else {
            if query.has_filters() {
                return Err(StateError::invalid(
                    "limit",
                    "an unpaged listing takes no filters over HTTP",
                ));
            }
            let call = Call::to(Operation::ListRunsRay, &[], None);
            let answer: RayRunListResponse<RunDocument> = parse(&self.send(call, timeout).await?)?;
            let total = answer.train_runs.len() as u64;
            return Ok(RunPage::new(answer.train_runs, None, total as usize));
        };
        let call = Call::to(Operation::ListRuns, &[], None).query(list_query);
        let answer: RunListResponse<RunDocument> = parse(&self.send(call, timeout).await?)?;
        let total = usize::try_from(answer.total).unwrap_or(usize::MAX);
        Ok(RunPage::new(answer.train_runs, answer.next_cursor, total))
    }
}

fn local_only(what: &str) -> StateError {
    StateError::Unsupported {
        reason: format!("{what} are not available over HTTP; use GET /api/train/events"),
    }
}

/// Reads an answer of the API into its type.
fn parse<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, StateError> {
    serde_json::from_slice(bytes).map_err(|e| StateError::Protocol {
        reason: format!("the head answered unreadable JSON: {e}"),
    })
}

/// The typed error of an error answer.
fn error_of(status: StatusCode, bytes: &[u8], run_id: Option<&RunId>) -> StateError {
    match serde_json::from_slice::<ErrorResponse>(bytes) {
        Ok(answer) => StateError::from_error_body(answer.error, run_id),
        // Not the API's error shape: a proxy or another server answered.
        // A 404 of theirs says the URL is wrong, not that a run is missing.
        Err(_) if status == StatusCode::NOT_FOUND => StateError::NoSuchRoute {
            reason: format!("{status} that is not a trainstate error answer: {}", excerpt(bytes)),
        },
        Err(_) if status.is_server_error() => {
            StateError::unavailable(format!("the head answered {status}"))
        }
        Err(_) => StateError::Protocol { reason: format!("the head answered {status}") },
    }
}

/// The start of an answer that is not ours, for a message: its first
/// characters, on one line.
fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(400)]);
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let line = trainstate_schema::text::first_chars(&line, 120);
    if line.is_empty() { "an empty body".to_owned() } else { format!("{line:?}") }
}
