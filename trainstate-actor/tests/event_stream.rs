//! The live event stream and slow readers: subscribers that never read,
//! snapshots beside writers, lagged subscribers, event ids that name their
//! stream, and the bounds on what a slow reader may pin (items 4, 8, 3's
//! backlog and 6's slow readers of docs/reliability.md).

use std::collections::HashSet;
use std::time::Duration;

use reqwest::{Client, Method, StatusCode};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use trainstate_actor::StateConfig;
use trainstate_actor::http::HttpConfig;
use trainstate_schema::{RunId, RunStatus, TrainRunInfo};

use crate::common::{Server, eventually, fill, run_with, start_head, unique_name};
use crate::contract::{check_event, send};

const T0: u64 = 1_760_000_000_000;

/// What a test waits for at most; only a hung test reaches it.
const DEADLINE: Duration = Duration::from_secs(120);

/// One Server-Sent Event.
#[derive(Debug)]
struct SseEvent {
    id: u64,
    event: String,
    data: Value,
}

/// Reads events from a real socket, checking each against the document.
struct SseReader {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl SseReader {
    async fn open(base: &str, last_event_id: Option<u64>) -> Self {
        let mut request = Client::new().get(format!("{base}/api/train/events"));
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id.to_string());
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        Self { response, buffer: Vec::new() }
    }

    /// The next event (keep-alive comments skipped).
    async fn next(&mut self) -> SseEvent {
        tokio::time::timeout(DEADLINE, async {
            loop {
                if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                    let block: Vec<u8> = self.buffer.drain(..end + 2).collect();
                    let block = String::from_utf8(block).unwrap();
                    let (mut id, mut event, mut data) = (None, String::from("message"), None);
                    for line in block.lines() {
                        if let Some(v) = line.strip_prefix("id:") {
                            id = Some(v.trim().parse::<u64>().unwrap());
                        } else if let Some(v) = line.strip_prefix("event:") {
                            event = v.trim().to_owned();
                        } else if let Some(v) = line.strip_prefix("data:") {
                            assert!(data.is_none(), "one data line per event");
                            data = Some(v.strip_prefix(' ').unwrap_or(v).to_owned());
                        }
                    }
                    let Some(data) = data else { continue }; // a keep-alive comment
                    let data: Value = serde_json::from_str(&data).unwrap();
                    check_event(&data);
                    let id = id.expect("every event has an id");
                    assert_eq!(data["seq"], id, "the id is the event's seq");
                    return SseEvent { id, event, data };
                }
                let chunk = self.response.chunk().await.unwrap().expect("the stream goes on");
                self.buffer.extend_from_slice(&chunk);
            }
        })
        .await
        .expect("an event before the deadline")
    }
}

/// Opens an event stream on a raw socket and never reads from it.
async fn never_reading_subscriber(base: &str) -> TcpStream {
    let address = base.strip_prefix("http://").unwrap();
    let mut socket = TcpStream::connect(address).await.unwrap();
    let request = format!("GET /api/train/events HTTP/1.1\r\nHost: {address}\r\n\r\n");
    socket.write_all(request.as_bytes()).await.unwrap();
    socket
}

/// Asks for `path` on a raw socket and never reads the answer. The socket's
/// receive buffer is kept small, so the kernel cannot take the answer off
/// the head's hands (loopback buffers can grow to megabytes): what the head
/// still holds is what the test measures.
async fn never_reading_request(base: &str, path: &str) -> TcpStream {
    let address = base.strip_prefix("http://").unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut socket = socket.connect(address.parse().unwrap()).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\n\r\n");
    socket.write_all(request.as_bytes()).await.unwrap();
    socket
}

/// One reading of `/metrics`.
async fn metric(base: &str, name: &str) -> u64 {
    let (status, text) =
        send(&Client::new(), Method::GET, &format!("{base}/metrics"), None, None).await;
    assert_eq!(status, StatusCode::OK);
    let text = text.as_str().expect("metrics are text");
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no metric {name}"))
        .parse::<f64>()
        .unwrap() as u64
}

