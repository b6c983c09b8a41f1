//! Several heads on one PostgreSQL database: writes through one are seen
//! through the others and on their event streams, racing writes leave one
//! winner, one head sweeps at a time, and killing one leaves the others
//! serving with every acknowledged write.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::Mutex;
use trainstate_actor::{ManualClock, StateService, launch_state_actor};
use trainstate_client::{EventKind, RunDocument, StateError, StatusUpdate};
use trainstate_schema::{CauseKind, RunId, RunStatus};

use crate::common::{eventually, start_head};
use crate::common::{run, run_with, unique_name};
use crate::contract::check_answer;
use crate::process::without_heartbeat;
use crate::stores::{Fresh, Store};

const T0: u64 = 1_760_000_000_000;

/// Two heads (actors of their own) on one fresh schema.
async fn two_heads(
    what: &str,
    clock: Option<&Arc<ManualClock>>,
) -> (StateService, StateService, Fresh) {
    let fresh = Store::Postgres.fresh(what).await;
    let config = |name: &str| {
        let config =
            fresh.config_named(&unique_name(name)).with_sweep_interval(Duration::from_secs(3600));
        match clock {
            Some(clock) => config.with_clock(clock.clone()),
            None => config,
        }
    };
    let a = launch_state_actor(config("a")).await.unwrap();
    let b = launch_state_actor(config("b")).await.unwrap();
    (a, b, fresh)
}

/// Retries a write while it is refused as decided on a stale version.
async fn retrying<T, F: std::future::Future<Output = Result<T, StateError>>>(
    mut write: impl FnMut() -> F,
) -> Result<T, StateError> {
    for _ in 0..100 {
        match write().await {
            Err(StateError::Unavailable { .. }) => {
                tokio::time::sleep(Duration::from_millis(5)).await
            }
            other => return other,
        }
    }
    panic!("a write stayed unavailable through 100 tries");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_postgres), ignore = "needs TRAINSTATE_TEST_POSTGRES_URL")]
async fn a_write_through_one_head_is_seen_through_the_other_and_on_its_events() {
    let (a, b, _store) = two_heads("seen", None).await;
    let mut events = b.handle().subscribe(None).await.unwrap();
    let r = run("through-a", T0);
    a.handle().register(r.clone()).await.unwrap();
    // Read right after the answer, through the other head.
    assert_eq!(b.handle().get_run(r.id().clone()).await.unwrap().id(), r.id());
    let event = tokio::time::timeout(Duration::from_secs(10), events.receiver.recv())
        .await
        .expect("B announces A's write")
        .unwrap();
    assert_eq!((event.kind, &event.run_id), (EventKind::Registered, r.id()));

    // A change through B, read through A: the view follows within a moment.
    let finished = b.handle().set_status(r.id().clone(), StatusUpdate::finished()).await.unwrap();
    let (state, id) = (a.handle(), r.id().clone());
    eventually("A to show B's change", Duration::from_secs(10), || {
        let (state, id, finished) = (state.clone(), id.clone(), finished.clone());
        async move { state.get(id).await.is_ok_and(|doc| doc.body() == finished.body()) }
    })
    .await;
    let listed = a.handle().list(trainstate_client::RunQuery::all()).await.unwrap();
    assert_eq!(listed.runs.iter().map(RunDocument::body).collect::<Vec<_>>(), [finished.body()]);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_postgres), ignore = "needs TRAINSTATE_TEST_POSTGRES_URL")]
