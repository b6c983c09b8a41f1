//! Issue 15: a restart that serves at once however many runs are stored.
//! `trainstate serve` listens before its runs are loaded: `/healthz`
//! answers at once with `"loaded": false`, every other request is held
//! until the load completes and then answered as usual. The load is held on
//! purpose by the `fault-injection` hook `TRAINSTATE_HOLD_LOAD_UNTIL=PATH`
//! (it waits until the test creates the file): a condition, not a timer.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use trainstate_actor::http::{HttpConfig, load_channel, serve_while_loading};
use trainstate_actor::{StateConfig, launch_state_actor};
use trainstate_schema::RunId;

use crate::common::{Head, eventually, fill, numbered, run_with, serve, unique_name};
use crate::contract::check_answer;

const T0: u64 = 1_760_000_000_000;

/// A guard on a wait that must end by itself; not a margin the test needs.
const HANG: Duration = Duration::from_secs(60);

/// What the head logs for each request it holds (at debug level).
const HELD: &str = "held until the stored runs are loaded";

/// `trainstate serve` whose load waits for a file.
struct Held {
    head: Head,
    release: PathBuf,
}

impl Held {
    /// Starts a head on `dir` whose load waits until [`Held::release`] is
    /// called, and waits for its `listening on` line.
    fn start(dir: &Path) -> Held {
        let release = dir.with_extension("release");
        let head = serve(dir)
            .env("RUST_LOG", "warn,trainstate_actor::services::http=debug")
            .env("TRAINSTATE_HOLD_LOAD_UNTIL", release.to_str().unwrap())
            .start()
            .unwrap_or_else(|refused| panic!("no `listening on` line ({refused})"));
        Held { head, release }
    }

    /// Lets the load go on.
    fn release(&self) {
        std::fs::write(&self.release, b"").unwrap();
    }
}

impl std::ops::Deref for Held {
    type Target = Head;

    fn deref(&self) -> &Head {
        &self.head
    }
}

impl std::ops::DerefMut for Held {
    fn deref_mut(&mut self) -> &mut Head {
        &mut self.head
    }
}

/// Stores `count` runs in `dir`'s store, through the state actor alone.
async fn store_runs(dir: &Path, count: u64) -> Vec<RunId> {
    std::fs::create_dir_all(dir).unwrap();
    let config =
        StateConfig::sqlite(dir.join("trainstate.db")).with_name(unique_name("loading.store"));
    let service = launch_state_actor(config).await.unwrap();
    let ids = fill(&service.handle(), numbered(count, "r", "load", T0, 4)).await.unwrap();
    service.shutdown().await;
    ids
}

