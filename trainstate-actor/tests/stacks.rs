//! Stack captures: a rendezvous run that stalls opens a capture, each
//! rank's heartbeat carries its order once, the ranks' answers are kept
//! (cut to their bound), and the capture completes when every rank
//! answered or its deadline passed, with the stall's health naming it. The
//! captures are served from the store, survive a restart of the head, are
//! bounded per run and go with the run, on SQLite and on PostgreSQL; bad
//! input is refused naming its field. `trainstate runs stacks` prints them
//! for a person.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use trainstate_actor::http::HttpConfig;
use trainstate_actor::{ManualClock, StateConfig};
use trainstate_schema::limits::{
    CAPTURE_DEADLINE_MS, MAX_CAPTURES_PER_RUN, MAX_STACK_BYTES, MIN_CAPTURE_INTERVAL_MS,
};

use crate::common::{Server, unique_name, workers};
use crate::contract::send;
use crate::stores::{Store, on_both_stores};

const T0: u64 = 1_760_000_000_000;
const LEASE: Duration = Duration::from_secs(24 * 3600);
const STALL_AFTER: Duration = Duration::from_secs(10);

fn body(value: &Value) -> Option<(&'static str, Vec<u8>)> {
    Some(("application/json", serde_json::to_vec(value).unwrap()))
}

fn configured(config: StateConfig, what: &str, clock: &Arc<ManualClock>) -> StateConfig {
    config
        .with_name(unique_name(what))
        .with_clock(clock.clone())
        .with_lease(LEASE)
        .with_stall_after(STALL_AFTER)
        // The tests drive the sweep and the health tick themselves.
        .with_sweep_interval(Duration::from_secs(3600))
        .with_health_tick(Duration::from_secs(3600))
}

/// A stack of the main thread stuck in `function`.
fn stack(function: &str) -> String {
    format!(
        "Thread 0x00007f0a1b2c3d40 (most recent call first):\n  File \"train.py\", line 41 in {function}\n  File \"train.py\", line 90 in main\n"
    )
}

struct Fixture {
    server: Server,
    client: Client,
}

impl Fixture {
    async fn start(config: StateConfig) -> Self {
        let server = Server::start(config, HttpConfig::default()).await;
        Self { server, client: Client::new() }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.url)
    }

    async fn join(&self, key: &str, world_size: u32) -> String {
        self.join_with(key, world_size, &json!({})).await
    }

    /// Every rank of a group of `world_size` joins, each join with the
    /// fields of `extra` too: the run's id.
    async fn join_with(&self, key: &str, world_size: u32, extra: &Value) -> String {
        let mut id = String::new();
        for worker in workers(world_size, 1, &format!("{key}-")) {
            let mut join =
                json!({"world_size": world_size, "worker": worker, "name": key, "job_id": "7"});
            for (field, value) in extra.as_object().unwrap() {
                join[field] = value.clone();
            }
            let path = format!("/api/train/rendezvous/{key}/join");
            let (status, answer) =
                send(&self.client, Method::POST, &self.url(&path), body(&join), None).await;
            assert_eq!(status, StatusCode::OK, "{answer}");
            id = answer["run_id"].as_str().unwrap().to_owned();
        }
        id
    }

    /// Rank `rank`'s heartbeat with `progress`: its answer.
    async fn beat(&self, id: &str, rank: u32, progress: Value) -> Value {
        let path = format!("/api/train/runs/{id}/ranks/{rank}/heartbeat");
        let beat = json!({"attempt_id": "0", "progress": progress});
        let (status, answer) =
            send(&self.client, Method::POST, &self.url(&path), body(&beat), None).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        answer
    }

    async fn post(&self, id: &str, request: Value) -> (StatusCode, Value) {
        let url = self.url(&format!("/api/train/runs/{id}/stacks"));
        send(&self.client, Method::POST, &url, body(&request), None).await
    }

    async fn captures(&self, id: &str) -> Vec<Value> {
        let url = self.url(&format!("/api/train/runs/{id}/stacks"));
        let (status, answer) = send(&self.client, Method::GET, &url, None, None).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        answer["captures"].as_array().unwrap().clone()
    }

    async fn get(&self, id: &str) -> Value {
        let url = self.url(&format!("/api/train/runs/{id}"));
        let (status, run) = send(&self.client, Method::GET, &url, None, None).await;
        assert_eq!(status, StatusCode::OK, "{run}");
        run
    }

    async fn sweep(&self) {
        self.server.service.handle().sweep_leases().await.unwrap();
    }

    /// A run of `world_size` ranks that reported step 10 and then stalled.
    async fn stalled_run(&self, clock: &ManualClock, key: &str, world_size: u32) -> String {
        self.stalled_run_with(clock, key, world_size, &json!({})).await
    }

    /// [`Fixture::stalled_run`], its joins carrying the fields of `extra`.
    async fn stalled_run_with(
        &self,
        clock: &ManualClock,
        key: &str,
        world_size: u32,
        extra: &Value,
    ) -> String {
        let id = self.join_with(key, world_size, extra).await;
        for rank in 0..world_size {
            self.beat(&id, rank, json!({"step": 10})).await;
        }
        self.sweep().await;
        clock.advance_ms(STALL_AFTER.as_millis() as u64);
        self.sweep().await;
        assert_eq!(self.get(&id).await["health"]["state"], "STALLED");
        id
    }

    async fn stop(self) {
        self.server.stop().await;
    }
}

