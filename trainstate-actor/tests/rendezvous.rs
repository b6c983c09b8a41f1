//! The rendezvous: ranks of a launch without a controller assemble their
//! worker group at the head, and their ends become the run's. Through the
//! in-process handle on an injected clock, over HTTP (every answer checked
//! against the OpenAPI document), through the remote handle, and across a
//! restart of the head on a durable store.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use trainstate_actor::http::HttpConfig;
use trainstate_actor::{FAILURE_WINDOW_MS, ManualClock, StateConfig, launch_state_actor};
use trainstate_client::{Join, RankEnd, StateError, StateHandle};
use trainstate_schema::{AttemptStatus, CauseKind, FailureMode, RunId, RunStatus, TrainWorkerInfo};

use crate::common::{Server, unique_name, workers};
use crate::contract::send;

const T0: u64 = 1_760_000_000_000;
const LEASE: Duration = Duration::from_secs(60);

fn config(what: &str, clock: &Arc<ManualClock>) -> StateConfig {
    StateConfig::in_memory()
        .with_name(unique_name(what))
        .with_clock(clock.clone())
        .with_lease(LEASE)
        // The tests drive the sweep themselves.
        .with_sweep_interval(Duration::from_secs(3600))
}

/// The join of world rank `rank` of `group` (two workers per node).
fn join(key: &str, group: &[TrainWorkerInfo], rank: usize) -> Join {
    Join::new(key, group.len() as u32, group[rank].clone(), "train", "job-7").unwrap()
}

/// The same worker in another process.
fn other_process(worker: &TrainWorkerInfo) -> TrainWorkerInfo {
    let mut draft = worker.clone().into_draft();
    draft.pid += 10_000;
    draft.validate().unwrap()
}

async fn join_all(state: &StateHandle, key: &str, group: &[TrainWorkerInfo]) -> RunId {
    let mut id = None;
    for rank in 0..group.len() {
        let answer = state.join_rendezvous(join(key, group, rank)).await.unwrap();
        id.get_or_insert(answer.run_id.clone());
        assert_eq!(Some(&answer.run_id), id.as_ref(), "every rank gets the same run id");
    }
    id.unwrap()
}

#[tokio::test]
async fn the_group_registers_once_every_rank_joined_in_any_order() {
    let clock = Arc::new(ManualClock::new(T0));
    let service = launch_state_actor(config("rdv-join", &clock)).await.unwrap();
    let state = service.handle();
    let group = workers(4, 2, "a-");

    let mut id = None;
    for (i, rank) in [2, 0, 3].into_iter().enumerate() {
        let answer = state.join_rendezvous(join("k1", &group, rank)).await.unwrap();
        assert_eq!(answer.run_status, None, "nothing is registered while ranks are missing");
        assert_eq!((answer.joined, answer.world_size), (i as u32 + 1, 4));
        assert_eq!(answer.attempt_id, "0");
        id.get_or_insert(answer.run_id.clone());
        assert_eq!(Some(&answer.run_id), id.as_ref());
    }
    let id = id.unwrap();
    assert!(matches!(state.get(id.clone()).await, Err(StateError::NotFound { .. })));
    // A repeated join (a lost answer, retried) changes nothing.
    let again = state.join_rendezvous(join("k1", &group, 0)).await.unwrap();
    assert_eq!((again.joined, again.run_status), (3, None));

    clock.advance_ms(500);
    let last = state.join_rendezvous(join("k1", &group, 1)).await.unwrap();
    assert_eq!((last.joined, last.run_status), (4, Some(RunStatus::Running)));
    let run = state.get_run(id.clone()).await.unwrap();
    assert_eq!(run.workers().len(), 4);
    assert_eq!(run.workers().iter().map(|w| w.world_rank()).collect::<Vec<_>>(), [0, 1, 2, 3]);
    assert_eq!(run.workers()[3].pid(), group[3].pid());
    assert_eq!((run.name(), run.job_id()), ("train", "job-7"));
    assert_eq!(run.controller_actor_id(), "rendezvous:k1");
    assert_eq!(run.start_time_ms(), T0, "the run starts at its first join");
    assert_eq!(run.attempts()[0].attempt_id(), "0");

    // After the group closed: a member's repeat is a no-op, anyone else is refused.
    let again = state.join_rendezvous(join("k1", &group, 3)).await.unwrap();
    assert_eq!((again.run_id.clone(), again.run_status), (id.clone(), Some(RunStatus::Running)));
    let mut late = join("k1", &group, 3);
    late.worker = other_process(&group[3]);
    let err = state.join_rendezvous(late).await.unwrap_err();
    assert!(matches!(&err, StateError::Refused { reason } if reason.contains("closed")), "{err}");
    service.shutdown().await;
}

/// A head with a cluster name stamps it on the runs the rendezvous
/// registers, as on every other registration: listings, forwarding and
/// notification filters by cluster find them.
#[tokio::test]
async fn a_run_the_rendezvous_registers_belongs_to_the_heads_cluster() {
    let clock = Arc::new(ManualClock::new(T0));
    let config = config("rdv-cluster", &clock).with_cluster(Some("gpu-east-7".into()));
    let service = launch_state_actor(config).await.unwrap();
    let state = service.handle();
    let group = workers(2, 2, "c-");
    let id = join_all(&state, "k-cluster", &group).await;
    let run = state.get_run(id).await.unwrap();
    assert_eq!(run.cluster(), Some("gpu-east-7"));
    service.shutdown().await;
}