async fn racing_terminal_reports_through_two_heads_leave_exactly_one_winner() {
    let (a, b, _store) = two_heads("race", None).await;
    for i in 0..20 {
        let r = run(&format!("race{i}"), T0 + i);
        let id = r.id().clone();
        a.handle().register(r).await.unwrap();
        b.handle().get(id.clone()).await.unwrap();
        let (ha, hb) = (a.handle(), b.handle());
        let (first, second) = tokio::join!(
            retrying(|| ha.set_status(id.clone(), StatusUpdate::finished())),
            retrying(|| hb.set_status(
                id.clone(),
                StatusUpdate::errored(Some(0), CauseKind::UserError, "boom")
            )),
        );
        let winner = match (first, second) {
            (Ok(doc), Err(StateError::IllegalTransition { .. }))
            | (Err(StateError::IllegalTransition { .. }), Ok(doc)) => doc,
            other => panic!("run {i}: one report wins and the other is refused: {other:?}"),
        };
        for head in [&a, &b] {
            let state = head.handle();
            let (id, winner) = (id.clone(), winner.clone());
            eventually("both heads to agree", Duration::from_secs(10), || {
                let (state, id, winner) = (state.clone(), id.clone(), winner.clone());
                async move { state.get(id).await.is_ok_and(|doc| doc.body() == winner.body()) }
            })
            .await;
        }
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_postgres), ignore = "needs TRAINSTATE_TEST_POSTGRES_URL")]
async fn a_registration_repeated_through_another_head_is_a_no_op() {
    let (a, b, _store) = two_heads("repeat", None).await;
    for i in 0..20 {
        let r = run(&format!("repeat{i}"), T0 + i);
        let first = a.handle().register(r.clone()).await.unwrap();
        let handle = b.handle();
        let again = retrying(|| handle.register(r.clone())).await.unwrap();
        assert!(first.created && !again.created, "run {i}");
        assert_eq!(again.run.body(), first.run.body());
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_postgres), ignore = "needs TRAINSTATE_TEST_POSTGRES_URL")]
async fn one_head_sweeps_with_every_heads_heartbeats_and_another_takes_over_when_it_stops() {
    let clock = Arc::new(ManualClock::new(T0));
    let (a, b, store) = two_heads("sweep", Some(&clock)).await;
    eventually("one sweeping head", Duration::from_secs(10), || {
        let n = usize::from(a.is_sweeper()) + usize::from(b.is_sweeper());
        async move { n == 1 }
    })
    .await;
    let (sweeper, other) = if a.is_sweeper() { (a, b) } else { (b, a) };
    let (beating, silent) = (run("beating", T0), run("silent", T0));
    for r in [&beating, &silent] {
        other.handle().register(r.clone()).await.unwrap();
        // The sweeping head knows the run from now on (a head that first
        // hears of a live run later gives it a fresh lease from then).
        sweeper.handle().get(r.id().clone()).await.unwrap();
    }
    clock.advance_ms(40_000);
    // Heard only by the head that does not sweep.
    other.handle().heartbeat(beating.id().clone()).await.unwrap();
    // Heads share heartbeats every second.
    let db = crate::stores::connect(store.url().unwrap()).await;
    eventually("the heartbeat to be shared", Duration::from_secs(10), || {
        let db = &db;
        async move {
            let row =
                db.query_one("SELECT count(*) FROM trainstate_heartbeats", &[]).await.unwrap();
            row.get::<_, i64>(0) == 1
        }
    })
    .await;
    clock.advance_ms(30_000);
    assert!(other.handle().sweep_leases().await.unwrap().is_empty(), "only one head sweeps");
    assert_eq!(sweeper.handle().sweep_leases().await.unwrap(), [silent.id().clone()]);

    sweeper.shutdown().await;
    eventually("the other head to sweep", Duration::from_secs(10), || {
        let sweeps = other.is_sweeper();
        async move { sweeps }
    })
    .await;
    clock.advance_ms(61_000);
    assert_eq!(other.handle().sweep_leases().await.unwrap(), [beating.id().clone()]);
    let stored = other.handle().get_run(beating.id().clone()).await.unwrap();
    assert_eq!(stored.run_status(), RunStatus::Aborted);
    other.shutdown().await;
}

/// One client of the burst: registers runs, and finishes every other one
/// through the other head; a request to a head that died is sent to the
/// survivor (every write is idempotent). Records the last acknowledged
/// version of each run.
async fn client(
    worker: u64,
    heads: [String; 2],
    dead: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    acknowledged: Arc<Mutex<HashMap<String, Value>>>,
    count: Arc<AtomicUsize>,
) {
    let http = reqwest::Client::new();
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let run = run_with(&RunId::new_v7(), &format!("w{worker}-{i}"), "ha", T0 + i, 4);
        let id = run.id().to_string();
        let register =
            (Method::POST, "/api/train/runs".to_owned(), serde_json::to_vec(&run).unwrap());
        let finish = (
            Method::POST,
            format!("/api/train/runs/{id}/status"),
            serde_json::to_vec(&json!({"status": "FINISHED"})).unwrap(),
        );
        let writes = if i.is_multiple_of(2) { vec![register, finish] } else { vec![register] };
        for (n, (method, path, body)) in writes.into_iter().enumerate() {
            // Registrations through one head, finishes through the other.
            let mut head = ((i as usize) + n) % 2;
            let answer = loop {
                if head == 0 && dead.load(Ordering::SeqCst) {
                    head = 1;
                }
                let url = format!("{}{path}", heads[head]);
                let sent = http
                    .request(method.clone(), &url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await;
                let answered = match sent {
                    Ok(response) => {
                        let status = response.status();
                        response.bytes().await.ok().map(|bytes| (url, status, bytes))
                    }
                    Err(_) => None,
                };
                match answered {
                    Some((url, status, bytes)) => {
                        check_answer(&method, &url, status, &bytes);
                        if status == StatusCode::SERVICE_UNAVAILABLE {
                            continue; // decided on a stale version: retry
                        }
                        break (status, bytes);
                    }
                    // The head died with the request: the survivor gets it.
                    None if head == 0 => head = 1,
                    None => panic!("the surviving head failed a request"),
                }
            };
            let (status, bytes) = answer;
            assert!(status.is_success(), "{status}: {}", String::from_utf8_lossy(&bytes));
            let body: Value = serde_json::from_slice(&bytes).unwrap();
            let stored = if body.get("run").is_some() { body["run"].clone() } else { body };
            acknowledged.lock().await.insert(id.clone(), without_heartbeat(stored));
            count.fetch_add(1, Ordering::SeqCst);
        }
        i += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_postgres), ignore = "needs TRAINSTATE_TEST_POSTGRES_URL")]