/// Waits until `/metrics`' `name` satisfies `condition`; returns the reading.
async fn wait_for_metric(
    base: &str,
    name: &str,
    what: &str,
    condition: impl Fn(u64) -> bool,
) -> u64 {
    let what = format!("{what} ({name})");
    eventually(&what, DEADLINE, || async {
        let value = metric(base, name).await;
        condition(value).then_some(value)
    })
    .await
}

/// A small live run with a fresh id.
fn small_run(i: usize) -> TrainRunInfo {
    run_with(&RunId::new_v7(), &format!("run{i:05}"), "job1", T0 + i as u64, 2)
}

/// A finished run of about 70 KB (more than a 64 KiB chunk) with a fresh
/// id: a 50,000-character detail and 100 workers. Every one has the same
/// length.
fn big_run(i: usize) -> TrainRunInfo {
    let live = run_with(&RunId::new_v7(), &format!("big{i:05}"), "job1", T0 + i as u64, 100);
    let mut draft = live.into_draft();
    draft.run_status = RunStatus::Finished;
    draft.status_detail = "x".repeat(50_000);
    draft.end_time_ms = Some(T0 + 1_000_000 + i as u64);
    draft.validate().unwrap()
}

/// Registers `run` through the API.
async fn register(client: &Client, base: &str, run: &TrainRunInfo) -> usize {
    let body = serde_json::to_vec(run).unwrap();
    let len = body.len();
    let (status, answer) = send(
        client,
        Method::POST,
        &format!("{base}/api/train/runs"),
        Some(("application/json", body)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    len
}

/// Resident memory of a process, in bytes, from `/proc/<pid>/status`.
fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .map(|v| v.trim().parse().unwrap())
        .expect("VmRSS in /proc/<pid>/status");
    kib * 1024
}

/// What one connection of a client that never reads may pin in the head:
/// hyper's write buffer (it stops asking the body for more past ~408 KiB),
/// the chunk it last took (64 KiB, or one run when a run is larger) and the
/// stream's own state. Generous: 1 MiB.
const PER_SUBSCRIBER: u64 = 1024 * 1024;

/// Item 4: subscribers that never read must not make the head hold a copy
/// of the store each. A real `trainstate` process restarted on a store of
/// ~17 MB (a reconnect storm after a restart); 32 subscribers open the
/// event stream and never read. Each used to get its own serialized
/// snapshot (32 × 17 MB); now they share references to the stored runs,
/// and each pins at most `PER_SUBSCRIBER`. Measured two ways: the head's
/// own count of answer bytes held for sockets, and the process's resident
/// memory from /proc.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_subscribers_that_never_read_pin_memory_independent_of_the_store() {
    const SUBSCRIBERS: u64 = 32;
    let dir = tempfile::tempdir().unwrap();
    let mut store_bytes = 0;
    {
        let config = StateConfig::sqlite(dir.path().join("trainstate.db"))
            .with_name(unique_name("storm"))
            .with_synchronous(trainstate_actor::Synchronous::Normal);
        let service = trainstate_actor::launch_state_actor(config).await.unwrap();
        let runs: Vec<TrainRunInfo> = (0..240).map(big_run).collect();
        store_bytes += runs.iter().map(|run| serde_json::to_vec(run).unwrap().len()).sum::<usize>();
        fill(&service.handle(), runs).await.unwrap();
        service.shutdown().await;
    }
    assert!(store_bytes > 16 << 20, "a store of {store_bytes} bytes");
    let head = start_head(dir.path(), &[]).unwrap();
    let base = head.url.clone();
    let client = Client::new();
    let before = resident_bytes(head.pid());

    let mut sockets = Vec::new();
    for _ in 0..SUBSCRIBERS {
        sockets.push(never_reading_subscriber(&base).await);
    }
    wait_for_metric(&base, "trainstate_events_subscribers", "every stream to be open", |n| {
        n == SUBSCRIBERS
    })
    .await;
    // Every stream has filled its socket's buffers and stopped, hyper
    // holding at least a chunk for each: the snapshots are stuck midway,
    // which is when the old head held a whole copy per subscriber.
    let held = wait_for_metric(
        &base,
        "trainstate_answer_in_flight_bytes",
        "every snapshot to be stuck on its socket",
        |bytes| bytes >= SUBSCRIBERS * (64 << 10),
    )
    .await;
    assert!(
        held <= SUBSCRIBERS * PER_SUBSCRIBER,
        "{held} bytes held for {SUBSCRIBERS} sockets: more than {PER_SUBSCRIBER} each"
    );
    // The head still answers, and a write is committed while they are stuck.
    register(&client, &base, &small_run(10_000)).await;
    let after = resident_bytes(head.pid());
    let grown = after.saturating_sub(before);
    // Allocator slack and the connections' own buffers: 64 MiB.
    let bound = SUBSCRIBERS * PER_SUBSCRIBER + (64 << 20);
    assert!(
        (SUBSCRIBERS * store_bytes as u64) > 4 * bound,
        "the bound must be far below one copy of the store per subscriber"
    );
    assert!(
        grown <= bound,
        "the head grew {grown} bytes for {SUBSCRIBERS} subscribers that never read \
         (store {store_bytes} bytes; bound {bound})"
    );
    let held = metric(&base, "trainstate_answer_in_flight_bytes").await;
    assert!(held <= SUBSCRIBERS * PER_SUBSCRIBER, "{held} bytes held");
    eprintln!(
        "{SUBSCRIBERS} subscribers that never read, store of {store_bytes} bytes: \
         {held} answer bytes held, resident memory grew {grown} bytes (bound {bound})"
    );
    drop(sockets);
    wait_for_metric(
        &base,
        "trainstate_answer_in_flight_bytes",
        "closed sockets to free their bytes",
        |b| b == 0,
    )
    .await;
}