#[tokio::test]
async fn a_duplicate_rank_a_disagreeing_world_size_and_a_misplaced_rank_are_refused() {
    let clock = Arc::new(ManualClock::new(T0));
    let service = launch_state_actor(config("rdv-refuse", &clock)).await.unwrap();
    let state = service.handle();
    let group = workers(4, 2, "b-");
    state.join_rendezvous(join("k2", &group, 0)).await.unwrap();

    let mut twin = join("k2", &group, 0);
    twin.worker = other_process(&group[0]);
    let err = state.join_rendezvous(twin).await.unwrap_err();
    assert!(
        matches!(&err, StateError::Refused { reason } if reason.contains("already joined")),
        "{err}"
    );

    let wrong_size = Join::new("k2", 8, group[1].clone(), "train", "job-7").unwrap();
    let err = state.join_rendezvous(wrong_size).await.unwrap_err();
    assert!(
        matches!(&err, StateError::Refused { reason } if reason.contains("world_size 8")),
        "{err}"
    );

    // Rank 1 claims node rank 1 on rank 0's node.
    let mut draft = group[1].clone().into_draft();
    draft.node_rank = 1;
    let misplaced = Join::new("k2", 4, draft.validate().unwrap(), "train", "job-7").unwrap();
    let err = state.join_rendezvous(misplaced).await.unwrap_err();
    assert!(
        matches!(&err, StateError::Invalid { field, .. } if field == "worker.node_rank"),
        "{err}"
    );

    // A rank at or past the world size is not a join at all.
    let err = Join::new("k2", 2, group[3].clone(), "train", "job-7").unwrap_err();
    assert!(matches!(&err, StateError::Invalid { field, .. } if field == "worker.world_rank"));
    let err = Join::new("a/b", 4, group[0].clone(), "train", "job-7").unwrap_err();
    assert!(matches!(&err, StateError::Invalid { field, .. } if field == "key"));

    // None of it changed the group.
    let answer = state.join_rendezvous(join("k2", &group, 0)).await.unwrap();
    assert_eq!(answer.joined, 1);
    service.shutdown().await;
}

#[tokio::test]
async fn the_run_finishes_when_every_rank_finished_and_errors_at_the_first_failure() {
    let clock = Arc::new(ManualClock::new(T0));
    let service = launch_state_actor(config("rdv-end", &clock)).await.unwrap();
    let state = service.handle();

    let group = workers(3, 4, "c-");
    let id = join_all(&state, "fine", &group).await;
    for rank in [2, 0] {
        let answer = state.end_rank(id.clone(), rank, RankEnd::finished("0")).await.unwrap();
        assert_eq!(answer.run_status, Some(RunStatus::Running), "rank 1 still runs");
    }
    // A repeated end is a no-op.
    let answer = state.end_rank(id.clone(), 2, RankEnd::finished("0")).await.unwrap();
    assert_eq!((answer.ranks_ended, answer.run_status), (2, Some(RunStatus::Running)));
    clock.advance_ms(1_000);
    let answer = state.end_rank(id.clone(), 1, RankEnd::finished("0")).await.unwrap();
    assert_eq!((answer.ranks_ended, answer.run_status), (3, Some(RunStatus::Finished)));
    let run = state.get_run(id.clone()).await.unwrap();
    assert_eq!((run.run_status(), run.end_time_ms()), (RunStatus::Finished, Some(T0 + 1_000)));

    let group = workers(3, 4, "d-");
    let id = join_all(&state, "boom", &group).await;
    state.end_rank(id.clone(), 0, RankEnd::finished("0")).await.unwrap();
    let trace = "Traceback (most recent call last):\n  File \"train.py\", line 9\nValueError: boom";
    let answer = state.end_rank(id.clone(), 1, RankEnd::errored("0", trace)).await.unwrap();
    assert_eq!(answer.run_status, Some(RunStatus::Running), "rank 2 may have failed first");
    // The launcher stopping the others ends the last rank: decided at once.
    clock.advance_ms(500);
    let answer = state.end_rank(id.clone(), 2, RankEnd::aborted("0", "SIGTERM")).await.unwrap();
    assert_eq!(answer.run_status, Some(RunStatus::Errored));
    // A later end changes nothing.
    let answer = state.end_rank(id.clone(), 2, RankEnd::aborted("0", "SIGTERM")).await.unwrap();
    assert_eq!(answer.run_status, Some(RunStatus::Errored));
    let run = state.get_run(id.clone()).await.unwrap();
    assert_eq!(run.run_status(), RunStatus::Errored);
    let cause = run.cause().unwrap();
    assert_eq!((cause.kind, cause.failed_world_rank), (CauseKind::UserError, Some(1)));
    assert_eq!((cause.how, cause.failed_at_ms), (Some(FailureMode::Raised), Some(T0 + 1_000)));
    assert!(run.status_detail().starts_with("Rank 1 worker raised an error."));
    assert!(run.status_detail().contains("ValueError: boom\n\nThen, not the cause:\n- rank 2 0.5 s later: ABORTED (RAISED) SIGTERM"), "{}", run.status_detail());

    // A failure while its peers still run is decided after the window.
    let group = workers(2, 4, "e-");
    let id = join_all(&state, "stop", &group).await;
    let answer = state.end_rank(id.clone(), 1, RankEnd::aborted("0", "SIGTERM")).await.unwrap();
    assert_eq!(answer.run_status, Some(RunStatus::Running));
    clock.advance_ms(FAILURE_WINDOW_MS - 1);
    state.sweep_leases().await.unwrap();
    assert_eq!(state.get_run(id.clone()).await.unwrap().run_status(), RunStatus::Running);
    clock.advance_ms(1);
    state.sweep_leases().await.unwrap();
    let run = state.get_run(id).await.unwrap();
    assert_eq!(run.run_status(), RunStatus::Aborted);
    assert_eq!(run.cause().unwrap().kind, CauseKind::UserInterrupt);
    assert_eq!(run.cause().unwrap().failed_world_rank, Some(1));
    assert!(run.status_detail().contains("SIGTERM"), "{}", run.status_detail());
    service.shutdown().await;
}

