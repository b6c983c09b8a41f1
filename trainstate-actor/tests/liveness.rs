//! Leases and retention, on an injected clock.

use std::sync::Arc;
use std::time::Duration;

use trainstate_actor::{ManualClock, Retention, StateConfig, launch_state_actor};
use trainstate_client::{EventKind, RunQuery, StatusUpdate};
use trainstate_schema::{CauseKind, RunStatus};

use crate::common::run;
use crate::stores::{Fresh, on_both_stores};

const T0: u64 = 1_760_000_000_000;
const LEASE: Duration = Duration::from_secs(60);

fn config(fresh: &Fresh, clock: &Arc<ManualClock>) -> StateConfig {
    fresh
        .config()
        .with_clock(clock.clone())
        .with_lease(LEASE)
        // The test drives the sweep itself.
        .with_sweep_interval(Duration::from_secs(3600))
}

on_both_stores! {
    async fn lease_expiry_aborts_only_live_runs_whose_lease_expired(store) {
        let fresh = store.fresh("lease_expiry_aborts_").await;
        let clock = Arc::new(ManualClock::new(T0));
        let service = launch_state_actor(config(&fresh, &clock)).await.unwrap();
        let state = service.handle();
        let mut events = state.subscribe(None).await.unwrap();
        let (silent, beating, ended) = (run("silent", T0), run("beating", T0), run("ended", T0));
        for r in [&silent, &beating, &ended] {
            state.register(r.clone()).await.unwrap();
        }
        state.set_status(ended.id().clone(), StatusUpdate::finished()).await.unwrap();

        clock.advance_ms(40_000);
        state.heartbeat(beating.id().clone()).await.unwrap();
        assert!(state.sweep_leases().await.unwrap().is_empty(), "nobody's lease has expired yet");

        clock.advance_ms(30_000); // silent: 70 s without a word; beating: 30 s.
        let aborted = state.sweep_leases().await.unwrap();
        assert_eq!(aborted, [silent.id().clone()]);

        let stored = state.get_run(silent.id().clone()).await.unwrap();
        assert_eq!(stored.run_status(), RunStatus::Aborted);
        assert_eq!(stored.cause().unwrap().kind, CauseKind::LostController);
        assert_eq!(stored.end_time_ms(), Some(T0 + 70_000));
        assert!(stored.status_detail().contains("stopped heartbeating"), "{}", stored.status_detail());
        assert!(
            stored.status_detail().contains("(last at 2025-10-09T08:53:20.000Z)"),
            "says when it was last heard from, for a person: {}",
            stored.status_detail()
        );
        assert!(stored.status_detail().contains("for 70 s"), "{}", stored.status_detail());
        assert_eq!(state.get_run(beating.id().clone()).await.unwrap().run_status(), RunStatus::Running);
        assert_eq!(state.get_run(ended.id().clone()).await.unwrap().run_status(), RunStatus::Finished);

        let kinds: Vec<_> =
            std::iter::from_fn(|| events.receiver.try_recv().ok()).map(|e| e.kind).collect();
        assert_eq!(kinds.last(), Some(&EventKind::StatusChanged), "the abort is announced");

        // The controller's own late report replaces the lost-controller abort, once.
        let finished = state.set_status(silent.id().clone(), StatusUpdate::finished()).await.unwrap();
        assert_eq!(finished.parse().unwrap().run_status(), RunStatus::Finished);
        assert!(
            state
                .set_status(silent.id().clone(), StatusUpdate::aborted(CauseKind::UserInterrupt, ""))
                .await
                .is_err()
        );
        service.shutdown().await;
    }

    async fn after_a_restart_every_live_run_gets_a_fresh_lease(store) {
        let fresh = store.fresh("after_a_restart_ever").await;
        let clock = Arc::new(ManualClock::new(T0));
        let durable = |clock: &Arc<ManualClock>| config(&fresh, clock);
        let service = launch_state_actor(durable(&clock)).await.unwrap();
        let r = run("survivor", T0);
        service.handle().register(r.clone()).await.unwrap();
        service.shutdown().await;

        clock.advance_ms(10 * 60_000); // The head was down for ten minutes.
        let service = launch_state_actor(durable(&clock)).await.unwrap();
        assert!(service.handle().sweep_leases().await.unwrap().is_empty());
        clock.advance_ms(61_000);
        assert_eq!(service.handle().sweep_leases().await.unwrap(), [r.id().clone()]);
        service.shutdown().await;
    }

    async fn retention_evicts_exactly_the_oldest_ended_runs(store) {
        let fresh = store.fresh("retention_evicts_exa").await;
        let clock = Arc::new(ManualClock::new(T0 + 100_000));
        let service =
            launch_state_actor(config(&fresh, &clock).with_retention(Retention::max_runs(5)))
                .await
                .unwrap();
        let state = service.handle();
        // Runs 0..4 live; 1 and 3 end.
        let runs: Vec<_> = (0..5).map(|i| run(&format!("r{i}"), T0 + i)).collect();
        for r in &runs {
            state.register(r.clone()).await.unwrap();
        }
        for i in [1, 3] {
            state.set_status(runs[i].id().clone(), StatusUpdate::finished()).await.unwrap();
        }
        // Two more runs: the two ended runs go, oldest first; no live run goes.
        let extra: Vec<_> = (5..7).map(|i| run(&format!("r{i}"), T0 + i)).collect();
        let mut events = state.subscribe(None).await.unwrap();
        state.register(extra[0].clone()).await.unwrap();
        let listed = |page: trainstate_client::RunPage| -> Vec<String> {
            page.runs.iter().map(|r| r.parse().unwrap().name().to_owned()).collect()
        };
        assert_eq!(listed(state.list(RunQuery::all()).await.unwrap()), ["r5", "r4", "r3", "r2", "r0"]);
        state.register(extra[1].clone()).await.unwrap();
        assert_eq!(listed(state.list(RunQuery::all()).await.unwrap()), ["r6", "r5", "r4", "r2", "r0"]);
        let evicted: Vec<_> = std::iter::from_fn(|| events.receiver.try_recv().ok())
            .filter(|e| e.kind == EventKind::Evicted)
            .map(|e| e.run_id)
            .collect();
        assert_eq!(evicted, [runs[1].id().clone(), runs[3].id().clone()]);

        // Only live runs left, as many as the cap: a live run is never
        // evicted, so a sixth is refused (the live bound defaults to the
        // cap) and nothing is stored.
        let err = state.register(run("r7", T0 + 7)).await.unwrap_err();
        assert!(matches!(err, trainstate_client::StateError::TooManyLiveRuns { max: 5 }), "{err}");
        assert_eq!(state.list(RunQuery::all()).await.unwrap().total, 5);
        service.shutdown().await;
    }

    async fn retention_by_age_evicts_runs_that_ended_long_ago(store) {
        let fresh = store.fresh("retention_by_age_evi").await;
        let clock = Arc::new(ManualClock::new(T0));
        let retention = Retention::max_runs(100).with_max_age(Duration::from_secs(3600));
        let service =
            launch_state_actor(config(&fresh, &clock).with_retention(retention)).await.unwrap();
        let state = service.handle();
        let (old, recent, live) = (run("old", T0), run("recent", T0), run("live", T0));
        for r in [&old, &recent, &live] {
            state.register(r.clone()).await.unwrap();
        }
        state.set_status(old.id().clone(), StatusUpdate::finished()).await.unwrap();
        clock.advance_ms(3_000_000);
        state.set_status(recent.id().clone(), StatusUpdate::finished()).await.unwrap();
        state.heartbeat(live.id().clone()).await.unwrap();
        clock.advance_ms(700_000); // old ended 3,700 s ago, recent 700 s ago.
        state.heartbeat(live.id().clone()).await.unwrap();
        state.sweep_leases().await.unwrap();
        let names: Vec<String> = state
            .list(RunQuery::all())
            .await
            .unwrap()
            .runs
            .iter()
            .map(|r| r.parse().unwrap().name().to_owned())
            .collect();
        assert_eq!(names.len(), 2);
        assert!(!names.contains(&"old".to_owned()));
        service.shutdown().await;
    }

    async fn regression_a_head_clock_behind_the_controller_still_aborts_a_silent_run(store) {
        let fresh = store.fresh("regression_a_head_cl").await;
        // The controller stamped its start 10 minutes ahead of the head's clock.
        let clock = Arc::new(ManualClock::new(T0));
        let service = launch_state_actor(config(&fresh, &clock)).await.unwrap();
        let state = service.handle();
        let ahead = run("ahead", T0 + 600_000);
        state.register(ahead.clone()).await.unwrap();
        clock.advance_ms(61_000);
        assert_eq!(state.sweep_leases().await.unwrap(), [ahead.id().clone()]);
        let stored = state.get_run(ahead.id().clone()).await.unwrap();
        assert_eq!(stored.run_status(), RunStatus::Aborted);
        assert_eq!(stored.end_time_ms(), Some(T0 + 600_000), "the end is never before the start");
        service.shutdown().await;
    }
}