/// Item 4: snapshots in progress never hold up writers. Sixteen subscribers
/// are stuck midway through a snapshot of a ~7 MB store (they never read);
/// meanwhile writes are committed and answered, and a reading subscriber
/// gets them in commit order, ids increasing; each is then found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_writes_are_answered_while_many_snapshots_are_taken() {
    const STUCK: u64 = 16;
    let server = Server::start(
        StateConfig::in_memory().with_name(unique_name("snapshots")),
        HttpConfig::default(),
    )
    .await;
    let state = server.service.handle();
    for i in 0..100 {
        state.register(big_run(i)).await.unwrap();
    }
    let mut stuck = Vec::new();
    for _ in 0..STUCK {
        stuck.push(never_reading_subscriber(&server.url).await);
    }
    wait_for_metric(
        &server.url,
        "trainstate_answer_in_flight_bytes",
        "the snapshots to be stuck on their sockets",
        |bytes| bytes >= STUCK * (64 << 10),
    )
    .await;

    // A reader that resumes from now: no snapshot of its own, every change.
    let now = state.subscribe(None).await.unwrap().last_seq;
    let mut reader = SseReader::open(&server.url, Some(now)).await;
    let client = Client::new();
    let mut written = Vec::new();
    for i in 0..20 {
        let run = small_run(1_000 + i);
        register(&client, &server.url, &run).await;
        written.push(run.id().to_string());
    }
    let mut last = now;
    for id in &written {
        let event = reader.next().await;
        assert_eq!(
            (event.event.as_str(), event.data["run_id"].as_str()),
            ("registered", Some(id.as_str()))
        );
        assert!(event.id > last, "ids increase: {} after {last}", event.id);
        last = event.id;
        let (status, run) =
            send(&client, Method::GET, &format!("{}/api/train/runs/{id}", server.url), None, None)
                .await;
        assert_eq!((status, run["id"].as_str()), (StatusCode::OK, Some(id.as_str())));
    }
    // Still stuck, still holding no more than their share.
    assert_eq!(metric(&server.url, "trainstate_events_subscribers").await, STUCK + 1);
    drop(stuck);
    server.stop().await;
}

