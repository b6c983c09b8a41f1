//! Reads and heartbeats never wait for the actor's turn: with the actor
//! held at the start of a turn (a registration waiting behind it), every
//! read route, `/healthz` and the heartbeats of runs and ranks are answered
//! over HTTP from the committed view and the liveness tables, and what
//! they stamp counts for the lease sweep and shows in the runs served.

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};
use trainstate_actor::http::HttpConfig;
use trainstate_actor::{ManualClock, StateConfig};
use trainstate_schema::RunStatus;

use crate::common::{Server, eventually, run, unique_name, workers};
use crate::contract::send;

const T0: u64 = 1_760_000_000_000;
const LEASE: Duration = Duration::from_secs(60);
const DEADLINE: Duration = Duration::from_secs(10);

fn body(value: &Value) -> Option<(&'static str, Vec<u8>)> {
    Some(("application/json", serde_json::to_vec(value).unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_heartbeats_are_answered_while_the_actor_is_held() {
    let clock = Arc::new(ManualClock::new(T0));
    let config = StateConfig::in_memory()
        .with_name(unique_name("off-the-turn"))
        .with_clock(clock.clone())
        .with_lease(LEASE)
        // The test drives the sweep itself.
        .with_sweep_interval(Duration::from_secs(3600));
    let faults = config.faults.clone();
    let server = Server::start(config, HttpConfig::default()).await;
    let client = Client::new();
    let url = |path: &str| format!("{}{path}", server.url);

    // A run with a controller, and a rendezvous run of two ranks.
    let beating = run("beating", T0);
    let silent = run("silent", T0);
    for r in [&beating, &silent] {
        let (status, answer) = send(
            &client,
            Method::POST,
            &url("/api/train/runs"),
            body(&serde_json::to_value(r).unwrap()),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{answer}");
    }
    let group = workers(2, 2, "r-");
    let mut ranked = String::new();
    for (rank, worker) in group.iter().enumerate() {
        let join = json!({"world_size": 2, "worker": worker, "name": "ranked", "job_id": "7"});
        let (status, answer) =
            send(&client, Method::POST, &url("/api/train/rendezvous/k7/join"), body(&join), None)
                .await;
        assert_eq!(status, StatusCode::OK, "rank {rank}: {answer}");
        ranked = answer["run_id"].as_str().unwrap().to_owned();
    }
    let service = server.service.clone();

    // The actor stops at its next turn; a registration waits behind it.
    faults.hold_actor();
    let late = run("late", T0);
    let waiting = {
        let (client, url, late) = (client.clone(), url("/api/train/runs"), late.clone());
        tokio::spawn(async move {
            send(&client, Method::POST, &url, body(&serde_json::to_value(&late).unwrap()), None)
                .await
        })
    };
    eventually("the actor to be held", DEADLINE, || std::future::ready(faults.actor_waiting()))
        .await;

    clock.advance_ms(40_000);
    let beat = format!("/api/train/runs/{}/heartbeat", beating.id());
    let (status, answer) = send(&client, Method::POST, &url(&beat), None, None).await;
    assert_eq!(status, StatusCode::OK, "a heartbeat is taken without the actor: {answer}");
    assert_eq!(answer["lease_ms"], LEASE.as_millis() as u64);
    let rank_beat = format!("/api/train/runs/{ranked}/ranks/1/heartbeat");
    let (status, answer) =
        send(&client, Method::POST, &url(&rank_beat), body(&json!({"attempt_id": "0"})), None)
            .await;
    assert_eq!(status, StatusCode::OK, "a rank's heartbeat is taken without the actor: {answer}");
    assert_eq!(answer["run_status"], "RUNNING");
    assert_eq!((answer["world_size"].as_u64(), answer["ranks_ended"].as_u64()), (Some(2), Some(0)));

    let (status, got) =
        send(&client, Method::GET, &url(&format!("/api/train/runs/{}", beating.id())), None, None)
            .await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(got["last_heartbeat_ms"], T0 + 40_000, "the heartbeat shows at once");
    let (status, got) =
        send(&client, Method::GET, &url(&format!("/api/train/runs/{ranked}")), None, None).await;
    assert_eq!(status, StatusCode::OK, "{got}");
    assert_eq!(got["rank_last_heartbeat_ms"], json!([T0, T0 + 40_000]), "{got}");

    let (status, page) = send(&client, Method::GET, &url("/api/train/runs"), None, None).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["total"], 3, "the listing is the committed view: not the held registration");
    for path in ["/api/train/v2/runs", "/api/train/v2/runs/v1", "/healthz"] {
        let (status, answer) = send(&client, Method::GET, &url(path), None, None).await;
        assert_eq!(status, StatusCode::OK, "{path} is answered while the actor is held: {answer}");
    }
    let (status, answer) = send(
        &client,
        Method::GET,
        &url("/api/train/runs/01890000-0000-7000-8000-000000000000"),
        None,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert!(!waiting.is_finished(), "the registration still waits for the actor's turn");

    faults.release_actor();
    let (status, answer) = waiting.await.unwrap();
    assert_eq!(status, StatusCode::CREATED, "{answer}");

    // The heartbeat taken without the actor renewed the lease the sweep
    // decides on: 70 s after registration, only the silent run is aborted.
    clock.advance_ms(30_000);
    let aborted = service.handle().sweep_leases().await.unwrap();
    assert!(aborted.contains(silent.id()), "{aborted:?}");
    assert!(!aborted.contains(beating.id()), "{aborted:?}");
    let handle = service.handle();
    assert_eq!(
        handle.get_run(beating.id().clone()).await.unwrap().run_status(),
        RunStatus::Running
    );
    server.stop().await;
}

/// A heartbeat the liveness tables cannot take (a run that ended, a run
/// that does not exist, a rank of a replaced attempt) is decided by the
/// actor, with its error.
#[tokio::test]
async fn heartbeats_the_tables_cannot_take_get_the_actors_errors() {
    let config = StateConfig::in_memory().with_name(unique_name("off-the-turn-errors"));
    let server = Server::start(config, HttpConfig::default()).await;
    let client = Client::new();
    let url = |path: &str| format!("{}{path}", server.url);
    let ended = run("ended", T0);
    let (status, _) = send(
        &client,
        Method::POST,
        &url("/api/train/runs"),
        body(&serde_json::to_value(&ended).unwrap()),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let finish = json!({"status": "FINISHED"});
    let path = format!("/api/train/runs/{}/status", ended.id());
    let (status, answer) = send(&client, Method::POST, &url(&path), body(&finish), None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");

    let beat = format!("/api/train/runs/{}/heartbeat", ended.id());
    let (status, answer) = send(&client, Method::POST, &url(&beat), None, None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert_eq!(answer["error"]["code"], "illegal_transition", "{answer}");
    let unknown = "/api/train/runs/01890000-0000-7000-8000-000000000000/heartbeat";
    let (status, answer) = send(&client, Method::POST, &url(unknown), None, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");

    let group = workers(1, 1, "x-");
    let join = json!({"world_size": 1, "worker": group[0], "name": "solo", "job_id": "8"});
    let (status, answer) =
        send(&client, Method::POST, &url("/api/train/rendezvous/k8/join"), body(&join), None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let id = answer["run_id"].as_str().unwrap();
    let rank_beat = format!("/api/train/runs/{id}/ranks/0/heartbeat");
    let (status, answer) =
        send(&client, Method::POST, &url(&rank_beat), body(&json!({"attempt_id": "9"})), None)
            .await;
    assert_eq!(status, StatusCode::CONFLICT, "a replaced attempt: {answer}");
    let out_of_range = format!("/api/train/runs/{id}/ranks/5/heartbeat");
    let (status, answer) =
        send(&client, Method::POST, &url(&out_of_range), body(&json!({"attempt_id": "0"})), None)
            .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    server.stop().await;
}

/// `/healthz` reads no mailbox, but says when the actor is wedged: held
/// for longer than three sweep periods (and at least two seconds), it
/// answers 503 `unavailable`, and 200 again once the actor takes turns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_says_when_the_actor_takes_no_turn() {
    let config = StateConfig::in_memory()
        .with_name(unique_name("off-the-turn-wedged"))
        .with_sweep_interval(Duration::from_millis(20));
    let faults = config.faults.clone();
    let server = Server::start(config, HttpConfig::default()).await;
    let client = Client::new();
    let healthz = format!("{}/healthz", server.url);
    let (status, _) = send(&client, Method::GET, &healthz, None, None).await;
    assert_eq!(status, StatusCode::OK);

    faults.hold_actor();
    let answer = eventually("/healthz to say the actor is wedged", DEADLINE, || {
        let (client, healthz) = (client.clone(), healthz.clone());
        async move {
            let (status, answer) = send(&client, Method::GET, &healthz, None, None).await;
            (status == StatusCode::SERVICE_UNAVAILABLE).then_some(answer)
        }
    })
    .await;
    assert_eq!(answer["error"]["code"], "unavailable", "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("no turn"), "{answer}");

    faults.release_actor();
    eventually("/healthz to be well again", DEADLINE, || {
        let (client, healthz) = (client.clone(), healthz.clone());
        async move { send(&client, Method::GET, &healthz, None, None).await.0 == StatusCode::OK }
    })
    .await;
    server.stop().await;
}