#[tokio::test]
async fn a_relaunch_after_a_failure_is_a_new_attempt_of_the_same_run() {
    let clock = Arc::new(ManualClock::new(T0));
    let service = launch_state_actor(config("rdv-restart", &clock)).await.unwrap();
    let state = service.handle();
    let group = workers(2, 2, "f-");
    let id = join_all(&state, "elastic", &group).await;

    // Rank 1 fails; the launcher will restart the workers once more.
    let failed = RankEnd::errored("0", "RuntimeError: lost").with_restarts_remaining(1);
    let answer = state.end_rank(id.clone(), 1, failed).await.unwrap();
    assert_eq!(answer.run_status, Some(RunStatus::Running), "rank 0 may have failed first");
    let interrupted = RankEnd::aborted("0", "SIGTERM").with_restarts_remaining(1);
    let answer = state.end_rank(id.clone(), 0, interrupted).await.unwrap();
    assert_eq!(answer.run_status, Some(RunStatus::Restarting), "a restart is coming");
    // The attempt keeps the failure that ended it.
    let run = state.get_run(id.clone()).await.unwrap();
    assert_eq!(run.status(), RunStatus::Restarting);
    let failed = &run.attempts()[0];
    assert_eq!(failed.status(), AttemptStatus::Errored);
    assert_eq!(failed.end_time_ms(), Some(T0));
    assert_eq!(
        failed.cause().map(|c| (c.kind, c.failed_world_rank)),
        Some((CauseKind::UserError, Some(1)))
    );
    assert!(
        failed.status_detail().starts_with("Rank 1 worker raised an error. \nRuntimeError: lost"),
        "{}",
        failed.status_detail()
    );

    clock.advance_ms(2_000);
    let relaunched: Vec<TrainWorkerInfo> = group.iter().map(other_process).collect();
    for rank in 0..2 {
        let answer = state
            .join_rendezvous(join("elastic", &relaunched, rank).with_attempt(1))
            .await
            .unwrap();
        assert_eq!((answer.run_id.clone(), answer.attempt_id.as_str()), (id.clone(), "1"));
    }
    let run = state.get_run(id.clone()).await.unwrap();
    let attempts: Vec<_> = run.attempts().iter().map(|a| a.attempt_id().to_owned()).collect();
    assert_eq!(attempts, ["0", "1"]);
    assert_eq!(run.status(), RunStatus::Running);
    assert_eq!(run.attempts()[0].status(), AttemptStatus::Errored, "not \"replaced\"");
    assert_eq!(run.attempts()[0].end_time_ms(), Some(T0));
    assert_eq!(run.workers()[0].pid(), relaunched[0].pid());

    // The old attempt's ranks are told they were replaced.
    let err = state.heartbeat_rank(id.clone(), 0, "0").await.unwrap_err();
    assert!(matches!(err, StateError::Conflict { .. }), "{err}");
    let err = state.join_rendezvous(join("elastic", &group, 0)).await.unwrap_err();
    assert!(matches!(&err, StateError::Refused { reason } if reason.contains("replaced")), "{err}");

    for rank in 0..2 {
        state.end_rank(id.clone(), rank, RankEnd::finished("1")).await.unwrap();
    }
    assert_eq!(state.get_run(id.clone()).await.unwrap().run_status(), RunStatus::Finished);

    // A relaunch of an ended run is refused: it cannot start an attempt.
    let err = state.join_rendezvous(join("elastic", &group, 0).with_attempt(2)).await.unwrap_err();
    assert!(
        matches!(&err, StateError::Refused { reason } if reason.contains("has ended")),
        "{err}"
    );
    service.shutdown().await;
}