/// Sends a request, checks the answer against the served OpenAPI document,
/// and returns its status, `Retry-After` and JSON body.
async fn send(
    client: &Client,
    method: Method,
    url: &str,
    body: Option<Value>,
) -> (StatusCode, Option<String>, Value) {
    let mut request = client.request(method.clone(), url);
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).unwrap());
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    let retry_after = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    let bytes = response.bytes().await.unwrap();
    check_answer(&method, url, status, &bytes);
    (status, retry_after, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// `GET /healthz`'s `loaded`, after checking the answer is 200 and `ok`.
async fn loaded(client: &Client, head: &str) -> bool {
    let (status, _, body) = send(client, Method::GET, &format!("{head}/healthz"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "ok", "{body}");
    body["loaded"].as_bool().unwrap_or_else(|| panic!("`loaded` is a boolean: {body}"))
}

/// Polls `/healthz` until it says `loaded: true`.
async fn wait_until_loaded(client: &Client, head: &str) {
    eventually("the stored runs to be loaded", HANG, || loaded(client, head)).await;
}

/// Issue 15: `/healthz` answers 200 with `"loaded": false` while the
/// stored runs load (the load is held, so this is no race), then
/// `"loaded": true` once they are, and the runs are all there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_restart_answers_healthz_before_its_runs_are_loaded() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    let ids = store_runs(&dir, 3).await;
    let head = Held::start(&dir);
    let client = Client::new();
    for _ in 0..3 {
        assert!(!loaded(&client, &head.url).await, "the load is held: {}", head.log());
    }
    head.release();
    wait_until_loaded(&client, &head.url).await;
    let (status, _, page) =
        send(&client, Method::GET, &format!("{}/api/train/runs", head.url), None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["total"], json!(ids.len()), "{page}");
}

/// Issue 15: requests that arrive during the load (a read of a stored run,
/// a listing, a registration, `/metrics`) wait for it and are then
/// answered as a loaded head answers them: no 404 for a stored run, no
/// partial listing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_request_during_the_load_is_held_and_answered_after_it() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    let ids = store_runs(&dir, 5).await;
    let head = Held::start(&dir);
    let client = Client::new();
    let new_id = RunId::new_v7();
    let new_run = serde_json::to_value(run_with(&new_id, "during", "load", T0 + 99, 4)).unwrap();
    let requests = [
        (Method::GET, format!("{}/api/train/runs/{}", head.url, ids[2]), None),
        (Method::GET, format!("{}/api/train/runs?limit=1000", head.url), None),
        (Method::POST, format!("{}/api/train/runs", head.url), Some(new_run)),
        (Method::GET, format!("{}/metrics", head.url), None),
    ];
    let count = requests.len();
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|(method, url, body)| {
            let client = client.clone();
            tokio::spawn(async move {
                if url.ends_with("/metrics") {
                    let response = client.get(&url).send().await.unwrap();
                    (response.status(), None, Value::String(response.text().await.unwrap()))
                } else {
                    send(&client, method, &url, body).await
                }
            })
        })
        .collect();
    head.logged(HELD, count).await;
    // The load cannot end before the file exists: every request still waits.
    assert!(tasks.iter().all(|task| !task.is_finished()), "answered before the load");
    assert!(!loaded(&client, &head.url).await);
    head.release();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(tokio::time::timeout(HANG, task).await.unwrap().unwrap());
    }
    let (status, _, run) = &answers[0];
    assert_eq!(*status, StatusCode::OK, "{run}");
    assert_eq!(run["id"], ids[2].to_string(), "{run}");
    let (status, _, page) = &answers[1];
    assert_eq!(*status, StatusCode::OK, "{page}");
    let listed: Vec<&str> =
        page["train_runs"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    // Released together, the listing reads the committed view whenever its
    // connection runs: with the registration released beside it, or not yet.
    let with_new = listed.contains(&new_id.to_string().as_str());
    let expected = ids.len() + usize::from(with_new);
    assert_eq!(page["total"], json!(expected), "a complete listing: {page}");
    for id in &ids {
        assert!(listed.contains(&id.to_string().as_str()), "{id} listed: {page}");
    }
    let (status, _, registered) = &answers[2];
    assert_eq!(*status, StatusCode::CREATED, "{registered}");
    assert_eq!(registered["run"]["id"], new_id.to_string());
    let (status, _, metrics) = &answers[3];
    assert_eq!(*status, StatusCode::OK, "{metrics}");
    assert!(metrics.as_str().unwrap().contains("trainstate_runs"), "{metrics}");
    assert!(loaded(&client, &head.url).await);
}

/// Issue 15: SIGTERM while the runs load exits 0 at once (the load is
/// never released), answers the held request 503 `unavailable`, and
/// changes nothing: the next start has every stored run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_sigterm_during_the_load_exits_cleanly_and_loses_nothing() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    let ids = store_runs(&dir, 3).await;
    let mut head = Held::start(&dir);
    let client = Client::new();
    let held = {
        let (client, url) = (client.clone(), format!("{}/api/train/runs/{}", head.url, ids[0]));
        tokio::spawn(async move { send(&client, Method::GET, &url, None).await })
    };
    head.logged(HELD, 1).await;
    head.signal("-TERM");
    let status = head.exited().await;
    assert!(status.success(), "{status}: {}", head.log());
    let (status, retry_after, body) = tokio::time::timeout(HANG, held).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("shutting down before it loaded its stored runs"), "{message}");
    assert!(!head.log().contains("panicked"), "{}", head.log());
    drop(head);

    let head = Held::start(&dir);
    head.release();
    wait_until_loaded(&client, &head.url).await;
    for id in &ids {
        let url = format!("{}/api/train/runs/{id}", head.url);
        let (status, _, run) = send(&client, Method::GET, &url, None).await;
        assert_eq!(status, StatusCode::OK, "{run}");
    }
}

