//! The record at a run's edges: an ended run still serves its ranks' last
//! progress (`rank_progress`, kept in the store when their board goes
//! away, the same after a restart of the head), its metric points reach
//! the store with its end, and a heartbeat that carries no advance adds no
//! point to a metric history.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use trainstate_actor::http::HttpConfig;
use trainstate_actor::{ManualClock, StateConfig};

use crate::common::{Server, eventually, unique_name, workers};
use crate::contract::send;
use crate::stores::on_both_stores;

const T0: u64 = 1_760_000_000_000;
/// Long enough that no run is aborted for a lost controller here.
const LEASE: Duration = Duration::from_secs(24 * 3600);
const DEADLINE: Duration = Duration::from_secs(10);

fn body(value: &Value) -> Option<(&'static str, Vec<u8>)> {
    Some(("application/json", serde_json::to_vec(value).unwrap()))
}

fn configured(config: StateConfig, what: &str, clock: &Arc<ManualClock>) -> StateConfig {
    config
        .with_name(unique_name(what))
        .with_clock(clock.clone())
        .with_lease(LEASE)
        // The tests sweep nothing.
        .with_sweep_interval(Duration::from_secs(3600))
}

/// One head over HTTP.
struct Fixture {
    server: Server,
    client: Client,
}

impl Fixture {
    async fn start(config: StateConfig) -> Self {
        Self { server: Server::start(config, HttpConfig::default()).await, client: Client::new() }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.server.url)
    }

    async fn post(&self, path: &str, value: Value) -> Value {
        let (status, answer) =
            send(&self.client, Method::POST, &self.url(path), body(&value), None).await;
        assert_eq!(status, StatusCode::OK, "POST {path}: {answer}");
        answer
    }

    async fn get(&self, path: &str) -> Value {
        let (status, answer) = send(&self.client, Method::GET, &self.url(path), None, None).await;
        assert_eq!(status, StatusCode::OK, "GET {path}: {answer}");
        answer
    }

    /// The run of a group of `world_size` ranks that joined under `key`.
    async fn join(&self, key: &str, world_size: u32) -> String {
        let mut id = String::new();
        for worker in workers(world_size, 1, &format!("{key}-")) {
            let mut worker = serde_json::to_value(worker).unwrap();
            worker["node_name"] = json!(format!("{key}-host{}", worker["node_rank"]));
            let join =
                json!({"world_size": world_size, "worker": worker, "name": key, "job_id": "7"});
            id = self.post(&format!("/api/train/rendezvous/{key}/join"), join).await["run_id"]
                .as_str()
                .unwrap()
                .to_owned();
        }
        id
    }

    /// Rank `rank`'s heartbeat, with `progress` when it is not null.
    async fn beat(&self, id: &str, rank: u32, progress: Value) {
        let mut beat = json!({"attempt_id": "0"});
        if !progress.is_null() {
            beat["progress"] = progress;
        }
        self.post(&format!("/api/train/runs/{id}/ranks/{rank}/heartbeat"), beat).await;
    }

    async fn end(&self, id: &str, rank: u32, status: &str) -> Value {
        let end = json!({"attempt_id": "0", "status": status, "detail": "RuntimeError: CUDA out of memory"});
        self.post(&format!("/api/train/runs/{id}/ranks/{rank}/end"), end).await
    }

    /// The run's histories once the store holds `at_least` points of `name`.
    async fn points_once(&self, id: &str, name: &str, at_least: usize) -> Vec<Value> {
        let path = format!("/api/train/runs/{id}/metrics?name={name}");
        eventually(&format!("{at_least} points of {name} in the store"), DEADLINE, || {
            let (client, url) = (self.client.clone(), self.url(&path));
            async move {
                let (status, answer) = send(&client, Method::GET, &url, None, None).await;
                assert_eq!(status, StatusCode::OK, "{answer}");
                let points = answer["series"][0]["points"].as_array().cloned().unwrap_or_default();
                (points.len() >= at_least).then_some(points)
            }
        })
        .await
    }

    async fn stop(self) {
        self.server.stop().await;
    }
}

