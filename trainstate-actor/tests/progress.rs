//! Progress a run's controller reports for its ranks
//! (`POST /api/train/runs/{id}/progress`, `StateHandle::report_progress`):
//! the health of a controller run decided like a rendezvous run's, the
//! report as a sign of life, its board following the run's attempts and
//! end, every refusal naming what is wrong with nothing recorded, the
//! report taken while the actor is held, and the per-rank Prometheus
//! series behind their bound.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use trainstate_actor::http::HttpConfig;
use trainstate_actor::{ManualClock, StateConfig};
use trainstate_client::api::RankProgress;
use trainstate_client::{NewAttempt, StateError, StatusUpdate};
use trainstate_schema::{RunId, TrainRunInfo};

use crate::common::{Server, eventually, run_with, unique_name, workers};
use crate::contract::send;

const T0: u64 = 1_760_000_000_000;
/// Long enough that no run is aborted for a lost controller here.
const LEASE: Duration = Duration::from_secs(24 * 3600);
const STALL_AFTER: Duration = Duration::from_secs(10);
const DEADLINE: Duration = Duration::from_secs(10);

fn config(what: &str, clock: &Arc<ManualClock>) -> StateConfig {
    StateConfig::in_memory()
        .with_name(unique_name(what))
        .with_clock(clock.clone())
        .with_lease(LEASE)
        .with_stall_after(STALL_AFTER)
        // The tests drive the sweep themselves.
        .with_sweep_interval(Duration::from_secs(3600))
}

/// A live run of `n` workers, as a controller registers it.
fn controller_run(name: &str, n: u32) -> TrainRunInfo {
    run_with(&RunId::new_v7(), name, "job1", T0, n)
}

fn at(step: u64) -> RankProgress {
    RankProgress::at_step(step)
}

/// One head over HTTP and its clock.
struct Fixture {
    server: Server,
    client: Client,
}

impl Fixture {
    async fn start(config: StateConfig, http: HttpConfig) -> Self {
        Self { server: Server::start(config, http).await, client: Client::new() }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.url)
    }

    async fn register(&self, run: &TrainRunInfo) -> RunId {
        self.server.service.handle().register(run.clone()).await.unwrap();
        run.id().clone()
    }

    /// `POST /api/train/runs/{id}/progress` with `body`: the status and answer.
    async fn post(&self, id: &RunId, body: &Value) -> (StatusCode, Value) {
        let url = self.url(&format!("/api/train/runs/{id}/progress"));
        let body = Some(("application/json", serde_json::to_vec(body).unwrap()));
        send(&self.client, Method::POST, &url, body, None).await
    }

    async fn get(&self, id: &RunId) -> Value {
        let url = self.url(&format!("/api/train/runs/{id}"));
        let (status, run) = send(&self.client, Method::GET, &url, None, None).await;
        assert_eq!(status, StatusCode::OK, "{run}");
        run
    }

    async fn sweep(&self) {
        self.server.service.handle().sweep_leases().await.unwrap();
    }

    async fn metrics(&self) -> String {
        let response = self.client.get(self.url("/metrics")).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        response.text().await.unwrap()
    }

    async fn stop(self) {
        self.server.stop().await;
    }
}

