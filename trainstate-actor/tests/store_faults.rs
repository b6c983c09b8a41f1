//! A store in trouble (items 1 and 15 of docs/reliability.md): a full
//! disk, failed commits, a head whose state actor is given up on, damaged
//! stores, backups.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use reqwest::{Client, Method, StatusCode};
use serde_json::Value;
use trainstate_actor::{Faults, launch_state_actor};
use trainstate_client::{StateError, StatusUpdate};
use trainstate_schema::RunId;

use crate::common::{Head, eventually, run, run_with, serve};
use crate::contract::send_json as send;
use crate::process::without_heartbeat;
use crate::stores::on_both_stores;

const T0: u64 = 1_760_000_000_000;

/// A guard on a wait that must end by itself; not a margin the test needs.
const HANG: Duration = Duration::from_secs(60);

/// Starts a head on `dir` with `extra` flags and `env`, and waits for
/// `listening on`; or its exit status and what it logged if it exits first.
fn start(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Result<Head, (ExitStatus, String)> {
    env.iter()
        .fold(serve(dir).args(extra), |serve, (name, value)| serve.env(name, value))
        .start()
        .map_err(|refused| (refused.status, refused.log))
}

async fn register(client: &Client, head: &str, name: &str, i: u64) -> (StatusCode, Value, RunId) {
    let id = RunId::new_v7();
    let run = run_with(&id, name, "disk", T0 + i, 8);
    let url = format!("{head}/api/train/runs");
    let (status, body) =
        send(client, Method::POST, &url, Some(&serde_json::to_value(&run).unwrap())).await;
    (status, body, id)
}

async fn metric(client: &Client, head: &str, name: &str) -> f64 {
    let text = client.get(format!("{head}/metrics")).send().await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no metric {name} in {text}"))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// A small tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "mount -t tmpfs failed: {status}");
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}

/// Fills the file system of `path` until it has no room left (ENOSPC).
fn fill(path: &Path) -> u64 {
    let mut file = std::fs::File::create(path).unwrap();
    let chunk = vec![0x5au8; 4096];
    let mut written = 0u64;
    loop {
        match file.write_all(&chunk).and_then(|()| file.sync_data()) {
            Ok(()) => written += chunk.len() as u64,
            Err(err) if err.raw_os_error() == Some(28) => return written,
            Err(err) => panic!("filling {}: {err}", path.display()),
        }
    }
}

/// Item 1: a full disk. While the store cannot write, writes get a clear
/// 503 and reads, `/healthz` and `/metrics` are served; once space returns,
/// writes succeed again with no restart of the state actor (the old head
/// restarted it on every failed commit and gave up for good after 10); every
/// acknowledged run survives SIGKILL, and no refused one was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_full_disk_answers_writes_503_serves_reads_and_recovers_without_a_restart() {
    if !is_root() {
        assert_ne!(
            std::env::var("CI").as_deref(),
            Ok("true"),
            "CI runs as root: this test must run there, not skip"
        );
        eprintln!("skipped: mounting a tmpfs needs root");
        return;
    }
    let tmpfs = Tmpfs::mount("8m");
    let data = tmpfs.path().join("data");
    let client = Client::new();
    let mut head = start(&data, &[], &[]).unwrap();
    let url = head.url.clone();

    let mut acknowledged: Vec<Value> = Vec::new();
    for i in 0..20 {
        let (status, body, _) = register(&client, &url, &format!("before{i}"), i).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        acknowledged.push(body["run"].clone());
    }

    // The disk fills up. SQLite may still reuse room in its WAL for a
    // while: writes go on (each either acknowledged or refused) until one
    // is refused.
    let filler = tmpfs.path().join("filler");
    fill(&filler);
    let mut refused: Vec<(RunId, Value)> = Vec::new();
    let deadline = Instant::now() + HANG;
    let mut i = 100;
    while refused.is_empty() {
        assert!(Instant::now() < deadline, "no write was refused on a full disk");
        let (status, body, id) = register(&client, &url, &format!("full{i}"), i).await;
        match status {
            StatusCode::CREATED => acknowledged.push(body["run"].clone()),
            StatusCode::SERVICE_UNAVAILABLE => refused.push((id, body)),
            other => panic!("{other}: {body}"),
        }
        i += 1;
    }
    let after_fill = acknowledged.len() - 20;
    // More failed commits than the old restart budget (10 in 10 s).
    let full_since = Instant::now();
    for _ in 0..30 {
        let (status, body, id) = register(&client, &url, &format!("full{i}"), i).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        refused.push((id, body));
        i += 1;
    }
    for (_, body) in &refused {
        assert_eq!(body["error"]["code"], "unavailable", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("the store cannot write"), "{message}");
        assert!(message.contains("nothing of this request was written"), "{message}");
    }
    // Reads are served meanwhile, and say what is going on.
    let first = acknowledged[0]["id"].as_str().unwrap().to_owned();
    let (status, body) =
        send(&client, Method::GET, &format!("{url}/api/train/runs/{first}"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = send(&client, Method::GET, &format!("{url}/api/train/runs"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["total"].as_u64().unwrap() as usize, acknowledged.len());
    let (status, body) = send(&client, Method::GET, &format!("{url}/healthz"), None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(metric(&client, &url, "trainstate_store_writable").await, 0.0);
    assert!(metric(&client, &url, "trainstate_store_commit_failures_total").await >= 31.0);

    let full_for = full_since.elapsed();
    // Space returns: the next write succeeds, by itself, with no restart.
    std::fs::remove_file(&filler).unwrap();
    let freed = Instant::now();
    let (status, body, _) = register(&client, &url, "after", i).await;
    eprintln!(
        "measured: {after_fill} writes acknowledged after the disk filled, then {} refused \
         (30 in {full_for:?}); the first write after space returned answered {status} in {:?}",
        refused.len(),
        freed.elapsed()
    );
    assert_eq!(status, StatusCode::CREATED, "{body}");
    acknowledged.push(body["run"].clone());
    assert_eq!(metric(&client, &url, "trainstate_store_writable").await, 1.0);
    assert_eq!(metric(&client, &url, "trainstate_state_actor_restarts_total").await, 0.0);
    let log = head.log();
    assert!(log.contains("store commit failed"), "{log}");
    assert!(!log.contains("restarting it from the store"), "{log}");

    // Everything acknowledged is stored; nothing refused is.
    head.signal("-KILL");
    head.wait();
    let head = start(&data, &[], &[]).unwrap();
    for run in &acknowledged {
        let id = run["id"].as_str().unwrap();
        let (status, body) =
            send(&client, Method::GET, &format!("{}/api/train/runs/{id}", head.url), None).await;
        assert_eq!(status, StatusCode::OK, "{id}: {body}");
        assert_eq!(without_heartbeat(body), without_heartbeat(run.clone()));
    }
    for (id, _) in &refused {
        let (status, body) =
            send(&client, Method::GET, &format!("{}/api/train/runs/{id}", head.url), None).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "a refused write was stored: {body}");
    }
    drop(head);
}

/// Item 1: a failed commit costs no restart, refuses what was decided on
/// it (a status on the run it failed to register), and writes work at once
/// after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_failed_commit_costs_no_restart_and_what_was_decided_on_it_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let config = trainstate_actor::StateConfig::sqlite(dir.path().join("state.db"))
        .with_name(crate::common::unique_name("failed_commit"))
        .with_faults(faults.clone());
    let service = launch_state_actor(config).await.unwrap();
    let state = service.handle().with_timeout(Duration::from_secs(30));
    let kept = run("kept", T0);
    state.register(kept.clone()).await.unwrap();

    // Both are decided before the commit of the first fails.
    faults.hold_writer();
    faults.fail_next_commit();
    let lost = run("lost", T0 + 1);
    let lost_id = lost.id().clone();
    let first = tokio::spawn({
        let state = state.clone();
        async move { state.register(lost).await }
    });
    eventually("the registration in flight", HANG, || {
        std::future::ready(service.in_flight_writes() == 1)
    })
    .await;
    let second = tokio::spawn({
        let (state, id) = (state.clone(), lost_id.clone());
        async move { state.set_status(id, StatusUpdate::finished().ended_at(T0 + 10)).await }
    });
    eventually("the status in flight", HANG, || {
        std::future::ready(service.in_flight_writes() == 2)
    })
    .await;
    faults.release_writer();
    match first.await.unwrap() {
        Err(StateError::Unavailable { reason }) => {
            assert!(reason.contains("the store cannot write"), "{reason}");
            assert!(reason.contains("nothing of this request was written"), "{reason}");
        }
        other => panic!("a failed commit must not be acknowledged: {other:?}"),
    }
    match second.await.unwrap() {
        Err(StateError::Unavailable { reason }) => {
            assert!(reason.contains("nothing of this request was written"), "{reason}");
            assert!(reason.contains("database or disk is full"), "says why: {reason}");
        }
        other => panic!("a write decided on a failed one must be refused: {other:?}"),
    }
    assert!(!service.store_writable());

    // At once, with no restart: the working state is the committed one.
    assert!(matches!(
        state.set_status(lost_id.clone(), StatusUpdate::finished().ended_at(T0 + 10)).await,
        Err(StateError::NotFound { .. })
    ));
    let after = run("after", T0 + 2);
    state.register(after.clone()).await.unwrap();
    assert!(service.store_writable());
    state.get(kept.id().clone()).await.unwrap();
    state.get(after.id().clone()).await.unwrap();
    assert!(matches!(state.get(lost_id.clone()).await, Err(StateError::NotFound { .. })));
    assert_eq!(service.actor_restarts(), 0);
    assert_eq!(service.store_stats().failures.load(Ordering::SeqCst), 1);
    service.shutdown().await;

    // And the store holds exactly what was acknowledged.
    let service = launch_state_actor(
        trainstate_actor::StateConfig::sqlite(dir.path().join("state.db"))
            .with_name(crate::common::unique_name("failed_commit")),
    )
    .await
    .unwrap();
    let state = service.handle();
    state.get(kept.id().clone()).await.unwrap();
    state.get(after.id().clone()).await.unwrap();
    assert!(matches!(state.get(lost_id).await, Err(StateError::NotFound { .. })));
    service.shutdown().await;
}

/// Item 1, under concurrency: with commits failing now and then while 8
/// clients register runs and finish them, every acknowledged write is
/// stored and no refused one is (a finish refused leaves its run live), in
/// the view and after a restart from the store; and the actor never
/// restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_failed_commits_amid_concurrent_writes_store_exactly_what_was_acknowledged() {
    use trainstate_client::RunQuery;
    use trainstate_schema::RunStatus;

    let dir = tempfile::tempdir().unwrap();
    let faults = Arc::new(Faults::default());
    let path = dir.path().join("state.db");
    let name = crate::common::unique_name("concurrent_failures");
    let config = trainstate_actor::StateConfig::sqlite(&path)
        .with_name(name.clone())
        .with_faults(faults.clone());
    let service = Arc::new(launch_state_actor(config).await.unwrap());
    let state = service.handle().with_timeout(Duration::from_secs(30));

    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Fails a commit after every 15 committed writes.
    let injector = tokio::spawn({
        let (service, faults, done) = (service.clone(), faults.clone(), done.clone());
        async move {
            let stats = service.store_stats();
            while !done.load(Ordering::SeqCst) {
                let at = stats.writes.load(Ordering::SeqCst);
                faults.fail_next_commit();
                while !done.load(Ordering::SeqCst) && stats.writes.load(Ordering::SeqCst) < at + 15
                {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        }
    });
    let clients: Vec<_> = (0..8u64)
        .map(|client| {
            let state = state.clone();
            tokio::spawn(async move {
                // (id, registration acknowledged, finish acknowledged)
                let mut outcomes = Vec::new();
                for i in 0..40 {
                    let r = run(&format!("c{client}-{i}"), T0 + client * 100 + i);
                    let id = r.id().clone();
                    let registered = match state.register(r).await {
                        Ok(_) => true,
                        Err(StateError::Unavailable { .. }) => false,
                        Err(other) => panic!("{other:?}"),
                    };
                    let finished = registered
                        && match state
                            .set_status(id.clone(), StatusUpdate::finished().ended_at(T0 + 10_000))
                            .await
                        {
                            Ok(_) => true,
                            Err(StateError::Unavailable { .. }) => false,
                            Err(other) => panic!("{other:?}"),
                        };
                    outcomes.push((id, registered, finished));
                }
                outcomes
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for client in clients {
        outcomes.extend(client.await.unwrap());
    }
    done.store(true, Ordering::SeqCst);
    injector.await.unwrap();
    let failures = service.store_stats().failures.load(Ordering::SeqCst);
    assert!(failures >= 5, "only {failures} commits failed");
    assert!(outcomes.iter().any(|(_, registered, _)| !registered));
    assert!(outcomes.iter().any(|(_, registered, finished)| *registered && !*finished));
    assert_eq!(service.actor_restarts(), 0);

    let check = |stored: std::collections::HashMap<String, RunStatus>, when: &str| {
        for (id, registered, finished) in &outcomes {
            let found = stored.get(id.as_str());
            match (registered, finished) {
                (false, _) => assert_eq!(found, None, "{when}: refused registration {id} stored"),
                (true, true) => assert_eq!(found, Some(&RunStatus::Finished), "{when}: {id}"),
                (true, false) => assert!(
                    found.is_some_and(|s| !s.is_terminal()),
                    "{when}: refused finish of {id} stored, or the run lost: {found:?}"
                ),
            }
        }
        assert_eq!(
            stored.len(),
            outcomes.iter().filter(|(_, registered, _)| *registered).count(),
            "{when}"
        );
    };
    let listed =
        |page: trainstate_client::RunPage| -> std::collections::HashMap<String, RunStatus> {
            page.runs
                .iter()
                .map(|doc| {
                    let run: trainstate_schema::TrainRunInfo =
                        serde_json::from_str(doc.body().as_ref()).unwrap();
                    (run.id().to_string(), run.status())
                })
                .collect()
        };
    check(listed(state.list(RunQuery::all()).await.unwrap()), "served");
    service.shutdown().await;
    let service = launch_state_actor(trainstate_actor::StateConfig::sqlite(&path).with_name(name))
        .await
        .unwrap();
    check(listed(service.handle().list(RunQuery::all()).await.unwrap()), "stored");
    service.shutdown().await;
}

/// Item 1: a head whose supervisor gives up on the state actor (it failed
/// too often) logs why and exits non-zero, so that a service manager
/// restarts it (it used to stay up answering 503 to everything, and exit 0
/// on SIGTERM).
#[test]
fn regression_a_head_whose_state_actor_is_given_up_on_logs_why_and_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let mut head =
        start(dir.path(), &[], &[("TRAINSTATE_FAULTS", "panic-on-every-write")]).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = Client::new();
    let url = head.url.clone();
    // Every write panics the actor; the 11th failure within 10 s gives up.
    let answered = runtime.block_on(async {
        let mut answered = 0;
        for i in 0..100 {
            let run = run_with(&RunId::new_v7(), &format!("p{i}"), "job", T0 + i, 2);
            let sent = client
                .post(format!("{url}/api/train/runs"))
                .header("content-type", "application/json")
                .body(serde_json::to_vec(&run).unwrap())
                .send()
                .await;
            let Ok(response) = sent else { break };
            assert_ne!(response.status(), StatusCode::CREATED, "the fault was not injected");
            answered += 1;
        }
        answered
    });
    assert!(answered >= 11, "the head stopped after {answered} writes");
    let status = head.wait();
    assert!(!status.success(), "a head given up on must exit non-zero: {status}");
    let log = head.wait_for_log("was given up on", 1);
    assert!(log.contains("giving up on the state actor"), "{log}");
    assert!(log.contains("failed 11 times within 10s"), "{log}");
    assert!(log.contains("injected fault"), "the reason names the last failure: {log}");
}

/// Writes `runs` through a head on `dir`, then stops it with SIGTERM.
async fn store_runs(dir: &Path, names: &[&str]) -> Vec<String> {
    let client = Client::new();
    let mut head = start(dir, &[], &[]).unwrap();
    let mut ids = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let (status, body, id) = register(&client, &head.url, name, i as u64).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        ids.push(id.to_string());
    }
    head.signal("-TERM");
    assert!(head.wait().success());
    ids
}

fn db(dir: &Path) -> PathBuf {
    dir.join("trainstate.db")
}

/// Item 15: a damaged row no longer refuses the store with a message that
/// names no run: the refusal names it and says how to start anyway;
/// `--quarantine-corrupt` moves it aside (kept in `quarantined_runs`),
/// logs it, and starts with the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_a_corrupt_row_is_named_and_quarantine_starts_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let ids = store_runs(dir.path(), &["good", "truncated", "wrong-shape"]).await;
    let damaged = [
        (&ids[1], r#"{"id": "cut off"#.to_owned()),
        (&ids[2], r#"{"id": 7, "workers": "none"}"#.to_owned()),
    ];
    {
        let conn = rusqlite::Connection::open(db(dir.path())).unwrap();
        for (id, json) in &damaged {
            conn.execute("UPDATE runs SET json = ?2 WHERE id = ?1", [id.as_str(), json]).unwrap();
        }
    }
    // The head listens before it loads its runs (issue 15): the refusal
    // comes after `listening on`, as a non-zero exit with the same message.
    let mut refused = start(dir.path(), &[], &[]).expect("listens, then loads");
    let status = refused.wait();
    assert!(!status.success());
    let log = refused.wait_for_log("--quarantine-corrupt", 1);
    drop(refused);
    assert!(log.contains(&format!("run {}", ids[1])), "names the run: {log}");
    assert!(log.contains("1 more run(s) do not load"), "{log}");
    assert!(log.contains("--quarantine-corrupt"), "says how to start anyway: {log}");
    assert!(!log.contains("panicked"), "{log}");
    // Refusing changed nothing.
    let conn = rusqlite::Connection::open(db(dir.path())).unwrap();
    let count: i64 = conn.query_row("SELECT count(*) FROM runs", [], |r| r.get(0)).unwrap();
    assert_eq!(count, 3);
    drop(conn);

    let head = start(dir.path(), &["--quarantine-corrupt"], &[]).unwrap();
    let log = head.wait_for_log("moved aside into the quarantine table", 1);
    let client = Client::new();
    let (status, _) =
        send(&client, Method::GET, &format!("{}/api/train/runs/{}", head.url, ids[0]), None).await;
    assert_eq!(status, StatusCode::OK);
    for (id, _) in &damaged {
        assert!(log.contains(id.as_str()), "logs each run moved aside: {log}");
        let (status, _) =
            send(&client, Method::GET, &format!("{}/api/train/runs/{id}", head.url), None).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }
    drop(head);
    // Kept, not deleted: the damaged rows as they were, with why.
    let conn = rusqlite::Connection::open(db(dir.path())).unwrap();
    for (id, json) in &damaged {
        let (kept, reason): (String, String) = conn
            .query_row(
                "SELECT json, reason FROM quarantined_runs WHERE id = ?1",
                [id.as_str()],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        assert_eq!(&kept, json);
        assert!(!reason.is_empty());
    }
    // The next start needs no flag.
    start(dir.path(), &[], &[]).expect("starts once the damaged runs are aside");
}

/// Item 15: a store file emptied (0 bytes) or removed in a data directory
/// that a head served from no longer starts empty without a word: it is
/// refused, naming the file and the way to proceed deliberately.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_an_emptied_store_in_a_used_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    store_runs(dir.path(), &["precious"]).await;
    std::fs::File::create(db(dir.path())).unwrap().set_len(0).unwrap();
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.path().join(format!("trainstate.db{suffix}")));
    }
    let (status, log) = start(dir.path(), &[], &[]).expect_err("an emptied store is refused");
    assert!(!status.success());
    assert!(log.contains("trainstate.db is empty (0 bytes)"), "{log}");
    assert!(log.contains("--allow-empty-store"), "{log}");
    assert_eq!(std::fs::metadata(db(dir.path())).unwrap().len(), 0, "refusing changed nothing");

    std::fs::remove_file(db(dir.path())).unwrap();
    let (_, log) = start(dir.path(), &[], &[]).expect_err("a removed store is refused");
    assert!(log.contains("trainstate.db is missing"), "{log}");

    let head = start(dir.path(), &["--allow-empty-store"], &[]).unwrap();
    let log = head.wait_for_log("--allow-empty-store", 1);
    assert!(log.contains("starting an empty store"), "{log}");
    drop(head);
    // A directory never served from starts without a word.
    let fresh = tempfile::tempdir().unwrap();
    start(fresh.path(), &[], &[]).expect("a new directory starts");
}

on_both_stores! {
    /// Item 15, on both stores: the load error names the run; quarantine
    /// moves it aside and starts.
    async fn regression_a_corrupt_run_is_named_by_the_load_error(store) {
        let fresh = store.fresh("corrupt_named").await;
        let service = launch_state_actor(fresh.config()).await.unwrap();
        let good = run("good", T0);
        let bad = run("bad", T0 + 1);
        service.handle().register(good.clone()).await.unwrap();
        service.handle().register(bad.clone()).await.unwrap();
        service.shutdown().await;
        let bad_id = bad.id().to_string();
        match fresh.url() {
            None => {
                let conn = rusqlite::Connection::open(fresh.sqlite_path()).unwrap();
                conn.execute("UPDATE runs SET json = 'not json' WHERE id = ?1", [&bad_id]).unwrap();
            }
            Some(url) => {
                crate::stores::connect(url)
                    .await
                    .execute("UPDATE trainstate_runs SET json = 'not json' WHERE id = $1", &[&bad_id])
                    .await
                    .unwrap();
            }
        }
        let message = launch_state_actor(fresh.config()).await.unwrap_err().to_string();
        assert!(message.contains(&format!("run {bad_id} does not load")), "{message}");
        assert!(message.contains("--quarantine-corrupt"), "{message}");
        assert!(!message.contains("panicked"), "{message}");

        let service =
            launch_state_actor(fresh.config().with_quarantine_corrupt(true)).await.unwrap();
        service.handle().get(good.id().clone()).await.unwrap();
        assert!(matches!(
            service.handle().get(bad.id().clone()).await,
            Err(StateError::NotFound { .. })
        ));
        service.shutdown().await;
    }
}

/// Item 15 (backups): `trainstate backup` copies the store of a running
/// head consistently (what is still in its WAL included); the copy, put in
/// place in another directory, starts with every acknowledged run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backup_of_a_running_head_restores_every_acknowledged_run() {
    let dir = tempfile::tempdir().unwrap();
    let client = Client::new();
    let head = start(dir.path(), &[], &[]).unwrap();
    let mut acknowledged = Vec::new();
    for i in 0..25 {
        let (status, body, _) = register(&client, &head.url, &format!("b{i}"), i).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        acknowledged.push(body["run"].clone());
    }
    let copy = dir.path().join("copy.db");
    let output = Command::new(env!("CARGO_BIN_EXE_trainstate"))
        .args(["backup", "--data-dir"])
        .arg(dir.path())
        .arg(&copy)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{printed} {}", String::from_utf8_lossy(&output.stderr));
    assert!(printed.contains("backed up 25 runs"), "{printed}");
    // It never overwrites.
    let again = Command::new(env!("CARGO_BIN_EXE_trainstate"))
        .args(["backup", "--data-dir"])
        .arg(dir.path())
        .arg(&copy)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("refusing to overwrite"));
    drop(head);

    let restored = tempfile::tempdir().unwrap();
    std::fs::copy(&copy, db(restored.path())).unwrap();
    let head = start(restored.path(), &[], &[]).unwrap();
    for run in &acknowledged {
        let id = run["id"].as_str().unwrap();
        let (status, body) =
            send(&client, Method::GET, &format!("{}/api/train/runs/{id}", head.url), None).await;
        assert_eq!(status, StatusCode::OK, "{id}: {body}");
        assert_eq!(without_heartbeat(body), without_heartbeat(run.clone()));
    }
}

/// The number after `name=` in a log line.
fn logged_count(line: &str, name: &str) -> u64 {
    let at = line.find(&format!("{name}=")).unwrap_or_else(|| panic!("no {name} in {line}"));
    let digits: String =
        line[at + name.len() + 1..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|_| panic!("no count after {name} in {line}"))
}

/// Round two, finding 11: a PostgreSQL outage logged one line per failed
/// write (2,919 in 20 s), each saying only "db error". A database that
/// refuses every commit (a trigger raises) now gets one line at once and
/// then at most one per 5 s, with PostgreSQL's message, and the lines
/// count the failed writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(not(has_postgres), ignore = "needs TRAINSTATE_TEST_POSTGRES_URL")]
async fn regression_a_postgresql_outage_logs_one_line_per_interval_with_the_count() {
    let url = crate::stores::postgres_url();
    let url = crate::stores::fresh_schema(&url).await;
    let dir = tempfile::tempdir().unwrap();
    let head = start(dir.path(), &["--store", &url], &[]).unwrap();
    let client = Client::new();
    let (status, body, _) = register(&client, &head.url, "before", 0).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    let db = crate::stores::connect(&url).await;
    db.batch_execute(
        "CREATE FUNCTION outage() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'simulated outage'; END $$; \
         CREATE TRIGGER outage BEFORE INSERT OR UPDATE OR DELETE ON trainstate_runs \
         FOR EACH STATEMENT EXECUTE FUNCTION outage();",
    )
    .await
    .unwrap();
    let started = Instant::now();
    // Writes fail until a second line has come (one interval on).
    let failure_lines =
        |log: &str| log.lines().filter(|l| l.contains("store commit failed")).count();
    let mut refused = 0;
    while failure_lines(&head.log()) < 2 {
        assert!(started.elapsed() < HANG, "no second line: {}", head.log());
        let (status, body, _) =
            register(&client, &head.url, &format!("down{refused}"), refused + 1).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        refused += 1;
    }
    let elapsed = started.elapsed();
    db.batch_execute("DROP TRIGGER outage ON trainstate_runs").await.unwrap();
    // A write decided on the last failure may still be refused; then one commits.
    let deadline = Instant::now() + HANG;
    let mut i = 1_000_000;
    loop {
        i += 1;
        let (status, body, _) = register(&client, &head.url, &format!("up{i}"), i).await;
        if status == StatusCode::CREATED {
            break;
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(Instant::now() < deadline, "the store never committed again");
    }
    let log = head.wait_for_log("the store commits again", 1);
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("store commit failed")).collect();
    assert!(!lines.is_empty(), "the outage was never logged: {log}");
    assert!(lines[0].contains("simulated outage"), "PostgreSQL's message: {}", lines[0]);
    assert!(logged_count(lines[1], "failed_writes") > 1, "the second line counts: {}", lines[1]);
    // One line at once, then one per 5 s (and one more for a window cut short).
    let most = 2 + (elapsed.as_secs() / 5) as usize;
    assert!(lines.len() <= most, "{} lines in {elapsed:?}:\n{}", lines.len(), lines.join("\n"));
    let recovered = log.lines().find(|l| l.contains("the store commits again")).unwrap();
    eprintln!(
        "measured: {refused} writes refused in {elapsed:?}, logged as:\n{}\n{recovered}",
        lines.join("\n")
    );
    let counted = lines.iter().map(|l| logged_count(l, "failed_writes")).sum::<u64>()
        + logged_count(recovered, "failed_writes_not_yet_logged");
    // Writes decided on a failure are refused without a commit, and are
    // not counted as failed commits' writes.
    assert!((1..=refused).contains(&counted), "{counted} of {refused} refused: {log}");
}