/// Item 8: a subscriber that lagged gets a snapshot at S, then only events
/// above S: ids strictly increase on the wire. The writer is held while 20
/// writes queue, so they are committed (and published) as one group, more
/// than the 4 events the head keeps: the subscriber's next event is gone.
#[tokio::test]
async fn regression_a_lagged_subscriber_gets_a_snapshot_then_only_later_events() {
    let config = StateConfig::in_memory().with_name(unique_name("lagged")).with_event_backlog(4);
    let faults = config.faults.clone();
    let server = Server::start(config, HttpConfig::default()).await;
    let state = server.service.handle();
    state.register(small_run(0)).await.unwrap();
    let mut reader = SseReader::open(&server.url, None).await;
    let first = reader.next().await;
    assert_eq!(first.event, "snapshot");

    faults.hold_writer();
    let mut writes = Vec::new();
    let mut written = HashSet::new();
    for i in 1..=20 {
        let run = small_run(i);
        written.insert(run.id().to_string());
        let state = state.clone();
        writes.push(tokio::spawn(async move { state.register(run).await }));
        let service = server.service.clone();
        crate::common::eventually("the write to be queued", DEADLINE, move || {
            std::future::ready(service.in_flight_writes() == i)
        })
        .await;
    }
    faults.release_writer();
    for write in writes {
        write.await.unwrap().unwrap();
    }

    let mut last = first.id;
    let mut seen: HashSet<String> = HashSet::new();
    let mut resynced = None;
    while seen.len() < written.len() {
        let event = reader.next().await;
        assert!(
            event.id > last,
            "ids strictly increase: {} after {last} ({})",
            event.id,
            event.event
        );
        last = event.id;
        match event.event.as_str() {
            "snapshot" => {
                resynced = Some(event.id);
                seen = event.data["train_runs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r["id"].as_str().unwrap().to_owned())
                    .filter(|id| written.contains(id))
                    .collect();
            }
            "registered" => {
                seen.insert(event.data["run_id"].as_str().unwrap().to_owned());
            }
            other => panic!("unexpected {other}"),
        }
    }
    let resynced = resynced.expect("the lagged subscriber got a fresh snapshot");
    // And after it, only events above it.
    let run = small_run(99);
    state.register(run.clone()).await.unwrap();
    let event = reader.next().await;
    assert_eq!(event.data["run_id"], run.id().as_str());
    assert!(event.id > resynced && event.id > last);
    server.stop().await;
}

/// Item 8: an id from another process (another stream) never matches: resuming
/// from it is answered with a snapshot, even when the later head has
/// published as many events. An id of this head resumes without a gap; an
/// id from the future gets a snapshot too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_an_event_id_from_another_head_is_answered_with_a_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::new();
    let mut earlier = start_head(dir.path(), &[]).unwrap();
    register(&client, &earlier.url, &small_run(0)).await;
    let mut reader = SseReader::open(&earlier.url, None).await;
    let old_id = reader.next().await.id;
    drop(reader);
    earlier.signal("-TERM");
    assert!(earlier.wait().success());
    drop(earlier);

    let later = start_head(dir.path(), &[]).unwrap();
    for i in 1..=3 {
        register(&client, &later.url, &small_run(i)).await;
    }
    let mut reader = SseReader::open(&later.url, Some(old_id)).await;
    let event = reader.next().await;
    assert_eq!(event.event, "snapshot", "an id from another head must get a snapshot");
    assert_eq!(event.data["train_runs"].as_array().unwrap().len(), 4);
    assert_ne!(event.id >> 26, old_id >> 26, "the later head names another stream");
    let now = event.id;
    drop(reader);

    let mut reader = SseReader::open(&later.url, Some(now - 1)).await;
    let event = reader.next().await;
    assert_eq!((event.event.as_str(), event.id), ("registered", now), "its own id resumes");
    drop(reader);

    let mut reader = SseReader::open(&later.url, Some(now + 1_000)).await;
    assert_eq!(reader.next().await.event, "snapshot", "an id from the future gets a snapshot");
}

/// The run ids an event tells of: every run of a snapshot, or its run.
fn runs_of(event: &SseEvent) -> Vec<String> {
    match event.data["train_runs"].as_array() {
        Some(runs) => runs.iter().map(|r| r["id"].as_str().unwrap().to_owned()).collect(),
        None => vec![event.data["run_id"].as_str().unwrap().to_owned()],
    }
}