/// The lines of a Prometheus exposition that are samples of `metric`.
fn samples<'a>(text: &'a str, metric: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|line| line.strip_prefix(metric).is_some_and(|rest| rest.starts_with(['{', ' '])))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_runs_health_turns_stalled_and_progressing_again() {
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(config("progress-health", &clock), HttpConfig::default()).await;
    let handle = f.server.service.handle();
    let id = f.register(&controller_run("ctl-health", 2)).await;

    f.sweep().await;
    assert!(f.get(&id).await.get("health").is_none(), "no progress, no health");

    let mut first = at(10);
    first.phase = Some("train".into());
    first.metrics.insert("loss".into(), 2.5);
    let answer = handle.report_progress(&id, None, vec![(0, first), (1, at(10))]).await.unwrap();
    assert_eq!((answer.attempt_id.as_str(), answer.world_size, answer.recorded), ("0", 2, true));
    f.sweep().await;
    let run = f.get(&id).await;
    assert_eq!(run["health"]["state"], "PROGRESSING", "{run}");
    assert_eq!(run["rank_progress"][0]["metrics"]["loss"], 2.5, "{run}");
    assert_eq!(run["rank_progress"][1]["last_advance_ms"], T0, "{run}");

    // Rank 0 advances once more, then neither does: rank 1 stopped first.
    clock.advance_ms(2_000);
    handle.report_progress(&id, Some("0".into()), vec![(0, at(11)), (1, at(10))]).await.unwrap();
    clock.advance_ms(9_999);
    f.sweep().await;
    assert_eq!(f.get(&id).await["health"]["state"], "PROGRESSING", "within the window");
    clock.advance_ms(1);
    f.sweep().await;
    let run = f.get(&id).await;
    assert_eq!(run["health"]["state"], "STALLED", "{run}");
    assert_eq!(run["health"]["ranks"], json!([1]), "the rank behind: {run}");
    assert_eq!(run["health"]["since_ms"], T0 + 12_000, "{run}");

    // The same step again is no advance; a higher one is.
    clock.advance_ms(5_000);
    handle.report_progress(&id, None, vec![(1, at(10))]).await.unwrap();
    f.sweep().await;
    assert_eq!(f.get(&id).await["health"]["state"], "STALLED");
    handle.report_progress(&id, None, vec![(1, at(11))]).await.unwrap();
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
    // The controller's metric points reach the store with the next flush.
    let url = f.url(&format!("/api/train/runs/{id}/metrics"));
    eventually("the controller's metric points in the store", Duration::from_secs(10), || {
        let (client, url) = (f.client.clone(), url.clone());
        async move {
            let (status, series) = send(&client, Method::GET, &url, None, None).await;
            assert_eq!(status, StatusCode::OK, "{series}");
            series["series"][0]["name"] == "loss"
        }
    })
    .await;
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_is_a_sign_of_life_and_its_board_follows_the_attempts_and_the_end() {
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(config("progress-board", &clock), HttpConfig::default()).await;
    let handle = f.server.service.handle();
    let id = f.register(&controller_run("ctl-board", 2)).await;

    clock.advance_ms(7_000);
    let (status, answer) =
        f.post(&id, &json!({"ranks": [{"rank": 1, "progress": {"step": 3}}]})).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["lease_ms"], LEASE.as_millis() as u64, "{answer}");
    let run = f.get(&id).await;
    assert_eq!(run["last_heartbeat_ms"], T0 + 7_000, "a report renews the lease: {run}");
    assert_eq!(
        run["rank_progress"],
        json!([null, {"step": 3, "total_steps": null, "phase": null,
        "last_advance_ms": T0 + 7_000, "metrics": {}}]),
        "{run}"
    );

    // Taken by the connection from now on (the board exists): a second
    // report renews the lease too.
    clock.advance_ms(1_000);
    let (status, answer) =
        f.post(&id, &json!({"ranks": [{"rank": 1, "progress": {"step": 4}}]})).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(f.get(&id).await["last_heartbeat_ms"], T0 + 8_000);

    // A new worker group: a new board, of its ranks.
    let attempt = NewAttempt::new("1", T0 + 9_000, workers(3, 4, "b-"));
    handle.start_attempt(id.clone(), attempt).await.unwrap();
    let run = f.get(&id).await;
    assert!(run.get("rank_progress").is_none(), "the new attempt reported nothing: {run}");
    let (status, answer) = f
        .post(
            &id,
            &json!({"attempt_id": "0", "ranks": [
        {"rank": 0, "progress": {"step": 5}}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("not the run's current attempt"));
    let answer = handle.report_progress(&id, Some("1".into()), vec![(2, at(1))]).await.unwrap();
    assert_eq!((answer.attempt_id.as_str(), answer.world_size), ("1", 3));
    assert_eq!(f.get(&id).await["rank_progress"][2]["step"], 1);

    // While it restarts, a report renews the lease and records nothing.
    let restarting = StatusUpdate::live(trainstate_schema::RunStatus::Restarting, "");
    handle.set_status(id.clone(), restarting).await.unwrap();
    clock.advance_ms(1_000);
    let answer = handle.report_progress(&id, None, vec![(2, at(2))]).await.unwrap();
    assert!(!answer.recorded, "{answer:?}");
    let run = f.get(&id).await;
    assert_eq!(run["rank_progress"][2]["step"], 1, "{run}");
    assert_eq!(run["last_heartbeat_ms"], T0 + 9_000, "renewed by the report: {run}");

    // An ended run has no board, and takes no report; it serves its
    // ranks' last progress (of its last attempt).
    handle.set_status(id.clone(), StatusUpdate::finished()).await.unwrap();
    let run = f.get(&id).await;
    assert_eq!(run["rank_progress"][2]["step"], 1, "{run}");
    assert_eq!(run["rank_progress"].as_array().map(Vec::len), Some(3), "{run}");
    let (status, answer) =
        f.post(&id, &json!({"ranks": [{"rank": 0, "progress": {"step": 9}}]})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert_eq!(answer["error"]["code"], "illegal_transition", "{answer}");
    let err = handle.report_progress(&id, None, vec![(0, at(9))]).await.unwrap_err();
    assert!(matches!(err, StateError::IllegalTransition { .. }), "{err}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_report_is_refused_naming_what_is_wrong_and_nothing_is_recorded() {
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(config("progress-refusals", &clock), HttpConfig::default()).await;
    let id = f.register(&controller_run("ctl-refusals", 4)).await;
    let (status, answer) = f
        .post(
            &id,
            &json!({"ranks": [
        {"rank": 0, "progress": {"step": 7, "metrics": {"loss": 1.0}}},
        {"rank": 1, "progress": {"step": 7}}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let before = f.get(&id).await["rank_progress"].clone();

    let entry = |rank: u32, progress: Value| json!({"rank": rank, "progress": progress});
    let invalid = [
        (json!({"ranks": []}), "ranks"),
        (json!({"attempt_id": "", "ranks": [entry(0, json!({}))]}), "attempt_id"),
        (json!({"ranks": [entry(0, json!({"step": 8})), entry(0, json!({}))]}), "ranks[1].rank"),
        (
            json!({"ranks": [entry(0, json!({"step": 8})), entry(1, json!({"step": 8})),
                entry(2, json!({"metrics": {"loss rate": 1.0}}))]}),
            "ranks[2].progress.metrics[\"loss rate\"]",
        ),
        (json!({"ranks": [entry(3, json!({"phase": ""}))]}), "ranks[0].progress.phase"),
    ];
    for (body, field) in &invalid {
        let (status, answer) = f.post(&id, body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {answer}");
        assert_eq!(answer["error"]["field"], *field, "{body}: {answer}");
    }
    let (status, answer) = f.post(&id, &json!({"ranks": [{"rank": 0}]})).await;
    assert!(status.is_client_error(), "a rank without progress: {answer}");

    let conflicts = [
        (
            json!({"ranks": [entry(0, json!({"step": 8})), entry(4, json!({"step": 1}))]}),
            "world size is 4",
        ),
        (
            json!({"ranks": [entry(1, json!({"step": 9})), entry(0, json!({"step": 6}))]}),
            "steps never go back",
        ),
        (
            json!({"attempt_id": "1", "ranks": [entry(0, json!({"step": 9}))]}),
            "not the run's current attempt",
        ),
    ];
    for (body, words) in &conflicts {
        let (status, answer) = f.post(&id, body).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{body}: {message}");
    }
    // 64 metric names in all, then a report that would bring a 65th is
    // refused, naming it where it is.
    let names = |from: usize| -> Value {
        (from..from + 32)
            .map(|i| (format!("n{i:02}"), json!(0.5)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let (status, answer) = f
        .post(
            &id,
            &json!({"ranks": [entry(2, json!({"metrics": names(0)})),
        entry(3, json!({"metrics": names(31)}))]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "64 names with loss: {answer}");
    let (status, answer) = f
        .post(
            &id,
            &json!({"ranks": [entry(2, json!({"step": 1})),
        entry(3, json!({"metrics": {"zz": 1.0, "zzz": 2.0}}))]}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert_eq!(answer["error"]["field"], "ranks[1].progress.metrics[\"zz\"]", "{answer}");

    let after = f.get(&id).await["rank_progress"].clone();
    assert_eq!(after[0], before[0], "refused reports change nothing: {after}");
    assert_eq!(after[1], before[1], "refused reports change nothing: {after}");
    assert_eq!(after[2]["step"], Value::Null, "{after}");

    let missing = RunId::new_v7();
    let (status, answer) = f.post(&missing, &json!({"ranks": [entry(0, json!({}))]})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");

    // A rendezvous run's ranks report with their heartbeats.
    let join = json!({"world_size": 1, "worker": workers(1, 1, "rdzv-")[0], "name": "rdzv",
        "job_id": "7"});
    let (status, joined) = send(
        &f.client,
        Method::POST,
        &f.url("/api/train/rendezvous/rdzv/join"),
        Some(("application/json", serde_json::to_vec(&join).unwrap())),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{joined}");
    let rendezvous = RunId::parse(joined["run_id"].as_str().unwrap()).unwrap();
    let (status, answer) =
        f.post(&rendezvous, &json!({"ranks": [entry(0, json!({"step": 1}))]})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("heartbeat"), "{answer}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_is_taken_while_the_actor_is_held() {
    let clock = Arc::new(ManualClock::new(T0));
    let config = config("progress-held", &clock);
    let faults = config.faults.clone();
    let f = Fixture::start(config, HttpConfig::default()).await;
    let id = f.register(&controller_run("ctl-held", 2)).await;
    let (status, answer) =
        f.post(&id, &json!({"ranks": [{"rank": 0, "progress": {"step": 1}}]})).await;
    assert_eq!(status, StatusCode::OK, "the first report, by the actor: {answer}");

    faults.hold_actor();
    let late = {
        let (client, url) = (f.client.clone(), f.url("/api/train/runs"));
        let late = serde_json::to_vec(&controller_run("late", 1)).unwrap();
        tokio::spawn(async move {
            send(&client, Method::POST, &url, Some(("application/json", late)), None).await
        })
    };
    eventually("the actor to be held", DEADLINE, || std::future::ready(faults.actor_waiting()))
        .await;
    clock.advance_ms(1_000);
    let (status, answer) =
        f.post(&id, &json!({"ranks": [{"rank": 1, "progress": {"step": 42}}]})).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (status, answer) =
        f.post(&id, &json!({"ranks": [{"rank": 1, "progress": {"step": 41}}]})).await;
    assert_eq!(status, StatusCode::CONFLICT, "refused on the connection too: {answer}");
    let run = f.get(&id).await;
    assert_eq!(run["rank_progress"][1]["step"], 42, "{run}");
    assert_eq!(run["last_heartbeat_ms"], T0 + 1_000, "{run}");
    assert!(!late.is_finished(), "the registration still waits for the actor");
    faults.release_actor();
    let (status, answer) = late.await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    f.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_rank_series_are_off_by_default_and_bounded_when_asked() {
    let clock = Arc::new(ManualClock::new(T0));
    let quiet = Fixture::start(config("progress-series-off", &clock), HttpConfig::default()).await;
    let id = quiet.register(&controller_run("ctl-series", 3)).await;
    let reports = vec![(0, at(5)), (1, at(6)), (2, RankProgress::default())];
    quiet.server.service.handle().report_progress(&id, None, reports.clone()).await.unwrap();
    let text = quiet.metrics().await;
    assert!(samples(&text, "trainstate_rank_step").is_empty(), "{text}");
    assert_eq!(
        samples(&text, "trainstate_rank_series_omitted"),
        ["trainstate_rank_series_omitted 2"],
        "the two ranks with a step: {text}"
    );
    quiet.stop().await;

    let http = HttpConfig::default().with_prometheus_rank_series(1);
    let f = Fixture::start(config("progress-series-one", &clock), http).await;
    let id = f.register(&controller_run("ctl-series", 3)).await;
    f.server.service.handle().report_progress(&id, None, reports).await.unwrap();
    let text = f.metrics().await;
    let steps = samples(&text, "trainstate_rank_step");
    assert_eq!(steps, [format!("trainstate_rank_step{{run_id=\"{id}\",rank=\"0\"}} 5")], "{text}");
    let advances = samples(&text, "trainstate_rank_last_advance_timestamp_seconds");
    assert_eq!(advances.len(), 1, "{text}");
    assert!(advances[0].contains(&format!("{{run_id=\"{id}\",rank=\"0\"}}")), "{text}");
    let seconds: f64 = advances[0].rsplit(' ').next().unwrap().parse().unwrap();
    assert_eq!(seconds, T0 as f64 / 1000.0, "{text}");
    assert_eq!(
        samples(&text, "trainstate_rank_series_omitted"),
        ["trainstate_rank_series_omitted 1"]
    );
    f.stop().await;
}

/// The points run `id` keeps in the SQLite store at `path`, all attempts
/// together, and the attempts they are of: what the store holds, read
/// from its own tables.
fn stored_points(path: &std::path::Path, id: &RunId) -> (u64, Vec<String>) {
    let conn = rusqlite::Connection::open(path).unwrap();
    let points: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM metric_points p JOIN metric_series s ON p.series_id = s.id
             WHERE s.run_id = ?1",
            [id.as_str()],
            |row| row.get(0),
        )
        .unwrap();
    let mut attempts = conn
        .prepare("SELECT DISTINCT attempt_id FROM metric_series WHERE run_id = ?1 ORDER BY 1")
        .unwrap();
    let attempts = attempts
        .query_map([id.as_str()], |row| row.get(0))
        .unwrap()
        .collect::<Result<Vec<String>, _>>()
        .unwrap();
    (points as u64, attempts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_histories_are_bounded_per_run_across_attempts_and_counted_in_retained_bytes() {
    use trainstate_actor::{Clock, HISTORY_POINT_BYTES, Retention};
    const RANKS: u32 = 8;
    const NAMES: usize = 4;
    const REPORTS: u64 = 25;
    // Each attempt reports 800 points (38,400 bytes): one fits the bound,
    // eight (307,200 bytes) would not.
    const PER_ATTEMPT: u64 = RANKS as u64 * NAMES as u64 * REPORTS;
    const BOUND: u64 = 100_000;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trainstate.db");
    let clock = Arc::new(ManualClock::new(T0));
    let sqlite = |what: &str, max_bytes: u64| {
        StateConfig::sqlite(&path)
            .with_name(unique_name(what))
            .with_clock(clock.clone())
            .with_lease(LEASE)
            .with_sweep_interval(Duration::from_secs(3600))
            .with_retention(Retention::max_runs(100).with_max_bytes(max_bytes))
    };
    let f = Fixture::start(sqlite("histories-bounded", BOUND), HttpConfig::default()).await;
    let handle = f.server.service.handle();
    let id = f.register(&controller_run("ctl-histories", RANKS)).await;

    let mut step = 0;
    for attempt in 0..8u64 {
        if attempt > 0 {
            clock.advance_ms(1_000);
            let workers = workers(RANKS, RANKS, &format!("a{attempt}-"));
            let next = NewAttempt::new(attempt.to_string(), clock.now_ms(), workers);
            handle.start_attempt(id.clone(), next).await.unwrap();
        }
        for _ in 0..REPORTS {
            step += 1;
            clock.advance_ms(10);
            let ranks = (0..RANKS)
                .map(|rank| {
                    let mut progress = at(step);
                    for name in 0..NAMES {
                        progress.metrics.insert(format!("m{name}"), step as f64);
                    }
                    (rank, progress)
                })
                .collect();
            handle.report_progress(&id, Some(attempt.to_string()), ranks).await.unwrap();
        }
        // Every point of this attempt reaches the store with a flush.
        let url = f.url(&format!("/api/train/runs/{id}/metrics"));
        eventually("the attempt's points in the store", DEADLINE, || {
            let (client, url) = (f.client.clone(), url.clone());
            async move {
                let (status, answer) = send(&client, Method::GET, &url, None, None).await;
                assert_eq!(status, StatusCode::OK, "{answer}");
                let series = answer["series"].as_array().unwrap();
                let points: usize =
                    series.iter().map(|s| s["points"].as_array().unwrap().len()).sum();
                points as u64 == PER_ATTEMPT
            }
        })
        .await;
        let (points, attempts) = stored_points(&path, &id);
        assert!(
            points * HISTORY_POINT_BYTES <= BOUND,
            "attempt {attempt}: {points} points ({} bytes) kept under a bound of {BOUND} \
             bytes, of attempts {attempts:?}",
            points * HISTORY_POINT_BYTES
        );
        assert!(attempts.contains(&attempt.to_string()), "{attempts:?}");
    }
    // The newest attempt keeps every point, the one before it too (both fit),
    // the older ones gave way.
    let (points, attempts) = stored_points(&path, &id);
    assert_eq!(attempts, ["6", "7"]);
    assert_eq!(points, 2 * PER_ATTEMPT);
    let history_bytes = points * HISTORY_POINT_BYTES;

    // Ended, the run's histories count against the retained bytes when the
    // store is loaded again: under a bound its JSON alone fits but not with
    // its histories, the sweep evicts it, histories and all.
    handle.set_status(id.clone(), StatusUpdate::finished()).await.unwrap();
    let json_bytes = serde_json::to_vec(&f.get(&id).await).unwrap().len() as u64;
    f.stop().await;
    let tight = json_bytes + history_bytes / 2;
    let f = Fixture::start(sqlite("histories-loaded", tight), HttpConfig::default()).await;
    f.sweep().await;
    let url = f.url(&format!("/api/train/runs/{id}"));
    let (status, answer) = send(&f.client, Method::GET, &url, None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "evicted with its histories: {answer}");
    f.stop().await;
    assert_eq!(stored_points(&path, &id), (0, Vec::new()));
}
