//! Answers that match what happened: a timed-out write says it may have
//! taken effect; a registration its own commit would evict is refused
//! (see docs/reliability.md).

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::{Client, Method, StatusCode};
use serde_json::Value;
use trainstate_actor::http::HttpConfig;
use trainstate_actor::{Faults, Retention, StateConfig};
use trainstate_client::{DEFAULT_CALL_TIMEOUT, RunQuery, StateError, deadline_allowance};
use trainstate_schema::{RunId, RunStatus, TrainRunInfo};

use crate::common::{Server, run_with, unique_name};
use crate::contract::send_json as send;

const T0: u64 = 1_760_000_000_000;

/// Ends a hung test; never a margin a passing run depends on.
const HANG: Duration = Duration::from_secs(60);

/// An ended run (FINISHED) of `id`, started at `start_ms`.
fn ended(id: &RunId, name: &str, start_ms: u64) -> TrainRunInfo {
    trainstate_testkit::runs::ended(&run_with(id, name, "job1", start_ms, 2), RunStatus::Finished)
}

/// A registration whose commit is held past the call deadline answers 503
/// `timeout` saying the write may have taken effect, and it has: once the
/// store commits, the run is there. The deadline grows with the document:
/// a run of 8,192 workers (about 1.7 MiB) waits its allowance more before
/// the answer (a timer never fires early, so this bound cannot fail
/// spuriously).
#[tokio::test]
async fn regression_a_write_slower_than_its_deadline_says_it_may_have_taken_effect() {
    let faults = Arc::new(Faults::default());
    let config =
        StateConfig::in_memory().with_name(unique_name("slow-write")).with_faults(faults.clone());
    let server = Server::start(config, HttpConfig::default()).await;
    let client = Client::builder().timeout(HANG).build().unwrap();
    let runs = format!("{}/api/train/runs", server.url);

    let run = run_with(&RunId::new_v7(), "big", "job1", T0, 8_192);
    let body = serde_json::to_value(&run).unwrap();
    let allowance = deadline_allowance(serde_json::to_vec(&run).unwrap().len() as u64);
    assert!(allowance > Duration::from_millis(500), "{allowance:?}");

    faults.hold_writer();
    let started = Instant::now();
    let (status, answer) = send(&client, Method::POST, &runs, Some(&body)).await;
    let waited = started.elapsed();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert_eq!(answer["error"]["code"], "timeout");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("may have taken effect"), "{message}");
    assert!(waited >= DEFAULT_CALL_TIMEOUT + allowance, "answered after {waited:?}: {answer}");

    faults.release_writer();
    let url = format!("{runs}/{}", run.id());
    let until = Instant::now() + HANG;
    loop {
        let (status, stored) = send(&client, Method::GET, &url, None).await;
        if status == StatusCode::OK {
            assert_eq!(stored["name"], "big");
            break;
        }
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(Instant::now() < until, "the timed-out write was never committed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Repeating it is safe, and says it was already there.
    let (status, again) = send(&client, Method::POST, &runs, Some(&body)).await;
    assert_eq!((status, &again["created"]), (StatusCode::OK, &Value::Bool(false)));
    server.stop().await;
}

/// With retention full, an ended run that started before every ended run
/// kept would be evicted by the commit that stores it: it is refused (409
/// `conflict`, naming retention) and nothing is stored, neither the run
/// nor an eviction. A newer ended run is stored and evicts the oldest; a
/// live run is never evicted, so it is stored whatever its age.
#[tokio::test]
async fn regression_a_registration_its_own_commit_evicts_is_refused_and_nothing_stored() {
    let config = StateConfig::in_memory()
        .with_name(unique_name("evicted-at-once"))
        .with_retention(Retention::max_runs(2));
    let server = Server::start(config, HttpConfig::default()).await;
    let client = Client::new();
    let runs = format!("{}/api/train/runs", server.url);
    let post = |run: &TrainRunInfo| {
        let (client, runs, body) =
            (client.clone(), runs.clone(), serde_json::to_value(run).unwrap());
        async move { send(&client, Method::POST, &runs, Some(&body)).await }
    };
    let (kept_a, kept_b) =
        (ended(&RunId::new_v7(), "a", T0 + 10_000), ended(&RunId::new_v7(), "b", T0 + 20_000));
    for run in [&kept_a, &kept_b] {
        assert_eq!(post(run).await.0, StatusCode::CREATED);
    }
    let mut events = server.service.handle().subscribe(None).await.unwrap();

    let old = ended(&RunId::new_v7(), "old", T0);
    let (status, refused) = post(&old).await;
    assert_eq!(status, StatusCode::CONFLICT, "{refused}");
    assert_eq!(refused["error"]["code"], "conflict");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("retention is full") && message.contains("nothing was stored"),
        "{message}"
    );
    assert_eq!(
        send(&client, Method::GET, &format!("{runs}/{}", old.id()), None).await.0,
        StatusCode::NOT_FOUND
    );
    let state = server.service.handle();
    let names: Vec<String> = state
        .list(RunQuery::all())
        .await
        .unwrap()
        .runs
        .iter()
        .map(|r| r.parse().unwrap().name().to_owned())
        .collect();
    assert_eq!(names, ["b", "a"]);
    // The same through the typed API.
    let err = state.register(old.clone()).await.unwrap_err();
    assert!(matches!(&err, StateError::Conflict { id, .. } if id == old.id()), "{err}");

    // So is the same run forwarded from another cluster's head.
    let mut foreign = old.clone().into_draft();
    foreign.id = RunId::new_v7().to_string();
    foreign.cluster = Some("east".into());
    let foreign = foreign.validate().unwrap();
    let err = state.forward(foreign.clone()).await.unwrap_err();
    assert!(
        matches!(&err, StateError::Conflict { reason, .. } if reason.contains("retention is full")),
        "{err}"
    );
    assert!(matches!(state.get(foreign.id().clone()).await, Err(StateError::NotFound { .. })));

    // A live run of any age, and a newer ended run, are stored.
    let live_old = run_with(&RunId::new_v7(), "live-old", "job1", T0 - 1_000, 2);
    assert_eq!(post(&live_old).await.0, StatusCode::CREATED);
    let newer = ended(&RunId::new_v7(), "newer", T0 + 30_000);
    assert_eq!(post(&newer).await.0, StatusCode::CREATED);
    let names: Vec<String> = state
        .list(RunQuery::all())
        .await
        .unwrap()
        .runs
        .iter()
        .map(|r| r.parse().unwrap().name().to_owned())
        .collect();
    assert!(
        names.contains(&"newer".to_owned()) && names.contains(&"live-old".to_owned()),
        "{names:?}"
    );
    assert!(!names.contains(&"old".to_owned()));

    // The refused registration announced nothing: the first event is the live run's.
    let first = tokio::time::timeout(HANG, events.receiver.recv()).await.unwrap().unwrap();
    assert_eq!(&first.run_id, live_old.id(), "{first:?}");
    server.stop().await;
}