/// Round two, finding 4: PostgreSQL heads started close together handed
/// out overlapping event ids (each started at its start time in µs), so a
/// subscriber that resumed on the other head was taken for one of its own,
/// got no snapshot and missed runs. Each head now names its own stream, at
/// random, in the high bits of every id: two heads of one store started
/// back to back, runs registered through both, a subscriber that read the
/// first head's stream resumes on the second with its last id, gets a
/// snapshot, and in the end has every run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_postgres), ignore = "needs TRAINSTATE_TEST_POSTGRES_URL")]
async fn regression_an_event_id_resumed_on_another_head_of_a_shared_store_gets_a_snapshot() {
    let fresh = crate::stores::Store::Postgres.fresh("ids_two_heads").await;
    let url = fresh.url().unwrap().to_owned();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = start_head(dir_a.path(), &["--store", &url]).unwrap();
    let b = start_head(dir_b.path(), &["--store", &url]).unwrap();
    let client = Client::new();
    let register_through_both = async |range: std::ops::Range<usize>| {
        let mut ids = HashSet::new();
        for i in range {
            let run = small_run(i);
            register(&client, if i % 2 == 0 { &a.url } else { &b.url }, &run).await;
            ids.insert(run.id().to_string());
        }
        ids
    };
    let first_twenty = register_through_both(0..20).await;

    let mut known = HashSet::new();
    let mut reader = SseReader::open(&a.url, None).await;
    let mut last = None;
    while !known.is_superset(&first_twenty) {
        let event = reader.next().await;
        known.extend(runs_of(&event));
        last = Some(event.id);
    }
    drop(reader);
    let mut every = register_through_both(20..40).await;
    every.extend(first_twenty);

    let mut reader = SseReader::open(&b.url, last).await;
    let event = reader.next().await;
    assert_eq!(event.event, "snapshot", "an id of the other head gets a snapshot");
    assert_ne!(Some(event.id >> 26), last.map(|id| id >> 26), "each head names its own stream");
    known.extend(runs_of(&event));
    while !known.is_superset(&every) {
        known.extend(runs_of(&reader.next().await));
    }
    assert_eq!(known, every, "the subscriber has every run, and only those");
}

/// Item 3 (the backlog): the events kept for resuming are bounded by bytes
/// as well as by count. Runs of ~70 KB with a backlog of 1,000 events but
/// 300,000 bytes: the head keeps at most 300,000 bytes of events (or the
/// newest alone), so an id the count would keep is answered with a
/// snapshot, and the newest still resume.
#[tokio::test]
async fn regression_the_event_backlog_is_bounded_by_bytes() {
    const BYTES: u64 = 300_000;
    let server = Server::start(
        StateConfig::in_memory()
            .with_name(unique_name("backlog"))
            .with_event_backlog(1_000)
            .with_event_backlog_bytes(BYTES as usize),
        HttpConfig::default(),
    )
    .await;
    let state = server.service.handle();
    // Small events: the count holds them all.
    for i in 0..10 {
        state.register(small_run(i)).await.unwrap();
    }
    assert_eq!(metric(&server.url, "trainstate_events_backlog").await, 10);
    let mut reader = SseReader::open(&server.url, None).await;
    let start = reader.next().await.id;
    drop(reader);
    for i in 10..30 {
        state.register(big_run(i)).await.unwrap();
        let held = metric(&server.url, "trainstate_events_backlog_bytes").await;
        let kept = metric(&server.url, "trainstate_events_backlog").await;
        assert!(held <= BYTES || kept == 1, "{held} bytes in {kept} events");
    }
    let run_len = serde_json::to_vec(&big_run(0)).unwrap().len() as u64;
    let kept = metric(&server.url, "trainstate_events_backlog").await;
    assert!(
        (1..=(BYTES / run_len).max(1)).contains(&kept),
        "events of {run_len} bytes in {BYTES} bytes: {kept} kept"
    );
    let last = start + 20;
    // Within the count, beyond the bytes: a snapshot.
    let mut reader = SseReader::open(&server.url, Some(start)).await;
    let event = reader.next().await;
    assert_eq!((event.event.as_str(), event.id), ("snapshot", last));
    drop(reader);
    // The newest event is kept.
    let mut reader = SseReader::open(&server.url, Some(last - 1)).await;
    assert_eq!(reader.next().await.id, last);
    server.stop().await;
}

