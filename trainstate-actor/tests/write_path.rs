//! The registration write path: an answer without the echoed run when the
//! caller asks for it (`Prefer: return=minimal`, RFC 7240), checked against
//! the OpenAPI document, with the run stored (committed) all the same.

use std::time::{SystemTime, UNIX_EPOCH};

use reqwest::{Client, Method, StatusCode};
use serde_json::Value;
use trainstate_actor::StateConfig;
use trainstate_actor::http::HttpConfig;
use trainstate_schema::RunId;

use crate::common::{Server, run_with, unique_name};
use crate::contract::check_answer;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Posts `body` as a registration, with `prefer` as the `Prefer` header;
/// checks the answer against the document. Returns the status, the
/// `Preference-Applied` header and the body.
async fn register(
    client: &Client,
    url: &str,
    body: &[u8],
    prefer: Option<&str>,
) -> (StatusCode, Option<String>, Value) {
    let mut request = client
        .request(Method::POST, url)
        .header("content-type", "application/json")
        .body(body.to_vec());
    if let Some(prefer) = prefer {
        request = request.header("prefer", prefer);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let applied =
        response.headers().get("preference-applied").map(|v| v.to_str().unwrap().to_owned());
    let bytes = response.bytes().await.unwrap();
    check_answer(&Method::POST, url, status, &bytes);
    (status, applied, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test]
async fn regression_registration_answers_without_the_run_when_return_minimal_is_preferred() {
    let dir = tempfile::tempdir().unwrap();
    let name = unique_name("write.minimal");
    let config = || StateConfig::sqlite(dir.path().join("runs.db")).with_name(name.clone());
    let server = Server::start(config(), HttpConfig::default()).await;
    let client = Client::new();
    let url = format!("{}/api/train/runs", server.url);
    let id = RunId::new_v7();
    let run = run_with(&id, "minimal", "job1", now_ms(), 8);
    let body = serde_json::to_vec(&run).unwrap();

    // Registered: 201, the id, the lease and `created`, no run.
    let (status, applied, answer) = register(&client, &url, &body, Some("return=minimal")).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(applied.as_deref(), Some("return=minimal"));
    assert_eq!(answer["run_id"], id.as_str());
    assert_eq!(answer["created"], true);
    assert!(answer["lease_ms"].as_u64().is_some_and(|ms| ms > 0), "{answer}");
    assert!(answer.get("run").is_none(), "the run is not echoed: {answer}");

    // Repeated, among other preferences and in another case: 200, not created.
    let prefer = "respond-async, RETURN=\"Minimal\"; x=1";
    let (status, applied, answer) = register(&client, &url, &body, Some(prefer)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(applied.as_deref(), Some("return=minimal"));
    assert_eq!(answer["created"], false);
    assert_eq!(answer["run_id"], id.as_str());

    // Acknowledged means committed: the run is read back after a restart.
    server.stop().await;
    let server = Server::start(config(), HttpConfig::default()).await;
    let stored = client.get(format!("{}/api/train/runs/{id}", server.url)).send().await.unwrap();
    assert_eq!(stored.status(), StatusCode::OK);
    let stored: Value = stored.json().await.unwrap();
    assert_eq!(stored["name"], "minimal");
    assert_eq!(stored["workers"].as_array().map(Vec::len), Some(8));
    server.stop().await;
}

#[tokio::test]
async fn regression_registration_without_a_preference_still_echoes_the_run() {
    let server = Server::start(
        StateConfig::in_memory().with_name(unique_name("write.full")),
        HttpConfig::default(),
    )
    .await;
    let client = Client::new();
    let url = format!("{}/api/train/runs", server.url);
    let id = RunId::new_v7();
    let body = serde_json::to_vec(&run_with(&id, "full", "job1", now_ms(), 8)).unwrap();

    for (prefer, created) in [(None, true), (Some("return=representation"), false)] {
        let (status, applied, answer) = register(&client, &url, &body, prefer).await;
        let expected = if created { StatusCode::CREATED } else { StatusCode::OK };
        assert_eq!(status, expected, "{prefer:?}");
        assert_eq!(applied, None, "{prefer:?}");
        assert_eq!(answer["created"], created);
        assert_eq!(answer["run"]["id"], id.as_str(), "the run is echoed: {answer}");
        assert_eq!(answer["run"]["workers"].as_array().map(Vec::len), Some(8));
        assert!(answer.get("run_id").is_none());
    }
    server.stop().await;
}
