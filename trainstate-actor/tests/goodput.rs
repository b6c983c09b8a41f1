//! Goodput: where a run's wall-clock time went, as the head counts it on
//! the head's manual clock through a real head on HTTP. The issue's
//! scenario (waiting, productive, a stall, a failure that loses the work
//! since the checkpoint mark, a restart, the rest) against hand-computed
//! buckets, a live read growing with the clock and the totals surviving a
//! restart on SQLite; an announced checkpoint and steps slower than the
//! run's pace; a restart loop on the run and its notification; and every
//! bad checkpoint mark refused, naming its field, with nothing changed.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use trainstate_actor::http::HttpConfig;
use trainstate_actor::{Clock, ManualClock, StateConfig};
use trainstate_schema::{RunId, RunStatus, TrainRunInfo};

use crate::common::{Server, eventually, run_with, start_head, unique_name, workers};
use crate::contract::{send, send_json};
use crate::notify::Receiver;

const T: u64 = 1_760_000_000_000;
const S: u64 = 1_000;
/// Long enough that no run is aborted for a lost controller here.
const LEASE: Duration = Duration::from_secs(24 * 3600);
const STALL_AFTER: Duration = Duration::from_secs(10);
const DEADLINE: Duration = Duration::from_secs(60);

fn config(base: StateConfig, what: &str, clock: &Arc<ManualClock>) -> StateConfig {
    base.with_name(unique_name(what))
        .with_clock(clock.clone())
        .with_lease(LEASE)
        .with_stall_after(STALL_AFTER)
        // The tests drive the sweep and the health tick themselves.
        .with_sweep_interval(Duration::from_secs(3600))
        .with_health_tick(Duration::from_secs(3600))
}

/// A live run of one worker, as a controller registers it, in `status`.
fn controller_run(name: &str, status: RunStatus) -> TrainRunInfo {
    let mut draft = run_with(&RunId::new_v7(), name, "job1", T, 1).into_draft();
    draft.run_status = status.v1();
    draft.status = Some(status);
    draft.validate().unwrap()
}

/// One head over HTTP on the manual clock.
struct Fixture {
    server: Server,
    client: Client,
    clock: Arc<ManualClock>,
}

impl Fixture {
    async fn start(config: StateConfig, clock: Arc<ManualClock>) -> Self {
        let server = Server::start(config, HttpConfig::default()).await;
        Self { server, client: Client::new(), clock }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.url)
    }

    async fn send(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let body = body.map(|b| ("application/json", serde_json::to_vec(&b).unwrap()));
        send(&self.client, method, &self.url(path), body, None).await
    }

    async fn ok(&self, method: Method, path: &str, body: Value) -> Value {
        let (status, answer) = self.send(method, path, Some(body)).await;
        assert!(status.is_success(), "{path}: {status} {answer}");
        answer
    }

    async fn register(&self, run: &TrainRunInfo) -> RunId {
        self.ok(Method::POST, "/api/train/runs", serde_json::to_value(run).unwrap()).await;
        run.id().clone()
    }

    async fn status(&self, id: &RunId, status: &str) {
        let path = format!("/api/train/runs/{id}/status");
        self.ok(Method::POST, &path, json!({"status": status})).await;
    }

    async fn start_attempt(&self, id: &RunId, attempt_id: &str) {
        let attempt = json!({
            "attempt_id": attempt_id,
            "start_time_ms": self.clock.now_ms(),
            "workers": workers(1, 4, &format!("a{attempt_id}-")),
        });
        self.ok(Method::POST, &format!("/api/train/runs/{id}/attempts"), attempt).await;
    }

    /// Rank 0's report `progress` in attempt `attempt_id`: status, answer.
    async fn report(&self, id: &RunId, attempt_id: &str, progress: Value) -> (StatusCode, Value) {
        let body = json!({"attempt_id": attempt_id, "ranks": [{"rank": 0, "progress": progress}]});
        self.send(Method::POST, &format!("/api/train/runs/{id}/progress"), Some(body)).await
    }

    async fn reported(&self, id: &RunId, attempt_id: &str, progress: Value) {
        let (status, answer) = self.report(id, attempt_id, progress).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }

    async fn get(&self, id: &RunId) -> Value {
        let (status, run) = self.send(Method::GET, &format!("/api/train/runs/{id}"), None).await;
        assert_eq!(status, StatusCode::OK, "{run}");
        run
    }

    async fn goodput(&self, id: &RunId) -> Value {
        let run = self.get(id).await;
        run.get("goodput").cloned().unwrap_or_else(|| panic!("no goodput: {run}"))
    }

    async fn sweep(&self) {
        self.server.service.handle().sweep_leases().await.unwrap();
    }

    /// Moves the clock to `at` a second at a time, sweeping each second.
    async fn sweep_until(&self, at: u64) {
        while self.clock.now_ms() < at {
            self.clock.advance_ms(S);
            self.sweep().await;
        }
    }

    async fn stop(self) {
        self.server.stop().await;
    }
}

