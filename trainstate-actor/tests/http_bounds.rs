//! Regression tests of cheap traffic at the HTTP layer (hardening, round
//! two): request bodies are charged as their bytes arrive and cut off when
//! they stall, and one client cannot take every connection. See
//! docs/reliability.md, "Round two: bounds at the HTTP layer".

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use trainstate_actor::http::HttpConfig;
use trainstate_actor::{ManualClock, StateConfig};
use trainstate_schema::RunId;

use crate::common::{Server, eventually, run_with, unique_name, workers};
use crate::contract::{check_answer, send};

const T0: u64 = 1_760_000_000_000;

/// A guard on a wait that must end by itself; not a margin the test needs.
const HANG: Duration = Duration::from_secs(60);

/// An hour: longer than any test, so that only the bound under test acts.
const NEVER: Duration = Duration::from_secs(3600);

fn addr(server: &Server) -> String {
    server.url.trim_start_matches("http://").to_owned()
}

/// Opens a raw connection and sends a write's headers announcing `length`
/// bytes of JSON, then `sent` bytes of it.
async fn upload(server: &Server, path: &str, length: usize, sent: usize) -> TcpStream {
    let mut stream = TcpStream::connect(addr(server)).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         content-length: {length}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    // JSON whitespace: what a stalled client sent of a document never finished.
    stream.write_all(&vec![b' '; sent]).await.unwrap();
    stream
}