/// Item 6 (slow readers): clients that ask for the unpaged listing and never
/// read pin at most the budget of answer bytes in flight (here 2 MiB), not
/// the listing each; past it, a listing is refused with 503 `overloaded`
/// (retryable); once they go, it is served whole again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_slow_readers_of_the_unpaged_listing_are_bounded() {
    const BUDGET: u64 = 2 << 20;
    let server = Server::start(
        StateConfig::in_memory().with_name(unique_name("slow-readers")),
        HttpConfig::default().with_max_answer_bytes(BUDGET as usize),
    )
    .await;
    let state = server.service.handle();
    let runs: Vec<TrainRunInfo> = (0..100).map(big_run).collect();
    for run in &runs {
        state.register(run.clone()).await.unwrap();
    }
    // Every listed run has the same length (ids, names and times too) and
    // is larger than a chunk, so every chunk of a listing is one run and a
    // comma or the opening: once the budget cannot take a next chunk
    // (`run + 1` bytes), it cannot take a new listing's first (`run + 15`).
    let (status, one) = send(
        &Client::new(),
        Method::GET,
        &format!("{}/api/train/runs?limit=1", server.url),
        None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let chunk = serde_json::to_vec(&one["train_runs"][0]).unwrap().len() as u64 + 1;
    assert!(chunk > 64 << 10, "a run of {chunk} bytes fills a chunk alone");
    let mut slow = Vec::new();
    // More readers than the budget can serve, each holding at least the
    // chunk it waits to write (those past the budget are refused).
    for _ in 0..32 {
        slow.push(never_reading_request(&server.url, "/api/train/v2/runs").await);
    }
    let held = wait_for_metric(
        &server.url,
        "trainstate_answer_in_flight_bytes",
        "the slow readers to take the whole budget",
        |bytes| bytes + chunk > BUDGET,
    )
    .await;
    assert!(held <= BUDGET, "{held} bytes held, over the budget");
    let client = Client::new();
    let url = format!("{}/api/train/v2/runs", server.url);
    let response = client.get(&url).send().await.unwrap();
    assert_eq!(response.headers().get("retry-after").map(|v| v.to_str().unwrap()), Some("1"));
    let status = response.status();
    let bytes = response.bytes().await.unwrap();
    crate::contract::check_answer(&Method::GET, &url, status, &bytes);
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("overloaded"))
    );
    // Reads that are not listings are served.
    let (status, _) =
        send(&client, Method::GET, &format!("{}/healthz", server.url), None, None).await;
    assert_eq!(status, StatusCode::OK);

    drop(slow);
    wait_for_metric(
        &server.url,
        "trainstate_answer_in_flight_bytes",
        "the slow readers' bytes to be freed",
        |b| b == 0,
    )
    .await;
    let (status, all) = send(&client, Method::GET, &url, None, None).await;
    assert_eq!(status, StatusCode::OK);
    let listed: Vec<&str> =
        all["train_runs"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    let expected: Vec<String> = runs.iter().rev().map(|r| r.id().to_string()).collect();
    assert_eq!(listed, expected, "every run, newest first");
    server.stop().await;
}

/// The flags of these bounds are checked before the head listens: a budget
/// of no bytes, one beyond 4 GiB, or a backlog of no events is refused,
/// naming the flag; their limits start.
#[test]
fn regression_event_and_answer_bound_flags_are_checked_before_listening() {
    let dir = tempfile::tempdir().unwrap();
    for (flags, named) in [
        (&["--max-answer-bytes", "0"][..], "--max-answer-bytes"),
        (&["--max-answer-bytes", "4294967296"][..], "--max-answer-bytes"),
        (&["--event-backlog", "0"][..], "--event-backlog"),
    ] {
        let refused = start_head(dir.path(), flags)
            .err()
            .unwrap_or_else(|| panic!("{flags:?} must be refused before `listening on`"));
        assert!(refused.contains(named), "{flags:?}: {refused}");
    }
    start_head(
        dir.path(),
        &["--max-answer-bytes", "4294967295", "--event-backlog", "1", "--event-backlog-bytes", "0"],
    )
    .expect("the limits themselves start");
}