/// Asserts `actual` ms within 2% of `expected` (and exact for 0).
fn near(what: &str, actual: &Value, expected: u64, goodput: &Value) {
    let actual = actual.as_u64().unwrap_or_else(|| panic!("{what}: {goodput}"));
    let tolerance = expected / 50;
    assert!(
        actual.abs_diff(expected) <= tolerance,
        "{what}: {actual} ms, expected {expected} ms: {goodput}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_issues_scenario_counts_every_bucket_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.sqlite");
    let clock = Arc::new(ManualClock::new(T));
    let f =
        Fixture::start(config(StateConfig::sqlite(&path), "goodput-issue", &clock), clock.clone())
            .await;

    // T: registered INITIALIZING; T+10 s: RUNNING.
    let id = f.register(&controller_run("goodput-issue", RunStatus::Initializing)).await;
    f.sweep_until(T + 10 * S).await;
    f.status(&id, "RUNNING").await;

    // Steps 1..=60 once a second (T+11 s .. T+70 s); step 40 at T+50 s is
    // marked saved.
    for step in 1..=60u64 {
        if step == 21 {
            // A live read grows with the clock, without any write.
            clock.advance_ms(S / 2);
            let before = f.goodput(&id).await;
            clock.advance_ms(S / 2);
            let after = f.goodput(&id).await;
            assert_eq!(after["as_of_ms"], T + 31 * S, "{after}");
            let grown = |key: &str| after[key].as_u64().unwrap() - before[key].as_u64().unwrap();
            assert_eq!((grown("wall_ms"), grown("productive_ms")), (500, 500), "{before} {after}");
            // The listing serves it counted to the read too.
            let (_, page) = f.send(Method::GET, "/api/train/runs", None).await;
            let listed = page["train_runs"].as_array().unwrap();
            let listed = listed.iter().find(|r| r["id"] == id.to_string()).unwrap();
            assert_eq!(listed["goodput"], after, "{page}");
        } else {
            clock.advance_ms(S);
        }
        let progress = match step {
            40 => json!({"step": step, "checkpoint": 40}),
            _ => json!({"step": step}),
        };
        f.reported(&id, "0", progress).await;
        f.sweep().await;
    }
    let marked = f.goodput(&id).await;
    assert_eq!(marked["checkpoint"], json!({"step": 40, "at_ms": T + 50 * S, "attempt_id": "0"}));
    // Productive from T+10 s to the mark at T+50 s.
    assert_eq!(marked["productive_at_checkpoint_ms"], 40 * S, "{marked}");

    // No advance after T+70 s: STALLED from T+80 s, its window of 10 s
    // after the last advance; the attempt fails at T+90 s.
    f.sweep_until(T + 90 * S).await;
    assert_eq!(f.get(&id).await["health"]["state"], "STALLED");
    f.status(&id, "RESTARTING").await;

    // T+100 s: the next attempt runs, resuming at step 41 once a second
    // for 30 s; FINISHED at T+130 s.
    f.sweep_until(T + 100 * S).await;
    f.start_attempt(&id, "1").await;
    f.status(&id, "RUNNING").await;
    for step in 41..=70u64 {
        clock.advance_ms(S);
        f.reported(&id, "1", json!({"step": step})).await;
        f.sweep().await;
    }
    assert_eq!(clock.now_ms(), T + 130 * S);
    f.status(&id, "FINISHED").await;

    let g = f.goodput(&id).await;
    // wall 130 s = waiting 10 + productive (60 − 20) + 30 + stalled 20
    //   + progress lost (70 − 50 = 20) + restarting 10 + checkpointing 0
    //   + slow 0.
    near("wall_ms", &g["wall_ms"], 130 * S, &g);
    near("productive_ms", &g["productive_ms"], (60 - 20 + 30) * S, &g);
    near("waiting_to_start_ms", &g["badput"]["waiting_to_start_ms"], 10 * S, &g);
    // Stalled from the last advance (T+70 s) to the failure (T+90 s).
    near("stalled_ms", &g["badput"]["stalled_ms"], (90 - 70) * S, &g);
    // The work from the mark (T+50 s) to the last advance (T+70 s).
    near("progress_lost_ms", &g["badput"]["progress_lost_ms"], (70 - 50) * S, &g);
    near("restarting_ms", &g["badput"]["restarting_ms"], (100 - 90) * S, &g);
    near("checkpointing_ms", &g["badput"]["checkpointing_ms"], 0, &g);
    near("slower_than_pace_ms", &g["badput"]["slower_than_pace_ms"], 0, &g);
    let ratio = g["ratio"].as_f64().unwrap();
    assert!((ratio - 70.0 / 130.0).abs() < 0.02 * 70.0 / 130.0, "{g}");
    assert_eq!(g["as_of_ms"], T + 130 * S, "counting stops at the run's end: {g}");
    assert_eq!(g["restarts_since_checkpoint"], 1, "{g}");
    assert_eq!(g["restart_loop"], false, "{g}");

    // Read later, an ended run's totals stay as they are.
    clock.advance_ms(60 * S);
    assert_eq!(f.goodput(&id).await, g);

    // The totals survive a restart of the head on the same store.
    f.stop().await;
    let f =
        Fixture::start(config(StateConfig::sqlite(&path), "goodput-issue", &clock), clock.clone())
            .await;
    assert_eq!(f.goodput(&id).await, g, "the same totals after the restart");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_checkpoint_and_slow_steps_are_counted_apart_from_productive_time() {
    let clock = Arc::new(ManualClock::new(T));
    let f = Fixture::start(config(StateConfig::in_memory(), "goodput-pace", &clock), clock.clone())
        .await;
    let id = f.register(&controller_run("goodput-pace", RunStatus::Running)).await;

    // Steps 1..=20 a second apart; step 20 announces a checkpoint, and
    // step 21 comes 15 s later; steps 22..=30 a second apart again.
    for step in 1..=20u64 {
        clock.advance_ms(S);
        f.reported(&id, "0", json!({"step": step})).await;
    }
    f.reported(&id, "0", json!({"phase": "Checkpoint", "expect_next_within_ms": 20_000})).await;
    clock.advance_ms(15 * S);
    f.reported(&id, "0", json!({"step": 21, "phase": "train"})).await;
    for step in 22..=30u64 {
        clock.advance_ms(S);
        f.reported(&id, "0", json!({"step": step})).await;
    }
    let live = f.goodput(&id).await;
    near("checkpointing_ms, served live", &live["badput"]["checkpointing_ms"], 15 * S, &live);
    // Then steps 31..=40 take 3 s each: 2 s beyond the 1 s pace each.
    for step in 31..=40u64 {
        clock.advance_ms(3 * S);
        f.reported(&id, "0", json!({"step": step})).await;
    }
    f.status(&id, "FINISHED").await;

    let g = f.goodput(&id).await;
    // wall 74 s = checkpointing 15 + slow 10 × (3 − 1) = 20 + productive 39.
    near("wall_ms", &g["wall_ms"], 74 * S, &g);
    near("checkpointing_ms", &g["badput"]["checkpointing_ms"], 15 * S, &g);
    near("slower_than_pace_ms", &g["badput"]["slower_than_pace_ms"], 20 * S, &g);
    near("productive_ms", &g["productive_ms"], 39 * S, &g);
    assert_eq!(g["reference_step_ms"], 1000.0, "{g}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_checkpoint_mark_is_refused_naming_its_field_and_changes_nothing() {
    let clock = Arc::new(ManualClock::new(T));
    let f = Fixture::start(config(StateConfig::in_memory(), "goodput-bad", &clock), clock.clone())
        .await;
    let id = f.register(&controller_run("goodput-bad", RunStatus::Running)).await;
    clock.advance_ms(S);
    f.reported(&id, "0", json!({"step": 10, "checkpoint": 8})).await;
    f.sweep().await;
    let before = f.get(&id).await;
    assert_eq!(before["goodput"]["checkpoint"]["step"], 8, "{before}");
    assert_eq!(before["rank_progress"][0]["checkpoint"], 8, "{before}");

    let refused = [
        // Ahead of the report's own step.
        (json!({"step": 11, "checkpoint": 12}), StatusCode::UNPROCESSABLE_ENTITY, "0"),
        // Ahead of the rank's latest step, the report having none.
        (json!({"checkpoint": 11}), StatusCode::UNPROCESSABLE_ENTITY, "0"),
        // Lower than the rank's previous mark in the attempt.
        (json!({"step": 11, "checkpoint": 7}), StatusCode::UNPROCESSABLE_ENTITY, "0"),
        // For an attempt that is not the run's current one.
        (json!({"step": 11, "checkpoint": 9}), StatusCode::CONFLICT, "7"),
    ];
    for (progress, expected, attempt) in refused {
        let (status, answer) = f.report(&id, attempt, progress.clone()).await;
        assert_eq!(status, expected, "{progress}: {answer}");
        if expected == StatusCode::UNPROCESSABLE_ENTITY {
            let field = &answer["error"]["field"];
            assert_eq!(field, "ranks[0].progress.checkpoint", "{progress}: {answer}");
        }
        f.sweep().await;
        let after = f.get(&id).await;
        assert_eq!(after["goodput"]["checkpoint"], before["goodput"]["checkpoint"], "{after}");
        assert_eq!(after["rank_progress"], before["rank_progress"], "{progress}: {after}");
    }
    let (status, answer) = f.report(&id, "0", json!({"step": 11, "checkpoint": 7})).await;
    assert!(answer.to_string().contains("previous checkpoint mark (8)"), "{status} {answer}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_failed_attempts_without_a_mark_are_a_restart_loop_that_a_new_mark_clears() {
    let receiver = Receiver::start(|_| 200).await;
    let dir = tempfile::tempdir().unwrap();
    let args = ["--notify-webhook", &format!("{}/hook#events=restarting", receiver.url)];
    let head = start_head(dir.path(), &args).unwrap();
    let client = Client::new();
    let run = controller_run("goodput-loop", RunStatus::Running);
    let id = run.id().clone();
    let url = |path: &str| format!("{}/api/train/runs/{id}{path}", head.url);
    let (status, answer) = send_json(
        &client,
        Method::POST,
        &format!("{}/api/train/runs", head.url),
        Some(&serde_json::to_value(&run).unwrap()),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let post = |path: String, body: Value| {
        let client = client.clone();
        async move {
            let (status, answer) = send_json(&client, Method::POST, &path, Some(&body)).await;
            assert!(status.is_success(), "{path}: {status} {answer}");
            answer
        }
    };
    for attempt in 1..=3u64 {
        post(url("/status"), json!({"status": "RESTARTING"})).await;
        let next = json!({
            "attempt_id": attempt.to_string(),
            "start_time_ms": T + attempt * S,
            "workers": workers(1, 4, &format!("a{attempt}-")),
        });
        post(url("/attempts"), next).await;
        let running = post(url("/status"), json!({"status": "RUNNING"})).await;
        let expected = attempt == 3;
        assert_eq!(running["goodput"]["restart_loop"], expected, "attempt {attempt}: {running}");
        assert_eq!(running["goodput"]["restarts_since_checkpoint"], attempt, "{running}");
    }
    let looping = format!("{id}:RESTARTING:3");
    let event = eventually("the restart loop told", DEADLINE, || {
        let found = receiver.accepted().into_iter().find(|e| e["event_id"] == looping.as_str());
        std::future::ready(found)
    })
    .await;
    assert_eq!(event["restart_loop"], true, "{event}");
    let detail = event["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("Restart loop: 3 attempts failed since the run's start."),
        "{event}"
    );
    let earlier = format!("{id}:RESTARTING:2");
    let earlier = eventually("the restart before told", DEADLINE, || {
        let found = receiver.accepted().into_iter().find(|e| e["event_id"] == earlier.as_str());
        std::future::ready(found)
    })
    .await;
    assert_eq!(earlier["restart_loop"], false, "{earlier}");

    // A new mark clears it.
    let body = json!({"attempt_id": "3", "ranks": [{"rank": 0, "progress": {"step": 5, "checkpoint": 5}}]});
    post(url("/progress"), body).await;
    let run = eventually("the mark written", DEADLINE, || {
        let client = client.clone();
        let url = url("");
        async move {
            let (_, run) = send_json(&client, Method::GET, &url, None).await;
            (run["goodput"]["checkpoint"]["step"] == 5).then_some(run)
        }
    })
    .await;
    assert_eq!(run["goodput"]["restart_loop"], false, "{run}");
    assert_eq!(run["goodput"]["restarts_since_checkpoint"], 0, "{run}");
    assert_eq!(run["goodput"]["checkpoint"]["attempt_id"], "3", "{run}");
    drop(head);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rendezvous_ranks_mark_comes_with_its_heartbeat_and_a_bad_one_is_refused() {
    let clock = Arc::new(ManualClock::new(T));
    let f =
        Fixture::start(config(StateConfig::in_memory(), "goodput-ranks", &clock), clock.clone())
            .await;
    let key = unique_name("goodput-ranks").replace('.', "-");
    let worker = &workers(1, 1, "ranks-")[0];
    let join = json!({"world_size": 1, "worker": worker, "name": "ranks", "job_id": "7"});
    let joined = f.ok(Method::POST, &format!("/api/train/rendezvous/{key}/join"), join).await;
    let id: RunId = joined["run_id"].as_str().unwrap().parse().unwrap();
    let beat = |progress: Value| json!({"attempt_id": "0", "progress": progress});
    let path = format!("/api/train/runs/{id}/ranks/0/heartbeat");

    clock.advance_ms(S);
    f.ok(Method::POST, &path, beat(json!({"step": 3, "checkpoint": 2}))).await;
    let (status, answer) =
        f.send(Method::POST, &path, Some(beat(json!({"step": 4, "checkpoint": 5})))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(answer["error"]["field"], "progress.checkpoint", "{answer}");
    let (status, answer) = f.send(Method::POST, &path, Some(beat(json!({"checkpoint": 1})))).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("(2)"), "{answer}");

    f.sweep().await;
    let run = f.get(&id).await;
    assert_eq!(run["goodput"]["checkpoint"], json!({"step": 2, "at_ms": T + S, "attempt_id": "0"}));
    assert_eq!(run["rank_progress"][0]["checkpoint"], 2, "{run}");
    assert_eq!(run["rank_progress"][0]["step"], 3, "the refused reports changed nothing: {run}");
    f.stop().await;
}