/// The world ranks in a list of rank entries or suspects.
fn ranks_of(entries: &Value) -> Vec<u64> {
    entries.as_array().unwrap().iter().map(|e| e["rank"].as_u64().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_asks_every_rank_once_and_the_answers_complete_the_capture() {
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(configured(StateConfig::in_memory(), "stacks-stall", &clock)).await;
    let id = f.stalled_run(&clock, "stall", 4).await;

    let health = f.get(&id).await["health"].clone();
    assert_eq!(health["capture"]["capture_id"], 1, "{health}");
    assert_eq!(health["capture"]["state"], "PENDING", "{health}");

    // Each rank's next heartbeat carries the order, once.
    for rank in 0..4 {
        let answer = f.beat(&id, rank, json!({"step": 10})).await;
        assert_eq!(answer["capture"]["capture_id"], 1, "rank {rank}: {answer}");
        let again = f.beat(&id, rank, json!({"step": 10})).await;
        assert!(again.get("capture").is_none(), "asked once: {again}");
    }

    // A second request while it is pending is refused.
    let (status, refused) = f.post(&id, json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("pending"), "{refused}");

    // Bad answers name their field and change nothing.
    let bad = [
        (
            json!({"capture_id": 1, "ranks": [{"rank": 4, "source": "py-spy", "stack": "x"}]}),
            "ranks[0].rank",
        ),
        (
            json!({"capture_id": 1, "ranks": [{"rank": 0, "source": "Py Spy", "stack": "x"}]}),
            "ranks[0].source",
        ),
        (
            json!({"capture_id": 1, "ranks": [{"rank": 0, "source": "py-spy", "note": "n".repeat(1025)}]}),
            "ranks[0].note",
        ),
        (
            json!({"capture_id": 1, "ranks": [
            {"rank": 0, "source": "py-spy", "stack": "x"},
            {"rank": 0, "source": "py-spy", "stack": "x"}]}),
            "ranks[1].rank",
        ),
        (json!({"reason": "r".repeat(257)}), "reason"),
    ];
    for (request, field) in bad {
        let (status, answer) = f.post(&id, request).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{field}: {answer}");
        assert_eq!(answer["error"]["field"], field, "{answer}");
    }
    let (status, answer) = f
        .post(
            &id,
            json!({"capture_id": 7, "ranks": [{"rank": 0, "source": "py-spy", "stack": "x"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "an unknown capture: {answer}");
    let (status, answer) = f
        .post(&id, json!({"capture_id": 1, "attempt_id": "9", "ranks": [{"rank": 0, "source": "py-spy", "stack": "x"}]}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("\"9\""), "names it: {answer}");

    // Ranks 0, 1 and 3 are stuck in the same place; rank 2 elsewhere, and
    // its stack is over the bound.
    for rank in [0, 1, 3] {
        let answer = json!({"capture_id": 1, "ranks": [{"rank": rank, "source": "py-spy", "stack": stack("all_reduce")}]});
        let (status, capture) = f.post(&id, answer).await;
        assert_eq!(status, StatusCode::OK, "{capture}");
        assert_eq!(capture["state"], "PENDING", "{capture}");
    }
    let (status, again) = f
        .post(
            &id,
            json!({"capture_id": 1, "ranks": [{"rank": 0, "source": "py-spy", "stack": "x"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "a rank answers once: {again}");
    let pending = f.captures(&id).await;
    assert_eq!(pending[0]["state"], "PENDING", "served with what arrived");
    let answered: Vec<bool> =
        pending[0]["ranks"].as_array().unwrap().iter().map(|r| r["answered"] == true).collect();
    assert_eq!(answered, [true, true, false, true]);

    let long =
        format!("{}{}", stack("rank_two_is_stuck"), "  File \"x.py\", line 1 in f\n".repeat(4_000));
    assert!(long.len() > MAX_STACK_BYTES);
    let answer =
        json!({"capture_id": 1, "ranks": [{"rank": 2, "source": "py-spy", "stack": long}]});
    let (status, capture) = f.post(&id, answer).await;
    assert_eq!(status, StatusCode::OK, "{capture}");
    assert_eq!(capture["state"], "COMPLETE", "every rank answered: {capture}");

    let captures = f.captures(&id).await;
    assert_eq!(captures.len(), 1);
    let capture = &captures[0];
    assert_eq!(capture["trigger"], "STALLED");
    assert!(capture["reason"].as_str().unwrap().starts_with("No rank has advanced"), "{capture}");
    let two = &capture["ranks"][2];
    assert_eq!(two["truncated"], true, "cut at the bound: {two}");
    assert!(two["stack"].as_str().unwrap().len() <= MAX_STACK_BYTES);
    assert!(two["stack"].as_str().unwrap().ends_with('\n'), "cut at a line");
    assert_eq!(capture["ranks"][0]["truncated"], false);

    // The stall's health names the capture, complete.
    let health = f.get(&id).await["health"].clone();
    assert_eq!(health["capture"]["state"], "COMPLETE", "{health}");
    if !capture["groups"].as_array().unwrap().is_empty() {
        // The grouping rule: rank 2 is outside the largest group.
        assert_eq!(ranks_of(&capture["suspects"]), [2], "{capture}");
        assert_eq!(ranks_of(&health["capture"]["suspects"]), [2], "{health}");
    }

    // No order once complete; a request within the interval is refused,
    // and accepted after it.
    assert!(f.beat(&id, 0, json!({"step": 10})).await.get("capture").is_none());
    let (status, answer) = f.post(&id, json!({"reason": "again?"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "within the interval: {answer}");
    clock.advance_ms(MIN_CAPTURE_INTERVAL_MS);
    let (status, opened) = f.post(&id, json!({"reason": "again?"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{opened}");
    assert_eq!(opened["capture_id"], 2);
    assert_eq!(opened["trigger"], "REQUESTED");

    // Nobody answers: at the deadline, every rank is listed as silent.
    clock.advance_ms(CAPTURE_DEADLINE_MS);
    f.sweep().await;
    let captures = f.captures(&id).await;
    assert_eq!(captures[0]["capture_id"], 2, "newest first");
    assert_eq!(captures[0]["state"], "COMPLETE");
    assert!(captures[0]["ranks"].as_array().unwrap().iter().all(|r| r["answered"] == false));

    let url = f.url("/api/train/runs/01890000-0000-7000-8000-000000000000/stacks");
    let (status, _) = send(&f.client, Method::GET, &url, None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captures_survive_a_restart_are_bounded_counted_and_go_with_their_run() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.sqlite");
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(configured(StateConfig::sqlite(&path), "stacks-restart", &clock)).await;
    let id = f.join("kept", 2).await;

    // A controller's own captures: complete at once, unlisted ranks silent.
    for n in 0..MAX_CAPTURES_PER_RUN + 2 {
        let request = json!({"reason": format!("attach {n}"), "ranks": [
            {"rank": 0, "source": "controller", "stack": stack("step")}]});
        let (status, capture) = f.post(&id, request).await;
        assert_eq!(status, StatusCode::OK, "{capture}");
        assert_eq!(capture["state"], "COMPLETE");
        assert_eq!(capture["trigger"], "CONTROLLER");
        assert_eq!(capture["ranks"][1]["answered"], false, "{capture}");
    }
    let kept = f.captures(&id).await;
    assert_eq!(kept.len(), MAX_CAPTURES_PER_RUN, "the oldest are dropped");
    assert_eq!(kept[0]["capture_id"], (MAX_CAPTURES_PER_RUN + 2) as u64);
    f.stop().await;

    let f = Fixture::start(configured(StateConfig::sqlite(&path), "stacks-restart", &clock)).await;
    let kept = f.captures(&id).await;
    assert_eq!(kept.len(), MAX_CAPTURES_PER_RUN, "kept across a restart");
    assert_eq!(kept[0]["ranks"][0]["stack"], stack("step"));
    let request = json!({"ranks": [{"rank": 1, "source": "controller", "stack": stack("step")}]});
    let (status, capture) = f.post(&id, request).await;
    assert_eq!(status, StatusCode::OK, "{capture}");
    assert_eq!(capture["capture_id"], (MAX_CAPTURES_PER_RUN + 3) as u64, "ids go on");

    // Ended and deleted: its captures go with it.
    let url = f.url(&format!("/api/train/runs/{id}/ranks/0/end"));
    for rank in 0..2 {
        let url = url.replace("/ranks/0/", &format!("/ranks/{rank}/"));
        let end = json!({"attempt_id": "0", "status": "FINISHED"});
        let (status, answer) = send(&f.client, Method::POST, &url, body(&end), None).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    let (status, answer) = f.post(&id, json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "an ended run has no ranks to ask: {answer}");
    let run_url = f.url(&format!("/api/train/runs/{id}"));
    let (status, _) = send(&f.client, Method::DELETE, &run_url, None, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    f.stop().await;
    let conn = rusqlite::Connection::open(&path).unwrap();
    let rows: i64 = conn
        .query_row(
            "SELECT (SELECT COUNT(*) FROM stack_captures) + (SELECT COUNT(*) FROM stack_ranks)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(rows, 0, "deleted with the run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_captures_count_against_the_retained_bytes() {
    let clock = Arc::new(ManualClock::new(T0));
    // Room for a few runs, not for one whose captures are large.
    let retention = trainstate_actor::Retention::max_runs(100).with_max_bytes(200_000);
    let config =
        configured(StateConfig::in_memory(), "stacks-bytes", &clock).with_retention(retention);
    let f = Fixture::start(config).await;
    let big = f.join("big", 4).await;
    for rank in 0..4 {
        let request = json!({"ranks": [{"rank": rank, "source": "controller",
            "stack": "  File \"x.py\", line 1 in f\n".repeat(2_000)}]});
        let (status, answer) = f.post(&big, request).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    for rank in 0..4 {
        let url = f.url(&format!("/api/train/runs/{big}/ranks/{rank}/end"));
        let end = json!({"attempt_id": "0", "status": "FINISHED"});
        let (status, answer) = send(&f.client, Method::POST, &url, body(&end), None).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    // A later run ends and retention makes room: the big run goes.
    let other = f.join("other", 1).await;
    let url = f.url(&format!("/api/train/runs/{other}/ranks/0/end"));
    let end = json!({"attempt_id": "0", "status": "FINISHED"});
    send(&f.client, Method::POST, &url, body(&end), None).await;
    f.sweep().await;
    let url = f.url(&format!("/api/train/runs/{big}"));
    let (status, _) = send(&f.client, Method::GET, &url, None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "evicted for its captures' bytes");
    f.stop().await;
}

/// The joins' fields of a run that asks to be ended `after_ms` after it
/// stalls.
fn abort_after(after_ms: u64) -> Value {
    json!({"on_stall": "ABORT", "abort_after_ms": after_ms})
}

impl Fixture {
    /// Every rank of `world_size` answers capture `capture_id`: rank 2 stuck
    /// elsewhere than its peers. Answers the capture as the last answer left
    /// it.
    async fn answer_with_rank_two_apart(
        &self,
        id: &str,
        capture_id: u64,
        world_size: u32,
    ) -> Value {
        let mut capture = Value::Null;
        for rank in 0..world_size {
            let function = if rank == 2 { "rank_two_is_stuck" } else { "all_reduce" };
            let answer = json!({"capture_id": capture_id, "ranks": [
                {"rank": rank, "source": "faulthandler", "stack": stack(function)}]});
            let (status, answered) = self.post(id, answer).await;
            assert_eq!(status, StatusCode::OK, "{answered}");
            capture = answered;
        }
        capture
    }

    /// Each rank's `end_rank` in the answer of its heartbeat (with no
    /// progress), by rank.
    async fn end_ranks(&self, id: &str, world_size: u32) -> Vec<Option<String>> {
        let mut ends = Vec::new();
        for rank in 0..world_size {
            let path = format!("/api/train/runs/{id}/ranks/{rank}/heartbeat");
            let beat = json!({"attempt_id": "0"});
            let (status, answer) =
                send(&self.client, Method::POST, &self.url(&path), body(&beat), None).await;
            assert_eq!(status, StatusCode::OK, "{answer}");
            ends.push(answer.get("end_rank").map(|text| text.as_str().unwrap().to_owned()));
        }
        ends
    }

    /// Rank `rank` reports its end `end`: the answer.
    async fn end(&self, id: &str, rank: u32, end: Value) -> Value {
        let url = self.url(&format!("/api/train/runs/{id}/ranks/{rank}/end"));
        let (status, answer) = send(&self.client, Method::POST, &url, body(&end), None).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        answer
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_asked_for_abort_has_its_suspect_ended_after_the_grace_and_restarts() {
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(configured(StateConfig::in_memory(), "stacks-abort", &clock)).await;
    let id = f.stalled_run_with(&clock, "abort", 4, &abort_after(30_000)).await;
    let stalled_at = T0 + STALL_AFTER.as_millis() as u64;
    assert_eq!(f.get(&id).await["health"]["since_ms"], stalled_at);

    // The stall's capture: rank 2 is stuck elsewhere, the suspect.
    let capture = f.answer_with_rank_two_apart(&id, 1, 4).await;
    assert_eq!(capture["state"], "COMPLETE", "{capture}");
    let health = f.get(&id).await["health"].clone();
    assert_eq!(ranks_of(&health["capture"]["suspects"]), [2], "{health}");

    // Within the grace, no rank is asked to end.
    clock.advance_ms(29_999);
    f.sweep().await;
    assert_eq!(f.end_ranks(&id, 4).await, [None, None, None, None], "within the grace");

    // Once it has passed, the suspect alone is, in words that name the
    // stall's start and its capture.
    clock.advance_ms(1);
    let ends = f.end_ranks(&id, 4).await;
    assert!(ends[0].is_none() && ends[1].is_none() && ends[3].is_none(), "{ends:?}");
    let text = ends[2].clone().expect("rank 2, the suspect, is ended");
    assert_eq!(
        text,
        format!(
            "the run made no progress since 2025-10-09T08:53:20.000Z; ended by trainstate because the run asked for on_stall ABORT; its stacks: capture 1, GET /api/train/runs/{id}/stacks"
        )
    );
    // A sweep changes nothing of it.
    f.sweep().await;
    assert_eq!(f.end_ranks(&id, 4).await[2].as_deref(), Some(text.as_str()));

    // Its watcher ends it and says so; the launcher has a restart left,
    // and stops the others.
    let killed = json!({"attempt_id": "0", "status": "ERRORED", "cause": "NO_PROGRESS",
        "how": "KILLED", "detail": text, "restarts_remaining": 1});
    f.end(&id, 2, killed).await;
    for rank in [0, 1, 3] {
        let stopped = json!({"attempt_id": "0", "status": "ABORTED", "detail": "SIGTERM",
            "restarts_remaining": 1});
        f.end(&id, rank, stopped).await;
    }
    let run = f.get(&id).await;
    assert_eq!(run["status"], "RESTARTING", "{run}");
    let cause = &run["attempts"][0]["cause"];
    assert_eq!(cause["kind"], "NO_PROGRESS", "{run}");
    assert_eq!(cause["class"], "NO_PROGRESS", "{run}");
    assert_eq!(cause["failed_world_rank"], 2, "{run}");
    let detail = run["attempts"][0]["status_detail"].as_str().unwrap();
    assert!(detail.starts_with("Rank 2 (pid 1002 on node abort-node2 (10.0.0.3)) was ended at 2025-10-09T08:54:00.000Z: the run made no progress since"), "{detail}");
    assert!(detail.contains("capture 1, GET /api/train/runs/"), "{detail}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_run_that_asked_for_abort_is_ended_and_an_advance_cancels_it() {
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(configured(StateConfig::in_memory(), "stacks-detect", &clock)).await;
    // Three runs stall together: one that did not ask, one that asked for
    // DETECT, one that asked for ABORT and then moves within its grace.
    let quiet = f.join("quiet", 4).await;
    let detect = f.join_with("detect", 4, &json!({"on_stall": "DETECT"})).await;
    let moving = f.join_with("moving", 4, &abort_after(30_000)).await;
    for id in [&quiet, &detect, &moving] {
        for rank in 0..4 {
            f.beat(id, rank, json!({"step": 10})).await;
        }
    }
    f.sweep().await;
    clock.advance_ms(STALL_AFTER.as_millis() as u64);
    f.sweep().await;
    for id in [&quiet, &detect, &moving] {
        assert_eq!(f.get(id).await["health"]["state"], "STALLED");
        f.answer_with_rank_two_apart(id, 1, 4).await;
    }

    clock.advance_ms(29_000);
    f.beat(&moving, 1, json!({"step": 11})).await;
    clock.advance_ms(1_000);
    assert_eq!(
        f.end_ranks(&moving, 4).await,
        [None, None, None, None],
        "the advance cancels it, before the health tick sees it"
    );
    f.sweep().await;
    assert_eq!(f.get(&moving).await["health"]["state"], "PROGRESSING");
    assert_eq!(f.end_ranks(&moving, 4).await, [None, None, None, None], "and after");

    clock.advance_ms(7 * 24 * 3_600_000);
    f.sweep().await;
    for id in [&quiet, &detect] {
        assert_eq!(f.get(id).await["health"]["state"], "STALLED");
        assert_eq!(f.end_ranks(id, 4).await, [None, None, None, None], "never ended");
    }
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_grace_every_rank_the_stall_names_is_ended_before_its_capture_completes() {
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(configured(StateConfig::in_memory(), "stacks-at-once", &clock)).await;
    let id = f.stalled_run_with(&clock, "at-once", 3, &abort_after(0)).await;
    let health = f.get(&id).await["health"].clone();
    assert_eq!(health["capture"]["state"], "PENDING", "{health}");
    assert_eq!(health["ranks"], json!([]), "the stall names no rank: {health}");
    for rank in 0..3 {
        let answer = f.beat(&id, rank, json!({"step": 10})).await;
        assert_eq!(answer["capture"]["capture_id"], 1, "{answer}");
        let text = answer["end_rank"].as_str().unwrap_or_default();
        assert!(text.contains("its stacks: capture 1"), "rank {rank}: {answer}");
    }
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_abort_grace_is_refused_naming_it_and_changes_nothing() {
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(configured(StateConfig::in_memory(), "stacks-bad-abort", &clock)).await;
    let url = f.url("/api/train/rendezvous/bad-grace/join");
    let mut group = workers(2, 1, "bad-grace-").into_iter();
    let first = json!({"world_size": 2, "worker": group.next().unwrap(), "name": "bad",
        "job_id": "7", "on_stall": "ABORT", "abort_after_ms": 604_800_001_u64});
    let (status, answer) = send(&f.client, Method::POST, &url, body(&first), None).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(answer["error"]["field"], "abort_after_ms", "{answer}");

    // The refused join did not count: the next one is the group's first.
    let second = json!({"world_size": 2, "worker": group.next().unwrap(), "name": "bad",
        "job_id": "7", "on_stall": "ABORT", "abort_after_ms": 604_800_000_u64});
    let (status, answer) = send(&f.client, Method::POST, &url, body(&second), None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["joined"], 1, "{answer}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_of_the_head_the_ranks_joining_again_bring_back_abort() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.sqlite");
    let clock = Arc::new(ManualClock::new(T0));
    let config = || configured(StateConfig::sqlite(&path), "stacks-abort-restart", &clock);
    let f = Fixture::start(config()).await;
    let id = f.stalled_run_with(&clock, "again", 4, &abort_after(30_000)).await;
    f.answer_with_rank_two_apart(&id, 1, 4).await;
    f.stop().await;

    // The new head keeps the stall and its capture, not what the joins
    // asked for: no rank is ended until they join again.
    let f = Fixture::start(config()).await;
    clock.advance_ms(30_000);
    f.sweep().await;
    assert_eq!(f.get(&id).await["health"]["capture"]["state"], "COMPLETE");
    assert_eq!(f.end_ranks(&id, 4).await, [None, None, None, None], "forgotten");
    let mut extra = abort_after(30_000);
    extra["run_id"] = json!(id);
    assert_eq!(f.join_with("again", 4, &extra).await, id, "the same group");
    let ends = f.end_ranks(&id, 4).await;
    assert!(ends[2].as_deref().is_some_and(|t| t.contains("capture 1")), "{ends:?}");
    assert!(ends[0].is_none() && ends[1].is_none() && ends[3].is_none(), "{ends:?}");
    f.stop().await;
}

/// `trainstate runs stacks` of this crate's binary, on a blocking thread:
/// its exit status, stdout and stderr.
async fn cli(args: Vec<String>) -> (bool, String, String) {
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_trainstate")).args(&args).output().unwrap()
    })
    .await
    .unwrap();
    let text = |bytes: Vec<u8>| String::from_utf8(bytes).unwrap();
    (output.status.success(), text(output.stdout), text(output.stderr))
}

/// The arguments of `runs stacks ID --url URL` and `extra`.
fn stacks_args(f: &Fixture, id: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> =
        ["runs", "stacks", id, "--url", &f.server.url].map(String::from).to_vec();
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    args
}

/// A run a controller registered, with `n` workers: its id.
async fn registered(f: &Fixture, name: &str, n: u32) -> String {
    let run = crate::common::run_with(&trainstate_schema::RunId::new_v7(), name, "job-s", T0, n);
    f.server.service.handle().register(run.clone()).await.unwrap();
    run.id().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_prints_a_controller_capture_suspects_first_and_stack_text_as_text() {
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(configured(StateConfig::in_memory(), "stacks-cli", &clock)).await;
    let id = registered(&f, "cli-stacks", 4).await;

    let (ok, out, _) = cli(stacks_args(&f, &id, &[])).await;
    assert!(ok, "{out}");
    assert_eq!(
        out,
        format!(
            "no capture of run {id} yet; `trainstate runs stacks {id} --capture` asks for one\n"
        )
    );

    // Ranks 0, 1 and 3 wait in the same place; rank 2 elsewhere, with
    // another thread (listed first, as faulthandler lists the newest)
    // whose text would drive the terminal.
    let logger = "Thread 0x2 (most recent call first):\n  File \"\u{1b}]0;owned\u{7}.py\", line 1 in logger\n";
    let hostile = format!("{logger}{}", stack("rank_two_is_stuck"));
    let ranks: Vec<Value> = (0..4)
        .map(|rank| {
            let text = if rank == 2 { hostile.clone() } else { stack("all_reduce") };
            json!({"rank": rank, "source": "controller", "stack": text})
        })
        .collect();
    let (status, capture) = f.post(&id, json!({"reason": "loss is flat", "ranks": ranks})).await;
    assert_eq!(status, StatusCode::OK, "{capture}");
    assert_eq!(capture["trigger"], "CONTROLLER");
    assert_eq!(ranks_of(&capture["suspects"]), [2], "{capture}");

    // In process, the handle reads the same captures as the route serves.
    let id_typed = trainstate_schema::RunId::parse(&id).unwrap();
    let in_process = f.server.service.handle().run_stacks(&id_typed).await.unwrap();
    assert_eq!(
        serde_json::to_value(&in_process).unwrap()["captures"],
        json!(f.captures(&id).await)
    );
    let unknown = trainstate_schema::RunId::new_v7();
    let missing = f.server.service.handle().run_stacks(&unknown).await;
    assert!(matches!(missing, Err(trainstate_client::StateError::NotFound { .. })), "{missing:?}");

    let (ok, out, err) = cli(stacks_args(&f, &id, &[])).await;
    assert!(ok, "{err}");
    let line = |start: &str| {
        out.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("{start}: {out}"))
    };
    assert!(line("capture").contains("1 (attempt 0)"), "{out}");
    assert!(line("when").ends_with("2025-10-09T08:53:20.000Z"), "{out}");
    assert!(line("why").ends_with("CONTROLLER: loss is flat"), "{out}");
    assert!(line("state").ends_with("COMPLETE (4 of 4 ranks answered)"), "{out}");
    let suspects = out.find("\nsuspects\n").expect("suspects");
    let groups = out.find("\ngroups\n").expect("groups");
    assert!(suspects < groups, "suspects first: {out}");
    // After the title and the header: the one suspect.
    let suspect_row: Vec<&str> =
        out[suspects..].lines().nth(3).unwrap().split_whitespace().collect();
    assert_eq!(suspect_row[0], "2", "{out}");
    assert!(out[suspects..groups].contains("rank_two_is_stuck (train.py:41)"), "{out}");
    let largest: Vec<&str> = out[groups..].lines().nth(3).unwrap().split_whitespace().collect();
    assert_eq!(&largest[..2], ["0", "0,1,3"], "{out}");
    assert!(largest.join(" ").contains("all_reduce (train.py:41)"), "{out}");
    assert!(!out.contains("Thread 0x"), "stacks only with --all: {out}");

    let (ok, all, err) = cli(stacks_args(&f, &id, &["--all"])).await;
    assert!(ok, "{err}");
    assert!(all.contains(&stack("all_reduce")), "every rank's stack, as text: {all}");
    assert!(all.contains("\\u{1b}]0;owned\\u{7}.py"), "control characters escaped: {all}");
    assert!(!all.contains('\u{1b}') && !all.contains('\u{7}'), "{all}");

    let (ok, json_out, err) = cli(stacks_args(&f, &id, &["--json"])).await;
    assert!(ok, "{err}");
    let served: Value = serde_json::from_str(&json_out).unwrap();
    assert_eq!(served["run_id"], json!(id));
    assert_eq!(served["captures"][0]["suspects"][0]["rank"], 2, "{served}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_capture_waits_for_the_ranks_and_a_pending_one_is_refused() {
    let clock = Arc::new(ManualClock::new(T0));
    let f =
        Fixture::start(configured(StateConfig::in_memory(), "stacks-cli-capture", &clock)).await;

    // `--capture` opens a capture and prints it once the ranks answered.
    let id = registered(&f, "cli-capture", 2).await;
    let asking = tokio::spawn(cli(stacks_args(&f, &id, &["--capture"])));
    let opened =
        crate::common::eventually("the capture to open", Duration::from_secs(30), || async {
            f.captures(&id).await.first().cloned()
        })
        .await;
    assert_eq!(opened["trigger"], "REQUESTED", "{opened}");
    assert_eq!(opened["state"], "PENDING", "{opened}");
    for (rank, function) in [(0, "all_reduce"), (1, "barrier")] {
        let answer = json!({"capture_id": opened["capture_id"], "ranks": [
            {"rank": rank, "source": "py-spy", "stack": stack(function)}]});
        let (status, answered) = f.post(&id, answer).await;
        assert_eq!(status, StatusCode::OK, "{answered}");
    }
    let (ok, out, err) = asking.await.unwrap();
    assert!(ok, "{err}");
    assert!(out.contains("REQUESTED") && out.contains("COMPLETE (2 of 2 ranks answered)"), "{out}");
    assert!(out.contains("\nsuspects\n") && out.contains("barrier (train.py:41)"), "{out}");

    // A run whose capture is pending: the head's refusal, and a failure.
    let other = registered(&f, "cli-pending", 2).await;
    let (status, pending) = f.post(&other, json!({"reason": "first"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{pending}");
    let (ok, out, err) = cli(stacks_args(&f, &other, &["--capture"])).await;
    assert!(!ok, "refused: {out}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("pending"), "the head's words: {err}");
    assert_eq!(f.captures(&other).await.len(), 1, "nothing opened");
    f.stop().await;
}

on_both_stores! {
    multi_thread:
    /// A controller's capture and one the ranks' watchers answer are kept
    /// on either store as they were served, read back the same after a
    /// restart of the head, and deleted with their run.
    async fn captures_round_trip_through_the_store_and_go_with_their_run(store) {
        let fresh = store.fresh("stacks-store").await;
        let clock = Arc::new(ManualClock::new(T0));
        let f = Fixture::start(configured(fresh.config(), "stacks-store", &clock)).await;
        let id = f.join("stored", 2).await;

        let attached = json!({"reason": "attached", "ranks": [
            {"rank": 0, "source": "controller", "stack": stack("all_reduce")},
            {"rank": 1, "source": "controller", "stack": stack("load_batch"), "note": "kept"}]});
        let (status, controller) = f.post(&id, attached).await;
        assert_eq!(status, StatusCode::OK, "{controller}");
        assert_eq!(controller["state"], "COMPLETE");

        // A capture asked for: each rank's watcher hears of it on a
        // heartbeat and answers it.
        let (status, opened) = f.post(&id, json!({"reason": "asked"})).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{opened}");
        for rank in 0..2 {
            let order = f.beat(&id, rank, json!({"step": 3}))
                .await["capture"]["capture_id"].clone();
            assert_eq!(order, opened["capture_id"], "rank {rank}");
            let answer = json!({"capture_id": order, "attempt_id": "0", "ranks": [
                {"rank": rank, "source": "faulthandler", "stack": stack("all_reduce")}]});
            let (status, answered) = f.post(&id, answer).await;
            assert_eq!(status, StatusCode::OK, "{answered}");
        }
        let served = f.captures(&id).await;
        assert_eq!(served.len(), 2, "{served:?}");
        assert_eq!(served[0]["state"], "COMPLETE", "every rank answered");
        assert_eq!(served[0]["trigger"], "REQUESTED");
        assert_eq!(served[1], controller, "kept as it was answered");
        assert_eq!(served[1]["ranks"][1]["note"], "kept");
        f.stop().await;

        let f = Fixture::start(configured(fresh.config(), "stacks-store", &clock)).await;
        assert_eq!(f.captures(&id).await, served, "read back the same after a restart");
        for rank in 0..2 {
            let url = f.url(&format!("/api/train/runs/{id}/ranks/{rank}/end"));
            let end = json!({"attempt_id": "0", "status": "FINISHED"});
            // `super::`: the macro's own `body` is the test's.
            let end = super::body(&end);
            let (status, answer) = send(&f.client, Method::POST, &url, end, None).await;
            assert_eq!(status, StatusCode::OK, "{answer}");
        }
        let run_url = f.url(&format!("/api/train/runs/{id}"));
        let (status, _) = send(&f.client, Method::DELETE, &run_url, None, None).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        f.stop().await;

        let rows: i64 = match store {
            Store::Sqlite => rusqlite::Connection::open(fresh.sqlite_path())
                .unwrap()
                .query_row(
                    "SELECT (SELECT COUNT(*) FROM stack_captures) \
                     + (SELECT COUNT(*) FROM stack_ranks)",
                    [],
                    |r| r.get(0),
                )
                .unwrap(),
            Store::Postgres => crate::stores::connect(fresh.url().unwrap())
                .await
                .query_one(
                    "SELECT (SELECT COUNT(*) FROM trainstate_stack_captures) \
                     + (SELECT COUNT(*) FROM trainstate_stack_ranks)",
                    &[],
                )
                .await
                .unwrap()
                .get::<_, i64>(0),
        };
        assert_eq!(rows, 0, "deleted with the run");
    }
}