#[tokio::test]
async fn a_group_whose_ranks_never_all_arrive_ends_after_its_join_timeout() {
    let clock = Arc::new(ManualClock::new(T0));
    let service = launch_state_actor(config("rdv-timeout", &clock)).await.unwrap();
    let state = service.handle();
    let group = workers(4, 4, "g-");
    let first = join("lonely", &group, 0).with_join_timeout(Duration::from_secs(30)).unwrap();
    let id = state.join_rendezvous(first).await.unwrap().run_id;
    state.join_rendezvous(join("lonely", &group, 2)).await.unwrap();

    clock.advance_ms(29_000);
    state.sweep_leases().await.unwrap();
    assert!(matches!(state.get(id.clone()).await, Err(StateError::NotFound { .. })));
    clock.advance_ms(1_000);
    state.sweep_leases().await.unwrap();
    let run = state.get_run(id.clone()).await.unwrap();
    assert_eq!(run.run_status(), RunStatus::Aborted);
    assert_eq!(run.cause().unwrap().kind, CauseKind::SystemError);
    assert!(run.workers().is_empty(), "a partial group is not a worker group");
    let detail = run.status_detail();
    assert!(detail.contains("2 of 4 ranks joined (0, 2); missing ranks: 1, 3"), "{detail}");

    let err = state.join_rendezvous(join("lonely", &group, 1)).await.unwrap_err();
    assert!(matches!(&err, StateError::Refused { reason } if reason.contains("closed")), "{err}");

    // A rank that raised while its group waited makes the run ERRORED, with its trace.
    let group = workers(2, 2, "h-");
    let id = state.join_rendezvous(join("crashy", &group, 1)).await.unwrap().run_id;
    state.end_rank(id.clone(), 1, RankEnd::errored("0", "ImportError: no torch")).await.unwrap();
    clock.advance_ms(300_000);
    state.sweep_leases().await.unwrap();
    let run = state.get_run(id).await.unwrap();
    assert_eq!(run.run_status(), RunStatus::Errored);
    assert_eq!(run.cause().unwrap().failed_world_rank, Some(1));
    assert!(run.status_detail().contains("ImportError: no torch"));
    service.shutdown().await;
}

#[tokio::test]
async fn rank_heartbeats_keep_the_run_alive_and_are_served_with_it() {
    let clock = Arc::new(ManualClock::new(T0));
    let service = launch_state_actor(config("rdv-heartbeat", &clock)).await.unwrap();
    let state = service.handle();
    let group = workers(2, 2, "i-");
    let id = join_all(&state, "beats", &group).await;

    clock.advance_ms(40_000);
    state.heartbeat_rank(id.clone(), 1, "0").await.unwrap();
    let document = state.get(id.clone()).await.unwrap();
    assert_eq!(document.rank_heartbeats(), Some(&[Some(T0), Some(T0 + 40_000)][..]));
    let json: Value = serde_json::from_str(&document.to_json()).unwrap();
    assert_eq!(json["rank_last_heartbeat_ms"], json!([T0, T0 + 40_000]));
    assert_eq!(
        json["last_heartbeat_ms"],
        json!(T0 + 40_000),
        "a rank's heartbeat renews the lease"
    );

    clock.advance_ms(50_000); // 50 s after the last heartbeat: within the lease.
    assert!(state.sweep_leases().await.unwrap().is_empty());
    clock.advance_ms(20_000); // Every rank silent for 70 s: the job is gone.
    assert_eq!(state.sweep_leases().await.unwrap(), std::slice::from_ref(&id));
    let run = state.get_run(id.clone()).await.unwrap();
    assert_eq!(run.cause().unwrap().kind, CauseKind::LostController);
    let document = state.get(id.clone()).await.unwrap();
    assert_eq!(
        document.rank_heartbeats(),
        Some(&[Some(T0), Some(T0 + 40_000)][..]),
        "an aborted run still shows which rank went silent first"
    );
    // Its ranks' own ends, late, replace the lost-controller abort.
    state.end_rank(id.clone(), 0, RankEnd::finished("0")).await.unwrap();
    let answer = state.end_rank(id.clone(), 1, RankEnd::finished("0")).await.unwrap();
    assert_eq!(answer.run_status, Some(RunStatus::Finished));

    // Unknown runs and ranks.
    let err = state.heartbeat_rank(RunId::new_v7(), 0, "0").await.unwrap_err();
    assert!(matches!(err, StateError::NotFound { .. }));
    let err = state.heartbeat_rank(id, 9, "0").await.unwrap_err();
    assert!(matches!(&err, StateError::Invalid { field, .. } if field == "rank"), "{err}");
    service.shutdown().await;
}