/// One value of the head's `/metrics`.
async fn metric(server: &Server, name: &str) -> i64 {
    let text = Client::new()
        .get(format!("{}/metrics", server.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// Waits until `/metrics` says `name` is `want` (or more, with `at_least`).
pub(crate) async fn wait_for_metric(server: &Server, name: &str, want: i64, at_least: bool) {
    let what = format!("{name} to be {want}{}", if at_least { " or more" } else { "" });
    eventually(&what, HANG, || async {
        let value = metric(server, name).await;
        value == want || (at_least && value > want)
    })
    .await;
}

/// A registration of about `bytes` of JSON.
pub(crate) fn registration_of(bytes: usize) -> Vec<u8> {
    let per_worker =
        serde_json::to_vec(&run_with(&RunId::new_v7(), "big", "job1", T0, 100)).unwrap().len()
            / 100;
    let n = (bytes / per_worker).max(1) as u32;
    serde_json::to_vec(&run_with(&RunId::new_v7(), "big", "job1", T0, n)).unwrap()
}

async fn post(server: &Server, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let url = format!("{}{path}", server.url);
    send(&Client::new(), Method::POST, &url, Some(("application/json", body)), None).await
}

/// Finding 6 of round two: sixteen uploads that each announced 16 MiB and
/// sent one byte took the whole body budget up front, so a 3 KB
/// registration and a 20-byte rank heartbeat got 503, and a healthy run
/// was aborted `LOST_CONTROLLER`. A body now costs what it has sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_uploads_that_announce_16_mib_and_stall_do_not_stop_small_writes() {
    let clock = Arc::new(ManualClock::new(T0));
    let config = StateConfig::in_memory()
        .with_name(unique_name("stalled-uploads"))
        .with_clock(clock.clone())
        .with_lease(Duration::from_secs(60))
        .with_sweep_interval(NEVER);
    // The default budget (256 MiB: sixteen announced bodies of 16 MiB), and
    // neither the body-read timeout nor the request deadline cuts the stalls.
    let http = HttpConfig::default().with_body_read_timeout(NEVER).with_request_timeout(NEVER);
    let server = Server::start(config, http).await;

    // A launch without a controller: one rank, kept alive by its heartbeats.
    let join = json!({
        "world_size": 1,
        "worker": serde_json::to_value(&workers(1, 1, "n-")[0]).unwrap(),
        "name": "train",
        "job_id": "7",
    });
    let (status, joined) =
        post(&server, "/api/train/rendezvous/slurm:7.0/join", serde_json::to_vec(&join).unwrap())
            .await;
    assert_eq!((status, &joined["run_status"]), (StatusCode::OK, &json!("RUNNING")), "{joined}");
    let id = joined["run_id"].as_str().unwrap().to_owned();

    let stalled: Vec<TcpStream> = {
        let mut stalled = Vec::new();
        for _ in 0..16 {
            stalled.push(upload(&server, "/api/train/runs", 16 << 20, 1).await);
        }
        stalled
    };
    // Every stalled body is being received before anything else is sent.
    wait_for_metric(&server, "trainstate_http_request_bodies", 16, true).await;

    let registration =
        serde_json::to_vec(&run_with(&RunId::new_v7(), "r", "job1", T0, 14)).unwrap();
    assert!((2_500..4_000).contains(&registration.len()), "{} bytes", registration.len());
    let (status, body) = post(&server, "/api/train/runs", registration).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // The rank beats 40 s after the join and again 80 s after it, each
    // with a body of 18 bytes; 40 s after the last, past the join's lease,
    // the sweep finds the run alive.
    let beat = br#"{"attempt_id":"0"}"#.to_vec();
    for _ in 0..2 {
        clock.advance_ms(40_000);
        let (status, answer) =
            post(&server, &format!("/api/train/runs/{id}/ranks/0/heartbeat"), beat.clone()).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    clock.advance_ms(40_000);
    // (The registration above never beats, so the sweep ends that one.)
    let swept = server.service.handle().sweep_leases().await.unwrap();
    assert!(!swept.iter().any(|swept| swept.as_str() == id), "{swept:?}");
    let (status, run) = send(
        &Client::new(),
        Method::GET,
        &format!("{}/api/train/runs/{id}", server.url),
        None,
        None,
    )
    .await;
    assert_eq!((status, &run["run_status"]), (StatusCode::OK, &json!("RUNNING")), "{run}");

    // The sixteen uploads were held all along, unanswered.
    assert_eq!(metric(&server, "trainstate_http_request_bodies").await, 16);
    let mut probe = [0u8; 1];
    for stream in &stalled {
        let unanswered = matches!(
            stream.try_read(&mut probe),
            Err(ref e) if e.kind() == std::io::ErrorKind::WouldBlock
        );
        assert!(unanswered, "a stalled upload was answered or closed");
    }
    drop(stalled);
    server.stop().await;
}

/// A body that sends nothing for the body-read timeout is cut off with 408
/// `request_timeout`, and the bytes it had sent go back to the budget.
#[tokio::test]
async fn regression_a_body_that_stops_sending_is_cut_off_with_408_and_its_bytes_released() {
    let http = HttpConfig::default()
        .with_body_read_timeout(Duration::from_millis(200))
        .with_request_timeout(NEVER)
        .with_max_body_bytes_in_flight(1 << 20);
    let server =
        Server::start(StateConfig::in_memory().with_name(unique_name("idle-body")), http).await;
    let url = format!("{}/api/train/runs", server.url);
    // 64 KiB free of the budget, then 700 KiB charged to it, then nothing.
    let mut stalled = upload(&server, "/api/train/runs", 2 << 20, (64 + 700) << 10).await;
    let (status, body) = tokio::time::timeout(HANG, crate::http_guards::read_answer(&mut stalled))
        .await
        .expect("the head must cut off a body that sends nothing")
        .expect("an answer before the connection closes");
    check_answer(&Method::POST, &url, status, &body);
    assert_eq!(status, StatusCode::REQUEST_TIMEOUT);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["error"]["code"], "request_timeout", "{body}");
    // Its bytes are back: nothing is charged, and a body needing more than
    // what was left beside them (1 MiB - 700 KiB) is taken.
    assert_eq!(metric(&server, "trainstate_http_request_body_budget_bytes").await, 0);
    let big = registration_of(800 << 10);
    assert!(big.len() > (64 + 400) << 10, "{} bytes", big.len());
    let (status, body) = post(&server, "/api/train/runs", big).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    server.stop().await;
}

/// Finding 10 of round two: one client re-opening 700 half-sent
/// connections held every place, and every other client waited. Now one
/// client has at most `--max-connections-per-client` open; another client's
/// request is answered while the first is still at it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_one_client_reopening_700_half_sent_connections_does_not_hold_up_another() {
    // Only the per-client limit can close a half-sent connection here.
    let http = HttpConfig::default().with_header_read_timeout(NEVER);
    let server =
        Server::start(StateConfig::in_memory().with_name(unique_name("slowloris")), http).await;
    let target = addr(&server);
    let stop = Arc::new(AtomicBool::new(false));
    let reopened = Arc::new(AtomicU64::new(0));
    let slowloris = tokio::spawn({
        let (stop, reopened, target) = (stop.clone(), reopened.clone(), target.clone());
        async move {
            let open = |target: String| async move {
                let mut stream = TcpStream::connect(target).await.unwrap();
                // Half a header block, never finished.
                let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0").await;
                stream
            };
            let mut streams = Vec::with_capacity(700);
            for _ in 0..700 {
                streams.push(open(target.clone()).await);
            }
            // Re-opens every connection the head closes, until told to stop
            // (or after a bounded number of re-opens or a minute).
            let until = Instant::now() + HANG;
            let mut probe = [0u8; 64];
            while !stop.load(Ordering::SeqCst)
                && Instant::now() < until
                && reopened.load(Ordering::SeqCst) < 200_000
            {
                for stream in &mut streams {
                    let closed = match stream.try_read(&mut probe) {
                        Ok(_) => true,
                        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                    };
                    if closed {
                        *stream = open(target.clone()).await;
                        reopened.fetch_add(1, Ordering::SeqCst);
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            streams.len()
        }
    });
    // The head closes the connections over the limit at once (no timeout
    // could), and the client re-opens them.
    eventually("the head to close a connection over the per-client limit", HANG, || {
        std::future::ready(reopened.load(Ordering::SeqCst) >= 700)
    })
    .await;

    // Another client address on the loopback network.
    let other = Client::builder()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    let url = format!("{}/healthz", server.url);
    let (status, body) = tokio::time::timeout(HANG, send(&other, Method::GET, &url, None, None))
        .await
        .expect("another client is answered while one holds its connections");
    assert_eq!(status, StatusCode::OK, "{body}");
    // The slowloris was still at it when the answer came.
    let at_answer = reopened.load(Ordering::SeqCst);
    assert!(!slowloris.is_finished(), "the slowloris ended before the answer");
    eventually("the slowloris to go on after the answer", HANG, || {
        std::future::ready(reopened.load(Ordering::SeqCst) > at_answer)
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    assert_eq!(slowloris.await.unwrap(), 700);
    server.stop().await;
}
