//! Run health: a rendezvous run whose ranks report progress is STALLED
//! when none of them advanced for its stall window, PROGRESSING again when
//! one does; the culprits are named, an announced pause and a per-run
//! window are kept, a restart of the head raises no false alarm, the
//! listing filters by health, and every bad report is refused naming its
//! field with nothing recorded.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use trainstate_actor::http::HttpConfig;
use trainstate_actor::{ManualClock, StateConfig};
use trainstate_client::{EventKind, StateEvent};
use trainstate_schema::RunId;

use crate::common::{Server, eventually, run, unique_name, workers};
use crate::contract::send;
use crate::stores::on_both_stores;

const T0: u64 = 1_760_000_000_000;
/// Long enough that no run is aborted for a lost controller here.
const LEASE: Duration = Duration::from_secs(24 * 3600);
const STALL_AFTER: Duration = Duration::from_secs(10);
const DEADLINE: Duration = Duration::from_secs(10);

fn body(value: &Value) -> Option<(&'static str, Vec<u8>)> {
    Some(("application/json", serde_json::to_vec(value).unwrap()))
}

fn config(what: &str, clock: &Arc<ManualClock>) -> StateConfig {
    configured(StateConfig::in_memory(), what, clock)
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

/// One head over HTTP, its clock, and the run of a group of `world_size`
/// ranks that joined under `key` (each join with `extra` members).
struct Fixture {
    server: Server,
    client: Client,
    _clock: Arc<ManualClock>,
}

impl Fixture {
    async fn start(config: StateConfig, clock: Arc<ManualClock>) -> Self {
        let server = Server::start(config, HttpConfig::default()).await;
        Self { server, client: Client::new(), _clock: clock }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.url)
    }

    async fn join(&self, key: &str, world_size: u32, extra: Value) -> String {
        let mut id = String::new();
        for (rank, worker) in workers(world_size, 1, &format!("{key}-")).iter().enumerate() {
            let mut join =
                json!({"world_size": world_size, "worker": worker, "name": key, "job_id": "7"});
            for (k, v) in extra.as_object().unwrap() {
                join[k] = v.clone();
            }
            let path = format!("/api/train/rendezvous/{key}/join");
            let (status, answer) =
                send(&self.client, Method::POST, &self.url(&path), body(&join), None).await;
            assert_eq!(status, StatusCode::OK, "rank {rank}: {answer}");
            id = answer["run_id"].as_str().unwrap().to_owned();
        }
        id
    }

    /// Rank `rank`'s heartbeat with `progress`: the status and answer.
    async fn report(&self, id: &str, rank: u32, progress: Value) -> (StatusCode, Value) {
        let path = format!("/api/train/runs/{id}/ranks/{rank}/heartbeat");
        let beat = json!({"attempt_id": "0", "progress": progress});
        send(&self.client, Method::POST, &self.url(&path), body(&beat), None).await
    }

    async fn reported(&self, id: &str, rank: u32, progress: Value) {
        let (status, answer) = self.report(id, rank, progress).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }

    async fn get(&self, id: &str) -> Value {
        let path = format!("/api/train/runs/{id}");
        let (status, run) = send(&self.client, Method::GET, &self.url(&path), None, None).await;
        assert_eq!(status, StatusCode::OK, "{run}");
        run
    }

    async fn sweep(&self) {
        self.server.service.handle().sweep_leases().await.unwrap();
    }

    async fn listed(&self, health: &str) -> Vec<String> {
        let path = format!("/api/train/runs?health={health}");
        let (status, page) = send(&self.client, Method::GET, &self.url(&path), None, None).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        page["train_runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().into())
            .collect()
    }

    async fn stop(self) {
        self.server.stop().await;
    }
}

fn health_changes(receiver: &mut tokio::sync::broadcast::Receiver<StateEvent>) -> Vec<RunId> {
    std::iter::from_fn(|| receiver.try_recv().ok())
        .filter(|event| event.kind == EventKind::HealthChanged)
        .map(|event| event.run_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stalls_after_its_window_names_the_rank_that_stopped_first_and_progresses_again() {
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(config("health-stall", &clock), clock.clone()).await;
    let id = f.join("stall", 2, json!({})).await;
    let mut events = f.server.service.handle().subscribe(None).await.unwrap().receiver;

    f.sweep().await;
    assert!(f.get(&id).await.get("health").is_none(), "no progress, no health");

    f.reported(&id, 0, json!({"step": 10, "phase": "train", "metrics": {"loss": 2.5}})).await;
    f.reported(&id, 1, json!({"step": 10, "total_steps": 100})).await;
    f.sweep().await;
    let run = f.get(&id).await;
    assert_eq!(run["health"]["state"], "PROGRESSING", "{run}");
    assert_eq!(run["rank_progress"][0]["metrics"]["loss"], 2.5, "{run}");
    assert_eq!(run["rank_progress"][0]["phase"], "train", "{run}");
    assert_eq!(run["rank_progress"][1]["total_steps"], 100, "{run}");
    assert_eq!(run["rank_progress"][1]["last_advance_ms"], T0, "{run}");

    // Rank 0 advances once more, then neither does: rank 1 stopped first.
    clock.advance_ms(2_000);
    f.reported(&id, 0, json!({"step": 11})).await;
    f.reported(&id, 1, json!({"step": 10})).await;
    clock.advance_ms(9_999);
    f.sweep().await;
    assert_eq!(f.get(&id).await["health"]["state"], "PROGRESSING", "within the window");
    clock.advance_ms(1);
    f.sweep().await;
    let run = f.get(&id).await;
    let health = &run["health"];
    assert_eq!(health["state"], "STALLED", "{run}");
    assert_eq!(health["ranks"], json!([1]), "the rank that stopped first: {run}");
    assert_eq!(health["since_ms"], T0 + 12_000, "{run}");
    let detail = health["detail"].as_str().unwrap();
    assert!(
        detail.starts_with(
            "No rank has advanced for 10 s; the run's window is 10 s, the head's --stall-after: \
             the run has not shown its pace yet. Rank 1 last advanced at"
        ),
        "{detail}"
    );
    assert!(detail.contains("(step 10)") && detail.contains("(step 11, phase train)"), "{detail}");
    assert!(!detail.contains(&T0.to_string()), "no raw ms in words: {detail}");
    assert_eq!(f.listed("STALLED").await, vec![id.clone()]);
    assert!(f.listed("PROGRESSING").await.is_empty());
    assert_eq!(run["status"].as_str().unwrap_or("RUNNING"), "RUNNING", "health is not status");

    // The same step again is no advance; a higher one is.
    clock.advance_ms(5_000);
    f.reported(&id, 1, json!({"step": 10})).await;
    f.sweep().await;
    assert_eq!(f.get(&id).await["health"]["state"], "STALLED");
    f.reported(&id, 1, json!({"step": 11})).await;
    f.sweep().await;
    let run = f.get(&id).await;
    assert_eq!(run["health"]["state"], "PROGRESSING", "{run}");
    let history: Vec<&str> = run["health_history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|change| change["state"].as_str().unwrap())
        .collect();
    assert_eq!(history, ["PROGRESSING", "STALLED", "PROGRESSING"], "{run}");
    let id_typed = RunId::parse(&id).unwrap();
    eventually("three health changes announced", DEADLINE, || {
        let seen = health_changes(&mut events);
        std::future::ready(seen.len() == 3 && seen.iter().all(|r| *r == id_typed))
    })
    .await;

    let (status, metrics) = {
        let response = f.client.get(f.url("/metrics")).send().await.unwrap();
        (response.status(), response.text().await.unwrap())
    };
    assert_eq!(status, StatusCode::OK);
    assert!(metrics.contains("trainstate_runs_stalled 0"), "{metrics}");
    assert!(metrics.contains("trainstate_runs_by_health{health=\"PROGRESSING\"} 1"), "{metrics}");
    f.stop().await;
}

/// Two ranks in lock-step report the same steps at the same times, but
/// rank 1's own work takes twice rank 0's: after 10 s of that it is named a
/// straggler (one write, one event, the state and its since kept), ratios
/// that drift write nothing, and once it is as fast as its peer again it
/// is cleared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_twice_as_slow_as_its_peer_is_named_a_straggler_after_ten_seconds() {
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(config("health-stragglers", &clock), clock.clone()).await;
    let id = f.join("stragglers", 2, json!({})).await;
    let mut events = f.server.service.handle().subscribe(None).await.unwrap().receiver;
    let mut step = 0;
    // One report of each rank a second, each carrying its own time per step.
    let mut second = async |rank_1_ms: f64| {
        step += 5;
        clock.advance_ms(1_000);
        f.reported(&id, 0, json!({"step": step, "step_time_ms": 100.0})).await;
        f.reported(&id, 1, json!({"step": step, "step_time_ms": rank_1_ms})).await;
        f.sweep().await;
        f.get(&id).await
    };
    let first = second(200.0).await;
    assert_eq!(first["health"]["state"], "PROGRESSING", "{first}");
    assert_eq!(first["health"]["stragglers"], json!([]), "{first}");
    let since = first["health"]["since_ms"].clone();
    for _ in 0..9 {
        let run = second(200.0).await;
        assert_eq!(run["health"]["stragglers"], json!([]), "slow for less than 10 s: {run}");
    }
    let named = second(200.0).await;
    let health = &named["health"];
    assert_eq!(
        health["stragglers"],
        json!([{"rank": 1, "step_time_ms": 200.0, "peers_step_time_ms": 100.0, "ratio": 2.0}]),
        "{named}"
    );
    assert_eq!((&health["state"], &health["since_ms"]), (&json!("PROGRESSING"), &since));
    assert_eq!(health["ranks"], json!([]), "a straggler is no culprit: {named}");
    let detail = health["detail"].as_str().unwrap();
    assert!(
        detail.ends_with("Rank 1 is a straggler: 0.20 s a step, 2.0\u{d7} its peers' 0.10 s."),
        "{detail}"
    );
    let history = named["health_history"].as_array().unwrap();
    assert_eq!(history.len(), 2, "{named}");
    assert_eq!(history[1]["stragglers"], json!([1]), "{named}");
    assert_eq!(history[1]["at_ms"], T0 + 11_000, "when the set changed: {named}");

    // Its ratio drifts (the smoothed time moves toward 180 ms): nothing is written.
    for _ in 0..5 {
        let run = second(180.0).await;
        assert_eq!(run["health"], *health, "{run}");
    }
    // As fast as its peer: below 1.25 within a few reports, and cleared.
    let mut cleared = None;
    for _ in 0..10 {
        let run = second(100.0).await;
        if run["health"]["stragglers"] == json!([]) {
            cleared = Some(run);
            break;
        }
    }
    let cleared = cleared.expect("rank 1 is cleared once as fast as its peer");
    assert!(!cleared["health"]["detail"].as_str().unwrap().contains("straggler"), "{cleared}");
    let id_typed = RunId::parse(&id).unwrap();
    eventually("three health changes announced", DEADLINE, || {
        let seen = health_changes(&mut events);
        std::future::ready(seen.len() == 3 && seen.iter().all(|r| *r == id_typed))
    })
    .await;
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_an_infinite_straggler_ratio_names_the_straggler_with_a_finite_one() {
    // Legal step times as far apart as they go: a rank at 0.0001 ms a step
    // (finer than the microsecond the record keeps) beside one at 7 days.
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(config("health-infinite-ratio", &clock), clock.clone()).await;
    let id = f.join("infinite-ratio", 2, json!({})).await;
    let mut step = 0;
    let mut named = None;
    for _ in 0..12 {
        step += 1;
        clock.advance_ms(1_000);
        f.reported(&id, 0, json!({"step": step, "step_time_ms": 0.0001})).await;
        f.reported(&id, 1, json!({"step": step, "step_time_ms": 604_800_000.0})).await;
        f.sweep().await;
        let run = f.get(&id).await;
        // Every sweep's health is written: the first one at once.
        assert_eq!(run["health"]["state"], "PROGRESSING", "{run}");
        if run["health"]["stragglers"] != json!([]) {
            named = Some(run);
            break;
        }
    }
    let named = named.expect("rank 1 is named a straggler within 12 s");
    let straggler = &named["health"]["stragglers"][0];
    assert_eq!(named["health"]["stragglers"].as_array().unwrap().len(), 1, "{named}");
    assert_eq!(straggler["rank"], 1, "{named}");
    let ratio = straggler["ratio"].as_f64().expect("a finite ratio is a JSON number");
    assert!(ratio.is_finite() && ratio >= 1.5, "{named}");
    assert_eq!(straggler["step_time_ms"], 604_800_000.0, "{named}");
    assert_eq!(straggler["peers_step_time_ms"], 0.001, "bounded to the microsecond: {named}");
    // The write that named it was taken: the history holds the change.
    let history = named["health_history"].as_array().unwrap();
    assert_eq!(history.last().unwrap()["stragglers"], json!([1]), "{named}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_pause_and_a_runs_own_window_delay_the_stall() {
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(config("health-windows", &clock), clock.clone()).await;
    let paused = f.join("paused", 1, json!({})).await;
    let patient = f.join("patient", 1, json!({"stall_after_ms": 60_000})).await;
    f.reported(
        &paused,
        0,
        json!({"step": 5, "phase": "checkpoint", "expect_next_within_ms": 30_000}),
    )
    .await;
    f.reported(&patient, 0, json!({"step": 5})).await;
    f.sweep().await;

    clock.advance_ms(29_999);
    f.sweep().await;
    assert_eq!(f.get(&paused).await["health"]["state"], "PROGRESSING", "the pause covers it");
    assert_eq!(f.get(&patient).await["health"]["state"], "PROGRESSING", "its own window");
    clock.advance_ms(1);
    f.sweep().await;
    assert_eq!(f.get(&paused).await["health"]["state"], "STALLED", "past the pause");
    assert_eq!(f.get(&patient).await["health"]["state"], "PROGRESSING");
    clock.advance_ms(30_000);
    f.sweep().await;
    assert_eq!(f.get(&patient).await["health"]["state"], "STALLED", "past its 60 s window");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_window_follows_its_pace_between_a_minute_and_the_heads_stall_after() {
    let clock = Arc::new(ManualClock::new(T0));
    let config = config("health-paced", &clock).with_stall_after(Duration::from_secs(900));
    let f = Fixture::start(config, clock.clone()).await;
    let fast = f.join("fast", 2, json!({})).await;
    let slow = f.join("slow", 1, json!({})).await;

    // Steps of 0.2 s, a heartbeat a second: five steps a report.
    for second in 0..=10u64 {
        for rank in 0..2 {
            f.reported(&fast, rank, json!({"step": 5 * second, "step_time_ms": 200.0})).await;
        }
        if second < 10 {
            clock.advance_ms(1_000);
        }
    }
    let fast_advanced = T0 + 10_000;
    f.sweep().await;
    clock.advance_ms(59_999);
    f.sweep().await;
    assert_eq!(f.get(&fast).await["health"]["state"], "PROGRESSING", "within its minute");
    clock.advance_ms(1);
    f.sweep().await;
    let run = f.get(&fast).await;
    assert_eq!(run["health"]["state"], "STALLED", "a minute after its last advance: {run}");
    assert_eq!(run["health"]["since_ms"], fast_advanced + 60_000, "{run}");
    let detail = run["health"]["detail"].as_str().unwrap();
    assert!(
        detail.starts_with(
            "No rank has advanced for 1 min; the run's window is 1 min: 10 \u{d7} its slowest \
             recent step (1.00 s), at least 1 min. Rank 0 last advanced at"
        ),
        "{detail}"
    );

    // Steps of 30 s: five minutes.
    for step in 0..=5u64 {
        f.reported(&slow, 0, json!({"step": step, "step_time_ms": 30_000.0})).await;
        if step < 5 {
            clock.advance_ms(30_000);
        }
    }
    f.sweep().await;
    clock.advance_ms(299_999);
    f.sweep().await;
    assert_eq!(f.get(&slow).await["health"]["state"], "PROGRESSING", "within its 5 min");
    clock.advance_ms(1);
    f.sweep().await;
    let run = f.get(&slow).await;
    assert_eq!(run["health"]["state"], "STALLED", "{run}");
    let detail = run["health"]["detail"].as_str().unwrap();
    assert!(
        detail
            .contains("; the run's window is 5 min: 10 \u{d7} its slowest recent step (30.0 s). "),
        "{detail}"
    );
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_behind_the_highest_step_is_named_lagging() {
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(config("health-lagging", &clock), clock.clone()).await;
    let id = f.join("lagging", 3, json!({})).await;
    for (rank, step) in [(0, 500), (1, 500), (2, 480)] {
        f.reported(&id, rank, json!({"step": step})).await;
    }
    f.sweep().await;
    let run = f.get(&id).await;
    assert_eq!(run["health"]["state"], "PROGRESSING", "{run}");
    assert_eq!(run["health"]["ranks"], json!([2]), "{run}");
    let detail = run["health"]["detail"].as_str().unwrap();
    assert!(detail.contains("rank 2 at step 480"), "{detail}");

    clock.advance_ms(10_000);
    f.sweep().await;
    let run = f.get(&id).await;
    assert_eq!(run["health"]["state"], "STALLED", "{run}");
    // Every rank stopped at once, but not at the same step: the rank behind
    // is the one its peers wait for.
    assert_eq!(run["health"]["ranks"], json!([2]), "the rank at the lowest step: {run}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_report_is_refused_naming_its_field_and_nothing_is_recorded() {
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(config("health-refusals", &clock), clock.clone()).await;
    let id = f.join("refusals", 1, json!({})).await;
    f.reported(&id, 0, json!({"step": 7, "phase": "train", "metrics": {"loss": 1.0}})).await;
    let before = f.get(&id).await["rank_progress"].clone();

    let long_name = "m".repeat(129);
    let too_many: serde_json::Map<String, Value> =
        (0..33).map(|i| (format!("m{i}"), json!(1.0))).collect();
    let refused = [
        (json!({"phase": ""}), "progress.phase"),
        (json!({"phase": "x".repeat(65)}), "progress.phase"),
        (json!({"phase": "tab\there"}), "progress.phase"),
        (json!({"phase": "évaluation"}), "progress.phase"),
        (json!({"expect_next_within_ms": 604_800_001_u64}), "progress.expect_next_within_ms"),
        (json!({"step": 8, "step_time_ms": 0.0}), "progress.step_time_ms"),
        (json!({"step": 8, "step_time_ms": -5.0}), "progress.step_time_ms"),
        (json!({"step": 8, "step_time_ms": 604_800_000.5}), "progress.step_time_ms"),
        (json!({"metrics": {"loss rate": 1.0}}), "progress.metrics[\"loss rate\"]"),
        (
            json!({"metrics": {long_name.clone(): 1.0}}),
            &format!("progress.metrics[\"{long_name}\"]"),
        ),
        (json!({"metrics": Value::Object(too_many)}), "progress.metrics"),
    ];
    for (progress, field) in &refused {
        let (status, answer) = f.report(&id, 0, progress.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{progress}: {answer}");
        assert_eq!(answer["error"]["code"], "invalid", "{answer}");
        assert_eq!(answer["error"]["field"], *field, "{progress}: {answer}");
    }
    // A non-finite number is not JSON: the body itself is refused.
    let path = format!("/api/train/runs/{id}/ranks/0/heartbeat");
    let raw = r#"{"attempt_id": "0", "progress": {"metrics": {"loss": NaN}}}"#;
    let (status, answer) = send(
        &f.client,
        Method::POST,
        &f.url(&path),
        Some(("application/json", raw.as_bytes().to_vec())),
        None,
    )
    .await;
    assert!(status.is_client_error(), "{answer}");

    let (status, answer) = f.report(&id, 0, json!({"step": 6})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert!(
        answer["error"]["message"].as_str().unwrap().contains("steps never go back"),
        "{answer}"
    );

    // 64 names in all, then the 65th is refused, naming it.
    for batch in 0..2 {
        let names: serde_json::Map<String, Value> =
            (0..32).map(|i| (format!("n{batch}_{i:02}"), json!(0.5))).collect();
        let metrics = if batch == 0 { names } else { names.into_iter().take(31).collect() };
        f.reported(&id, 0, json!({"step": 7, "metrics": metrics})).await;
    }
    let (status, answer) = f.report(&id, 0, json!({"metrics": {"zz_new": 1.0}})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(answer["error"]["field"], "progress.metrics[\"zz_new\"]", "{answer}");

    let after = f.get(&id).await["rank_progress"].clone();
    assert_eq!(after[0]["step"], before[0]["step"], "refused reports change nothing");
    assert_eq!(after[0]["last_advance_ms"], before[0]["last_advance_ms"]);

    let join = json!({"world_size": 1, "worker": workers(1, 1, "w-")[0], "name": "w",
        "job_id": "7", "stall_after_ms": 999});
    let (status, answer) = send(
        &f.client,
        Method::POST,
        &f.url("/api/train/rendezvous/window/join"),
        body(&join),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(answer["error"]["field"], "stall_after_ms", "{answer}");

    // A registration's own health is the head's to decide: ignored.
    let mut registered = serde_json::to_value(run("registered", T0)).unwrap();
    registered["health"] =
        json!({"state": "STALLED", "since_ms": T0, "ranks": [0], "detail": "made up"});
    registered["health_history"] = json!([{"state": "STALLED", "at_ms": T0, "ranks": [0]}]);
    let (status, answer) =
        send(&f.client, Method::POST, &f.url("/api/train/runs"), body(&registered), None).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let stored = f.get(registered["id"].as_str().unwrap()).await;
    assert!(stored.get("health").is_none() && stored.get("health_history").is_none(), "{stored}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_window_starts_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.sqlite");
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(
        configured(StateConfig::sqlite(&path), "health-restart", &clock),
        clock.clone(),
    )
    .await;
    let id = f.join("restart", 1, json!({})).await;
    f.reported(&id, 0, json!({"step": 2, "metrics": {"loss": 0.5}})).await;
    f.reported(&id, 0, json!({"step": 3, "metrics": {"loss": 0.25}})).await;
    f.sweep().await;
    assert_eq!(f.get(&id).await["health"]["state"], "PROGRESSING");
    // Stopped before the next flush: the points pending are flushed on the way.
    f.stop().await;

    // The head was down for longer than the window; the rank reports the
    // same step when it is back.
    clock.advance_ms(60_000);
    let f = Fixture::start(
        configured(StateConfig::sqlite(&path), "health-restart", &clock),
        clock.clone(),
    )
    .await;
    assert_eq!(f.listed("PROGRESSING").await, vec![id.clone()], "the health survives");
    let url = f.url(&format!("/api/train/runs/{id}/metrics"));
    let (status, kept) = send(&f.client, Method::GET, &url, None, None).await;
    assert_eq!(status, StatusCode::OK, "{kept}");
    assert_eq!(
        kept["series"],
        json!([{"name": "loss", "points": [
            {"rank": 0, "step": 2, "value": 0.5},
            {"rank": 0, "step": 3, "value": 0.25}
        ]}]),
        "the history survives the restart, read from the store"
    );
    f.reported(&id, 0, json!({"step": 3})).await;
    clock.advance_ms(9_999);
    f.sweep().await;
    assert_eq!(f.get(&id).await["health"]["state"], "PROGRESSING", "no false alarm");
    clock.advance_ms(1);
    f.sweep().await;
    assert_eq!(f.get(&id).await["health"]["state"], "STALLED", "a window after the restart");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_is_taken_while_the_actor_is_held() {
    let clock = Arc::new(ManualClock::new(T0));
    let config = config("health-held", &clock);
    let faults = config.faults.clone();
    let f = Fixture::start(config, clock.clone()).await;
    let id = f.join("held", 2, json!({})).await;

    faults.hold_actor();
    let late = {
        let (client, url) = (f.client.clone(), f.url("/api/train/runs"));
        let late = serde_json::to_value(run("late", T0)).unwrap();
        tokio::spawn(async move { send(&client, Method::POST, &url, body(&late), None).await })
    };
    eventually("the actor to be held", DEADLINE, || std::future::ready(faults.actor_waiting()))
        .await;
    clock.advance_ms(1_000);
    f.reported(&id, 1, json!({"step": 42, "metrics": {"loss": 0.25}})).await;
    let (status, answer) = f.report(&id, 1, json!({"step": 41})).await;
    assert_eq!(status, StatusCode::CONFLICT, "refused on the connection too: {answer}");
    let run = f.get(&id).await;
    assert_eq!(run["rank_progress"][1]["step"], 42, "{run}");
    assert_eq!(run["rank_progress"][0], Value::Null, "{run}");
    assert!(!late.is_finished(), "the registration still waits for the actor");
    faults.release_actor();
    let (status, answer) = late.await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    f.stop().await;
}

/// `GET /api/train/runs/{id}/metrics`: each metric reported with a step,
/// a point per report and rank, filtered by name, rank and steps; at most
/// 1,000 points a metric, the history decimated as it grows so that it
/// still spans the first step to the last; 404 for a run that does not
/// exist, and no series for a run whose ranks reported none.
#[tokio::test]
async fn the_metrics_route_serves_each_metrics_history_bounded_and_filtered() {
    let clock = Arc::new(ManualClock::new(T0));
    let fixture = Fixture::start(config("health-metrics", &clock), clock).await;
    let id = fixture.join("metrics", 2, json!({})).await;
    let metrics = |query: &str| {
        let url = fixture.url(&format!("/api/train/runs/{id}/metrics{query}"));
        let client = fixture.client.clone();
        async move {
            let (status, answer) = send(&client, Method::GET, &url, None, None).await;
            assert_eq!(status, StatusCode::OK, "{answer}");
            answer
        }
    };
    assert_eq!(metrics("").await["series"], json!([]), "nothing reported yet");
    for step in 1..=3u64 {
        for rank in 0..2u32 {
            let loss = 1.0 / step as f64 + f64::from(rank);
            fixture
                .reported(&id, rank, json!({"step": step, "metrics": {"loss": loss, "lr": 0.1}}))
                .await;
        }
    }
    // A report without a step adds no point.
    fixture.reported(&id, 0, json!({"metrics": {"loss": 9.0}})).await;
    // The points reach the store with the next flush (about a second).
    let all = eventually("the reported points", DEADLINE, || {
        let all = metrics("");
        async move {
            let all = all.await;
            (all["series"].as_array().unwrap().len() == 2
                && all["series"][1]["points"].as_array().unwrap().len() == 6)
                .then_some(all)
        }
    })
    .await;
    let names: Vec<&str> =
        all["series"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["loss", "lr"]);
    // In batches: one transaction carried them all, and none was lost.
    let text =
        fixture.client.get(fixture.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let value = |name: &str| -> f64 {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} in {text}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(value("trainstate_metric_points_total"), 12.0, "{text}");
    assert!(value("trainstate_metric_flushes_total") >= 1.0, "{text}");
    assert_eq!(value("trainstate_metric_points_dropped_total"), 0.0, "{text}");
    assert_eq!(all["series"][0]["points"].as_array().unwrap().len(), 6);
    assert_eq!(all["series"][0]["points"][1], json!({"rank": 1, "step": 1, "value": 2.0}));
    let one = metrics("?name=loss&rank=1&from_step=2&to_step=3").await;
    assert_eq!(
        one["series"],
        json!([{"name": "loss", "points": [
            {"rank": 1, "step": 2, "value": 1.5},
            {"rank": 1, "step": 3, "value": 1.0 + 1.0 / 3.0}
        ]}])
    );

    // 2,500 reports of one rank: bounded, decimated, still from the start.
    for step in 4..=2_503u64 {
        fixture.reported(&id, 0, json!({"step": step, "metrics": {"loss": 0.5}})).await;
    }
    // The last reports reach the store (at the grain the series keeps).
    let long = eventually("the last reports' points", DEADLINE, || {
        let long = metrics("?name=loss&rank=0&from_step=2500");
        async move { long.await["series"][0]["points"].as_array().is_some_and(|p| !p.is_empty()) }
    });
    long.await;
    let long = metrics("?name=loss&rank=0").await;
    let points = long["series"][0]["points"].as_array().unwrap();
    assert!(points.len() <= 1_000 && points.len() > 250, "{} points", points.len());
    assert_eq!(points[0]["step"], 1, "the history keeps its start");
    assert!(
        points.last().unwrap()["step"].as_u64().unwrap() > 2_000,
        "and reaches the recent steps"
    );

    let missing = fixture.url("/api/train/runs/01890000-0000-7000-8000-000000000000/metrics");
    let (status, answer) = send(&fixture.client, Method::GET, &missing, None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    let (status, answer) = send(
        &fixture.client,
        Method::GET,
        &fixture.url(&format!("/api/train/runs/{id}/metrics?rank=x")),
        None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    fixture.stop().await;
}

/// How many metric points run `id` has in the store's own tables.
async fn stored_points(fresh: &crate::stores::Fresh, id: &str) -> i64 {
    match fresh.url() {
        Some(url) => crate::stores::connect(url)
            .await
            .query_one(
                "SELECT count(*) FROM trainstate_metric_points p
                 JOIN trainstate_metric_series s ON s.id = p.series_id WHERE s.run_id = $1",
                &[&id],
            )
            .await
            .unwrap()
            .get(0),
        None => rusqlite::Connection::open(fresh.sqlite_path())
            .unwrap()
            .query_row(
                "SELECT count(*) FROM metric_points p
                 JOIN metric_series s ON s.id = p.series_id WHERE s.run_id = ?1",
                [id],
                |row| row.get(0),
            )
            .unwrap(),
    }
}

on_both_stores! {
    multi_thread:
    /// A run's metric histories live in the store: reports are flushed to
    /// it in batches, bounded as they grow, read back from it by the route
    /// (the same after a restart) and deleted with the run.
    async fn metric_histories_are_kept_in_the_store_and_deleted_with_their_run(store) {
        let fresh = store.fresh("health-histories").await;
        let clock = Arc::new(ManualClock::new(T0));
        let config = |clock: &Arc<ManualClock>| configured(fresh.config(), "health-histories", clock);
        let f = Fixture::start(config(&clock), clock.clone()).await;
        let id = f.join("histories", 2, json!({})).await;
        for step in 1..=1_500u64 {
            let metrics = json!({"loss": 1.0 / step as f64, "lr": 0.01});
            f.reported(&id, 0, json!({"step": step, "metrics": metrics})).await;
        }
        f.reported(&id, 1, json!({"step": 1_500, "metrics": {"loss": 0.5}})).await;
        let url = f.url(&format!("/api/train/runs/{id}/metrics"));
        let client = f.client.clone();
        let read = || {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let (status, answer) = send(&client, Method::GET, &url, None, None).await;
                assert_eq!(status, StatusCode::OK, "{answer}");
                answer
            }
        };
        let flushed = eventually("every report flushed", DEADLINE, || {
            let read = read();
            async move {
                let answer = read.await;
                let loss = answer["series"][0]["points"].as_array().cloned().unwrap_or_default();
                loss.last().is_some_and(|p| p["rank"] == 1).then_some(answer)
            }
        })
        .await;
        let loss = flushed["series"][0]["points"].as_array().unwrap();
        assert_eq!(flushed["series"][0]["name"], "loss");
        assert!(loss.len() <= 1_000 && loss.len() > 500, "{} points", loss.len());
        assert_eq!(loss[0], json!({"rank": 0, "step": 1, "value": 1.0}));
        let stored = stored_points(&fresh, &id).await;
        let lr = flushed["series"][1]["points"].as_array().unwrap().len();
        assert_eq!(stored, (loss.len() + lr) as i64, "the store holds what is served");
        f.stop().await;

        let f = Fixture::start(config(&clock), clock.clone()).await;
        let url = f.url(&format!("/api/train/runs/{id}/metrics"));
        let (status, again) = send(&f.client, Method::GET, &url, None, None).await;
        assert_eq!(status, StatusCode::OK, "{again}");
        assert_eq!(again, flushed, "read from the store after a restart");
        let run_url = f.url(&format!("/api/train/runs/{id}"));
        let finish = json!({"status": "FINISHED"});
        let (status, answer) =
            send(&f.client, Method::POST, &format!("{run_url}/status"), super::body(&finish), None)
                .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        let (status, _) = send(&f.client, Method::DELETE, &run_url, None, None).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        assert_eq!(stored_points(&fresh, &id).await, 0, "deleted with the run");
        f.stop().await;
    }
}

impl Fixture {
    /// Rank `rank` ends with `status` (`FINISHED`, `ERRORED`): the run's
    /// status as the answer says it.
    async fn end(&self, id: &str, rank: u32, status: &str) -> Value {
        let path = format!("/api/train/runs/{id}/ranks/{rank}/end");
        let end = json!({"attempt_id": "0", "status": status});
        let (code, answer) =
            send(&self.client, Method::POST, &self.url(&path), body(&end), None).await;
        assert_eq!(code, StatusCode::OK, "{answer}");
        answer["run_status"].clone()
    }

    /// The health tick, now.
    async fn tick(&self) -> usize {
        self.server.service.handle().decide_health().await.unwrap()
    }
}

/// The states of a run's `health_history`, with their `at_ms`.
fn history(run: &Value) -> Vec<(String, u64)> {
    let changes = run["health_history"].as_array().cloned().unwrap_or_default();
    changes
        .iter()
        .map(|c| (c["state"].as_str().unwrap().to_owned(), c["at_ms"].as_u64().unwrap()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_ends_with_the_advance_that_ended_it_or_with_the_run() {
    // Rank 1 stops at T0 + 2 s; the window passes at T0 + 12 s. Then either
    // a rank advances at T0 + 42 s (a 40 s pause) and the run finishes at
    // T0 + 42.5 s, before any sweep, or the run finishes still stalled.
    // (what happens, the history after the end, the health's state, whether
    // the run ended while stalled)
    let p = |at: u64| ("PROGRESSING".to_owned(), T0 + at);
    let s = |at: u64| ("STALLED".to_owned(), T0 + at);
    let cases = [
        ("resumes then finishes", true, vec![p(0), s(12_000), p(42_000)], "PROGRESSING", false),
        ("finishes while stalled", false, vec![p(0), s(12_000)], "STALLED", true),
    ];
    for (what, resumes, expected, state, ended_stalled) in cases {
        let clock = Arc::new(ManualClock::new(T0));
        let f = Fixture::start(config("health-resolved", &clock), clock.clone()).await;
        let id = f.join("resolved", 2, json!({})).await;
        f.reported(&id, 0, json!({"step": 10})).await;
        f.reported(&id, 1, json!({"step": 10})).await;
        f.sweep().await;
        clock.advance_ms(2_000);
        f.reported(&id, 0, json!({"step": 11})).await;
        f.reported(&id, 1, json!({"step": 11})).await;
        clock.advance_ms(10_000);
        f.sweep().await;
        let run = f.get(&id).await;
        assert_eq!(run["health"]["state"], "STALLED", "{what}: {run}");
        assert_eq!(run["health"]["last_advance_ms"], T0 + 2_000, "{what}: {run}");
        assert_eq!(f.listed("STALLED").await, vec![id.clone()], "{what}: a live stall");

        clock.advance_ms(30_000);
        if resumes {
            f.reported(&id, 0, json!({"step": 12})).await;
        }
        clock.advance_ms(500);
        assert_eq!(f.end(&id, 0, "FINISHED").await, "RUNNING", "{what}");
        assert_eq!(f.end(&id, 1, "FINISHED").await, "FINISHED", "{what}");

        let run = f.get(&id).await;
        assert_eq!(history(&run), expected, "{what}: {run}");
        let health = &run["health"];
        assert_eq!(health["state"], state, "{what}: {run}");
        let stalled = &run["health_history"][1];
        assert_eq!(stalled["last_advance_ms"], T0 + 2_000, "{what}: {run}");
        if ended_stalled {
            let ended = run["end_time_ms"].as_u64().unwrap();
            assert_eq!(health["ended_ms"], ended, "{what}: {run}");
            assert_eq!(stalled["ended_ms"], ended, "{what}: the stall ends with the run: {run}");
        } else {
            assert_eq!(health["since_ms"], T0 + 42_000, "{what}: dated by the advance: {run}");
            assert!(health.get("ended_ms").is_none(), "{what}: {run}");
            let detail = health["detail"].as_str().unwrap();
            assert!(
                detail.contains(", 40 s after the last advance before it."),
                "{what}: {detail}"
            );
        }
        assert!(f.listed("STALLED").await.is_empty(), "{what}: an ended run is no live stall");
        f.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_tick_sees_a_stall_and_its_end_without_the_lease_sweep() {
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(config("health-tick", &clock), clock.clone()).await;
    let id = f.join("tick", 1, json!({})).await;
    f.reported(&id, 0, json!({"step": 1})).await;
    f.sweep().await;
    assert_eq!(f.tick().await, 0, "nothing is due within the window");

    clock.advance_ms(STALL_AFTER.as_millis() as u64);
    assert_eq!(f.tick().await, 1, "the window passed");
    let run = f.get(&id).await;
    assert_eq!(run["health"]["state"], "STALLED", "{run}");
    assert_eq!(f.tick().await, 0, "a stall no rank ended is not decided again");

    clock.advance_ms(7_000);
    f.reported(&id, 0, json!({"step": 2})).await;
    clock.advance_ms(900);
    assert_eq!(f.tick().await, 1, "the advance ended the stall");
    let run = f.get(&id).await;
    assert_eq!(run["health"]["state"], "PROGRESSING", "{run}");
    assert_eq!(run["health"]["since_ms"], T0 + 17_000, "dated by the advance: {run}");
    assert_eq!(history(&run).last(), Some(&("PROGRESSING".to_owned(), T0 + 17_000)), "{run}");
    assert_eq!(f.tick().await, 0);
    f.stop().await;
}