#[tokio::test]
async fn after_a_head_restart_ranks_join_again_and_keep_their_run() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let durable = |what: &str| {
        StateConfig::sqlite(dir.path().join("state.db"))
            .with_name(unique_name(what))
            .with_clock(clock.clone())
            .with_sweep_interval(Duration::from_secs(3600))
    };
    let service = launch_state_actor(durable("rdv-before")).await.unwrap();
    let state = service.handle();
    let group = workers(2, 2, "j-");
    let half = state.join_rendezvous(join("half", &group, 0)).await.unwrap();
    let whole = join_all(&state, "whole", &group).await;
    service.shutdown().await;

    let service = launch_state_actor(durable("rdv-after")).await.unwrap();
    let state = service.handle();
    // The half-assembled group is forgotten: its rank learns it from a heartbeat...
    let err = state.heartbeat_rank(half.run_id.clone(), 0, "0").await.unwrap_err();
    assert!(matches!(err, StateError::NotFound { .. }), "{err}");
    // ...and joins again, keeping its run id; the other rank's first join completes it.
    let again = join("half", &group, 0).with_run_id(half.run_id.clone());
    assert_eq!(state.join_rendezvous(again).await.unwrap().run_id, half.run_id);
    let done = state.join_rendezvous(join("half", &group, 1)).await.unwrap();
    assert_eq!((done.run_id, done.run_status), (half.run_id, Some(RunStatus::Running)));

    // The registered run is found again by its key: heartbeats, relaunches, ends.
    state.heartbeat_rank(whole.clone(), 1, "0").await.unwrap();
    let member = state.join_rendezvous(join("whole", &group, 1)).await.unwrap();
    assert_eq!(member.run_id, whole);
    let relaunched: Vec<TrainWorkerInfo> = group.iter().map(other_process).collect();
    for rank in 0..2 {
        let answer =
            state.join_rendezvous(join("whole", &relaunched, rank).with_attempt(1)).await.unwrap();
        assert_eq!(answer.run_id, whole);
    }
    assert_eq!(state.get_run(whole.clone()).await.unwrap().attempts().len(), 2);
    service.shutdown().await;
}

