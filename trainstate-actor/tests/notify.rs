//! Notifications, end to end: a real `trainstate serve` tells receivers on
//! loopback (small axum servers here) of runs that error, end, stall and
//! restart. A webhook gets one event per run and condition, with a stable
//! `event_id`, the failed rank and the link, delivered at least once
//! through failures of the receiver and a SIGKILL of the head; a Slack
//! stub gets valid Block Kit; an Alertmanager stub gets a stall's alert,
//! again while it holds, and its resolution; a bad flag refuses to start;
//! and the backlog of a receiver that is down stays bounded, what is
//! dropped counted.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode as AxumStatus, Uri};
use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use trainstate_schema::RunId;

use crate::common::{Head, eventually, run_with, serve, start_head, workers};
use crate::contract::send_json;

/// Long enough for anything here to happen; it only ends a hung test.
const DEADLINE: Duration = Duration::from_secs(60);

/// What a receiver answers a request with.
type Answer = Arc<dyn Fn(&Value) -> u16 + Send + Sync>;

/// One request a receiver took.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    headers: HeaderMap,
    body: Value,
    /// What it answered.
    status: u16,
    at: SystemTime,
}

#[derive(Default)]
struct Taken {
    requests: Vec<Received>,
}

/// A receiver of notifications on a loopback port: it keeps every request
/// and answers each as `answer` says.
#[derive(Clone)]
pub(crate) struct Receiver {
    pub(crate) url: String,
    taken: Arc<Mutex<Taken>>,
    answer: Arc<Mutex<Answer>>,
}

impl Receiver {
    pub(crate) async fn start(answer: impl Fn(&Value) -> u16 + Send + Sync + 'static) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let receiver = Self {
            url: format!("http://{addr}"),
            taken: Arc::default(),
            answer: Arc::new(Mutex::new(Arc::new(answer))),
        };
        let app = axum::Router::new().fallback(take).with_state(receiver.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        receiver
    }

    /// Answers as `answer` says from now on.
    fn answer_with(&self, answer: impl Fn(&Value) -> u16 + Send + Sync + 'static) {
        *self.answer.lock().unwrap() = Arc::new(answer);
    }

    fn requests(&self) -> Vec<Received> {
        self.taken.lock().unwrap().requests.clone()
    }

    /// The bodies of the requests it accepted (2xx).
    pub(crate) fn accepted(&self) -> Vec<Value> {
        self.requests().into_iter().filter(|r| r.status < 300).map(|r| r.body).collect()
    }
}