async fn killing_one_of_two_heads_mid_burst_loses_no_acknowledged_write() {
    let fresh = Store::Postgres.fresh("ha").await;
    let url = fresh.url().unwrap().to_owned();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = start_head(dir_a.path(), &["--store", &url]).unwrap();
    let b = start_head(dir_b.path(), &["--store", &url]).unwrap();
    let (dead, stop) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let acknowledged = Arc::new(Mutex::new(HashMap::new()));
    let count = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..6)
        .map(|worker| {
            tokio::spawn(client(
                worker,
                [a.url.clone(), b.url.clone()],
                dead.clone(),
                stop.clone(),
                acknowledged.clone(),
                count.clone(),
            ))
        })
        .collect();
    let wait_for = |n: usize| {
        let count = count.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while count.load(Ordering::SeqCst) < n {
                assert!(Instant::now() < deadline, "the burst made no progress");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    };
    wait_for(300).await;
    a.signal("-KILL");
    a.wait();
    dead.store(true, Ordering::SeqCst);
    let at_kill = count.load(Ordering::SeqCst);
    wait_for(at_kill + 200).await;
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.unwrap();
    }

    // Every acknowledged write, through the survivor.
    let acknowledged = acknowledged.lock().await.clone();
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    for (id, expected) in &acknowledged {
        let url = format!("{}/api/train/runs/{id}", b.url);
        loop {
            let (status, stored) =
                crate::contract::send(&http, Method::GET, &url, None, None).await;
            if status == StatusCode::OK && without_heartbeat(stored.clone()) == *expected {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "acknowledged {id} is not as acknowledged: {status} {stored}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let (_, all) = crate::contract::send(
        &http,
        Method::GET,
        &format!("{}/api/train/runs?limit=1", b.url),
        None,
        None,
    )
    .await;
    assert!(all["total"].as_u64().unwrap() >= acknowledged.len() as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_postgres), ignore = "needs TRAINSTATE_TEST_POSTGRES_URL")]
