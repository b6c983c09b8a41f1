//! Regression tests of issue 10's edge findings: each test is named after
//! the finding it pins (see docs/reliability.md).

use reqwest::{Client, Method, StatusCode};
use serde_json::Value;
use trainstate_actor::StateConfig;
use trainstate_actor::http::HttpConfig;
use trainstate_schema::RunId;

use crate::common::{Server, run_with, unique_name};
use crate::contract::check_answer;
use crate::process::Head;

const T0: u64 = 1_760_000_000_000;

async fn server(http: HttpConfig) -> Server {
    Server::start(StateConfig::in_memory().with_name(unique_name("hardening")), http).await
}

/// Sends `request` (built by the caller, for headers `send` does not set)
/// and checks the answer against the document.
async fn send_raw(
    method: Method,
    url: &str,
    request: reqwest::RequestBuilder,
) -> (StatusCode, Value) {
    let response = request.send().await.unwrap();
    let status = response.status();
    let bytes = response.bytes().await.unwrap();
    check_answer(&method, url, status, &bytes);
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test]
async fn regression_lower_case_bearer_scheme_is_accepted() {
    let server = server(HttpConfig::default().with_token(Some("s3cret".into()))).await;
    let client = Client::new();
    let runs = format!("{}/api/train/runs", server.url);
    for (i, scheme) in ["bearer", "BEARER", "Bearer", "bEaReR"].into_iter().enumerate() {
        let run = run_with(&RunId::new_v7(), &format!("case{i}"), "job1", T0, 2);
        let request = client
            .post(&runs)
            .header("content-type", "application/json")
            .header("authorization", format!("{scheme} s3cret"))
            .body(serde_json::to_vec(&run).unwrap());
        let (status, body) = send_raw(Method::POST, &runs, request).await;
        assert_eq!(status, StatusCode::CREATED, "{scheme}: {body}");
    }
    let request = client
        .post(&runs)
        .header("content-type", "application/json")
        .header("authorization", "bearer wrong")
        .body(serde_json::to_vec(&run_with(&RunId::new_v7(), "x", "job1", T0, 2)).unwrap());
    let (status, body) = send_raw(Method::POST, &runs, request).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(body["error"]["code"], "unauthorized");
    server.stop().await;
}

#[test]
fn regression_symlinked_lock_file_is_refused_and_its_target_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let victim = dir.path().join("precious");
    std::fs::write(&victim, "keep me").unwrap();
    std::os::unix::fs::symlink(&victim, data.join("trainstate.lock")).unwrap();
    let refused = Head::start(&data, &[]).err().expect("a symlinked lock file must be refused");
    assert!(refused.contains("symlink"), "{refused}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");

    // A dangling link must not create its target either.
    let data = dir.path().join("dangling");
    std::fs::create_dir(&data).unwrap();
    let target = dir.path().join("created-by-accident");
    std::os::unix::fs::symlink(&target, data.join("trainstate.lock")).unwrap();
    let refused = Head::start(&data, &[]).err().expect("a dangling lock symlink must be refused");
    assert!(refused.contains("symlink"), "{refused}");
    assert!(!target.exists());
}

#[test]
fn regression_flags_that_lied_or_crashed_are_refused_before_listening() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&[&str], &str)] = &[
        // ~6e12 h: more milliseconds than a u64 holds (wrapped to ~384 ms).
        (&["--max-age", "6000000000000h"], "--max-age"),
        (&["--lease", "0.0001ms"], "--lease"),
        (&["--lease", "999999999999999999999999999s"], "--lease"),
        (&["--lease", "9999999h"], "--lease"),
        (&["--cors-origin", "*"], "wildcard"),
        (&["--cors-origin", "not an origin"], "--cors-origin"),
        (&["--cors-origin", "https://ok.example,https://x.example/path"], "x.example/path"),
    ];
    for (flags, expected) in cases {
        let refused = Head::start(dir.path(), flags)
            .err()
            .unwrap_or_else(|| panic!("{flags:?} must be refused before `listening on`"));
        assert!(refused.contains(expected), "{flags:?}: {refused}");
        assert!(!refused.contains("panicked"), "{flags:?}: {refused}");
    }
    // The limits themselves are accepted.
    Head::start(
        dir.path(),
        &["--lease", "1s", "--max-age", "876000h", "--cors-origin", "http://127.0.0.1:3000"],
    )
    .expect("flags at their limits start");
}