async fn take(
    State(receiver): State<Receiver>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> AxumStatus {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let answer = receiver.answer.lock().unwrap().clone();
    let status = answer(&body);
    let received =
        Received { path: uri.path().to_owned(), headers, body, status, at: SystemTime::now() };
    receiver.taken.lock().unwrap().requests.push(received);
    AxumStatus::from_u16(status).unwrap()
}

/// Registers a live run of two workers named `name` on `head`; its id.
async fn register(client: &Client, head: &Head, name: &str) -> RunId {
    let id = RunId::new_v7();
    let run = run_with(&id, name, "job-n", trainstate_testkit::runs::T0, 2);
    let url = format!("{}/api/train/runs", head.url);
    let (status, answer) =
        send_json(client, Method::POST, &url, Some(&serde_json::to_value(&run).unwrap())).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    id
}

/// Sets run `id`'s status on `head` with `body`.
async fn set_status(client: &Client, head: &Head, id: &RunId, body: Value) {
    let url = format!("{}/api/train/runs/{id}/status", head.url);
    let (status, answer) = send_json(client, Method::POST, &url, Some(&body)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

/// Ends run `id` ERRORED, rank 1 failing first.
async fn error(client: &Client, head: &Head, id: &RunId) {
    let body = json!({
        "status": "ERRORED",
        "detail": "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\nValueError: bad batch",
        "cause": {"kind": "USER_ERROR", "failed_world_rank": 1},
    });
    set_status(client, head, id, body).await;
}

/// `GET /api/notify`'s first target, checked against the contract.
async fn target_info(client: &Client, head: &Head) -> Value {
    let url = format!("{}/api/notify", head.url);
    let (status, answer) = send_json(client, Method::GET, &url, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    answer["targets"][0].clone()
}

/// The first target's state once it counts `sent` events sent and none
/// pending: a receiver has an event before the head has its answer, so
/// the counts are read once the head has taken the answer in.
async fn target_info_once_sent(client: &Client, head: &Head, sent: u64) -> Value {
    eventually("the target's counts updated", DEADLINE, || async move {
        let info = target_info(client, head).await;
        (info["sent"].as_u64() == Some(sent) && info["pending"].as_u64() == Some(0)).then_some(info)
    })
    .await
}

/// The value of the sample `name{target="target"}` on `head`'s `/metrics`.
async fn metric(client: &Client, head: &Head, name: &str, target: &str) -> Option<f64> {
    let text =
        client.get(format!("{}/metrics", head.url)).send().await.unwrap().text().await.unwrap();
    let prefix = format!("{name}{{target=\"{target}\"}} ");
    text.lines().find_map(|line| line.strip_prefix(&prefix)?.trim().parse().ok())
}

/// Checks `event` against the JSON Schema the head publishes for it.
fn check_schema(event: &Value) {
    let schema = trainstate_schema::openapi::wire_schema("NotifyEvent").unwrap();
    let validator = jsonschema::validator_for(schema.as_value()).unwrap();
    let errors: Vec<String> = validator.iter_errors(event).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "the event breaks its schema: {errors:?}\n{event}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_errors_is_posted_once_with_its_failed_rank_and_link_through_two_failures() {
    // The receiver fails twice, then takes what it is sent.
    let tries = Arc::new(Mutex::new(0));
    let answered = tries.clone();
    let receiver = Receiver::start(move |_| {
        let mut tries = answered.lock().unwrap();
        *tries += 1;
        if *tries <= 2 { 500 } else { 200 }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let hook = format!("{}/hook", receiver.url);
    let head =
        start_head(dir.path(), &["--notify-webhook", &hook, "--public-url", "https://ts.example/"])
            .unwrap();
    let client = Client::new();
    let id = register(&client, &head, "bert-errs").await;
    error(&client, &head, &id).await;

    let event = eventually("the event accepted", DEADLINE, || {
        std::future::ready(receiver.accepted().first().cloned())
    })
    .await;
    let event_id = format!("{id}:ERRORED");
    assert_eq!(event["event_id"], event_id.as_str());
    assert_eq!(event["event"], "ERRORED");
    assert_eq!(event["run_id"], id.as_str());
    assert_eq!(event["name"], "bert-errs");
    assert_eq!(event["status"], "ERRORED");
    assert_eq!(event["cause"]["failed_world_rank"], 1);
    assert_eq!(event["ranks"], json!([1]));
    assert_eq!(event["node"]["node_ip"], "10.0.0.1", "rank 1's node");
    assert_eq!(event["detail"], "Rank 1 worker raised an error. … ValueError: bad batch");
    assert_eq!(event["link"], format!("https://ts.example/runs/{id}").as_str());
    check_schema(&event);
    let requests = receiver.requests();
    assert_eq!(requests.len(), 3, "two failures, then the delivery: {requests:?}");
    for request in &requests {
        assert_eq!(request.path, "/hook");
        assert_eq!(request.body, event, "every try sends the same event");
        assert_eq!(request.headers["idempotency-key"], event_id.as_str());
        assert_eq!(request.headers["content-type"], "application/json");
    }

    // A second run's event comes after: the first is not sent again.
    let second = register(&client, &head, "bert-errs-too").await;
    error(&client, &head, &second).await;
    eventually("the second event accepted", DEADLINE, || {
        std::future::ready(receiver.accepted().len() >= 2)
    })
    .await;
    let ids: Vec<Value> = receiver.accepted().iter().map(|e| e["event_id"].clone()).collect();
    assert_eq!(ids, [json!(event_id), json!(format!("{second}:ERRORED"))]);

    let info = target_info_once_sent(&client, &head, 2).await;
    let name = format!("webhook-{}", receiver.url.trim_start_matches("http://"));
    assert_eq!(info["name"], name.as_str());
    assert_eq!(info["kind"], "webhook");
    assert_eq!(info["url"], format!("{}/…", receiver.url).as_str(), "no path shown");
    assert_eq!(info["sending"], true);
    assert_eq!(info["sent"], 2);
    assert_eq!(info["failures"], 2);
    assert_eq!(info["dropped"], 0);
    assert_eq!(info["pending"], 0);
    assert!(info["last_error"].as_str().unwrap().contains("500"), "{info}");
    assert!(info["last_error_ms"].as_u64().is_some(), "{info}");
    assert_eq!(info["events"], json!(["ERRORED", "ABORTED", "STALLED", "RECOVERED", "RESTARTING"]));
    assert_eq!(metric(&client, &head, "trainstate_notify_failures_total", &name).await, Some(2.0));
    assert_eq!(metric(&client, &head, "trainstate_notify_sent_total", &name).await, Some(2.0));
    assert_eq!(metric(&client, &head, "trainstate_notify_pending", &name).await, Some(0.0));
    assert_eq!(metric(&client, &head, "trainstate_notify_dropped_total", &name).await, Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_in_flight_when_the_head_is_killed_arrives_after_the_restart_with_its_id() {
    // The receiver takes the first run's event and fails the second's
    // until it is told otherwise.
    let healed = Arc::new(AtomicBool::new(false));
    let heal = healed.clone();
    let failing = Arc::new(Mutex::new(String::new()));
    let fail = failing.clone();
    let receiver = Receiver::start(move |event| {
        let failing = fail.lock().unwrap();
        let fails = !failing.is_empty() && event["run_id"] == failing.as_str();
        if fails && !heal.load(Ordering::SeqCst) { 500 } else { 200 }
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let args = ["--notify-webhook", &format!("{}/hook", receiver.url)];
    let mut head = start_head(dir.path(), &args).unwrap();
    let client = Client::new();
    let delivered = register(&client, &head, "delivered").await;
    error(&client, &head, &delivered).await;
    eventually("the first event accepted", DEADLINE, || {
        std::future::ready(!receiver.accepted().is_empty())
    })
    .await;
    let in_flight = register(&client, &head, "in-flight").await;
    *failing.lock().unwrap() = in_flight.to_string();
    error(&client, &head, &in_flight).await;
    // Committed (the write was answered), and its delivery failed.
    eventually("a failed try of the second event", DEADLINE, || {
        std::future::ready(receiver.requests().iter().any(|r| r.status == 500))
    })
    .await;
    head.kill();

    healed.store(true, Ordering::SeqCst);
    let head = start_head(dir.path(), &args).unwrap();
    let wanted = format!("{in_flight}:ERRORED");
    eventually("the second event accepted after the restart", DEADLINE, || {
        std::future::ready(receiver.accepted().iter().any(|e| e["event_id"] == wanted.as_str()))
    })
    .await;
    let requests = receiver.requests();
    let tried: Vec<&Received> =
        requests.iter().filter(|r| r.body["event_id"] == wanted.as_str()).collect();
    let first = &tried[0].body;
    assert!(tried.iter().all(|r| r.body == *first), "the same event, before and after the kill");
    // Nothing else: each run's event, repeated only as at least once allows.
    let mut ids: Vec<String> =
        receiver.accepted().iter().map(|e| e["event_id"].as_str().unwrap().to_owned()).collect();
    ids.sort();
    ids.dedup();
    let mut expected = vec![format!("{delivered}:ERRORED"), wanted.clone()];
    expected.sort();
    assert_eq!(ids, expected);
    // And the head goes on from where it is.
    let after = register(&client, &head, "after").await;
    error(&client, &head, &after).await;
    let wanted = format!("{after}:ERRORED");
    eventually("an event after the restart", DEADLINE, || {
        std::future::ready(receiver.accepted().iter().any(|e| e["event_id"] == wanted.as_str()))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_events_already_delivered_are_not_sent_again_when_it_changes_across_a_restart() {
    let receiver = Receiver::start(|_| 200).await;
    let dir = tempfile::tempdir().unwrap();
    let args = ["--notify-webhook", &format!("{}/hook#events=restarting,errored", receiver.url)];
    let mut head = start_head(dir.path(), &args).unwrap();
    let client = Client::new();
    let id = register(&client, &head, "restarts").await;
    let attempt = json!({
        "attempt_id": "1",
        "start_time_ms": trainstate_testkit::runs::T0 + 1_000,
        "workers": workers(2, 4, "second-"),
    });
    let url = format!("{}/api/train/runs/{id}/attempts", head.url);
    let (status, answer) = send_json(&client, Method::POST, &url, Some(&attempt)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let restarting = format!("{id}:RESTARTING:1");
    eventually("the restart told", DEADLINE, || {
        std::future::ready(receiver.accepted().iter().any(|e| e["event_id"] == restarting.as_str()))
    })
    .await;
    let stopped = head.stop();
    assert!(stopped.success(), "{stopped}: {}", head.log());

    // The run changes for another reason, then errors: only the error is new.
    let head = start_head(dir.path(), &args).unwrap();
    set_status(&client, &head, &id, json!({"status": "RESIZING"})).await;
    set_status(&client, &head, &id, json!({"status": "RUNNING"})).await;
    error(&client, &head, &id).await;
    let errored = format!("{id}:ERRORED");
    eventually("the error told", DEADLINE, || {
        std::future::ready(receiver.accepted().iter().any(|e| e["event_id"] == errored.as_str()))
    })
    .await;
    let ids: Vec<Value> = receiver.accepted().iter().map(|e| e["event_id"].clone()).collect();
    assert_eq!(ids, [json!(restarting), json!(errored)], "the restart was told once");
    let restart = &receiver.accepted()[0];
    assert_eq!(restart["attempt_id"], "1");
    check_schema(restart);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slack_webhook_receives_block_kit_and_its_url_is_never_shown() {
    let receiver = Receiver::start(|_| 200).await;
    let dir = tempfile::tempdir().unwrap();
    let hook = format!("{}/services/T000/B000/S3CRETKEY", receiver.url);
    let head =
        start_head(dir.path(), &["--notify-slack", &hook, "--public-url", "https://ts.example"])
            .unwrap();
    let client = Client::new();
    let id = register(&client, &head, "<!channel> bert").await;
    error(&client, &head, &id).await;
    let message = eventually("the message", DEADLINE, || {
        std::future::ready(receiver.accepted().first().cloned())
    })
    .await;
    assert_eq!(receiver.requests()[0].path, "/services/T000/B000/S3CRETKEY");

    // Slack's incoming webhook: `text` (the fallback), and `blocks` within
    // Block Kit's limits.
    let text = message["text"].as_str().expect("a text fallback");
    assert!(text.contains("errored") && !text.contains("<!channel>"), "{text}");
    let blocks = message["blocks"].as_array().expect("blocks");
    assert!(!blocks.is_empty() && blocks.len() <= 50);
    let chars = |v: &Value| v.as_str().unwrap().chars().count();
    for block in blocks {
        match block["type"].as_str().unwrap() {
            "header" => {
                assert_eq!(block["text"]["type"], "plain_text");
                assert!((1..=150).contains(&chars(&block["text"]["text"])), "{block}");
            }
            "section" => {
                assert_eq!(block["text"]["type"], "plain_text", "no markup from a run's texts");
                assert!((1..=3000).contains(&chars(&block["text"]["text"])), "{block}");
                let fields = block["fields"].as_array().unwrap();
                assert!(fields.len() <= 10, "{block}");
                for field in fields {
                    assert_eq!(field["type"], "plain_text", "{field}");
                    assert!((1..=2000).contains(&chars(&field["text"])), "{field}");
                }
            }
            "actions" => {
                let elements = block["elements"].as_array().unwrap();
                assert!(!elements.is_empty() && elements.len() <= 25, "{block}");
                for button in elements {
                    assert_eq!(button["type"], "button");
                    assert_eq!(button["text"]["type"], "plain_text");
                    assert!((1..=75).contains(&chars(&button["text"]["text"])), "{button}");
                    assert_eq!(button["url"], format!("https://ts.example/runs/{id}").as_str());
                }
            }
            other => panic!("a block of type {other}: {block}"),
        }
    }
    assert_eq!(blocks[0]["type"], "header");
    assert!(blocks.iter().any(|b| b["type"] == "actions"), "a button to the run");
    let section = blocks.iter().find(|b| b["type"] == "section").unwrap();
    let shown = section["text"]["text"].as_str().unwrap();
    assert!(shown.contains("&lt;!channel&gt; bert"), "a run's name mentions nobody: {shown}");

    let info = target_info(&client, &head).await;
    assert_eq!(info["kind"], "slack");
    assert_eq!(info["url"], format!("{}/…", receiver.url).as_str(), "the host only");
    let listed = client.get(format!("{}/api/notify", head.url)).send().await.unwrap();
    assert!(!listed.text().await.unwrap().contains("S3CRETKEY"));
    let metrics = client.get(format!("{}/metrics", head.url)).send().await.unwrap();
    assert!(!metrics.text().await.unwrap().contains("S3CRETKEY"));
    assert!(!head.log().contains("S3CRETKEY"));
}

/// A receiver on a loopback port that refuses every request with a 404
/// whose body echoes the path and query asked for, as many servers do.
async fn echoing_refuser() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new()
        .fallback(|uri: Uri| async move { (AxumStatus::NOT_FOUND, format!("no hook at {uri}")) });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// Round three: a generic webhook's and an Alertmanager's URL path (where
/// Discord, Teams and relays keep their key) were shown by `GET
/// /api/notify` and in the head's log. Neither they, nor the error of a
/// failed delivery whose receiver echoes the path, carry the secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_webhook_secrets_shown_nowhere_for_any_kind_of_target() {
    let webhook = Receiver::start(|_| 200).await;
    let refuser = echoing_refuser().await;
    let dir = tempfile::tempdir().unwrap();
    let hook = format!("{}/hooks/W3BHOOKKEY?token=QU3RYKEY", webhook.url);
    let am = format!("{refuser}/relay/AMK3Y");
    // At `info`, the head logs each target as it starts sending to it.
    let head = serve(dir.path())
        .args(["--notify-webhook", &hook, "--notify-alertmanager", &am])
        .args(["--public-url", "https://ts.example"])
        .env("RUST_LOG", "info")
        .start()
        .unwrap();
    let client = Client::new();
    let id = register(&client, &head, "bert").await;
    error(&client, &head, &id).await;
    eventually("the webhook's event", DEADLINE, || {
        std::future::ready(webhook.accepted().first().cloned())
    })
    .await;
    assert_eq!(webhook.requests()[0].path, "/hooks/W3BHOOKKEY", "the secret is still sent");
    let listed = eventually("the Alertmanager's failure recorded", DEADLINE, || {
        let client = client.clone();
        let url = format!("{}/api/notify", head.url);
        async move {
            let (_, answer) = send_json(&client, Method::GET, &url, None).await;
            let targets = answer["targets"].as_array().cloned().unwrap_or_default();
            let failed =
                targets.iter().any(|t| t["kind"] == "alertmanager" && t["last_error"].is_string());
            failed.then_some(answer)
        }
    })
    .await;
    let targets = listed["targets"].as_array().unwrap();
    let of = |kind: &str| targets.iter().find(|t| t["kind"] == kind).unwrap().clone();
    assert_eq!(of("webhook")["url"], format!("{}/…", webhook.url).as_str());
    let refused = of("alertmanager");
    assert_eq!(refused["url"], format!("{refuser}/…").as_str());
    let error = refused["last_error"].as_str().unwrap();
    assert!(error.contains("404") && error.contains("no hook at …"), "{error}");
    let text = listed.to_string();
    let log = head.log();
    for secret in ["W3BHOOKKEY", "QU3RYKEY", "AMK3Y"] {
        assert!(!text.contains(secret), "GET /api/notify shows {secret}: {text}");
        assert!(!log.contains(secret), "the log shows {secret}: {log}");
    }
    assert!(log.contains("sending notifications"), "the targets are logged: {log}");
}

/// An alert's `endsAt` as a time.
fn ends_at(alert: &Value) -> SystemTime {
    humantime::parse_rfc3339(alert["endsAt"].as_str().unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_run_fires_an_alert_sent_again_while_it_holds_and_resolved_when_it_advances() {
    let alertmanager = Receiver::start(|_| 200).await;
    let dir = tempfile::tempdir().unwrap();
    let am = format!("{}/#resend=1s", alertmanager.url);
    let head = start_head(
        dir.path(),
        &[
            "--notify-alertmanager",
            &am,
            "--public-url",
            "http://ts.example",
            "--lease",
            "4s",
            "--stall-after",
            "1s",
        ],
    )
    .unwrap();
    let client = Client::new();
    let post = |path: String, body: Value| {
        let (client, url) = (client.clone(), format!("{}{path}", head.url));
        async move {
            let answer = client.post(&url).json(&body).send().await.unwrap();
            assert!(answer.status().is_success(), "POST {url}: {}", answer.status());
            answer.json::<Value>().await.unwrap()
        }
    };
    let worker = serde_json::to_value(&workers(1, 1, "am-")[0]).unwrap();
    let join = json!({"world_size": 1, "worker": worker, "name": "stalls", "job_id": "5"});
    let id = post("/api/train/rendezvous/am-stall/join".into(), join).await["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let beat = format!("/api/train/runs/{id}/ranks/0/heartbeat");
    post(beat.clone(), json!({"attempt_id": "0", "progress": {"step": 5, "total_steps": 10}}))
        .await;

    // Firing alerts of the run's stall: sent, and sent again while it holds.
    let firing = |requests: &[Received]| -> Vec<Value> {
        requests
            .iter()
            .filter(|r| r.path == "/api/v2/alerts")
            .flat_map(|r| {
                let at = r.at;
                r.body.as_array().unwrap().iter().cloned().map(move |a| (a, at))
            })
            .filter(|(a, at)| {
                a["labels"]["alertname"] == "TrainRunStalled"
                    && a["labels"]["run_id"] == id.as_str()
                    && ends_at(a) > *at + Duration::from_secs(2)
            })
            .map(|(a, _)| a)
            .collect()
    };
    let fired = loop {
        let fired = firing(&alertmanager.requests());
        if fired.len() >= 2 {
            break fired;
        }
        // The rank keeps heartbeating, without advancing.
        post(beat.clone(), json!({"attempt_id": "0"})).await;
        tokio::time::sleep(Duration::from_millis(100)).await; // a rank's heartbeat pace, not a wait for a result
        assert!(alertmanager.requests().len() < 1_000, "no stall alert came");
    };
    let labels = fired[0]["labels"].clone();
    assert_eq!(
        labels,
        json!({
            "alertname": "TrainRunStalled", "severity": "warning", "run_id": id,
            "run_name": "stalls", "job_id": "5", "node": "10.0.0.1",
        })
    );
    assert_eq!(fired[1]["labels"], labels, "sent again, the same alert");
    assert_eq!(fired[0]["generatorURL"], format!("http://ts.example/runs/{id}").as_str());
    assert!(fired[0]["annotations"]["summary"].as_str().unwrap().contains("stalls"));
    assert!(fired[0]["annotations"]["description"].as_str().unwrap().contains("rank"));

    // The rank advances: the same alert comes with `endsAt` now.
    let resolved = loop {
        let resolved = alertmanager.requests().into_iter().find_map(|r| {
            r.body
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["labels"] == labels && ends_at(a) <= r.at + Duration::from_secs(1))
                .cloned()
        });
        if let Some(resolved) = resolved {
            break resolved;
        }
        post(beat.clone(), json!({"attempt_id": "0", "progress": {"step": 6}})).await;
        tokio::time::sleep(Duration::from_millis(100)).await; // a rank's heartbeat pace, not a wait for a result
        assert!(alertmanager.requests().len() < 1_000, "the alert was never resolved");
    };
    assert_eq!(resolved["startsAt"], fired[0]["startsAt"]);
    let info = target_info(&client, &head).await;
    assert_eq!(info["kind"], "alertmanager");
    assert_eq!(info["url"], format!("{}/…", alertmanager.url).as_str(), "no path shown");
    assert_eq!(info["failures"], 0);
}

/// Starts a head with `args` and `env`, which must refuse to start (exit
/// non-zero, never saying `listening on`) with a message naming `flag`
/// and `rule`, and never showing a Slack URL's secret.
fn refuses(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)], flag: &str, rule: &str) {
    let mut serve = serve(dir).args(args);
    for (name, value) in env {
        serve = serve.env(name, value);
    }
    let refused = serve.start().expect_err("a bad flag must refuse to start");
    assert!(!refused.status.success(), "{args:?}: {}", refused.status);
    assert!(refused.log.contains(flag), "{args:?} {env:?}: {}", refused.log);
    assert!(refused.log.contains(rule), "{args:?} {env:?}: {}", refused.log);
    assert!(!refused.log.contains("S3CRETKEY"), "a Slack URL is a secret: {}", refused.log);
}

#[test]
fn bad_notification_flags_refuse_to_start_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    refuses(dir, &["--notify-webhook", "not-a-url"], &[], "--notify-webhook", "not a URL");
    let slack = "https://hooks.slack.com/services/T0/B0/S3CRETKEY#events=errored,explode";
    refuses(dir, &["--notify-slack", slack], &[], "--notify-slack", "unknown event \"explode\"");
    let am = "ftp://am:9093";
    refuses(
        dir,
        &["--notify-alertmanager", am],
        &[],
        "--notify-alertmanager",
        "http:// or https://",
    );
    let env = [("TRAINSTATE_NOTIFY_WEBHOOK", "http://h/a http://h/b#colour=red")];
    refuses(dir, &[], &env, "--notify-webhook", "unknown option \"colour\"");
    let hook = ["--notify-webhook", "http://h/"];
    refuses(
        dir,
        &[&hook[..], &["--public-url", "ts.example"]].concat(),
        &[],
        "--public-url",
        "is not a URL",
    );
    let twice = ["--notify-webhook", "http://h/a", "--notify-webhook", "http://h/b"];
    refuses(dir, &twice, &[], "--notify-", "#target=NAME");
    refuses(
        dir,
        &[&hook[..], &["--in-memory"]].concat(),
        &[],
        "--notify-webhook",
        "--in-memory keeps none",
    );
    let backlog = [&hook[..], &["--notify-backlog", "0"]].concat();
    refuses(dir, &backlog, &[], "--notify-backlog", "at least 1");
    let classes = ["--notify-webhook", "http://h/#classes=application,user"];
    refuses(
        dir,
        &classes,
        &[],
        "--notify-webhook",
        "unknown class \"user\" in classes=; known: infrastructure, application, interrupted, no_progress",
    );
    let mixed = ["--notify-webhook", "http://h/#causes=oom,!preempted"];
    refuses(dir, &mixed, &[], "--notify-webhook", "causes=\"oom,!preempted\"");
}

/// Ends run `id` as `status` of cause `kind`, rank 1 failing first.
async fn end_of(client: &Client, head: &Head, id: &RunId, status: &str, kind: &str) {
    let body = json!({
        "status": status,
        "detail": format!("Rank 1 ended: {kind}."),
        "cause": {"kind": kind, "failed_world_rank": 1},
    });
    set_status(client, head, id, body).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_filtered_on_causes_gets_only_the_failures_of_its_classes_and_kinds() {
    let application = Receiver::start(|_| 200).await;
    let not_preempted = Receiver::start(|_| 200).await;
    let dir = tempfile::tempdir().unwrap();
    let app_hook = format!("{}/app#classes=application&target=app", application.url);
    let kept_hook = format!("{}/kept#causes=!preempted&target=kept", not_preempted.url);
    let head =
        start_head(dir.path(), &["--notify-webhook", &app_hook, "--notify-webhook", &kept_hook])
            .unwrap();
    let client = Client::new();

    // Three runs the machine failed, one a scheduler preempted, then the
    // one the code failed. A target reads runs in the order they changed,
    // so once it has the last one and nothing pending, it has judged and
    // sent every other.
    let mut machine = Vec::new();
    for (i, kind) in ["OOM", "NODE_LOST", "HARDWARE"].into_iter().enumerate() {
        let id = register(&client, &head, &format!("machine-{i}")).await;
        end_of(&client, &head, &id, "ERRORED", kind).await;
        machine.push(id);
    }
    let preempted = register(&client, &head, "preempted").await;
    end_of(&client, &head, &preempted, "ABORTED", "PREEMPTED").await;
    let code = register(&client, &head, "code").await;
    end_of(&client, &head, &code, "ERRORED", "USER_ERROR").await;

    let code_event = format!("{code}:ERRORED");
    for receiver in [&application, &not_preempted] {
        eventually("the code's failure delivered", DEADLINE, || {
            let has = receiver.accepted().iter().any(|e| e["event_id"] == code_event.as_str());
            std::future::ready(has.then_some(()))
        })
        .await;
    }
    eventually("nothing pending", DEADLINE, || {
        let client = client.clone();
        let head = &head;
        async move {
            let (_, answer) =
                send_json(&client, Method::GET, &format!("{}/api/notify", head.url), None).await;
            let targets = answer["targets"].as_array().cloned().unwrap_or_default();
            targets.iter().all(|t| t["pending"] == 0).then_some(())
        }
    })
    .await;
    let ids = |receiver: &Receiver| -> Vec<String> {
        receiver.accepted().iter().map(|e| e["event_id"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(
        ids(&application),
        std::slice::from_ref(&code_event),
        "no infrastructure failure, no preemption"
    );
    let event = &application.accepted()[0];
    assert_eq!(event["cause"]["kind"], "USER_ERROR");
    assert_eq!(event["cause"]["class"], "APPLICATION");
    check_schema(event);

    // Events of different runs go side by side: in any order.
    let mut expected: Vec<String> = machine.iter().map(|id| format!("{id}:ERRORED")).collect();
    expected.push(code_event);
    expected.sort();
    let mut told = ids(&not_preempted);
    told.sort();
    assert_eq!(told, expected, "every failure but the preemption");
    let accepted = not_preempted.accepted();
    let oom = accepted.iter().find(|e| e["run_id"] == machine[0].as_str()).unwrap();
    assert_eq!(oom["cause"]["kind"], "OOM");
    assert_eq!(oom["cause"]["class"], "INFRASTRUCTURE");

    // GET /api/notify says each target's filter.
    let url = format!("{}/api/notify", head.url);
    let (status, answer) = send_json(&client, Method::GET, &url, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let targets = answer["targets"].as_array().unwrap();
    assert_eq!(targets[0]["name"], "app");
    assert_eq!(targets[0]["classes"], json!(["APPLICATION"]));
    assert_eq!(targets[1]["name"], "kept");
    assert_eq!(targets[1]["causes_left_out"], json!(["PREEMPTED"]));
    assert_eq!(targets[1]["causes"], json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_is_down_holds_at_most_the_backlog_and_the_rest_is_counted_dropped() {
    let receiver = Receiver::start(|_| 503).await;
    let dir = tempfile::tempdir().unwrap();
    let hook = format!("{}/hook#events=finished", receiver.url);
    let head =
        start_head(dir.path(), &["--notify-webhook", &hook, "--notify-backlog", "5"]).unwrap();
    let client = Client::new();
    let mut ids = Vec::new();
    for i in 0..40 {
        let id = register(&client, &head, &format!("burst-{i}")).await;
        set_status(&client, &head, &id, json!({"status": "FINISHED"})).await;
        ids.push(id);
        let info = target_info(&client, &head).await;
        assert!(info["pending"].as_u64().unwrap() <= 5, "{info}");
    }
    let info = eventually("every event read", DEADLINE, || {
        let client = client.clone();
        let head = &head;
        async move {
            let info = target_info(&client, head).await;
            assert!(info["pending"].as_u64().unwrap() <= 5, "{info}");
            (info["dropped"] == 35 && info["pending"] == 5).then_some(info)
        }
    })
    .await;
    assert!(info["failures"].as_u64().unwrap() >= 1, "{info}");
    assert!(receiver.accepted().is_empty());
    let name = info["name"].as_str().unwrap();
    assert_eq!(metric(&client, &head, "trainstate_notify_dropped_total", name).await, Some(35.0));
    assert_eq!(metric(&client, &head, "trainstate_notify_pending", name).await, Some(5.0));
    assert!(head.log().contains("notification events dropped"), "logged: {}", head.log());

    // Back up, it gets the newest five (side by side, in any order), and
    // nothing else.
    receiver.answer_with(|_| 200);
    eventually("the five kept delivered", DEADLINE, || {
        std::future::ready(receiver.accepted().len() >= 5)
    })
    .await;
    let mut delivered: Vec<String> =
        receiver.accepted().iter().map(|e| e["event_id"].as_str().unwrap().to_owned()).collect();
    delivered.sort();
    let mut newest: Vec<String> = ids[35..].iter().map(|id| format!("{id}:FINISHED")).collect();
    newest.sort();
    assert_eq!(delivered, newest);
    let info = target_info_once_sent(&client, &head, 5).await;
    assert_eq!((info["sent"].as_u64(), info["pending"].as_u64()), (Some(5), Some(0)), "{info}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_postgres), ignore = "needs TRAINSTATE_TEST_POSTGRES_URL")]
async fn of_two_heads_on_one_postgresql_store_only_the_sweeping_one_sends_and_the_other_takes_over()
{
    let receiver = Receiver::start(|_| 200).await;
    let fresh = crate::stores::Store::Postgres.fresh("notify").await;
    let url = fresh.url().unwrap().to_owned();
    let hook = format!("{}/hook", receiver.url);
    let args = ["--store", &url, "--notify-webhook", &hook];
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = start_head(dir_a.path(), &args).unwrap();
    let mut b = start_head(dir_b.path(), &args).unwrap();
    let client = Client::new();
    let sending = |head: &Head| {
        let (client, url) = (client.clone(), format!("{}/api/notify", head.url));
        async move {
            let (_, answer) = send_json(&client, Method::GET, &url, None).await;
            answer["targets"][0]["sending"] == true
        }
    };
    let (a_sends, b_sends) = eventually("one head to send", DEADLINE, || async {
        let both = (sending(&a).await, sending(&b).await);
        (both.0 != both.1).then_some(both)
    })
    .await;
    assert!(a_sends != b_sends, "exactly one head sends");
    let (sender, other) = if a_sends { (&mut a, &b) } else { (&mut b, &a) };

    // A run that errors through the head that does not send is told once.
    let first = register(&client, other, "through-the-other").await;
    error(&client, other, &first).await;
    let wanted = format!("{first}:ERRORED");
    eventually("the first event", DEADLINE, || {
        std::future::ready(receiver.accepted().iter().any(|e| e["event_id"] == wanted.as_str()))
    })
    .await;
    assert!(!sending(other).await, "the other head still does not send");

    // The sending head dies: the other takes the sweep lock and sends.
    sender.kill();
    let second = register(&client, other, "after-the-kill").await;
    error(&client, other, &second).await;
    let wanted = format!("{second}:ERRORED");
    eventually("the second event, sent by the survivor", DEADLINE, || {
        std::future::ready(receiver.accepted().iter().any(|e| e["event_id"] == wanted.as_str()))
    })
    .await;
    assert!(sending(other).await);
    let mut ids: Vec<String> =
        receiver.accepted().iter().map(|e| e["event_id"].as_str().unwrap().to_owned()).collect();
    ids.sort();
    ids.dedup();
    let mut expected = vec![format!("{first}:ERRORED"), wanted];
    expected.sort();
    assert_eq!(ids, expected, "each event, repeated only as at least once allows");
}

/// A receiver on a loopback port that holds every request until it is let
/// go, counting the requests it holds at once and checking that no run
/// has two of its events in flight together.
#[derive(Clone)]
struct Holding {
    url: String,
    /// Requests held now, and the most held at once.
    held: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    /// The runs of the requests held now.
    runs: Arc<Mutex<HashSet<String>>>,
    /// A run had two events in flight at once.
    overlapped: Arc<AtomicBool>,
    /// The event ids, in the order their requests arrived.
    arrived: Arc<Mutex<Vec<String>>>,
    /// Answered: the event ids taken.
    taken: Arc<Mutex<Vec<String>>>,
    /// Requests are held while this is false.
    gate: tokio::sync::watch::Sender<bool>,
}

impl Holding {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let holding = Self {
            url: format!("http://{addr}"),
            held: Arc::default(),
            most: Arc::default(),
            runs: Arc::default(),
            overlapped: Arc::default(),
            arrived: Arc::default(),
            taken: Arc::default(),
            gate: tokio::sync::watch::Sender::new(false),
        };
        let app = axum::Router::new().fallback(hold).with_state(holding.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        holding
    }
}

async fn hold(State(holding): State<Holding>, body: Bytes) -> AxumStatus {
    let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let id = event["event_id"].as_str().unwrap_or_default().to_owned();
    let run = event["run_id"].as_str().unwrap_or_default().to_owned();
    holding.arrived.lock().unwrap().push(id.clone());
    if !holding.runs.lock().unwrap().insert(run.clone()) {
        holding.overlapped.store(true, Ordering::SeqCst);
    }
    let now = holding.held.fetch_add(1, Ordering::SeqCst) + 1;
    holding.most.fetch_max(now, Ordering::SeqCst);
    let mut gate = holding.gate.subscribe();
    let _ = gate.wait_for(|open| *open).await;
    holding.runs.lock().unwrap().remove(&run);
    holding.held.fetch_sub(1, Ordering::SeqCst);
    holding.taken.lock().unwrap().push(id);
    AxumStatus::OK
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_one_slow_receiver_gets_four_events_at_once_and_its_wait_shows() {
    let receiver = Holding::start().await;
    let dir = tempfile::tempdir().unwrap();
    let hook = format!("{}/hook", receiver.url);
    let head = start_head(dir.path(), &["--notify-webhook", &hook]).unwrap();
    let client = Client::new();
    let name = format!("webhook-{}", receiver.url.trim_start_matches("http://"));
    let oldest = "trainstate_notify_oldest_pending_seconds";
    eventually("the gauge shown, nothing pending", DEADLINE, || {
        let client = client.clone();
        let (head, name) = (&head, &name);
        async move { (metric(&client, head, oldest, name).await == Some(0.0)).then_some(()) }
    })
    .await;

    // A run that restarts, then errors: its two events go in order, one
    // at a time.
    let ordered = register(&client, &head, "restarts-then-errs").await;
    let attempt = json!({
        "attempt_id": "1",
        "start_time_ms": trainstate_testkit::runs::T0 + 1_000,
        "workers": workers(2, 4, "second-"),
    });
    let url = format!("{}/api/train/runs/{ordered}/attempts", head.url);
    let (status, answer) = send_json(&client, Method::POST, &url, Some(&attempt)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    error(&client, &head, &ordered).await;
    // Eight more runs, an error each.
    let mut ids = Vec::new();
    for i in 0..8 {
        let id = register(&client, &head, &format!("slow-{i}")).await;
        error(&client, &head, &id).await;
        ids.push(id);
    }

    // The receiver holds what it gets: four requests at once, of four runs.
    eventually("four requests held at once", DEADLINE, || {
        std::future::ready((receiver.held.load(Ordering::SeqCst) == 4).then_some(()))
    })
    .await;
    // While they are held, the oldest event's wait shows.
    let waited = eventually("the oldest event's wait shown", DEADLINE, || {
        let client = client.clone();
        let (head, name) = (&head, &name);
        async move { metric(&client, head, oldest, name).await.filter(|age| *age > 0.0) }
    })
    .await;
    assert!(waited > 0.0, "{waited}");
    eventually("every event read", DEADLINE, || {
        let client = client.clone();
        let (head, name) = (&head, &name);
        async move {
            let pending = metric(&client, head, "trainstate_notify_pending", name).await;
            (pending == Some(10.0)).then_some(())
        }
    })
    .await;
    assert_eq!(receiver.most.load(Ordering::SeqCst), 4, "never more than four in flight");

    // Let go, every event is taken, and nothing waits any more.
    receiver.gate.send_replace(true);
    let info = target_info_once_sent(&client, &head, 10).await;
    assert_eq!(info["failures"], 0, "a slow receiver is no failing one: {info}");
    assert_eq!(metric(&client, &head, oldest, &name).await, Some(0.0));
    assert_eq!(receiver.most.load(Ordering::SeqCst), 4, "never more than four in flight");
    assert!(!receiver.overlapped.load(Ordering::SeqCst), "a run had two events in flight at once");
    let taken: HashSet<String> = receiver.taken.lock().unwrap().iter().cloned().collect();
    let mut expected: HashSet<String> = ids.iter().map(|id| format!("{id}:ERRORED")).collect();
    let (restarting, errored) = (format!("{ordered}:RESTARTING:1"), format!("{ordered}:ERRORED"));
    expected.extend([restarting.clone(), errored.clone()]);
    assert_eq!(taken, expected);
    assert_eq!(receiver.taken.lock().unwrap().len(), 10, "each event once");
    let arrived = receiver.arrived.lock().unwrap().clone();
    let at = |id: &str| arrived.iter().position(|a| a == id).unwrap();
    assert!(at(&restarting) < at(&errored), "a run's events in order: {arrived:?}");
}
