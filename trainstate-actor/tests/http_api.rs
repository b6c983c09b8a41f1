//! The HTTP API through a real socket: every endpoint's success path, every
//! error code, and a table of hostile requests that store nothing.

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use trainstate_actor::StateConfig;
use trainstate_actor::http::HttpConfig;
use trainstate_schema::RunId;

use crate::common::{Server, run_with, unique_name};
use crate::contract::send;

const T0: u64 = 1_760_000_000_000;

fn run_json(id: &RunId, name: &str) -> Value {
    serde_json::to_value(run_with(id, name, "job1", T0, 4)).unwrap()
}

async fn server(http: HttpConfig) -> Server {
    Server::start(StateConfig::in_memory().with_name(unique_name("http")), http).await
}

fn json_body(value: &Value) -> Option<(&'static str, Vec<u8>)> {
    Some(("application/json", serde_json::to_vec(value).unwrap()))
}

#[tokio::test]
async fn every_endpoint_answers_its_success_path() {
    let server = server(HttpConfig::default()).await;
    let client = Client::new();
    let url = |path: &str| format!("{}{path}", server.url);
    let id = RunId::new_v7();

    let (status, body) =
        send(&client, Method::POST, &url("/api/train/runs"), json_body(&run_json(&id, "a")), None)
            .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(body["created"], true);
    assert_eq!(body["lease_ms"], 60_000);
    assert_eq!(body["run"]["id"], id.as_str());
    let (status, body) =
        send(&client, Method::POST, &url("/api/train/runs"), json_body(&run_json(&id, "a")), None)
            .await;
    assert_eq!((status, &body["created"]), (StatusCode::OK, &json!(false)));

    let (status, body) =
        send(&client, Method::GET, &url(&format!("/api/train/runs/{id}")), None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["name"], "a");
    assert!(body["last_heartbeat_ms"].is_u64(), "live runs carry their last heartbeat");

    let other = RunId::new_v7();
    send(&client, Method::POST, &url("/api/train/runs"), json_body(&run_json(&other, "b")), None)
        .await;
    let (status, body) =
        send(&client, Method::GET, &url("/api/train/runs?limit=1"), None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["total"], 2);
    assert_eq!(body["train_runs"].as_array().unwrap().len(), 1);
    let cursor = body["next_cursor"].as_str().unwrap().to_owned();
    let (_, body) = send(
        &client,
        Method::GET,
        &url(&format!("/api/train/runs?limit=1&cursor={cursor}")),
        None,
        None,
    )
    .await;
    assert_eq!(body["train_runs"].as_array().unwrap().len(), 1);
    assert!(body["next_cursor"].is_null());
    let (status, body) = send(&client, Method::GET, &url("/api/train/v2/runs"), None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.as_object().unwrap().keys().collect::<Vec<_>>(), ["train_runs"]);
    assert_eq!(body["train_runs"].as_array().unwrap().len(), 2);

    let attempt = json!({"attempt_id": "1", "start_time_ms": T0 + 10, "workers": run_json(&id, "a")["workers"]});
    let (status, body) = send(
        &client,
        Method::POST,
        &url(&format!("/api/train/runs/{id}/attempts")),
        json_body(&attempt),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["attempts"].as_array().unwrap().len(), 2);
    let (status, body) =
        send(&client, Method::POST, &url(&format!("/api/train/runs/{id}/heartbeat")), None, None)
            .await;
    assert_eq!((status, &body["lease_ms"]), (StatusCode::OK, &json!(60_000)));
    let finish = json!({"status": "FINISHED"});
    let (status, body) = send(
        &client,
        Method::POST,
        &url(&format!("/api/train/runs/{id}/status")),
        json_body(&finish),
        None,
    )
    .await;
    assert_eq!((status, &body["run_status"]), (StatusCode::OK, &json!("FINISHED")));
    assert!(body["end_time_ms"].is_u64());
    let (status, _) =
        send(&client, Method::DELETE, &url(&format!("/api/train/runs/{id}")), None, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) =
        send(&client, Method::GET, &url(&format!("/api/train/runs/{id}")), None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas");
    let served =
        client.get(url("/api/schemas/TrainRunInfo")).send().await.unwrap().text().await.unwrap();
    assert_eq!(served, std::fs::read_to_string(root.join("TrainRunInfo.schema.json")).unwrap());
    let served = client.get(url("/openapi.json")).send().await.unwrap().text().await.unwrap();
    assert_eq!(served, std::fs::read_to_string(root.join("openapi.json")).unwrap());
    let (status, _) = send(&client, Method::GET, &url("/api/schemas/Nope"), None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    let (status, body) = send(&client, Method::GET, &url("/healthz"), None, None).await;
    assert_eq!((status, &body["status"]), (StatusCode::OK, &json!("ok")));
    let (_, body) = send(&client, Method::GET, &url("/api/version"), None, None).await;
    assert_eq!(body["wire_schema_version"], trainstate_schema::WIRE_SCHEMA_VERSION);
    let metrics = client.get(url("/metrics")).send().await.unwrap();
    // Prometheus text exposition, version 0.0.4: what a scraper expects to parse.
    assert_eq!(metrics.headers()["content-type"], "text/plain; version=0.0.4; charset=utf-8");
    let metrics = metrics.text().await.unwrap();
    for name in [
        "trainstate_runs{status=\"RUNNING\"} 1",
        "trainstate_http_requests_total{route=\"/api/train/runs\",code=\"201\"} 2",
        "trainstate_http_request_duration_seconds_bucket",
        "trainstate_store_commits_total",
        "trainstate_store_writes_total",
        "trainstate_events_subscribers 0",
    ] {
        assert!(metrics.contains(name), "metrics lack {name}:\n{metrics}");
    }
    server.stop().await;
}

type Case = (
    &'static str,
    Method,
    String,
    Option<(&'static str, Vec<u8>)>,
    StatusCode,
    &'static str,
    Option<&'static str>,
);

#[tokio::test]
async fn hostile_requests_get_the_right_status_and_store_nothing() {
    let server = server(HttpConfig::default().with_max_body_bytes(256 * 1024)).await;
    let client = Client::new();
    let live = RunId::new_v7();
    let ended = RunId::new_v7();
    for id in [&live, &ended] {
        let (status, _) = send(
            &client,
            Method::POST,
            &format!("{}/api/train/runs", server.url),
            json_body(&run_json(id, "base")),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::CREATED);
    }
    send(
        &client,
        Method::POST,
        &format!("{}/api/train/runs/{ended}/status", server.url),
        json_body(&json!({"status": "FINISHED"})),
        None,
    )
    .await;
    let before = client
        .get(format!("{}/api/train/v2/runs", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();

    let fresh = RunId::new_v7();
    let with = |mutate: &dyn Fn(&mut Value)| {
        let mut doc = run_json(&fresh, "fresh");
        mutate(&mut doc);
        json_body(&doc)
    };
    let raw = |bytes: &[u8]| Some(("application/json", bytes.to_vec()));
    let runs = "/api/train/runs".to_owned();
    let deep = format!("{}{}", "[".repeat(5000), "]".repeat(5000));
    let deep_workers =
        format!("{{\"name\":\"x\",\"workers\":{}{}}}", "[".repeat(5000), "]".repeat(5000));
    let mut bad_utf8 = serde_json::to_vec(&run_json(&fresh, "NAME")).unwrap();
    let at = bad_utf8.windows(4).position(|w| w == b"NAME").unwrap();
    bad_utf8[at] = 0xff;
    let duplicate_key = {
        let text = serde_json::to_string(&run_json(&fresh, "dup")).unwrap();
        text.replacen("\"name\":\"dup\"", "\"name\":\"dup\",\"name\":\"again\"", 1).into_bytes()
    };
    let huge = vec![b' '; 300 * 1024];
    let live_path = |suffix: &str| format!("/api/train/runs/{live}{suffix}");
    let unknown = RunId::new_v7();

    let cases: Vec<Case> = vec![
        (
            "no content type",
            Method::POST,
            runs.clone(),
            Some(("", b"{}".to_vec())),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            None,
        ),
        (
            "text content type",
            Method::POST,
            runs.clone(),
            Some(("text/plain", b"{}".to_vec())),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            None,
        ),
        (
            "truncated JSON",
            Method::POST,
            runs.clone(),
            raw(b"{\"name\":"),
            StatusCode::BAD_REQUEST,
            "bad_request",
            None,
        ),
        (
            "not JSON",
            Method::POST,
            runs.clone(),
            raw(b"hello"),
            StatusCode::BAD_REQUEST,
            "bad_request",
            None,
        ),
        (
            "bad UTF-8",
            Method::POST,
            runs.clone(),
            Some(("application/json", bad_utf8)),
            StatusCode::BAD_REQUEST,
            "bad_request",
            None,
        ),
        (
            "deep nesting",
            Method::POST,
            runs.clone(),
            raw(deep.as_bytes()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            None,
        ),
        (
            "deep nesting in a field",
            Method::POST,
            runs.clone(),
            raw(deep_workers.as_bytes()),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("workers[0]"),
        ),
        (
            "oversize body",
            Method::POST,
            runs.clone(),
            Some(("application/json", huge)),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            None,
        ),
        (
            "a list, not a run",
            Method::POST,
            runs.clone(),
            raw(b"[]"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("body"),
        ),
        (
            "null",
            Method::POST,
            runs.clone(),
            raw(b"null"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("body"),
        ),
        (
            "missing fields",
            Method::POST,
            runs.clone(),
            raw(b"{}"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("body"),
        ),
        (
            "pid as a string",
            Method::POST,
            runs.clone(),
            with(&|d| d["workers"][0]["pid"] = json!("4000")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("workers[0].pid"),
        ),
        (
            "pid as a float",
            Method::POST,
            runs.clone(),
            with(&|d| d["workers"][0]["pid"] = json!(4000.0)),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("workers[0].pid"),
        ),
        (
            "negative rank",
            Method::POST,
            runs.clone(),
            with(&|d| d["workers"][1]["world_rank"] = json!(-1)),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("workers[1].world_rank"),
        ),
        (
            "duplicate ranks",
            Method::POST,
            runs.clone(),
            with(&|d| d["workers"][1]["world_rank"] = json!(0)),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("workers[1].world_rank"),
        ),
        (
            "huge name",
            Method::POST,
            runs.clone(),
            with(&|d| d["name"] = json!("n".repeat(5000))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("name"),
        ),
        (
            "control char in job id",
            Method::POST,
            runs.clone(),
            with(&|d| d["job_id"] = json!("a\u{1b}b")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("job_id"),
        ),
        (
            "slash in run id",
            Method::POST,
            runs.clone(),
            with(&|d| d["id"] = json!("a/b")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("id"),
        ),
        (
            "bad node ip",
            Method::POST,
            runs.clone(),
            with(&|d| d["workers"][0]["node_ip"] = json!("localhost")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("workers[0].node_ip"),
        ),
        (
            "running with an end time",
            Method::POST,
            runs.clone(),
            with(&|d| d["end_time_ms"] = json!(T0 + 1)),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("end_time_ms"),
        ),
        (
            "duplicate key",
            Method::POST,
            runs.clone(),
            Some(("application/json", duplicate_key)),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            None,
        ),
        (
            "re-register with other metadata",
            Method::POST,
            runs.clone(),
            json_body(&run_json(&live, "renamed")),
            StatusCode::CONFLICT,
            "conflict",
            None,
        ),
        (
            "status of an unknown run",
            Method::POST,
            format!("/api/train/runs/{unknown}/status"),
            json_body(&json!({"status": "FINISHED"})),
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        ),
        (
            "unknown status",
            Method::POST,
            live_path("/status"),
            json_body(&json!({"status": "PENDING"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("status"),
        ),
        (
            "status body not JSON",
            Method::POST,
            live_path("/status"),
            raw(b"FINISHED"),
            StatusCode::BAD_REQUEST,
            "bad_request",
            None,
        ),
        (
            "a cause on FINISHED",
            Method::POST,
            live_path("/status"),
            json_body(&json!({"status": "FINISHED", "cause": {"kind": "USER_ERROR"}})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("cause"),
        ),
        (
            "ended run back to ERRORED",
            Method::POST,
            format!("/api/train/runs/{ended}/status"),
            json_body(&json!({"status": "ERRORED"})),
            StatusCode::CONFLICT,
            "illegal_transition",
            None,
        ),
        (
            "attempt of an unknown run",
            Method::POST,
            format!("/api/train/runs/{unknown}/attempts"),
            json_body(&json!({"attempt_id": "1", "start_time_ms": T0, "workers": []})),
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        ),
        (
            "attempt with pid 0",
            Method::POST,
            live_path("/attempts"),
            json_body(&{
                let mut w = run_json(&live, "x")["workers"].clone();
                w[0]["pid"] = json!(0);
                json!({"attempt_id": "1", "start_time_ms": T0 + 1, "workers": w})
            }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("workers[0].pid"),
        ),
        (
            "attempt of an ended run",
            Method::POST,
            format!("/api/train/runs/{ended}/attempts"),
            json_body(&json!({"attempt_id": "9", "start_time_ms": T0 + 1, "workers": []})),
            StatusCode::CONFLICT,
            "illegal_transition",
            None,
        ),
        (
            "heartbeat of an unknown run",
            Method::POST,
            format!("/api/train/runs/{unknown}/heartbeat"),
            None,
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        ),
        (
            "heartbeat of an ended run",
            Method::POST,
            format!("/api/train/runs/{ended}/heartbeat"),
            None,
            StatusCode::CONFLICT,
            "illegal_transition",
            None,
        ),
        (
            "malformed id in the path",
            Method::GET,
            "/api/train/runs/a%20b".into(),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("id"),
        ),
        (
            "unknown id",
            Method::GET,
            format!("/api/train/runs/{unknown}"),
            None,
            StatusCode::NOT_FOUND,
            "not_found",
            None,
        ),
        (
            "limit zero",
            Method::GET,
            "/api/train/runs?limit=0".into(),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("limit"),
        ),
        (
            "limit not a number",
            Method::GET,
            "/api/train/runs?limit=ten".into(),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("limit"),
        ),
        (
            "limit over 1,000",
            Method::GET,
            "/api/train/runs?limit=5000".into(),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("limit"),
        ),
        (
            "unknown status filter",
            Method::GET,
            "/api/train/runs?status=RUNNING,PENDING".into(),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("status"),
        ),
        (
            "forged cursor",
            Method::GET,
            "/api/train/runs?cursor=zz".into(),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("cursor"),
        ),
        (
            "bad last event id",
            Method::GET,
            "/api/train/events?last_event_id=abc".into(),
            None,
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
            Some("last_event_id"),
        ),
        (
            "delete a live run",
            Method::DELETE,
            live_path(""),
            None,
            StatusCode::CONFLICT,
            "illegal_transition",
            None,
        ),
        (
            "wrong method",
            Method::PUT,
            runs.clone(),
            json_body(&json!({})),
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            None,
        ),
        (
            "unknown route",
            Method::GET,
            "/api/train/nothing".into(),
            None,
            StatusCode::NOT_FOUND,
            "no_such_route",
            None,
        ),
    ];
    assert!(cases.len() >= 30);
    for (what, method, path, body, expected, code, field) in cases {
        let (status, answer) =
            send(&client, method, &format!("{}{path}", server.url), body, None).await;
        assert_eq!(status, expected, "{what}: {answer}");
        assert_eq!(answer["error"]["code"], code, "{what}: {answer}");
        assert!(answer["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}");
        if let Some(field) = field {
            assert_eq!(answer["error"]["field"], field, "{what}: {answer}");
        }
    }
    // Nothing partial was stored, and the server still serves.
    let after = client
        .get(format!("{}/api/train/v2/runs", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(without_live_goodput(&after), without_live_goodput(&before));
    let (status, _) =
        send(&client, Method::GET, &format!("{}/healthz", server.url), None, None).await;
    assert_eq!(status, StatusCode::OK);
    server.stop().await;
}

#[tokio::test]
async fn a_token_protects_writes_and_optionally_reads() {
    let server = server(HttpConfig::default().with_token(Some("s3cret".into()))).await;
    let client = Client::new();
    let runs = format!("{}/api/train/runs", server.url);
    let id = RunId::new_v7();
    for token in [None, Some("wrong"), Some("s3cret2")] {
        let (status, body) =
            send(&client, Method::POST, &runs, json_body(&run_json(&id, "t")), token).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}");
        assert_eq!(body["error"]["code"], "unauthorized");
    }
    let (status, _) = send(&client, Method::GET, &runs, None, None).await;
    assert_eq!(status, StatusCode::OK, "reads are open unless protected");
    let (status, _) =
        send(&client, Method::POST, &runs, json_body(&run_json(&id, "t")), Some("s3cret")).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _) = send(&client, Method::DELETE, &format!("{runs}/{id}"), None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    server.stop().await;

    let server = server_protected().await;
    let runs = format!("{}/api/train/runs", server.url);
    let (status, _) = send(&client, Method::GET, &runs, None, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = send(&client, Method::GET, &runs, None, Some("s3cret")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) =
        send(&client, Method::GET, &format!("{runs}?access_token=s3cret"), None, None).await;
    assert_eq!(status, StatusCode::OK, "a browser's EventSource passes the token in the query");
    let page = client.get(format!("{}/", server.url)).send().await.unwrap();
    assert_eq!(
        page.status(),
        StatusCode::OK,
        "the page itself is open so it can ask for the token"
    );
    server.stop().await;
}

async fn server_protected() -> Server {
    server(HttpConfig::default().with_token(Some("s3cret".into())).with_protected_reads(true)).await
}

#[tokio::test]
async fn the_remote_handle_speaks_the_same_api() {
    let server = server(HttpConfig::default()).await;
    let remote = trainstate_client::StateHandle::connect(&server.url, None).unwrap();
    let id = RunId::new_v7();
    let run = run_with(&id, "remote", "job1", T0, 4);
    assert!(remote.register(run.clone()).await.unwrap().created);
    assert!(!remote.register(run).await.unwrap().created);
    remote.heartbeat(id.clone()).await.unwrap();
    let page = remote.list(trainstate_client::RunQuery::new()).await.unwrap();
    assert_eq!(page.total, 1);
    let finished = remote
        .set_status(id.clone(), trainstate_client::StatusUpdate::finished())
        .await
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(finished.run_status(), trainstate_schema::RunStatus::Finished);
    match remote
        .set_status(
            id.clone(),
            trainstate_client::StatusUpdate::errored(
                None,
                trainstate_schema::CauseKind::UserError,
                "x",
            ),
        )
        .await
    {
        Err(trainstate_client::StateError::IllegalTransition { from, .. }) => {
            assert_eq!(from, trainstate_schema::RunStatus::Finished)
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        remote.get(RunId::new_v7()).await,
        Err(trainstate_client::StateError::NotFound { .. })
    ));
    server.stop().await;
    // The head is gone: an error within the deadline, not a hang.
    let remote = remote.with_timeout(std::time::Duration::from_millis(300));
    assert!(remote.get(id).await.unwrap_err().is_retryable());
}

#[tokio::test]
async fn cors_is_off_by_default_and_allows_the_configured_origins() {
    let client = Client::new();
    let preflight = |url: String| {
        client
            .request(Method::OPTIONS, format!("{url}/api/train/runs"))
            .header("origin", "https://dash.example")
            .header("access-control-request-method", "GET")
            .send()
    };
    let closed = server(HttpConfig::default()).await;
    let answer = preflight(closed.url.clone()).await.unwrap();
    assert!(answer.headers().get("access-control-allow-origin").is_none());
    closed.stop().await;

    let open =
        server(HttpConfig::default().with_cors_origins(vec!["https://dash.example".into()])).await;
    let answer = preflight(open.url.clone()).await.unwrap();
    assert_eq!(answer.headers()["access-control-allow-origin"], "https://dash.example");
    open.stop().await;
}

/// Issue 10, items 9 and 11: every refused write answers its status, code
/// and field, and changes nothing; the run stays as it was.
#[tokio::test]
async fn regression_validation_gaps_and_implausible_times_are_refused_naming_the_field() {
    let server = server(HttpConfig::default()).await;
    let client = Client::new();
    let live = RunId::new_v7();
    let (status, _) = send(
        &client,
        Method::POST,
        &format!("{}/api/train/runs", server.url),
        json_body(&run_json(&live, "live")),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    // A second attempt, 10 s after the run's start: the current attempt.
    let workers = run_json(&live, "live")["workers"].clone();
    let attempt = json!({"attempt_id": "1", "start_time_ms": T0 + 10_000, "workers": workers});
    let (status, answer) = send(
        &client,
        Method::POST,
        &format!("{}/api/train/runs/{live}/attempts", server.url),
        json_body(&attempt),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let before =
        send(&client, Method::GET, &format!("{}/api/train/runs/{live}", server.url), None, None)
            .await;

    let fresh = RunId::new_v7();
    let register = |mutate: &dyn Fn(&mut Value)| {
        let mut doc = run_json(&fresh, "fresh");
        mutate(&mut doc);
        json_body(&doc)
    };
    let raw = |bytes: &[u8]| Some(("application/json", bytes.to_vec()));
    let runs = "/api/train/runs".to_owned();
    let status_path = format!("/api/train/runs/{live}/status");
    let ns = T0 * 1_000_000;
    type Body = Option<(&'static str, Vec<u8>)>;
    let cases: Vec<(&str, String, Body, StatusCode, &str)> = vec![
        (
            "regression_trailing_bytes_after_the_document",
            status_path.clone(),
            raw(b"{\"status\":\"FINISHED\"} {}"),
            StatusCode::BAD_REQUEST,
            "",
        ),
        (
            "regression_trailing_garbage_after_the_document",
            status_path.clone(),
            raw(b"{\"status\":\"FINISHED\"}x"),
            StatusCode::BAD_REQUEST,
            "",
        ),
        (
            "regression_an_array_for_a_status_body",
            status_path.clone(),
            raw(b"[\"FINISHED\"]"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "body",
        ),
        (
            "regression_an_array_for_a_registration",
            runs.clone(),
            raw(b" [\"x\"]"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "body",
        ),
        (
            "regression_a_worker_written_as_an_array",
            runs.clone(),
            register(&|r| {
                let w = &r["workers"][0];
                let by_position: Vec<Value> = w.as_object().unwrap().values().cloned().collect();
                r["workers"][0] = Value::Array(by_position);
            }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "workers[0]",
        ),
        (
            "regression_a_dataset_written_as_an_array",
            runs.clone(),
            register(&|r| r["datasets"] = json!([["ds", "plan"]])),
            StatusCode::UNPROCESSABLE_ENTITY,
            "datasets[0]",
        ),
        (
            "regression_a_cause_written_as_an_array",
            status_path.clone(),
            raw(b"{\"status\":\"ERRORED\",\"cause\":[\"USER_ERROR\",3]}"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "cause",
        ),
        (
            "regression_an_attempts_worker_written_as_an_array",
            format!("/api/train/runs/{live}/attempts"),
            json_body(
                &json!({"attempt_id": "2", "start_time_ms": T0 + 20_000, "workers": [["w"]]}),
            ),
            StatusCode::UNPROCESSABLE_ENTITY,
            "workers[0]",
        ),
        (
            "regression_a_cause_on_a_running_registration",
            runs.clone(),
            register(&|r| r["cause"] = json!({"kind": "USER_ERROR"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "cause",
        ),
        (
            "regression_a_cause_on_a_finished_registration",
            runs.clone(),
            register(&|r| {
                r["run_status"] = json!("FINISHED");
                r["cause"] = json!({"kind": "USER_ERROR"});
            }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "cause",
        ),
        (
            "regression_a_client_registering_lost_controller",
            runs.clone(),
            register(&|r| {
                r["run_status"] = json!("ABORTED");
                r["cause"] = json!({"kind": "LOST_CONTROLLER"});
            }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "cause.kind",
        ),
        (
            "regression_a_registered_failed_rank_outside_the_ranks",
            runs.clone(),
            register(&|r| {
                r["run_status"] = json!("ERRORED");
                r["cause"] = json!({"kind": "USER_ERROR", "failed_world_rank": 4});
            }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "cause.failed_world_rank",
        ),
        (
            "regression_a_start_time_in_nanoseconds",
            runs.clone(),
            register(&|r| r["start_time_ms"] = json!(ns)),
            StatusCode::UNPROCESSABLE_ENTITY,
            "start_time_ms",
        ),
        (
            "regression_a_start_time_in_seconds",
            runs.clone(),
            register(&|r| r["start_time_ms"] = json!(T0 / 1_000)),
            StatusCode::UNPROCESSABLE_ENTITY,
            "start_time_ms",
        ),
        (
            "regression_a_registered_end_time_in_nanoseconds",
            runs.clone(),
            register(&|r| {
                r["run_status"] = json!("FINISHED");
                r["end_time_ms"] = json!(ns);
            }),
            StatusCode::UNPROCESSABLE_ENTITY,
            "end_time_ms",
        ),
        (
            "regression_a_client_setting_lost_controller",
            status_path.clone(),
            json_body(&json!({"status": "ABORTED", "cause": {"kind": "LOST_CONTROLLER"}})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "cause.kind",
        ),
        (
            "regression_a_cause_on_a_finished_status",
            status_path.clone(),
            json_body(&json!({"status": "FINISHED", "cause": {"kind": "USER_ERROR"}})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "cause",
        ),
        (
            "regression_a_failed_rank_outside_the_ranks",
            status_path.clone(),
            json_body(
                &json!({"status": "ERRORED", "cause": {"kind": "USER_ERROR", "failed_world_rank": 4}}),
            ),
            StatusCode::UNPROCESSABLE_ENTITY,
            "cause.failed_world_rank",
        ),
        (
            "regression_an_end_before_the_current_attempts_start",
            status_path.clone(),
            json_body(&json!({"status": "FINISHED", "end_time_ms": T0 + 5_000})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "end_time_ms",
        ),
        (
            "regression_an_end_time_in_nanoseconds",
            status_path.clone(),
            json_body(&json!({"status": "FINISHED", "end_time_ms": ns})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "end_time_ms",
        ),
        (
            "regression_an_attempt_start_in_nanoseconds",
            format!("/api/train/runs/{live}/attempts"),
            json_body(&json!({"attempt_id": "2", "start_time_ms": ns, "workers": workers})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "start_time_ms",
        ),
    ];
    for (what, path, body, expected, field) in cases {
        let method = if path.ends_with("status") || path.ends_with("attempts") || path == runs {
            Method::POST
        } else {
            Method::PUT
        };
        let (status, answer) =
            send(&client, method, &format!("{}{path}", server.url), body, None).await;
        assert_eq!(status, expected, "{what}: {answer}");
        if !field.is_empty() {
            assert_eq!(answer["error"]["field"], field, "{what}: {answer}");
        }
    }
    let after =
        send(&client, Method::GET, &format!("{}/api/train/runs/{live}", server.url), None, None)
            .await;
    // The live run's goodput is counted to each read; the rest is as it was.
    let (mut after, mut before) = (after, before);
    let goodput_after = after.1.as_object_mut().unwrap().remove("goodput").unwrap();
    let goodput_before = before.1.as_object_mut().unwrap().remove("goodput").unwrap();
    assert_eq!(after, before, "a refused write changed the run");
    assert_eq!(goodput_after["checkpoint"], goodput_before["checkpoint"]);
    assert_eq!(
        goodput_after["restarts_since_checkpoint"],
        goodput_before["restarts_since_checkpoint"]
    );
    let (status, _) =
        send(&client, Method::GET, &format!("{}/api/train/runs/{fresh}", server.url), None, None)
            .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "a refused registration was stored");
    // The same status, well-formed, is taken: the refusals were the body's.
    let (status, answer) = send(
        &client,
        Method::POST,
        &format!("{}{status_path}", server.url),
        json_body(&json!({"status": "ERRORED", "cause": {"kind": "USER_ERROR", "failed_world_rank": 3}, "end_time_ms": T0 + 10_000})),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    server.stop().await;
}

/// A controller reports the machine's kinds with the failed rank, and the
/// head gives each its class; an unknown kind, from an older or newer
/// client, is refused naming the field and listing every kind, on a run's
/// status and on a rank's end alike, and never mapped to another.
#[tokio::test]
async fn a_cause_kind_is_taken_with_its_class_or_refused_naming_the_field_and_every_kind() {
    let server = server(HttpConfig::default()).await;
    let client = Client::new();
    let url = |path: &str| format!("{}{path}", server.url);
    let id = RunId::new_v7();
    let (status, body) =
        send(&client, Method::POST, &url("/api/train/runs"), json_body(&run_json(&id, "k")), None)
            .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    let kinds = "`USER_ERROR`, `SYSTEM_ERROR`, `LOST_CONTROLLER`, `USER_INTERRUPT`, `OOM`, \
                 `PREEMPTED`, `TIMEOUT`, `NODE_LOST`, `HARDWARE`, `NO_PROGRESS`";
    let status_url = url(&format!("/api/train/runs/{id}/status"));
    let unknown = json!({"status": "ERRORED", "cause": {"kind": "OOPS"}});
    let (status, body) = send(&client, Method::POST, &status_url, json_body(&unknown), None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["code"], "invalid", "{body}");
    assert_eq!(body["error"]["field"], "cause.kind", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("`OOPS`") && message.contains(kinds), "{message}");

    let end_url = url(&format!("/api/train/runs/{id}/ranks/1/end"));
    let unknown = json!({"attempt_id": "a0", "status": "ERRORED", "cause": "OOPS"});
    let (status, body) = send(&client, Method::POST, &end_url, json_body(&unknown), None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["field"], "cause", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("`OOPS`") && message.contains(kinds), "{message}");

    // Nothing was stored; a new kind with its failed rank is taken.
    let (_, run) =
        send(&client, Method::GET, &url(&format!("/api/train/runs/{id}")), None, None).await;
    assert_eq!(run["run_status"], "RUNNING", "{run}");
    let lost = json!({"status": "ABORTED", "cause": {"kind": "NODE_LOST", "failed_world_rank": 3}});
    let (status, body) = send(&client, Method::POST, &status_url, json_body(&lost), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, run) =
        send(&client, Method::GET, &url(&format!("/api/train/runs/{id}")), None, None).await;
    assert_eq!(
        run["cause"],
        json!({"kind": "NODE_LOST", "class": "INFRASTRUCTURE", "failed_world_rank": 3}),
        "{run}"
    );
}

/// A listing's JSON text with each live run's goodput left out: it is
/// counted to the moment of each read.
fn without_live_goodput(listing: &str) -> Value {
    let mut listing: Value = serde_json::from_str(listing).unwrap();
    for run in listing["train_runs"].as_array_mut().into_iter().flatten() {
        if run["end_time_ms"].is_null() {
            run.as_object_mut().unwrap().remove("goodput");
        }
    }
    listing
}