on_both_stores! {
    multi_thread:
    /// A run that errors keeps its ranks' last progress (step, total,
    /// phase, last advance, metrics) with it in the store: `GET` of the
    /// ended run serves it at once, its last points reach the histories,
    /// and a restarted head serves the same.
    async fn an_ended_run_serves_its_ranks_last_progress_after_a_restart_too(store) {
        let fresh = store.fresh("last-progress").await;
        let clock = Arc::new(ManualClock::new(T0));
        let f = Fixture::start(configured(fresh.config(), "last-progress", &clock)).await;
        let id = f.join("oom", 2).await;
        for step in 1..=60u64 {
            clock.advance_ms(100);
            let loss = 1.0 / step as f64;
            let phase = if step == 60 { "checkpoint" } else { "train" };
            f.beat(&id, 0, json!({"step": step, "total_steps": 100, "phase": phase,
                "metrics": {"loss": loss}})).await;
            if step <= 47 {
                f.beat(&id, 1, json!({"step": step, "total_steps": 100, "phase": "train",
                    "metrics": {"loss": loss + 0.5}})).await;
            }
        }
        let last_advance = T0 + 60 * 100;
        clock.advance_ms(1_000);
        f.end(&id, 1, "ERRORED").await;
        let answer = f.end(&id, 0, "ABORTED").await;
        assert_eq!(answer["run_status"], "ERRORED", "{answer}");

        let run = f.get(&format!("/api/train/runs/{id}")).await;
        assert_eq!(run["run_status"], "ERRORED", "{run}");
        let expected = json!([
            {"step": 60, "total_steps": 100, "phase": "checkpoint",
             "last_advance_ms": last_advance, "metrics": {"loss": 1.0 / 60.0}},
            {"step": 47, "total_steps": 100, "phase": "train",
             "last_advance_ms": T0 + 47 * 100, "metrics": {"loss": 1.0 / 47.0 + 0.5}},
        ]);
        assert_eq!(run["rank_progress"], expected, "served as soon as the run ended: {run}");
        let points = f.points_once(&id, "loss", 60 + 47).await;
        assert!(
            points.contains(&json!({"rank": 0, "step": 60, "value": 1.0 / 60.0})),
            "the last step's point reached the store"
        );
        f.stop().await;

        let f = Fixture::start(configured(fresh.config(), "last-progress", &clock)).await;
        let run = f.get(&format!("/api/train/runs/{id}")).await;
        assert_eq!(run["rank_progress"], expected, "read from the store after a restart: {run}");
        assert_eq!(f.points_once(&id, "loss", 60 + 47).await.len(), 60 + 47);
        assert_eq!(run["workers"][1]["node_name"], "oom-host1", "{run}");

        // `runs show` prints each rank's last step and phase, and each
        // node as "hostname (id)".
        let shown = std::process::Command::new(env!("CARGO_BIN_EXE_trainstate"))
            .args(["runs", "show", &id, "--url", &f.server.url])
            .output()
            .unwrap();
        assert!(shown.status.success(), "{}", String::from_utf8_lossy(&shown.stderr));
        let text = String::from_utf8(shown.stdout).unwrap();
        let line = |start: &str| {
            text.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("{start}: {text}"))
        };
        assert!(line("last progress").contains("step 60 of 100 (60 %)"), "{text}");
        let header = line("RANK");
        assert!(header.contains("STEP") && header.contains("PHASE"), "{text}");
        let rows: Vec<Vec<&str>> = text
            .lines()
            .skip_while(|l| !l.starts_with("RANK"))
            .skip(1)
            .take(2)
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(rows[0][0], "0", "{text}");
        assert!(rows[0].contains(&"60") && rows[0].contains(&"checkpoint"), "{text}");
        assert!(rows[1].contains(&"47") && rows[1].contains(&"train"), "{text}");
        assert!(text.contains("oom-host1 (oom-node1)"), "{text}");
        // A run deleted takes its last progress along.
        let run_path = format!("/api/train/runs/{id}");
        let (status, _) = send(&f.client, Method::DELETE, &f.url(&run_path), None, None).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        let (status, _) = send(&f.client, Method::GET, &f.url(&run_path), None, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        f.stop().await;
    }
}

/// What a rank's heartbeats carry, one after another, and the points of
/// `loss` and `eval_loss` the history keeps of them.
struct Case {
    what: &'static str,
    beats: Vec<Value>,
    loss: usize,
    eval_loss: usize,
}

fn cases() -> Vec<Case> {
    let at = |step: u64, loss: f64| json!({"step": step, "metrics": {"loss": loss}});
    vec![
        Case {
            what: "a hang: heartbeats that repeat the step and its metrics",
            beats: std::iter::repeat_n(at(5, 0.5), 30).collect(),
            loss: 1,
            eval_loss: 0,
        },
        Case {
            what: "heartbeats without progress",
            beats: [at(5, 0.5)].into_iter().chain(std::iter::repeat_n(Value::Null, 10)).collect(),
            loss: 1,
            eval_loss: 0,
        },
        Case {
            what: "the same step with another value of the same metric",
            beats: vec![at(5, 0.5), at(5, 0.4), at(5, 0.3)],
            loss: 1,
            eval_loss: 0,
        },
        Case {
            what: "metrics without a step",
            beats: vec![at(5, 0.5), json!({"metrics": {"loss": 0.4}}), json!({"phase": "eval"})],
            loss: 1,
            eval_loss: 0,
        },
        Case {
            what: "a new metric at the same step (an evaluation after the step)",
            beats: vec![
                at(5, 0.5),
                json!({"step": 5, "metrics": {"loss": 0.5, "eval_loss": 0.7}}),
                json!({"step": 5, "metrics": {"eval_loss": 0.7}}),
            ],
            loss: 1,
            eval_loss: 1,
        },
        Case {
            what: "every new step, and only those",
            beats: vec![at(5, 0.5), at(6, 0.4), at(6, 0.4), at(7, 0.3), at(7, 0.3), at(9, 0.2)],
            loss: 4,
            eval_loss: 0,
        },
    ]
}

/// A heartbeat that carries no advance adds no history point: only a
/// report with a new step (or a metric new at the rank's step) does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_without_an_advance_adds_no_history_point() {
    let clock = Arc::new(ManualClock::new(T0));
    let f = Fixture::start(configured(StateConfig::in_memory(), "no-idle-points", &clock)).await;
    for (i, case) in cases().into_iter().enumerate() {
        let id = f.join(&format!("idle-{i}"), 2).await;
        for beat in case.beats {
            clock.advance_ms(1_000);
            f.beat(&id, 0, beat).await;
        }
        // Rank 1's point comes after every point of rank 0's in the flushes:
        // once it is in the store, so is everything rank 0 added.
        f.beat(&id, 1, json!({"step": 1, "metrics": {"done": 1.0}})).await;
        f.points_once(&id, "done", 1).await;
        let answer = f.get(&format!("/api/train/runs/{id}/metrics?rank=0")).await;
        let count = |name: &str| {
            let series = answer["series"].as_array().unwrap();
            series
                .iter()
                .find(|s| s["name"] == name)
                .map_or(0, |s| s["points"].as_array().unwrap().len())
        };
        assert_eq!(
            (count("loss"), count("eval_loss")),
            (case.loss, case.eval_loss),
            "{}: {answer}",
            case.what
        );
    }
    f.stop().await;
}
