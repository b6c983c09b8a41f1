//! The progress a controller reports for its ranks, through a real head
//! over HTTP: merged per rank and sent in the background, so that many
//! reports make few requests; the head decides the run's health from it;
//! and what cannot be sent (a report that breaks a rule, a rank the worker
//! group does not have, a step the head refuses, a head that is gone) is
//! dropped and counted, never queued.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use trainstate_actor::http::HttpConfig;
use trainstate_actor::{StateConfig, StateService, launch_state_actor};
use trainstate_client::StateHandle;
use trainstate_manager::{ManagerError, RankProgress, TrainRunStateManager};
use trainstate_schema::{Rule, RunId};

use crate::common::{FakeGroup, eventually, patient, unique_name};

const DEADLINE: Duration = Duration::from_secs(20);

/// A head service on a free loopback port, in this process.
pub(crate) struct Head {
    pub(crate) url: String,
    pub(crate) service: Arc<StateService>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Head {
    pub(crate) async fn start(what: &str) -> Self {
        let config = StateConfig::in_memory().with_name(unique_name(what));
        let service = Arc::new(launch_state_actor(config).await.unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let serving = trainstate_actor::http::serve(
            listener,
            service.clone(),
            HttpConfig::default(),
            shutdown,
        );
        Self { url, service, stop: Some(stop), task: tokio::spawn(serving) }
    }

    /// The run as the head serves it.
    async fn run(&self, state: &StateHandle, id: &RunId) -> Value {
        serde_json::to_value(state.get(id.clone()).await.unwrap()).unwrap()
    }

    /// How many progress reports the head answered with `code`.
    async fn progress_requests(&self, code: u16) -> u64 {
        let text =
            reqwest::get(format!("{}/metrics", self.url)).await.unwrap().text().await.unwrap();
        let wanted = format!("route=\"/api/train/runs/{{id}}/progress\",code=\"{code}\"");
        text.lines()
            .find(|line| {
                line.starts_with("trainstate_http_requests_total{") && line.contains(&wanted)
            })
            .map_or(0, |line| line.rsplit(' ').next().unwrap().parse().unwrap())
    }

    /// Stops serving HTTP (the actor stays).
    async fn stop_serving(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await.unwrap().unwrap();
    }
}

fn at(step: u64) -> RankProgress {
    RankProgress::at_step(step)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_reaches_a_head_over_http_merged_and_what_cannot_be_sent_is_dropped() {
    let mut head = Head::start("progress").await;
    let state = StateHandle::connect(&head.url, None).unwrap();
    // Deadlines a loaded machine meets, short enough that a head that is
    // gone is given up on within the test's wait.
    let config = patient()
        .with_call_timeout(Duration::from_secs(3))
        .with_progress_interval(Duration::from_millis(50));
    let manager = TrainRunStateManager::new(Some(state.clone()), config);
    let group = FakeGroup::new(2, 2);
    let id = manager
        .register_train_run("progress", "job-1", "controller-0", &group, [], None)
        .await
        .unwrap()
        .into_id();

    // Two hundred reports in a burst: merged per rank, each rank's latest.
    for step in 1..=100u64 {
        for rank in 0..2u32 {
            let mut progress = at(step);
            progress.phase = Some("train".into());
            progress.metrics.insert("loss".into(), 1.0 / step as f64 + f64::from(rank));
            manager.report_progress(&id, rank, progress).unwrap();
        }
    }
    // Dropped at once: a report that breaks a rule, a rank the group lacks,
    // a run this manager does not track.
    let mut empty_phase = RankProgress::default();
    empty_phase.phase = Some(String::new());
    let refused = manager.report_progress(&id, 0, empty_phase).unwrap_err();
    assert!(matches!(&refused, ManagerError::InvalidProgress(e) if e.field() == "progress.phase"));
    manager.report_progress(&id, 2, at(1)).unwrap();
    manager.report_progress(&RunId::new_v7(), 0, at(1)).unwrap();
    assert_eq!(manager.dropped_progress(), 3);

    let run = eventually("both ranks at step 100", DEADLINE, || async {
        let run = head.run(&state, &id).await;
        let done = run["rank_progress"][0]["step"] == 100 && run["rank_progress"][1]["step"] == 100;
        done.then_some(run)
    })
    .await;
    let loss = run["rank_progress"][1]["metrics"]["loss"].as_f64();
    assert_eq!(loss, Some(1.0 / 100.0 + 1.0), "the latest value: {run}");
    assert_eq!(run["rank_progress"][0]["phase"], "train", "{run}");
    let requests = head.progress_requests(200).await;
    assert!((1..=3).contains(&requests), "200 reports took {requests} requests");

    head.service.handle().sweep_leases().await.unwrap();
    let run = head.run(&state, &id).await;
    assert_eq!(run["health"]["state"], "PROGRESSING", "{run}");

    // A step the head refuses (it goes back) is dropped, counted.
    manager.report_progress(&id, 0, at(5)).unwrap();
    eventually("the refused report counted", DEADLINE, || {
        std::future::ready(manager.dropped_progress() == 4)
    })
    .await;
    assert_eq!(head.progress_requests(409).await, 1);

    // The head gone: what cannot be sent is dropped, not kept.
    head.stop_serving().await;
    manager.report_progress(&id, 1, at(101)).unwrap();
    eventually("the unsent report counted", DEADLINE, || {
        std::future::ready(manager.dropped_progress() == 5)
    })
    .await;
    assert_eq!(head.run(&state_of(&head), &id).await["rank_progress"][1]["step"], 100);
    manager.shutdown(Duration::from_millis(10)).await;
    head.service.shutdown().await;
}

fn marked(step: Option<u64>, checkpoint: u64) -> RankProgress {
    let mut progress = RankProgress::default();
    progress.step = step;
    progress.checkpoint = Some(checkpoint);
    progress
}

fn refused_rule(answer: Result<(), ManagerError>) -> Rule {
    match answer {
        Err(ManagerError::InvalidProgress(err)) if err.field() == "progress.checkpoint" => {
            err.rule().clone()
        }
        other => panic!("a refused mark naming progress.checkpoint, not {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_mark_that_breaks_a_rule_is_refused_at_the_call_after_its_rank_was_sent() {
    let head = Head::start("marks").await;
    let state = StateHandle::connect(&head.url, None).unwrap();
    let config = patient()
        .with_call_timeout(Duration::from_secs(3))
        .with_progress_interval(Duration::from_millis(50));
    let manager = TrainRunStateManager::new(Some(state.clone()), config);
    let group = FakeGroup::new(2, 2);
    let id = manager
        .register_train_run("marks", "job-1", "controller-0", &group, [], None)
        .await
        .unwrap()
        .into_id();

    manager.report_progress(&id, 0, marked(Some(40), 40)).unwrap();
    eventually("rank 0 at step 40 at the head", DEADLINE, || async {
        head.run(&state, &id).await["rank_progress"][0]["step"] == 40
    })
    .await;
    // What was sent is remembered: the rank's step and mark of the attempt.
    let rule = refused_rule(manager.report_progress(&id, 0, marked(None, 41)));
    assert_eq!(rule, Rule::CheckpointAheadOfStep { step: 40 });
    let rule = refused_rule(manager.report_progress(&id, 0, marked(Some(45), 30)));
    assert_eq!(rule, Rule::CheckpointGoesBack { previous: 40 });
    assert_eq!(manager.dropped_progress(), 2, "a refused report is counted as dropped");
    // Another rank has marks of its own; the same mark again is no step back.
    manager.report_progress(&id, 1, marked(Some(3), 3)).unwrap();
    manager.report_progress(&id, 0, marked(Some(45), 40)).unwrap();
    eventually("rank 0 at step 45 at the head", DEADLINE, || async {
        head.run(&state, &id).await["rank_progress"][0]["step"] == 45
    })
    .await;
    assert_eq!(manager.dropped_progress(), 2, "the valid reports were taken");
    manager.shutdown(Duration::from_millis(10)).await;
    head.service.shutdown().await;
}

/// The head's own handle, in process (its HTTP service has stopped).
fn state_of(head: &Head) -> StateHandle {
    head.service.handle()
}
