//! Leases on a monotonic clock: a frozen head, a stepped wall clock or a
//! late sweep aborts no healthy run, on one head or on a shared store
//! (see docs/reliability.md).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use reqwest::{Client, Method, StatusCode};
use trainstate_actor::{ManualClock, StateConfig, launch_state_actor};
use trainstate_client::Join;
use trainstate_schema::{RunId, RunStatus};

use crate::common::start_head;
use crate::common::{run_with, unique_name, workers};
use crate::contract::{check_answer, send_json as send};

const T0: u64 = 1_760_000_000_000;

/// Ends a hung test; never a margin a passing run depends on.
const HANG: Duration = Duration::from_secs(60);

/// An in-memory head on a manual clock, whose periodic sweep does not run
/// during the test unless `sweep_every` says so: the tests sweep.
fn manual(what: &str, clock: &Arc<ManualClock>, sweep_every: Duration) -> StateConfig {
    StateConfig::in_memory()
        .with_name(unique_name(what))
        .with_clock(clock.clone())
        .with_lease(Duration::from_secs(60))
        .with_sweep_interval(sweep_every)
}

/// A real head, frozen with SIGSTOP for five of its 2 s leases while its
/// runs' controllers keep heartbeating (their requests wait in the
/// kernel), then resumed: its sweep comes late, so it knows it was not
/// running and gives every live run a fresh lease instead of aborting it.
/// The freeze is the scenario, not a margin: a longer one only makes the
/// test stronger.
#[test]
fn regression_a_frozen_head_keeps_its_healthy_runs_alive() {
    const LEASE: Duration = Duration::from_secs(2);
    const FROZEN: Duration = Duration::from_secs(10);
    let dir = tempfile::tempdir().unwrap();
    let head = start_head(dir.path(), &["--lease", "2s"]).unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = Client::builder().timeout(HANG).build().unwrap();
    let base = head.url.clone();

    let ids: Vec<RunId> = (0..3).map(|_| RunId::new_v7()).collect();
    runtime.block_on(async {
        for (i, id) in ids.iter().enumerate() {
            let run =
                serde_json::to_value(run_with(id, &format!("healthy{i}"), "job1", T0, 4)).unwrap();
            let url = format!("{base}/api/train/runs");
            let (status, body) = send(&client, Method::POST, &url, Some(&run)).await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
            assert_eq!(body["lease_ms"], LEASE.as_millis() as u64);
        }
    });

    // Each run's controller heartbeats every 200 ms, before, during and
    // after the freeze, and notes every answer.
    let stop = Arc::new(AtomicBool::new(false));
    let accepted_before = Arc::new(AtomicUsize::new(0));
    let accepted_after_resume = Arc::new(AtomicUsize::new(0));
    let resumed = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let beaters: Vec<_> = ids
        .iter()
        .map(|id| {
            let url = format!("{base}/api/train/runs/{id}/heartbeat");
            let (client, stop, before, accepted, resumed, refused) = (
                client.clone(),
                stop.clone(),
                accepted_before.clone(),
                accepted_after_resume.clone(),
                resumed.clone(),
                refused.clone(),
            );
            runtime.spawn(async move {
                while !stop.load(Ordering::SeqCst) {
                    let sent_after_resume = resumed.load(Ordering::SeqCst);
                    // A kept-alive connection whose idle timer ran out
                    // during the freeze is closed on resume: a transport
                    // error, retried like any.
                    let Ok(response) = client.post(&url).send().await else {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    };
                    let status = response.status();
                    let bytes = response.bytes().await.unwrap_or_default();
                    check_answer(&Method::POST, &url, status, &bytes);
                    let body = String::from_utf8_lossy(&bytes);
                    match status {
                        StatusCode::OK if sent_after_resume => {
                            accepted.fetch_add(1, Ordering::SeqCst);
                        }
                        StatusCode::OK => {
                            before.fetch_add(1, Ordering::SeqCst);
                        }
                        // A beat the freeze held past the head's deadline:
                        // retryable, and the next one follows.
                        StatusCode::SERVICE_UNAVAILABLE => {}
                        other => refused.lock().unwrap().push(format!("{other}: {body}")),
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            })
        })
        .collect();

    // Healthy before the freeze: every run's beats answered.
    let until = Instant::now() + HANG;
    while accepted_before.load(Ordering::SeqCst) < 2 * ids.len() {
        assert!(Instant::now() < until, "no heartbeat accepted before the freeze");
        std::thread::sleep(Duration::from_millis(10));
    }
    head.signal("-STOP");
    std::thread::sleep(FROZEN);
    resumed.store(true, Ordering::SeqCst);
    head.signal("-CONT");

    let until = Instant::now() + HANG;
    while accepted_after_resume.load(Ordering::SeqCst) < 2 * ids.len() {
        let refused = refused.lock().unwrap().clone();
        assert!(refused.is_empty(), "heartbeats refused after the freeze: {refused:?}");
        assert!(Instant::now() < until, "no heartbeat accepted after the head resumed");
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::SeqCst);
    runtime.block_on(async {
        for beater in beaters {
            beater.await.unwrap();
        }
        for id in &ids {
            let url = format!("{base}/api/train/runs/{id}");
            let (status, run) = send(&client, Method::GET, &url, None).await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(run["run_status"], "RUNNING", "a healthy run was aborted: {run}");
        }
    });
    let refused = refused.lock().unwrap();
    assert!(refused.is_empty(), "heartbeats refused: {refused:?}");

    // The head says why it renewed the leases.
    let until = Instant::now() + HANG;
    while !head.log().contains("was not running") {
        assert!(Instant::now() < until, "the head never logged that it was not running");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The wall clock stepped 120 s forward (two default leases) and back:
/// leases run on the monotonic clock, so nothing is aborted, and the runs'
/// heartbeats are accepted. What is shown stays on the wall clock.
#[tokio::test]
async fn regression_a_wall_clock_step_aborts_no_run() {
    let clock = Arc::new(ManualClock::new(T0));
    let service =
        launch_state_actor(manual("clock-step", &clock, Duration::from_secs(15))).await.unwrap();
    let state = service.handle();
    let run = run_with(&RunId::new_v7(), "stepped", "job1", T0, 4);
    let id = run.id().clone();
    state.register(run).await.unwrap();
    clock.advance_ms(10_000);
    state.heartbeat(id.clone()).await.unwrap();

    clock.step_wall_ms(120_000);
    assert_eq!(
        state.sweep_leases().await.unwrap(),
        Vec::<RunId>::new(),
        "a clock step aborted a run"
    );
    assert_eq!(state.get_run(id.clone()).await.unwrap().run_status(), RunStatus::Running);
    state.heartbeat(id.clone()).await.unwrap();
    let shown = state.get(id.clone()).await.unwrap().last_heartbeat_ms();
    assert_eq!(shown, Some(T0 + 10_000 + 120_000), "the heartbeat shown is a wall time");

    clock.step_wall_ms(-600_000);
    assert!(state.sweep_leases().await.unwrap().is_empty());
    state.heartbeat(id.clone()).await.unwrap();
    assert_eq!(state.get_run(id).await.unwrap().run_status(), RunStatus::Running);
    service.shutdown().await;
}

/// Ordinary expiry still works: a run whose controller really stops is
/// aborted once its lease has passed on the monotonic clock, with the
/// head sweeping on time (every 15 s), even while the wall clock is
/// stepped back (which, with wall-clock leases, postponed the abort).
#[tokio::test]
async fn regression_a_silent_run_is_still_aborted_when_its_lease_passes_on_the_monotonic_clock() {
    let clock = Arc::new(ManualClock::new(T0));
    let service =
        launch_state_actor(manual("expiry", &clock, Duration::from_secs(15))).await.unwrap();
    let state = service.handle();
    let silent = run_with(&RunId::new_v7(), "silent", "job1", T0, 4);
    let beating = run_with(&RunId::new_v7(), "beating", "job1", T0, 4);
    state.register(silent.clone()).await.unwrap();
    state.register(beating.clone()).await.unwrap();

    for step in 1..=6 {
        clock.advance_ms(10_000);
        if step == 3 {
            clock.step_wall_ms(-300_000);
        }
        state.heartbeat(beating.id().clone()).await.unwrap();
        assert!(state.sweep_leases().await.unwrap().is_empty(), "{}0 s: within the lease", step);
    }
    clock.advance_ms(1_000); // 61 s of silence.
    state.heartbeat(beating.id().clone()).await.unwrap();
    assert_eq!(state.sweep_leases().await.unwrap(), [silent.id().clone()]);
    let aborted = state.get_run(silent.id().clone()).await.unwrap();
    assert_eq!(aborted.run_status(), RunStatus::Aborted);
    assert!(
        aborted.status_detail().contains("stopped heartbeating"),
        "{}",
        aborted.status_detail()
    );
    assert_eq!(state.get_run(beating.id().clone()).await.unwrap().run_status(), RunStatus::Running);
    service.shutdown().await;
}

/// A sweep that comes more than two periods late shows that the head was
/// not running: every live run gets a fresh lease from then (as after a
/// restart), and so does a rendezvous group still assembling; a run that
/// stays silent is aborted one lease later, and the group completes when
/// its last rank arrives.
#[tokio::test]
async fn regression_a_late_sweep_renews_leases_instead_of_aborting() {
    let clock = Arc::new(ManualClock::new(T0));
    let service =
        launch_state_actor(manual("late-sweep", &clock, Duration::from_secs(15))).await.unwrap();
    let state = service.handle();
    let silent = run_with(&RunId::new_v7(), "silent", "job1", T0, 4);
    state.register(silent.clone()).await.unwrap();
    let group = workers(2, 2, "late-");
    let join = |rank: usize| {
        Join::new("late-key", 2, group[rank].clone(), "train", "job-7")
            .unwrap()
            .with_join_timeout(Duration::from_secs(30))
            .unwrap()
    };
    let rendezvous = state.join_rendezvous(join(0)).await.unwrap().run_id;

    for _ in 0..2 {
        clock.advance_ms(10_000);
        assert!(state.sweep_leases().await.unwrap().is_empty());
    }
    // Frozen for 100 s: no sweep ran. Both the run's lease (60 s) and the
    // group's join deadline (30 s) passed while the head could hear nothing.
    clock.advance_ms(100_000);
    assert!(state.sweep_leases().await.unwrap().is_empty(), "a late sweep aborted a run");
    assert_eq!(state.get_run(silent.id().clone()).await.unwrap().run_status(), RunStatus::Running);

    // The group was not closed: its last rank completes it.
    let complete = state.join_rendezvous(join(1)).await.unwrap();
    assert_eq!(complete.run_id, rendezvous);
    assert_eq!(state.get_run(rendezvous.clone()).await.unwrap().run_status(), RunStatus::Running);

    // The renewed lease runs out like any other, the head sweeping on time.
    for _ in 0..6 {
        clock.advance_ms(10_000);
        state.heartbeat(rendezvous.clone()).await.unwrap();
        assert!(state.sweep_leases().await.unwrap().is_empty(), "within the renewed lease");
    }
    clock.advance_ms(1_000);
    state.heartbeat(rendezvous.clone()).await.unwrap();
    assert_eq!(state.sweep_leases().await.unwrap(), [silent.id().clone()]);
    service.shutdown().await;
}

/// With a shared PostgreSQL store, a heartbeat another head received comes
/// as that head's wall time, converted on receipt to the sweeping head's
/// monotonic clock. The sweeping head's wall clock stepped 120 s ahead of
/// the other's makes that heartbeat look 150 s old; it was not in the
/// shared table at the previous sweep's read, so it is counted as heard no
/// earlier than that read, and the run it keeps alive is not aborted. The
/// silent run is, once its lease has passed on the monotonic clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_postgres), ignore = "needs TRAINSTATE_TEST_POSTGRES_URL")]
async fn regression_a_clock_step_on_the_sweeping_head_of_a_shared_store_aborts_no_healthy_run() {
    let fresh = crate::stores::Store::Postgres.fresh("clock_step_shared").await;
    let (clock_a, clock_b) = (Arc::new(ManualClock::new(T0)), Arc::new(ManualClock::new(T0)));
    let config = |name: &str, clock: &Arc<ManualClock>| {
        fresh
            .config_named(&unique_name(name))
            .with_clock(clock.clone())
            .with_sweep_interval(Duration::from_secs(15))
    };
    let a = launch_state_actor(config("a", &clock_a)).await.unwrap();
    let b = launch_state_actor(config("b", &clock_b)).await.unwrap();
    let until = Instant::now() + HANG;
    while usize::from(a.is_sweeper()) + usize::from(b.is_sweeper()) != 1 {
        assert!(Instant::now() < until, "no head took the sweep");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let ((sweeper, sweeper_clock), (other, other_clock)) =
        if a.is_sweeper() { ((a, clock_a), (b, clock_b)) } else { ((b, clock_b), (a, clock_a)) };
    let both = |ms: u64| {
        sweeper_clock.advance_ms(ms);
        other_clock.advance_ms(ms);
    };
    let beating = run_with(&RunId::new_v7(), "beating", "job1", T0, 4);
    let silent = run_with(&RunId::new_v7(), "silent", "job1", T0, 4);
    for run in [&beating, &silent] {
        other.handle().register(run.clone()).await.unwrap();
        sweeper.handle().get(run.id().clone()).await.unwrap();
    }
    // The sweeping head sweeps on time, every 10 s.
    for _ in 0..4 {
        both(10_000);
        assert!(sweeper.handle().sweep_leases().await.unwrap().is_empty());
    }
    // Heard only by the head that does not sweep; shared within a second.
    other.handle().heartbeat(beating.id().clone()).await.unwrap();
    let db = crate::stores::connect(fresh.url().unwrap()).await;
    let until = Instant::now() + HANG;
    loop {
        let row = db.query_one("SELECT count(*) FROM trainstate_heartbeats", &[]).await.unwrap();
        if row.get::<_, i64>(0) == 1 {
            break;
        }
        assert!(Instant::now() < until, "the heartbeat was never shared");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    sweeper_clock.step_wall_ms(120_000);
    both(10_000);
    assert!(sweeper.handle().sweep_leases().await.unwrap().is_empty());
    both(10_000);
    assert!(sweeper.handle().sweep_leases().await.unwrap().is_empty());
    both(10_000); // 70 s of silence; 30 s since the shared heartbeat.
    assert_eq!(sweeper.handle().sweep_leases().await.unwrap(), [silent.id().clone()]);
    let stored = sweeper.handle().get_run(beating.id().clone()).await.unwrap();
    assert_eq!(stored.run_status(), RunStatus::Running);
    sweeper.shutdown().await;
    other.shutdown().await;
}