#[tokio::test]
async fn the_rendezvous_over_http_answers_as_documented() {
    let server = Server::start(
        StateConfig::in_memory().with_name(unique_name("rdv-http")),
        HttpConfig::default(),
    )
    .await;
    let client = Client::new();
    let url = |path: &str| format!("{}{path}", server.url);
    let body = |value: Value| Some(("application/json", serde_json::to_vec(&value).unwrap()));
    let group = workers(2, 2, "k-");
    let worker = |rank: usize| serde_json::to_value(&group[rank]).unwrap();
    let join_body = |rank: usize| json!({"world_size": 2, "worker": worker(rank), "name": "train", "job_id": "42"});

    let (status, first) = send(
        &client,
        Method::POST,
        &url("/api/train/rendezvous/slurm:42.0/join"),
        body(join_body(0)),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["run_status"], Value::Null);
    let id = first["run_id"].as_str().unwrap().to_owned();
    let (status, second) = send(
        &client,
        Method::POST,
        &url("/api/train/rendezvous/slurm:42.0/join"),
        body(join_body(1)),
        None,
    )
    .await;
    assert_eq!((status, &second["run_status"]), (StatusCode::OK, &json!("RUNNING")));

    let beat = json!({"attempt_id": "0"});
    let (status, answer) = send(
        &client,
        Method::POST,
        &url(&format!("/api/train/runs/{id}/ranks/1/heartbeat")),
        body(beat.clone()),
        None,
    )
    .await;
    assert_eq!((status, &answer["lease_ms"]), (StatusCode::OK, &json!(60_000)));
    let (status, run) =
        send(&client, Method::GET, &url(&format!("/api/train/runs/{id}")), None, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(run["rank_last_heartbeat_ms"][1].is_u64(), "{run}");

    // Every refusal is a clear 4xx.
    let mut twin = join_body(1);
    twin["worker"]["pid"] = json!(99_999);
    let (status, err) = send(
        &client,
        Method::POST,
        &url("/api/train/rendezvous/slurm:42.0/join"),
        body(twin),
        None,
    )
    .await;
    assert_eq!((status, &err["error"]["code"]), (StatusCode::CONFLICT, &json!("conflict")));
    let mut wide = join_body(1);
    wide["world_size"] = json!(1);
    let (status, err) =
        send(&client, Method::POST, &url("/api/train/rendezvous/other/join"), body(wide), None)
            .await;
    assert_eq!(
        (status, &err["error"]["field"]),
        (StatusCode::UNPROCESSABLE_ENTITY, &json!("worker.world_rank"))
    );
    let (status, err) = send(
        &client,
        Method::POST,
        &url("/api/train/rendezvous/a%20b/join"),
        body(join_body(0)),
        None,
    )
    .await;
    assert_eq!((status, &err["error"]["field"]), (StatusCode::UNPROCESSABLE_ENTITY, &json!("key")));
    let (status, _) = send(
        &client,
        Method::POST,
        &url(&format!("/api/train/runs/{id}/ranks/x/heartbeat")),
        body(beat.clone()),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = send(
        &client,
        Method::POST,
        &url(&format!("/api/train/runs/{}/ranks/0/heartbeat", RunId::new_v7())),
        body(beat),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let running = json!({"attempt_id": "0", "status": "RUNNING"});
    let (status, err) = send(
        &client,
        Method::POST,
        &url(&format!("/api/train/runs/{id}/ranks/0/end")),
        body(running),
        None,
    )
    .await;
    assert_eq!(
        (status, &err["error"]["field"]),
        (StatusCode::UNPROCESSABLE_ENTITY, &json!("status"))
    );

    let end = |rank: u32, status: &str| {
        json!({"attempt_id": "0", "status": status, "detail": "ValueError: boom"})
            .as_object()
            .map(|o| (rank, Value::Object(o.clone())))
            .unwrap()
    };
    let (rank, errored) = end(1, "ERRORED");
    let (status, answer) = send(
        &client,
        Method::POST,
        &url(&format!("/api/train/runs/{id}/ranks/{rank}/end")),
        body(errored),
        None,
    )
    .await;
    assert_eq!((status, &answer["run_status"]), (StatusCode::OK, &json!("RUNNING")));
    let (rank, killed) = end(0, "ABORTED");
    let (status, answer) = send(
        &client,
        Method::POST,
        &url(&format!("/api/train/runs/{id}/ranks/{rank}/end")),
        body(killed),
        None,
    )
    .await;
    assert_eq!((status, &answer["run_status"]), (StatusCode::OK, &json!("ERRORED")));
    let (_, run) =
        send(&client, Method::GET, &url(&format!("/api/train/runs/{id}")), None, None).await;
    assert_eq!(run["cause"]["kind"], json!("USER_ERROR"));
    assert_eq!(run["cause"]["failed_world_rank"], json!(1));
    assert_eq!(run["cause"]["how"], json!("RAISED"));

    // The remote handle speaks the same API, and reads a refusal as one.
    let remote = StateHandle::connect(&server.url, None).unwrap();
    let relaunch = remote
        .join_rendezvous(
            Join::new("slurm:42.0", 2, other_process(&group[0]), "train", "42").unwrap(),
        )
        .await
        .unwrap();
    // A process that is none of the ended run's ranks is a new launch of
    // the key (a launcher that gives every launch the same key).
    assert_ne!(relaunch.run_id.to_string(), id);
    assert_eq!((relaunch.joined, relaunch.run_status), (1, None));
    let err = remote
        .join_rendezvous(
            Join::new("slurm:42.0", 3, other_process(&group[1]), "train", "42").unwrap(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StateError::Refused { reason } if reason.contains("disagrees")),
        "{err}"
    );
    let answer = remote.heartbeat_rank(RunId::parse(&id).unwrap(), 0, "0").await.unwrap();
    assert_eq!(answer.run_status, Some(RunStatus::Errored));
    server.stop().await;
}

#[tokio::test]
async fn waiting_groups_are_bounded() {
    let clock = Arc::new(ManualClock::new(T0));
    let service = launch_state_actor(config("rdv-bound", &clock)).await.unwrap();
    let state = service.handle();
    let group = workers(2, 2, "m-");
    for i in 0..10_000 {
        state.join_rendezvous(join(&format!("g{i}"), &group, 0)).await.unwrap();
    }
    let err = state.join_rendezvous(join("one-too-many", &group, 0)).await.unwrap_err();
    assert!(
        matches!(&err, StateError::Unavailable { reason } if reason.contains("10000 groups are waiting")),
        "a clear 503 naming the bound: {err}"
    );
    // Groups already waiting still assemble, which makes room again.
    let done = state.join_rendezvous(join("g7", &group, 1)).await.unwrap();
    assert_eq!(done.run_status, Some(RunStatus::Running));
    state.join_rendezvous(join("one-too-many", &group, 0)).await.unwrap();
    service.shutdown().await;
}

#[tokio::test]
async fn regression_rendezvous_groups_from_some_clients_never_lock_out_another_clients_launch() {
    let clock = Arc::new(ManualClock::new(T0));
    let service = launch_state_actor(config("rdv-share", &clock)).await.unwrap();
    let state = service.handle();
    let group = workers(2, 2, "s-");
    let from = |client: &str| Some(client.to_owned());
    // 10,050 one-rank joins from nine addresses fill the waiting groups.
    let attackers: Vec<String> = (1..=9).map(|i| format!("10.0.0.{i}")).collect();
    // Past the bound, the attackers only push out each other's groups (or
    // are refused, naming the bound): together they never hold more.
    for i in 0..10_050 {
        let client = &attackers[i % attackers.len()];
        let joined = state.join_rendezvous_from(join(&format!("g{i}"), &group, 0), from(client));
        match joined.await {
            Ok(_) => {}
            Err(StateError::Unavailable { reason }) => {
                assert!(reason.contains("10000 groups are waiting"), "{reason}");
            }
            Err(err) => panic!("{err}"),
        }
    }
    // Another client's launch opens its group and completes all the same,
    // the oldest group of the client holding the most making room...
    let launch = state.join_rendezvous_from(join("real", &group, 0), from("10.0.1.1")).await;
    let launch = launch.expect("another client's launch is never locked out");
    assert_eq!(launch.run_status, None);
    let done = state.join_rendezvous_from(join("real", &group, 1), from("10.0.1.2")).await;
    assert_eq!(done.unwrap().run_status, Some(RunStatus::Running));
    // ...and re-joining does not win a closed group back for the attacker
    // holding the most: it is refused while it holds as many as any other.
    let biggest = &attackers[0];
    let mut again = Vec::new();
    for i in 0..20 {
        let rejoin = state.join_rendezvous_from(join(&format!("g{i}"), &group, 0), from(biggest));
        again.push(rejoin.await);
    }
    assert!(
        again.iter().any(|a| matches!(a, Err(StateError::Unavailable { .. }))),
        "re-joining from the address holding the most is refused: {:?}",
        again.iter().filter(|a| a.is_ok()).count()
    );
    service.shutdown().await;
}

#[tokio::test]
async fn regression_rendezvous_groups_are_shared_out_by_the_address_joins_come_from() {
    let server = Server::start(
        StateConfig::in_memory().with_name(unique_name("rdv-peer")),
        HttpConfig::default(),
    )
    .await;
    let state = server.service.handle();
    let group = workers(2, 2, "p-");
    // 127.0.0.2 holds every waiting group (in-process joins counted as its).
    for i in 0..10_000 {
        let joined =
            state.join_rendezvous_from(join(&format!("g{i}"), &group, 0), Some("127.0.0.2".into()));
        joined.await.unwrap();
    }
    let worker = serde_json::to_value(&group[0]).unwrap();
    let join_body = json!({"world_size": 2, "worker": worker, "name": "train", "job_id": "42"});
    let join_from = |from: &'static str, key: &'static str| {
        let (url, body) = (server.url.clone(), join_body.clone());
        async move {
            let client = Client::builder().local_address(from.parse().ok()).build().unwrap();
            let response = client
                .post(format!("{url}/api/train/rendezvous/{key}/join"))
                .json(&body)
                .send()
                .await
                .unwrap();
            (response.status(), response.json::<Value>().await.unwrap())
        }
    };
    // Over HTTP from that address, a new group is refused, naming the bound...
    let (status, refused) = join_from("127.0.0.2", "more").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{refused}");
    assert!(refused["error"]["message"].as_str().unwrap().contains("10000 groups"), "{refused}");
    // ...and from another address it opens.
    let (status, opened) = join_from("127.0.0.3", "real").await;
    assert_eq!(status, StatusCode::OK, "{opened}");
    assert_eq!(opened["joined"], json!(1));
    server.stop().await;
}

#[tokio::test]
async fn the_cause_is_the_rank_that_failed_first_in_time_whatever_arrives_first() {
    let clock = Arc::new(ManualClock::new(T0));
    let service = launch_state_actor(config("rdv-first", &clock)).await.unwrap();
    let state = service.handle();
    let group = workers(3, 4, "q-");
    let id = join_all(&state, "first", &group).await;

    // Rank 1 was killed at T0 + 10; rank 0 raised because of it at T0 + 40,
    // and its report arrived first. Rank 2 was then terminated.
    let reset = "Traceback (most recent call last):\nRuntimeError: Connection reset by peer";
    let raised = RankEnd::errored("0", reset).at(T0 + 40, Some(FailureMode::Raised));
    let answer = state.end_rank(id.clone(), 0, raised).await.unwrap();
    assert_eq!(answer.run_status, Some(RunStatus::Running));
    let mut killed =
        RankEnd::errored("0", "killed by SIGKILL").at(T0 + 10, Some(FailureMode::Killed));
    killed.cause = Some(CauseKind::SystemError);
    state.end_rank(id.clone(), 1, killed).await.unwrap();
    let terminated =
        RankEnd::aborted("0", "terminated by SIGTERM").at(T0 + 900, Some(FailureMode::Killed));
    let answer = state.end_rank(id.clone(), 2, terminated).await.unwrap();
    assert_eq!(answer.run_status, Some(RunStatus::Errored));

    let run = state.get_run(id.clone()).await.unwrap();
    let cause = run.cause().unwrap();
    assert_eq!(
        (cause.kind, cause.failed_world_rank, cause.how, cause.failed_at_ms),
        (CauseKind::SystemError, Some(1), Some(FailureMode::Killed), Some(T0 + 10))
    );
    let pid = group[1].pid();
    let detail = run.status_detail();
    assert!(detail.starts_with(&format!("Rank 1 (pid {pid} on node q-")), "{detail}");
    assert!(
        detail.contains("died without reporting: killed by SIGKILL, at 2025-10-09T08:53:20.010Z."),
        "{detail}"
    );
    assert!(
        detail.contains(
            "\n- rank 0 0.03 s later: ERRORED (RAISED) RuntimeError: Connection reset by peer"
        ) || detail.contains("\n- rank 0 0.0 s later"),
        "{detail}"
    );
    assert!(
        detail.contains("\n- rank 2 0.9 s later: ABORTED (KILLED) terminated by SIGTERM"),
        "{detail}"
    );
    assert!(!detail.contains("worker raised an error"), "a killed rank raised nothing: {detail}");
    service.shutdown().await;
}

#[tokio::test]
async fn a_run_starts_when_its_first_rank_started_and_a_new_launch_of_an_ended_key_is_a_new_run() {
    let clock = Arc::new(ManualClock::new(T0));
    let service = launch_state_actor(config("rdv-start", &clock)).await.unwrap();
    let state = service.handle();
    let group = workers(2, 2, "r-");
    // The head was down: the ranks reach it a minute after they started.
    clock.advance_ms(60_000);
    let mut id = None;
    for (rank, started) in [(0, T0 + 700), (1, T0 + 300)] {
        let join = join("same-key", &group, rank).with_process_start(started).unwrap();
        id = Some(state.join_rendezvous(join).await.unwrap().run_id);
    }
    let id = id.unwrap();
    let run = state.get_run(id.clone()).await.unwrap();
    assert_eq!(run.start_time_ms(), T0 + 300);
    assert_eq!(run.attempts()[0].start_time_ms(), T0 + 300);
    // A start in the future of the first join does not count.
    let err = join("k", &group, 0).with_process_start(5).unwrap_err();
    assert!(
        matches!(&err, StateError::Invalid { field, .. } if field == "process_start_ms"),
        "{err}"
    );

    for rank in 0..2 {
        state.end_rank(id.clone(), rank, RankEnd::finished("0")).await.unwrap();
    }
    // The next launch gives the same key (torchrun's default run id on
    // several nodes): other processes, attempt 0, so a new run.
    let next: Vec<TrainWorkerInfo> = group.iter().map(other_process).collect();
    let second = join_all(&state, "same-key", &next).await;
    assert_ne!(second, id);
    assert_eq!(state.get_run(second).await.unwrap().run_status(), RunStatus::Running);
    assert_eq!(state.get_run(id).await.unwrap().run_status(), RunStatus::Finished);
    service.shutdown().await;
}

/// `worker` with 256 resources of ~1 KiB names: about 260 KiB of JSON, legal.
fn heavy(worker: &TrainWorkerInfo) -> TrainWorkerInfo {
    let mut draft = worker.clone().into_draft();
    draft.resources = (0..256).map(|i| (format!("{i:04}{}", "r".repeat(1_000)), 1.0)).collect();
    draft.validate().unwrap()
}

#[tokio::test]
async fn regression_waiting_groups_hold_a_bounded_number_of_bytes_and_say_so_at_the_bound() {
    let clock = Arc::new(ManualClock::new(T0));
    let service = launch_state_actor(config("rdv-bytes", &clock)).await.unwrap();
    let state = service.handle();
    let group = workers(2_000, 8, "big-");
    let mut refused = None;
    for (rank, worker) in group.iter().enumerate() {
        let join = Join::new("heavy", 2_000, heavy(worker), "train", "job-7").unwrap();
        match state.join_rendezvous(join).await {
            Ok(_) => {}
            Err(err) => {
                refused = Some((rank, err));
                break;
            }
        }
    }
    let (rank, err) = refused.expect("joins of ~260 KiB workers are refused past the bound");
    assert!((200..300).contains(&rank), "about 64 MiB of 260 KiB workers: refused at {rank}");
    assert!(
        matches!(&err, StateError::Unavailable { reason } if reason.contains("bound of 64 MiB")),
        "a clear 503 naming the bound: {err}"
    );
    // The bound is for all groups together: another launch waits too.
    let other = workers(2, 2, "o-");
    let heavy_join = || Join::new("other", 2, heavy(&other[0]), "train", "job-8").unwrap();
    let err = state.join_rendezvous(heavy_join()).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");

    // The held bytes are freed when the group closes.
    clock.advance_ms(LEASE.as_millis() as u64);
    state.sweep_leases().await.unwrap();
    state.join_rendezvous(heavy_join()).await.unwrap();
    service.shutdown().await;
}

#[tokio::test]
async fn regression_a_waiting_group_whose_ranks_fell_silent_closes_after_a_lease_not_a_day() {
    let clock = Arc::new(ManualClock::new(T0));
    let service = launch_state_actor(config("rdv-silent", &clock)).await.unwrap();
    let state = service.handle();
    let group = workers(2, 2, "q-");
    let day = Duration::from_secs(86_400);
    let silent = join("silent", &group, 0).with_join_timeout(day).unwrap();
    let silent_id = state.join_rendezvous(silent).await.unwrap().run_id;
    let alive = join("alive", &group, 0).with_join_timeout(day).unwrap();
    let alive_id = state.join_rendezvous(alive).await.unwrap().run_id;

    // The live group's rank heartbeats while it waits; the other's is gone.
    for _ in 0..4 {
        clock.advance_ms(20_000);
        state.heartbeat_rank(alive_id.clone(), 0, "0").await.unwrap();
        state.sweep_leases().await.unwrap();
    }
    let run = state.get_run(silent_id).await.unwrap();
    assert_eq!(run.run_status(), RunStatus::Aborted);
    let detail = run.status_detail();
    assert!(
        detail.contains("did not assemble and none of its ranks has been heard from for 60 s"),
        "{detail}"
    );
    assert!(matches!(state.get(alive_id.clone()).await, Err(StateError::NotFound { .. })));
    let done = state.join_rendezvous(join("alive", &group, 1)).await.unwrap();
    assert_eq!((done.run_id, done.run_status), (alive_id, Some(RunStatus::Running)));
    service.shutdown().await;
}