async fn a_head_behind_what_the_change_log_keeps_loads_every_run_again() {
    let (a, b, store) = two_heads("pruned", None).await;
    a.handle().register(run("before", T0)).await.unwrap();
    // Another writer commits a run and prunes the log past both heads.
    let missed = run("missed", T0 + 1);
    let json = serde_json::to_string(&missed).unwrap();
    let db = crate::stores::connect(store.url().unwrap()).await;
    db.batch_execute("BEGIN").await.unwrap();
    let seq: i64 = db
        .query_one(
            "UPDATE trainstate_meta SET seq = seq + 1, pruned_through = seq + 1 RETURNING seq",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    db.execute(
        "INSERT INTO trainstate_runs (id, start_time_ms, run_status, version, seq, json)
         VALUES ($1, $2, 'RUNNING', 42, $3, $4)",
        &[&missed.id().as_str(), &((T0 + 1) as i64), &seq, &json],
    )
    .await
    .unwrap();
    db.batch_execute("COMMIT").await.unwrap();
    // Each head finds out on its next follow and loads everything again.
    for head in [&b, &a] {
        let state = head.handle();
        eventually("the head to list the missed run", Duration::from_secs(10), || {
            let state = state.clone();
            async move { state.list(trainstate_client::RunQuery::all()).await.unwrap().total == 2 }
        })
        .await;
        assert_eq!(state.get(missed.id().clone()).await.unwrap().body(), json);
    }
    // And goes on writing.
    b.handle().set_status(missed.id().clone(), StatusUpdate::finished()).await.unwrap();
    a.shutdown().await;
    b.shutdown().await;
}

/// POSTs `body` to `path` of the head at `base`, retrying while the answer
/// is 503 (the heads are still choosing the one that sweeps), as the
/// Python client does.
async fn post_retrying(http: &reqwest::Client, base: &str, path: &str, body: Value) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, answer) = crate::contract::send(
            http,
            Method::POST,
            &format!("{base}{path}"),
            Some(("application/json", serde_json::to_vec(&body).unwrap())),
            None,
        )
        .await;
        if status == StatusCode::OK {
            return answer;
        }
        assert!(
            status == StatusCode::SERVICE_UNAVAILABLE && Instant::now() < deadline,
            "POST {path} through {base}: {status} {answer}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_postgres), ignore = "needs TRAINSTATE_TEST_POSTGRES_URL")]
async fn regression_ranks_whose_requests_reach_different_heads_form_one_group_and_one_run() {
    let fresh = Store::Postgres.fresh("rdv").await;
    let url = fresh.url().unwrap().to_owned();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = start_head(dir_a.path(), &["--store", &url, "--lease", "8s"]).unwrap();
    let b = start_head(dir_b.path(), &["--store", &url, "--lease", "8s"]).unwrap();
    let heads = [a.url.clone(), b.url.clone()];
    let http = reqwest::Client::new();
    let group = crate::common::workers(2, 1, "rdv-");
    let join = |rank: usize, timeout_ms: u64| {
        json!({
            "world_size": 2,
            "worker": serde_json::to_value(&group[rank]).unwrap(),
            "name": "two-heads",
            "job_id": "7",
            "join_timeout_ms": timeout_ms,
        })
    };

    // Rank 0 joins through A, rank 1 through B: one group, one run.
    let first =
        post_retrying(&http, &heads[0], "/api/train/rendezvous/slurm:7.0/join", join(0, 600_000))
            .await;
    let second =
        post_retrying(&http, &heads[1], "/api/train/rendezvous/slurm:7.0/join", join(1, 600_000))
            .await;
    let id = first["run_id"].as_str().unwrap().to_owned();
    assert_eq!(second["run_id"], first["run_id"], "one group: {first} {second}");
    assert_eq!(second["run_status"], "RUNNING", "{second}");

    // Each rank's heartbeat is taken by either head, never "join again".
    for (rank, head) in [(0, &heads[1]), (1, &heads[0]), (1, &heads[1])] {
        let beat = post_retrying(
            &http,
            head,
            &format!("/api/train/runs/{id}/ranks/{rank}/heartbeat"),
            json!({"attempt_id": "0"}),
        )
        .await;
        assert_eq!(beat["run_status"], "RUNNING", "rank {rank} through {head}: {beat}");
    }

    // The ranks end through different heads: both ends count, the run is FINISHED.
    let end = json!({"attempt_id": "0", "status": "FINISHED"});
    let ended =
        post_retrying(&http, &heads[0], &format!("/api/train/runs/{id}/ranks/0/end"), end.clone())
            .await;
    assert_eq!(ended["ranks_ended"], 1, "{ended}");
    let ended =
        post_retrying(&http, &heads[1], &format!("/api/train/runs/{id}/ranks/1/end"), end).await;
    assert_eq!(
        (&ended["ranks_ended"], &ended["run_status"]),
        (&json!(2), &json!("FINISHED")),
        "{ended}"
    );
    for head in &heads {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let (status, run) = crate::contract::send(
                &http,
                Method::GET,
                &format!("{head}/api/train/runs/{id}"),
                None,
                None,
            )
            .await;
            if status == StatusCode::OK && run["run_status"] == "FINISHED" {
                break;
            }
            assert!(Instant::now() < deadline, "{head} shows {status} {run}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    // A group that never completes is closed, whichever head its ranks reached.
    for (n, head) in heads.iter().enumerate() {
        let key = format!("/api/train/rendezvous/slurm:8{n}.0/join");
        let half = post_retrying(&http, head, &key, join(0, 1_000)).await;
        let half_id = half["run_id"].as_str().unwrap().to_owned();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, run) = crate::contract::send(
                &http,
                Method::GET,
                &format!("{}/api/train/runs/{half_id}", heads[1 - n]),
                None,
                None,
            )
            .await;
            if status == StatusCode::OK {
                assert_eq!(run["run_status"], "ABORTED", "{run}");
                assert!(
                    run["status_detail"].as_str().unwrap().contains("did not assemble"),
                    "{run}"
                );
                break;
            }
            assert!(Instant::now() < deadline, "the half group through {head} never closed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_postgres), ignore = "needs TRAINSTATE_TEST_POSTGRES_URL")]
async fn a_runs_ranks_go_on_through_the_surviving_head_when_the_other_is_killed() {
    let fresh = Store::Postgres.fresh("rdv-kill").await;
    let url = fresh.url().unwrap().to_owned();
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut a = start_head(dir_a.path(), &["--store", &url, "--lease", "30s"]).unwrap();
    let b = start_head(dir_b.path(), &["--store", &url, "--lease", "30s"]).unwrap();
    let http = reqwest::Client::new();
    let group = crate::common::workers(2, 1, "kill-");
    let join = |rank: usize| {
        json!({
            "world_size": 2,
            "worker": serde_json::to_value(&group[rank]).unwrap(),
            "name": "survivor",
            "job_id": "9",
        })
    };
    let key = "/api/train/rendezvous/slurm:9.0/join";
    let first = post_retrying(&http, &a.url, key, join(0)).await;
    let second = post_retrying(&http, &b.url, key, join(1)).await;
    assert_eq!(second["run_status"], "RUNNING", "{second}");
    let id = first["run_id"].as_str().unwrap().to_owned();

    // Whichever head owned the groups, the survivor owns them now.
    a.signal("-KILL");
    a.wait();
    for rank in 0..2 {
        let path = format!("/api/train/runs/{id}/ranks/{rank}/heartbeat");
        let beat = post_retrying(&http, &b.url, &path, json!({"attempt_id": "0"})).await;
        assert_eq!(beat["run_status"], "RUNNING", "{beat}");
    }
    let end = json!({"attempt_id": "0", "status": "FINISHED"});
    post_retrying(&http, &b.url, &format!("/api/train/runs/{id}/ranks/0/end"), end.clone()).await;
    let ended =
        post_retrying(&http, &b.url, &format!("/api/train/runs/{id}/ranks/1/end"), end).await;
    assert_eq!(ended["run_status"], "FINISHED", "{ended}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_postgres), ignore = "needs TRAINSTATE_TEST_POSTGRES_URL")]
async fn regression_a_token_revoked_on_one_head_is_refused_by_the_other_within_a_second() {
    use trainstate_actor::http::HttpConfig;
    use trainstate_client::api::TokenScope;

    use crate::common::Server;
    use crate::tokens::{HEAD_TOKEN, create};

    let fresh = Store::Postgres.fresh("revoke-across").await;
    let http = || HttpConfig::default().with_token(Some(HEAD_TOKEN.into()));
    let a = Server::start(fresh.config_named(&unique_name("a")), http()).await;
    let b = Server::start(fresh.config_named(&unique_name("b")), http()).await;
    let client = reqwest::Client::new();
    let (id, secret) = create(&a.url, &[TokenScope::Write], Some("c1")).await;
    let mut draft = run("forwarded", T0).into_draft();
    draft.cluster = Some("c1".into());
    let body = serde_json::to_vec(&draft.validate().unwrap()).unwrap();
    let path = format!(
        "/api/train/forwarded/{}",
        serde_json::from_slice::<Value>(&body).unwrap()["id"].as_str().unwrap()
    );
    let forward = |base: String, secret: String| {
        let (client, body, url) = (client.clone(), body.clone(), format!("{base}{path}"));
        async move {
            let response = client
                .put(url)
                .bearer_auth(secret)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .unwrap();
            response.status()
        }
    };
    // A token created on head A is taken by head B.
    assert_eq!(forward(b.url.clone(), secret.clone()).await, StatusCode::OK);

    let admin = trainstate_client::StateHandle::connect(&a.url, Some(HEAD_TOKEN.into())).unwrap();
    admin.revoke_token(&id).await.unwrap();
    let revoked_at = Instant::now();
    assert_eq!(forward(a.url.clone(), secret.clone()).await, StatusCode::UNAUTHORIZED, "A at once");
    // B refuses it within the bound: it reads the tokens every 500 ms.
    loop {
        let status = forward(b.url.clone(), secret.clone()).await;
        if status == StatusCode::UNAUTHORIZED {
            break;
        }
        assert_eq!(status, StatusCode::OK);
        assert!(
            revoked_at.elapsed() < Duration::from_secs(1),
            "head B still takes a token revoked on head A {:?} ago",
            revoked_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.stop().await;
    b.stop().await;
}