/// Round two, finding 7: live runs were never evicted nor bounded. With
/// `--max-live-runs 20` (here `Retention::with_max_live_runs`), the 21st
/// live run is refused from every source (a registration, a run Ray
/// Train V2 creates, a run forwarded to a hub) with 503 `overloaded`
/// naming the bound and the flag, and nothing is stored; an ended run
/// still registers, and a run that ends frees a place.
#[tokio::test]
async fn regression_live_runs_past_the_bound_are_refused_naming_the_flag_until_one_ends() {
    use reqwest::{Client, Method, StatusCode};
    use serde_json::json;
    use trainstate_actor::http::HttpConfig;

    use crate::common::{Server, json, unique_name};
    use crate::contract::send;

    let clock = Arc::new(ManualClock::new(T0));
    let config = StateConfig::in_memory()
        .with_name(unique_name("live-bound"))
        .with_clock(clock.clone())
        .with_cluster(Some("hub".to_owned()))
        .with_retention(Retention::max_runs(100).with_max_live_runs(20));
    let server = Server::start(config, HttpConfig::default()).await;
    let client = Client::new();
    let body =
        |value: &serde_json::Value| Some(("application/json", serde_json::to_vec(value).unwrap()));
    let runs_url = format!("{}/api/train/runs", server.url);
    let state = server.service.handle();

    let live: Vec<_> = (0..19).map(|i| run(&format!("live{i}"), T0 + i)).collect();
    for r in &live {
        let (status, answer) = send(&client, Method::POST, &runs_url, body(&json(r)), None).await;
        assert_eq!(status, StatusCode::CREATED, "{answer}");
    }
    let v2 = |id: &str| {
        json!({"id": id, "name": "v2", "job_id": "01000000", "controller_actor_id": "c0ffee",
               "status": "RUNNING", "start_time_ns": T0 * 1_000_000})
    };
    let v2_url = |id: &str| format!("{}/api/train/v2/runs/{id}", server.url);
    let first_v2 = trainstate_schema::RunId::new_v7().to_string();
    let (status, answer) =
        send(&client, Method::PUT, &v2_url(&first_v2), body(&v2(&first_v2)), None).await;
    assert_eq!(status, StatusCode::OK, "the 20th live run: {answer}");

    let refused = |status: StatusCode, answer: &serde_json::Value| {
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
        assert_eq!(answer["error"]["code"], "overloaded", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("at most 20 live runs") && message.contains("--max-live-runs"),
            "{message}"
        );
    };
    let extra = run("extra", T0 + 100);
    let (status, answer) = send(&client, Method::POST, &runs_url, body(&json(&extra)), None).await;
    refused(status, &answer);
    let second_v2 = trainstate_schema::RunId::new_v7().to_string();
    let (status, answer) =
        send(&client, Method::PUT, &v2_url(&second_v2), body(&v2(&second_v2)), None).await;
    refused(status, &answer);
    let mut forwarded = run("forwarded", T0 + 200).into_draft();
    forwarded.cluster = Some("edge".to_owned());
    let err = state.forward(forwarded.validate().unwrap()).await.unwrap_err();
    assert!(matches!(err, trainstate_client::StateError::TooManyLiveRuns { max: 20 }), "{err}");
    for id in [extra.id().to_string(), second_v2.clone()] {
        let (status, _) = send(&client, Method::GET, &format!("{runs_url}/{id}"), None, None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "nothing was stored for {id}");
    }
    // A run registered as ended takes no live place.
    let mut ended = json(&run("ended", T0 + 300));
    ended["run_status"] = "FINISHED".into();
    if ended.get("status").is_some() {
        ended["status"] = "FINISHED".into();
    }
    let (status, answer) = send(&client, Method::POST, &runs_url, body(&ended), None).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");

    // A run that ends frees a place.
    let status_url = format!("{runs_url}/{}/status", live[0].id());
    let (status, answer) =
        send(&client, Method::POST, &status_url, body(&json!({"status": "FINISHED"})), None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (status, answer) = send(&client, Method::POST, &runs_url, body(&json(&extra)), None).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let (status, answer) =
        send(&client, Method::PUT, &v2_url(&second_v2), body(&v2(&second_v2)), None).await;
    refused(status, &answer);
    server.stop().await;
}

/// Round two, finding 7: a run registered with `"heartbeats": false` was
/// never swept. No client may opt out of its lease: the field is accepted
/// but ignored, and such a run that never heartbeats is aborted
/// `LOST_CONTROLLER` once its lease passes.
#[tokio::test]
async fn regression_a_registration_saying_heartbeats_false_is_still_aborted_after_its_lease() {
    use reqwest::{Client, Method, StatusCode};

    use crate::common::{Server, json, unique_name};
    use crate::contract::send;

    let clock = Arc::new(ManualClock::new(T0));
    let config = StateConfig::in_memory()
        .with_name(unique_name("opt-out"))
        .with_clock(clock.clone())
        .with_lease(LEASE)
        .with_sweep_interval(Duration::from_secs(3600));
    let server = Server::start(config, trainstate_actor::http::HttpConfig::default()).await;
    let client = Client::new();
    let silent = run("opted-out", T0);
    let mut doc = json(&silent);
    doc["heartbeats"] = false.into();
    let url = format!("{}/api/train/runs", server.url);
    let (status, answer) = send(
        &client,
        Method::POST,
        &url,
        Some(("application/json", serde_json::to_vec(&doc).unwrap())),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    assert!(answer["run"].get("heartbeats").is_none(), "the run is leased: {answer}");

    let state = server.service.handle();
    clock.advance_ms(LEASE.as_millis() as u64 / 2);
    assert!(state.sweep_leases().await.unwrap().is_empty(), "its lease has not passed yet");
    clock.advance_ms(LEASE.as_millis() as u64);
    assert_eq!(state.sweep_leases().await.unwrap(), [silent.id().clone()]);
    let stored = state.get_run(silent.id().clone()).await.unwrap();
    assert_eq!(stored.run_status(), RunStatus::Aborted);
    assert_eq!(stored.cause().unwrap().kind, CauseKind::LostController);
    server.stop().await;
}

/// Round three: live runs had a count bound but no byte bound (20 live
/// runs of 8,000 workers made a 212 MiB store under a 48 MiB
/// `--max-retained-bytes`). With `--max-live-bytes` (here
/// `Retention::with_max_live_bytes`), a registration that would bring the
/// live runs past it is refused with 503 naming the bound, the flag and
/// the figures, and nothing is stored; a live run that would grow past it
/// (a new attempt's worker table) is refused the same way and stays as it
/// was; a write that ends a run is taken, and then the refused run
/// registers.
#[tokio::test]
async fn regression_live_runs_past_the_byte_bound_are_refused_naming_the_flag_until_one_ends() {
    use reqwest::{Client, Method, StatusCode};
    use serde_json::json;
    use trainstate_actor::http::HttpConfig;
    use trainstate_client::NewAttempt;

    use crate::common::{Server, json, run_with, unique_name, workers};
    use crate::contract::send;

    const MAX_LIVE_BYTES: u64 = 60_000;
    let clock = Arc::new(ManualClock::new(T0));
    let retention =
        Retention::max_runs(100).with_max_bytes(10_000_000).with_max_live_bytes(MAX_LIVE_BYTES);
    let config = StateConfig::in_memory()
        .with_name(unique_name("live-bytes"))
        .with_clock(clock.clone())
        .with_retention(retention);
    let server = Server::start(config, HttpConfig::default()).await;
    let client = Client::new();
    let state = server.service.handle();
    let body =
        |value: &serde_json::Value| Some(("application/json", serde_json::to_vec(value).unwrap()));
    let runs_url = format!("{}/api/train/runs", server.url);
    let refused = |status: StatusCode, answer: &serde_json::Value| {
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
        assert_eq!(answer["error"]["code"], "unavailable", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("at most {MAX_LIVE_BYTES} bytes of live runs"))
                && message.contains("--max-live-bytes")
                && message.contains("the live runs take "),
            "{message}"
        );
    };

    // Live runs of 32 workers each, until the next would pass the bound.
    let mut live = Vec::new();
    let over = loop {
        assert!(live.len() < 50, "never refused: the live runs' bytes are not bounded");
        let id = trainstate_schema::RunId::new_v7();
        let r = run_with(&id, &format!("live{}", live.len()), "job", T0 + live.len() as u64, 32);
        let (status, answer) = send(&client, Method::POST, &runs_url, body(&json(&r)), None).await;
        if status == StatusCode::CREATED {
            live.push(r);
            continue;
        }
        refused(status, &answer);
        break r;
    };
    assert!(live.len() >= 2, "{} live runs fit", live.len());
    let url = format!("{runs_url}/{}", over.id());
    let (status, _) = send(&client, Method::GET, &url, None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was stored");
    let listed = state.list(trainstate_client::RunQuery::default()).await.unwrap();
    assert_eq!(listed.runs.len(), live.len());

    // A live run growing past the bound (a new attempt of 256 workers) is
    // refused the same way, and stays as it was.
    let grown = NewAttempt::new("1", T0 + 1_000, workers(256, 8, "big-"));
    let err = state.start_attempt(live[0].id().clone(), grown).await.unwrap_err();
    assert!(matches!(err, trainstate_client::StateError::Unavailable { .. }), "{err}");
    assert!(err.to_string().contains("--max-live-bytes"), "{err}");
    let kept = state.get_run(live[0].id().clone()).await.unwrap();
    assert_eq!(kept.attempts().len(), 1, "the attempt was not stored");
    assert_eq!(kept.workers().len(), 32);

    // A write that ends a run is taken; its bytes no longer count as live.
    let status_url = format!("{runs_url}/{}/status", live[0].id());
    let (status, answer) =
        send(&client, Method::POST, &status_url, body(&json!({"status": "FINISHED"})), None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (status, answer) = send(&client, Method::POST, &runs_url, body(&json(&over)), None).await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    server.stop().await;
}