/// Issue 15: a store that does not load (a corrupt row) is now refused
/// after `listening on`: a request held meanwhile is answered 503
/// `unavailable` naming the run, and the head exits non-zero with the
/// message it gave before it listened first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_load_that_fails_answers_held_requests_503_and_exits_non_zero() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    let ids = store_runs(&dir, 2).await;
    let conn = rusqlite::Connection::open(dir.join("trainstate.db")).unwrap();
    let bad = ids[1].to_string();
    conn.execute("UPDATE runs SET json = 'not json' WHERE id = ?1", [&bad]).unwrap();
    drop(conn);
    let mut head = Held::start(&dir);
    let client = Client::new();
    let held = {
        let (client, url) = (client.clone(), format!("{}/api/train/runs/{}", head.url, ids[0]));
        tokio::spawn(async move { send(&client, Method::GET, &url, None).await })
    };
    head.logged(HELD, 1).await;
    head.release();
    let (status, retry_after, body) = tokio::time::timeout(HANG, held).await.unwrap().unwrap();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains(&format!("run {bad} does not load")), "{message}");
    let status = head.exited().await;
    assert!(!status.success(), "{status}");
    let log = head.log();
    let exit_line = log.lines().find(|l| l.starts_with("trainstate: ")).unwrap_or_default();
    assert!(exit_line.contains(&format!("run {bad} does not load")), "{log}");
    assert!(log.contains("--quarantine-corrupt"), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// Issue 15, in process: a request held longer than the hold is answered
/// 503 `unavailable` with `Retry-After: 1` and a message naming the rule;
/// `/healthz` says `loaded: false` meanwhile; once the launch is done the
/// same request is answered by the API and `/healthz` says `loaded: true`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_request_held_past_the_load_hold_gets_503_with_retry_after() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let (load, loading) = load_channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let http = HttpConfig::default().with_load_hold(Duration::from_millis(50));
    let server = tokio::spawn(serve_while_loading(listener, loading, http, async move {
        let _ = stopped.await;
    }));
    let client = Client::new();
    assert!(!loaded(&client, &url).await);
    let (status, retry_after, body) =
        send(&client, Method::GET, &format!("{url}/api/train/runs"), None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(retry_after.as_deref(), Some("1"));
    assert_eq!(body["error"]["code"], "unavailable", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("still loading its stored runs"), "{message}");
    assert!(message.contains("\"loaded\": true"), "says what to watch: {message}");

    let config = StateConfig::in_memory().with_name(unique_name("loading.hold"));
    let service = Arc::new(launch_state_actor(config).await.unwrap());
    service.handle().register(run_with(&RunId::new_v7(), "r", "load", T0, 4)).await.unwrap();
    load.loaded(service.clone());
    wait_until_loaded(&client, &url).await;
    let (status, _, page) =
        send(&client, Method::GET, &format!("{url}/api/train/runs"), None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["total"], 1, "{page}");
    let _ = stop.send(());
    server.await.unwrap().unwrap();
    service.shutdown().await;
}

/// A head killed after `listening on` but before it loaded its store
/// answered nothing from it, so its next start must not take the store it
/// never used for a lost one (before, the lock file's pid alone marked the
/// directory as used, and a missing store then refused the restart).
#[tokio::test]
async fn regression_a_head_killed_before_it_loaded_does_not_mark_its_store_as_lost() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("data");
    let mut head = Held::start(&dir);
    head.signal("-KILL");
    head.exited().await;
    drop(head);
    // As if it had died before creating the store.
    for file in ["trainstate.db", "trainstate.db-wal", "trainstate.db-shm"] {
        let _ = std::fs::remove_file(dir.join(file));
    }
    let head = Held::start(&dir);
    head.release();
    wait_until_loaded(&Client::new(), &head.url).await;

    // Once loaded, the directory is in use: a lost store is refused again.
    drop(head);
    std::fs::remove_file(dir.join("trainstate.db")).unwrap();
    let refused = serve(&dir).start().expect_err("a lost store refuses");
    assert!(refused.log.contains("--allow-empty-store"), "{}", refused.log);
}
