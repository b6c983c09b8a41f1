//! The `trainstate` binary as a child process: its lock, its signals, and
//! what survives SIGTERM and SIGKILL.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Mutex;
use trainstate_schema::RunId;

use crate::common::{run_with, start_head};
use crate::stores::{Store, on_both_stores};

const T0: u64 = 1_760_000_000_000;

#[test]
fn a_second_serve_on_the_same_directory_refuses_and_kill_9_releases_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = start_head(dir.path(), &[]).unwrap();
    let refused = start_head(dir.path(), &[]).expect_err("the second head must refuse");
    assert!(refused.contains("another trainstate serve"), "{refused}");
    assert!(refused.contains(&first.pid().to_string()), "names the holder: {refused}");
    first.kill();
    // No stale pid file: the OS released the lock with the process.
    start_head(dir.path(), &[]).expect("a restart after kill -9 starts");
}

/// Two heads of one process on one data directory: the second is refused,
/// naming the directory and the holder, and the first keeps serving.
#[tokio::test]
async fn a_second_head_in_the_same_process_on_the_same_directory_refuses() {
    use trainstate_actor::http::HttpConfig;
    use trainstate_actor::{Head, HeadConfig, StateConfig};
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("trainstate.db");
    let first = Head::start(HeadConfig::new(
        StateConfig::sqlite(&store).with_name("one-dir-first"),
        HttpConfig::default(),
    ))
    .await
    .expect("the first head starts");
    let refused = Head::start(HeadConfig::new(
        StateConfig::sqlite(&store).with_name("one-dir-second"),
        HttpConfig::default(),
    ))
    .await
    .expect_err("the second head must refuse");
    let refused = refused.to_string();
    assert!(refused.contains(&dir.path().display().to_string()), "names the directory: {refused}");
    assert!(refused.contains("another head of this process"), "names the holder: {refused}");
    assert!(refused.contains(&std::process::id().to_string()), "names the holder: {refused}");
    let health = reqwest::get(format!("{}/healthz", first.url())).await.unwrap();
    assert_eq!(health.status(), reqwest::StatusCode::OK, "the first head keeps serving");
    // Another store file in the same directory has a lock of its own.
    let beside = Head::start(HeadConfig::new(
        StateConfig::sqlite(dir.path().join("other.db")).with_name("one-dir-beside"),
        HttpConfig::default(),
    ))
    .await
    .expect("a head of another store file in the directory starts");
    assert!(dir.path().join("other.db.lock").exists());
    beside.shutdown().await.unwrap();
    first.shutdown().await.expect("the first head stops cleanly");
    // Released with the head: a third starts.
    let third = Head::start(HeadConfig::new(
        StateConfig::sqlite(&store).with_name("one-dir-third"),
        HttpConfig::default(),
    ))
    .await
    .expect("a head after the first stopped starts");
    third.shutdown().await.unwrap();
}

#[test]
fn listening_beyond_loopback_without_a_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_trainstate"))
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    assert!(!child.wait().unwrap().success());
    assert!(stderr.contains("refusing to listen on 0.0.0.0"), "{stderr}");
    assert!(stderr.contains("--insecure"), "{stderr}");
}

/// Registers runs concurrently until told to stop; returns each
/// acknowledged run as the head answered it.
async fn burst(url: String, acknowledged: Arc<Mutex<Vec<Value>>>, started: Arc<AtomicUsize>) {
    let client = reqwest::Client::new();
    let tasks: Vec<_> = (0..8)
        .map(|worker| {
            let (client, url, acknowledged, started) =
                (client.clone(), url.clone(), acknowledged.clone(), started.clone());
            tokio::spawn(async move {
                for i in 0..10_000u64 {
                    started.fetch_add(1, Ordering::SeqCst);
                    let run =
                        run_with(&RunId::new_v7(), &format!("w{worker}-{i}"), "burst", T0 + i, 8);
                    let url = format!("{url}/api/train/runs");
                    let answer = client
                        .post(&url)
                        .header("content-type", "application/json")
                        .body(serde_json::to_vec(&run).unwrap())
                        .send()
                        .await;
                    let Ok(answer) = answer else { return };
                    let status = answer.status();
                    // The head may die mid-answer: only a whole answer counts.
                    let Ok(bytes) = answer.bytes().await else { return };
                    crate::contract::check_answer(&reqwest::Method::POST, &url, status, &bytes);
                    if status != 201 {
                        return;
                    }
                    let body: Value = serde_json::from_slice(&bytes).unwrap();
                    acknowledged.lock().await.push(body["run"].clone());
                }
            })
        })
        .collect();
    for task in tasks {
        let _ = task.await;
    }
}

pub(crate) fn without_heartbeat(mut run: Value) -> Value {
    run.as_object_mut().unwrap().remove("last_heartbeat_ms");
    // A live run's goodput is served counted to the moment of the read.
    if run["end_time_ms"].is_null() {
        run.as_object_mut().unwrap().remove("goodput");
    }
    run
}

/// Starts a burst of writes, stops the head with `signal` once some are
/// acknowledged, restarts it, and checks every acknowledged run.
async fn every_acknowledged_write_survives(signal: &str, store: Store) {
    let fresh = store.fresh("burst").await;
    let dir = fresh.dir();
    let store_args: Vec<&str> = fresh.url().map(|url| vec!["--store", url]).unwrap_or_default();
    let mut head = start_head(dir, &store_args).unwrap();
    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    let started = Arc::new(AtomicUsize::new(0));
    let writer = tokio::spawn(burst(head.url.clone(), acknowledged.clone(), started.clone()));
    let deadline = Instant::now() + Duration::from_secs(60);
    while acknowledged.lock().await.len() < 300 {
        assert!(Instant::now() < deadline, "the burst made no progress");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    head.signal(signal);
    let status = head.wait();
    writer.await.unwrap();
    if signal == "-TERM" {
        assert!(status.success(), "SIGTERM exits 0 after draining: {status}");
    }
    let acknowledged = acknowledged.lock().await.clone();
    assert!(
        started.load(Ordering::SeqCst) > acknowledged.len(),
        "writes were in flight at the signal"
    );

    let head = start_head(dir, &store_args).unwrap();
    let client = reqwest::Client::new();
    let url = format!("{}/api/train/v2/runs", head.url);
    let (status, stored) =
        crate::contract::send(&client, reqwest::Method::GET, &url, None, None).await;
    assert_eq!(status, 200);
    let stored: std::collections::HashMap<String, Value> = stored["train_runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| {
            // Nothing partial: every stored run is a whole, valid run.
            serde_json::from_value::<trainstate_schema::TrainRunInfo>(run.clone()).unwrap();
            (run["id"].as_str().unwrap().to_owned(), without_heartbeat(run.clone()))
        })
        .collect();
    for run in &acknowledged {
        let id = run["id"].as_str().unwrap();
        let found = stored.get(id).unwrap_or_else(|| panic!("acknowledged run {id} was lost"));
        assert_eq!(found, &without_heartbeat(run.clone()));
    }
}

on_both_stores! {
    multi_thread:

    async fn sigterm_during_a_burst_of_writes_loses_nothing_acknowledged(store) {
        every_acknowledged_write_survives("-TERM", store).await;
    }

    async fn sigkill_during_concurrent_writes_loses_nothing_acknowledged(store) {
        every_acknowledged_write_survives("-KILL", store).await;
    }
}

/// Workers of a simulated controller, answered at once.
struct FixedGroup(Vec<trainstate_schema::TrainWorkerInfo>);

impl trainstate_manager::WorkerGroup for FixedGroup {
    fn world_size(&self) -> u32 {
        self.0.len() as u32
    }

    fn worker_info(&self, world_rank: u32) -> trainstate_manager::WorkerInfoFuture {
        let info = self.0[world_rank as usize].clone();
        Box::pin(async move { Ok(info) })
    }
}

/// A TCP relay on a loopback port of its own to whichever head is current,
/// so that a client keeps one address while heads come and go. A head
/// restarted after a kill binds a free port of its own: the killed head's
/// port may be in TIME_WAIT or taken by another process meanwhile (an
/// outgoing connection of a test running alongside, say).
pub(crate) struct Relay {
    pub(crate) url: String,
    upstream: Arc<std::sync::Mutex<String>>,
    task: tokio::task::JoinHandle<()>,
}

impl Relay {
    /// Relays to the head at `head_url` (`http://host:port`).
    pub(crate) async fn start(head_url: &str) -> Relay {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let upstream = Arc::new(std::sync::Mutex::new(String::new()));
        let target = upstream.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let to = target.lock().unwrap().clone();
                tokio::spawn(async move {
                    // No head there: the connection closes, and the client
                    // retries as it would after a refused connection.
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(&to).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        let relay = Relay { url, upstream, task };
        relay.point_to(head_url);
        relay
    }

    /// Relays new connections to the head at `head_url`.
    pub(crate) fn point_to(&self, head_url: &str) {
        let address = head_url.strip_prefix("http://").expect("an http:// head URL");
        *self.upstream.lock().unwrap() = address.to_owned();
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manager_works_over_http_and_catches_up_after_a_head_kill_9() {
    use trainstate_manager::{DatasetSpec, Delivery, ManagerConfig, TrainRunStateManager};

    let dir = tempfile::tempdir().unwrap();
    let mut head = start_head(dir.path(), &[]).unwrap();
    let relay = Relay::start(&head.url).await;
    // The test's own reads wait as long as a hung test would.
    let state = trainstate_client::StateHandle::connect(&relay.url, None)
        .unwrap()
        .with_timeout(Duration::from_secs(30));
    let config = ManagerConfig::default().with_call_timeout(Duration::from_secs(2));
    let manager = TrainRunStateManager::new(Some(state.clone()), config);
    let group = FixedGroup(crate::common::workers(4, 4, ""));
    let datasets = || [DatasetSpec::new("train", "ds-1").named("c4")];
    // Acknowledged or still pending at the call's deadline, as the machine's
    // load decides; the test waits for delivery, not for the deadline.
    let delivered = || async {
        let deadline = Instant::now() + Duration::from_secs(30);
        while manager.pending_writes() > 0 {
            assert!(Instant::now() < deadline, "the manager never delivered");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };

    let finished = manager
        .register_train_run("over-http", "job-h", "controller-h", &group, datasets(), None)
        .await
        .unwrap()
        .into_id();
    let errored = manager
        .register_train_run("fails", "job-h", "controller-h", &group, datasets(), None)
        .await
        .unwrap()
        .into_id();
    manager.errored(&errored, Some(0), "ValueError: boom", "Traceback: ...").await.unwrap();
    delivered().await;
    let stored = state.get_run(errored).await.unwrap();
    assert_eq!(stored.run_status(), trainstate_schema::RunStatus::Errored);
    assert!(stored.status_detail().starts_with("Rank 0 worker raised an error."));
    assert!(stored.status_detail().contains("ValueError: boom"));
    assert_eq!(stored.datasets()[0].dataset_name(), Some("train_c4"));

    // The head dies mid-run; training goes on and reports the end anyway.
    // Nothing can acknowledge it: the call ends at its deadline (pinned in
    // the manager's `deadlines` tests) with the write pending.
    head.kill();
    let delivery = manager.finished(&finished).await.unwrap();
    assert!(matches!(delivery, Delivery::Pending), "{delivery:?}");
    assert_eq!(manager.pending_writes(), 1);

    // A new head on the same store, on a port of its own, behind the relay.
    let head = start_head(dir.path(), &[]).unwrap();
    relay.point_to(&head.url);
    delivered().await;
    let run = state.get_run(finished).await.unwrap();
    assert_eq!(run.run_status(), trainstate_schema::RunStatus::Finished);
    assert_eq!(manager.shutdown(Duration::from_secs(5)).await, 0);
}

#[test]
fn the_cli_reads_a_head_and_says_in_one_line_when_it_cannot() {
    let dir = tempfile::tempdir().unwrap();
    let head = start_head(dir.path(), &[]).unwrap();
    let cli =
        |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_trainstate")).args(args).output().unwrap();
    let run = run_with(&RunId::new_v7(), "cli-run", "job-cli", T0, 4);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let remote = trainstate_client::StateHandle::connect(&head.url, None).unwrap();
    assert!(runtime.block_on(remote.register(run.clone())).unwrap().created);

    let listed = cli(&["runs", "list", "--url", &head.url]);
    assert!(listed.status.success());
    let table = String::from_utf8(listed.stdout).unwrap();
    assert!(table.contains("cli-run") && table.contains("RUNNING"), "{table}");
    let shown = cli(&["runs", "show", run.id().as_str(), "--url", &head.url, "--json"]);
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(shown["name"], "cli-run");
    let schema = cli(&["schema", "TrainRunInfo"]);
    let schema: Value = serde_json::from_slice(&schema.stdout).unwrap();
    assert_eq!(schema["title"], "TrainRunInfo");

    let unreachable = cli(&["runs", "list", "--url", "http://127.0.0.1:9"]);
    assert!(!unreachable.status.success());
    let stderr = String::from_utf8(unreachable.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("unreachable"), "{stderr}");
}

#[test]
fn regression_sigterm_right_after_ready_shuts_down_cleanly() {
    // The signal handlers were installed only once serving began, so a
    // SIGTERM just after the `listening on` line killed the head outright.
    let dir = tempfile::tempdir().unwrap();
    let mut head = start_head(dir.path(), &[]).unwrap();
    head.signal("-TERM");
    let status = head.wait();
    assert!(status.success(), "{status}");
}

/// Finding 3 of round two, for the manager: with a path in its URL, the
/// head's "no such route" read as "run not found", so the manager's
/// registration was refused for good and later writes registered the run
/// again and again. Now a route miss is kept and retried as an unreachable
/// head is: the registration and the end are pending, nothing is dropped,
/// and nothing reaches the head.
#[tokio::test]
async fn regression_a_manager_whose_url_reaches_no_route_keeps_its_writes() {
    use trainstate_manager::{Delivery, ManagerConfig, RunRegistration, TrainRunStateManager};

    let dir = tempfile::tempdir().unwrap();
    let head = start_head(dir.path(), &[]).unwrap();
    let misrouted =
        trainstate_client::StateHandle::connect(&format!("{}/prefix", head.url), None).unwrap();
    let config = ManagerConfig::default().with_call_timeout(Duration::from_millis(500));
    let manager = TrainRunStateManager::new(Some(misrouted), config);
    let group = FixedGroup(crate::common::workers(2, 2, ""));
    let registration =
        manager.register_train_run("misrouted", "job-m", "controller-m", &group, [], None).await;
    let Ok(RunRegistration::Pending(id)) = registration else {
        panic!("the registration is kept, not refused: {registration:?}")
    };
    let delivery = manager.finished(&id).await.unwrap();
    assert!(matches!(delivery, Delivery::Pending), "{delivery:?}");
    assert_eq!(manager.pending_writes(), 2, "both writes kept, in order");

    let state = trainstate_client::StateHandle::connect(&head.url, None).unwrap();
    assert!(
        matches!(state.get_run(id).await, Err(trainstate_client::StateError::NotFound { .. })),
        "nothing reached the head"
    );
    assert_eq!(manager.shutdown(Duration::from_millis(200)).await, 2, "nothing dropped");
}

#[test]
fn runs_show_lists_attempts_with_statuses_and_fills_the_link_templates() {
    let dir = tempfile::tempdir().unwrap();
    let head = start_head(
        dir.path(),
        &[
            "--logs-url",
            "https://logs.example/{run_id}/{rank}",
            "--metrics-url",
            "https://grafana.example/?run={run_id}",
        ],
    )
    .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let remote = trainstate_client::StateHandle::connect(&head.url, None).unwrap();
    let run = run_with(&RunId::new_v7(), "cli-v2", "job-cli", T0, 2);
    runtime.block_on(async {
        remote.register(run.clone()).await.unwrap();
        let attempt = trainstate_client::NewAttempt::new("1", T0 + 5, run.workers().to_vec());
        remote.start_attempt(run.id().clone(), attempt).await.unwrap();
        let errored = trainstate_client::StatusUpdate::errored(
            Some(1),
            trainstate_schema::CauseKind::UserError,
            "boom",
        );
        remote.set_status(run.id().clone(), errored).await.unwrap();
    });
    let shown = Command::new(env!("CARGO_BIN_EXE_trainstate"))
        .args(["runs", "show", run.id().as_str(), "--url", &head.url])
        .output()
        .unwrap();
    let text = String::from_utf8(shown.stdout).unwrap();
    assert!(shown.status.success(), "{text}");
    let id = run.id();
    assert!(text.contains(&format!("metrics         https://grafana.example/?run={id}")), "{text}");
    assert!(text.contains(&format!("https://logs.example/{id}/1")), "{text}");
    let attempts: Vec<&str> =
        text.lines().skip_while(|l| !l.starts_with("attempts")).skip(2).take(2).collect();
    assert!(attempts[0].starts_with("0") && attempts[0].contains("ABORTED"), "{text}");
    assert!(
        attempts[1].starts_with("1")
            && attempts[1].contains("ERRORED")
            && attempts[1].contains("USER_ERROR APPLICATION (rank 1)"),
        "{text}"
    );
    // The run's cause says whose fault it was: its kind, then its class.
    assert!(text.lines().any(|l| l.starts_with("cause") && l.contains("USER_ERROR")), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("class") && l.ends_with("APPLICATION (the code's fault)")),
        "{text}"
    );
}

/// Finding 11 of round two (links): `--logs-url https://logs{run_name}/`
/// was accepted, and a run named `.evil.example` linked to
/// `https://logs.evil.example/`. Now a placeholder in the scheme, host or
/// port is refused before `listening on`, naming the flag, and a run's
/// values, percent-encoded in the path, query or fragment, never change
/// the link's host.
#[test]
fn regression_a_link_template_keeps_every_link_on_the_configured_host() {
    let dir = tempfile::tempdir().unwrap();
    for (flag, template) in [
        ("--logs-url", "https://logs{run_name}/x"),
        ("--logs-url", "https://{run_id}@logs.example/x"),
        ("--metrics-url", "https://grafana.example:{pid}/x"),
    ] {
        let refused = start_head(dir.path(), &[flag, template]).expect_err("refused");
        assert!(refused.contains(flag) && refused.contains("host or port"), "{refused}");
        assert!(!refused.contains("listening on"), "{refused}");
    }
    let head = start_head(
        dir.path(),
        &[
            "--logs-url",
            "https://logs.example/{run_name}/{node_ip}",
            "--metrics-url",
            "https://grafana.example/d?run={run_name}#{run_name}",
        ],
    )
    .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let remote = trainstate_client::StateHandle::connect(&head.url, None).unwrap();
    let run = run_with(&RunId::new_v7(), ".evil.example", "job-links", T0, 2);
    runtime.block_on(remote.register(run.clone())).unwrap();
    let shown = Command::new(env!("CARGO_BIN_EXE_trainstate"))
        .args(["runs", "show", run.id().as_str(), "--url", &head.url])
        .output()
        .unwrap();
    let text = String::from_utf8(shown.stdout).unwrap();
    assert!(shown.status.success(), "{text}");
    let links: Vec<reqwest::Url> = text
        .split_whitespace()
        .filter(|word| word.starts_with("https://"))
        .map(|word| reqwest::Url::parse(word).unwrap())
        .collect();
    assert!(links.len() >= 3, "the metrics link and a logs link per worker: {text}");
    for link in &links {
        assert!(
            matches!(link.host_str(), Some("logs.example" | "grafana.example")),
            "{link} in {text}"
        );
        assert!(link.as_str().contains(".evil.example"), "the name is in the link: {link}");
    }
}

#[test]
fn a_link_template_that_names_an_unknown_placeholder_is_refused_before_listening() {
    let dir = tempfile::tempdir().unwrap();
    let refused = start_head(dir.path(), &["--logs-url", "https://logs.example/{run}"])
        .expect_err("the head refuses to start");
    assert!(refused.contains("--logs-url") && refused.contains("{run}"), "{refused}");
}

#[test]
fn the_token_commands_create_list_and_revoke_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let admin_file = dir.path().join("admin.token");
    std::fs::write(&admin_file, "admin-secret-of-the-head\n").unwrap();
    let admin_file = admin_file.to_str().unwrap().to_owned();
    let head =
        start_head(&dir.path().join("data"), &["--token-file", &admin_file, "--protect-reads"])
            .unwrap();
    let cli =
        |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_trainstate")).args(args).output().unwrap();
    let admin = ["--url", head.url.as_str(), "--token-file", admin_file.as_str()];

    // A bad scope is refused by the command line, naming the flag.
    let refused = cli(&[&["token", "create", "--scope", "owner"][..], &admin].concat());
    assert!(!refused.status.success());
    let stderr = String::from_utf8(refused.stderr).unwrap();
    assert!(stderr.contains("--scope") && stderr.contains("owner"), "{stderr}");
    // A cluster with a scope other than write is refused by the head, naming the field.
    let refused =
        cli(&[&["token", "create", "--scope", "read", "--cluster", "a"][..], &admin].concat());
    assert!(!refused.status.success());
    let stderr = String::from_utf8(refused.stderr).unwrap();
    assert!(stderr.contains("cluster"), "{stderr}");

    let created =
        cli(&[&["token", "create", "--scope", "read", "--name", "dashboard"][..], &admin].concat());
    assert!(created.status.success(), "{}", String::from_utf8_lossy(&created.stderr));
    let secret = String::from_utf8(created.stdout).unwrap().trim().to_owned();
    assert!(secret.starts_with("tsk_"), "{secret}");
    let read_file = dir.path().join("read.token");
    std::fs::write(&read_file, &secret).unwrap();
    let read_file = read_file.to_str().unwrap();
    let with_read = |args: &[&str]| {
        cli(&[args, &["--url", head.url.as_str(), "--token-file", read_file][..]].concat())
    };
    assert!(with_read(&["runs", "list"]).status.success(), "the new token reads");
    // It administers nothing.
    let listed = with_read(&["token", "list"]);
    assert!(!listed.status.success());
    assert!(String::from_utf8(listed.stderr).unwrap().contains("forbidden"));

    let listed = cli(&[&["token", "list", "--json"][..], &admin].concat());
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let token = &listed["tokens"][0];
    assert_eq!(
        (&token["name"], &token["scopes"]),
        (&serde_json::json!("dashboard"), &serde_json::json!(["read"]))
    );
    assert!(!listed.to_string().contains(&secret), "a listing never shows a secret");

    let id = token["id"].as_str().unwrap();
    let revoked = cli(&[&["token", "revoke", id][..], &admin].concat());
    assert!(revoked.status.success(), "{}", String::from_utf8_lossy(&revoked.stderr));
    let refused = with_read(&["runs", "list"]);
    assert!(!refused.status.success(), "a revoked token reads nothing");
    assert!(String::from_utf8(refused.stderr).unwrap().contains("unauthorized"));
}

#[test]
fn regression_symlinked_lock_file_is_refused_and_its_target_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let victim = dir.path().join("precious");
    std::fs::write(&victim, "keep me").unwrap();
    std::os::unix::fs::symlink(&victim, data.join("trainstate.lock")).unwrap();
    let refused = start_head(&data, &[]).expect_err("a symlinked lock file must be refused");
    assert!(refused.contains("symlink"), "{refused}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");

    // A dangling link must not create its target either.
    let data = dir.path().join("dangling");
    std::fs::create_dir(&data).unwrap();
    let target = dir.path().join("created-by-accident");
    std::os::unix::fs::symlink(&target, data.join("trainstate.lock")).unwrap();
    let refused = start_head(&data, &[]).expect_err("a dangling lock symlink must be refused");
    assert!(refused.contains("symlink"), "{refused}");
    assert!(!target.exists());
}

#[test]
fn regression_flags_that_lied_or_crashed_are_refused_before_listening() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&[&str], &str)] = &[
        // ~6e12 h: more milliseconds than a u64 holds (wrapped to ~384 ms).
        (&["--max-age", "6000000000000h"], "--max-age"),
        (&["--lease", "0.0001ms"], "--lease"),
        (&["--lease", "999999999999999999999999999s"], "--lease"),
        (&["--lease", "9999999h"], "--lease"),
        (&["--cors-origin", "*"], "wildcard"),
        (&["--cors-origin", "not an origin"], "--cors-origin"),
        (&["--cors-origin", "https://ok.example,https://x.example/path"], "x.example/path"),
        (&["--max-connections-per-client", "0"], "--max-connections-per-client"),
        (&["--body-read-timeout", "0s"], "--body-read-timeout"),
        (&["--body-read-timeout", "9999999h"], "--body-read-timeout"),
        // Round two: the live bound is at least 1 and at most --max-runs.
        (&["--max-live-runs", "0"], "--max-live-runs must be at least 1"),
        (&["--max-runs", "10", "--max-live-runs", "11"], "at most --max-runs (10)"),
        // Round three: the live byte bound is at least 1 and at most
        // --max-retained-bytes.
        (&["--max-live-bytes", "0"], "--max-live-bytes must be at least 1"),
        (
            &["--max-retained-bytes", "1000", "--max-live-bytes", "1001"],
            "at most --max-retained-bytes (1000)",
        ),
    ];
    for (flags, expected) in cases {
        let refused = start_head(dir.path(), flags)
            .err()
            .unwrap_or_else(|| panic!("{flags:?} must be refused before `listening on`"));
        assert!(refused.contains(expected), "{flags:?}: {refused}");
        assert!(!refused.contains("panicked"), "{flags:?}: {refused}");
    }
    // TLS: both files or neither, readable, and a key that is the
    // certificate's; a CA only where it is used, and readable.
    let (ca, other) = (crate::tls::Ca::new("CA"), crate::tls::Ca::new("other CA"));
    let pki = crate::tls::Pki::write(dir.path(), "head", &ca);
    let stranger = crate::tls::Pki::write(dir.path(), "stranger", &other);
    let missing = dir.path().join("missing.pem");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not PEM at all\n").unwrap();
    let [cert, key, ca_pem, missing, garbage, stranger_key] =
        [&pki.cert, &pki.key, &pki.ca, &missing, &garbage, &stranger.key]
            .map(|p| p.to_str().unwrap());
    let tls_cases: &[(&[&str], &str)] = &[
        (&["--tls-cert", cert], "--tls-key"),
        (&["--tls-key", key], "--tls-cert"),
        (&["--tls-cert", missing, "--tls-key", key], "--tls-cert"),
        (&["--tls-cert", garbage, "--tls-key", key], "--tls-cert"),
        (&["--tls-cert", key, "--tls-key", key], "--tls-cert"),
        (&["--tls-cert", cert, "--tls-key", missing], "--tls-key"),
        (&["--tls-cert", cert, "--tls-key", cert], "--tls-key"),
        (&["--tls-cert", cert, "--tls-key", stranger_key], "--tls-cert and --tls-key"),
        (&["--ca-cert", ca_pem], "no --forward-to"),
        (
            &["--cluster", "c1", "--forward-to", "https://127.0.0.1:1", "--ca-cert", missing],
            "--ca-cert",
        ),
        (
            &["--cluster", "c1", "--forward-to", "https://127.0.0.1:1", "--ca-cert", garbage],
            "--ca-cert",
        ),
        (
            &["--cluster", "c1", "--forward-to", "http://127.0.0.1:1", "--ca-cert", ca_pem],
            "--ca-cert",
        ),
    ];
    for (flags, expected) in tls_cases {
        let refused = start_head(dir.path(), flags)
            .err()
            .unwrap_or_else(|| panic!("{flags:?} must be refused before `listening on`"));
        assert!(refused.contains(expected), "{flags:?}: {refused}");
        assert!(!refused.contains("panicked"), "{flags:?}: {refused}");
    }
    // The limits themselves are accepted.
    start_head(
        dir.path(),
        &[
            "--lease",
            "1s",
            "--max-age",
            "876000h",
            "--cors-origin",
            "http://127.0.0.1:3000",
            "--max-runs",
            "20",
            "--max-live-runs",
            "20",
        ],
    )
    .expect("flags at their limits start");
}

#[test]
fn regression_sigterm_completes_whatever_clients_do() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    // The header-read timeout is far longer than the test's guard: only the
    // shutdown grace can end these connections.
    let mut head =
        start_head(dir.path(), &["--header-read-timeout", "1h", "--shutdown-grace", "1s"]).unwrap();
    let addr = head.url.trim_start_matches("http://").to_owned();
    // One client holds half-sent headers.
    let mut half = std::net::TcpStream::connect(&addr).unwrap();
    half.write_all(b"GET /api/train/runs HTTP/1.1\r\nhost: 127.0").unwrap();
    // Another pipelines far more answers than socket buffers hold, and never reads.
    let mut deaf = std::net::TcpStream::connect(&addr).unwrap();
    let request = b"GET /openapi.json HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n".repeat(400);
    deaf.write_all(&request).unwrap();
    head.signal("-TERM");
    let status = head.wait();
    assert!(status.success(), "{status}");
    drop((half, deaf));
}

/// `runs show` prints a run's health (with the ranks it names and its
/// detail) and its progress: the step of the total, for a rendezvous run of
/// a real head whose only rank reported step 5 of 10 and then stopped
/// advancing (it keeps heartbeating, so only its progress stalls).
#[test]
fn runs_show_prints_health_and_progress() {
    let dir = tempfile::tempdir().unwrap();
    let head = start_head(dir.path(), &["--lease", "4s", "--stall-after", "1s"]).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = reqwest::Client::new();
    let post = |path: String, body: Value| {
        let (client, url) = (client.clone(), format!("{}{path}", head.url));
        runtime.block_on(async move {
            let answer = client.post(&url).json(&body).send().await.unwrap();
            assert!(answer.status().is_success(), "POST {url}: {}", answer.status());
            answer.json::<Value>().await.unwrap()
        })
    };
    let worker = serde_json::to_value(&crate::common::workers(1, 1, "cli-")[0]).unwrap();
    let join =
        serde_json::json!({"world_size": 1, "worker": worker, "name": "stalls", "job_id": "5"});
    let id = post("/api/train/rendezvous/cli-health/join".into(), join)["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let beat = format!("/api/train/runs/{id}/ranks/0/heartbeat");
    let progress =
        serde_json::json!({"attempt_id": "0", "progress": {"step": 5, "total_steps": 10}});
    post(beat.clone(), progress);
    let until = Instant::now() + Duration::from_secs(30);
    let health = loop {
        let run = post(beat.clone(), serde_json::json!({"attempt_id": "0"}));
        assert_eq!(run["run_id"], id.as_str());
        let url = format!("{}/api/train/runs/{id}", head.url);
        let got: Value = runtime
            .block_on(async { client.get(&url).send().await.unwrap().json().await.unwrap() });
        if got["health"]["state"] == "STALLED" {
            break got["health"].clone();
        }
        assert!(Instant::now() < until, "the run never stalled: {got}");
        std::thread::sleep(Duration::from_millis(100)); // the pace of a rank's heartbeats, not a wait for a result
    };
    let shown = Command::new(env!("CARGO_BIN_EXE_trainstate"))
        .args(["runs", "show", &id, "--url", &head.url])
        .output()
        .unwrap();
    assert!(shown.status.success(), "{}", String::from_utf8_lossy(&shown.stderr));
    let text = String::from_utf8(shown.stdout).unwrap();
    let health_line =
        text.lines().find(|l| l.starts_with("health")).unwrap_or_else(|| panic!("{text}"));
    assert!(health_line.contains("STALLED since") && health_line.contains("ranks 0"), "{text}");
    let detail = health["detail"].as_str().unwrap();
    assert!(text.contains(detail), "the detail is printed: {text}");
    let progress_line =
        text.lines().find(|l| l.starts_with("progress")).unwrap_or_else(|| panic!("{text}"));
    assert!(progress_line.contains("step 5 of 10 (50 %)"), "{text}");
}

/// A finished run of cluster `c1`, as its head forwards it to a hub, whose
/// goodput is known: 2m10s of wall-clock time, 70 s of it productive
/// (53.8 %), 10 s waiting to start, 20 s restarting, 30 s stalled; step 40
/// marked saved 60 s in, and three failed attempts since then (a restart
/// loop).
pub(crate) fn forwarded_with_goodput(name: &str, start_ms: u64) -> trainstate_schema::TrainRunInfo {
    use trainstate_schema::{CheckpointMark, GoodputBucket, RunGoodput, RunStatus};

    let run = run_with(&RunId::new_v7(), name, "job-goodput", start_ms, 2);
    let mut draft = trainstate_testkit::runs::ended(&run, RunStatus::Finished).into_draft();
    draft.end_time_ms = Some(start_ms + 130_000);
    for attempt in &mut draft.attempts {
        attempt.end_time_ms = Some(start_ms + 130_000);
    }
    draft.cluster = Some("c1".into());
    let mut goodput = RunGoodput::starting_at(start_ms);
    goodput.add(GoodputBucket::WaitingToStart, 10_000);
    goodput.add(GoodputBucket::Productive, 70_000);
    goodput.add(GoodputBucket::Restarting, 20_000);
    goodput.add(GoodputBucket::Stalled, 30_000);
    goodput.as_of_ms = start_ms + 130_000;
    goodput.checkpoint = Some(CheckpointMark::new(40, start_ms + 60_000, "0"));
    goodput.productive_at_checkpoint_ms = 50_000;
    goodput.restarts_since_checkpoint = 3;
    goodput.restart_loop = true;
    draft.validate().unwrap().with_goodput(goodput).unwrap()
}

/// Stores `run` on the hub at `hub_url` as a forwarded run of its cluster.
pub(crate) async fn forward(hub_url: &str, run: &trainstate_schema::TrainRunInfo) {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = format!("{hub_url}/api/train/forwarded/{}", run.id());
    let body = Some(("application/json", serde_json::to_vec(run).unwrap()));
    let (status, stored) =
        crate::contract::send(&http, reqwest::Method::PUT, &url, body, None).await;
    assert!(status.is_success(), "PUT {url}: {status}: {stored}");
    assert!(stored["goodput"].is_object(), "stored with its goodput: {stored}");
}

/// `runs show` says what a run cost: its goodput ratio of its wall-clock
/// time, the buckets that cost something, its checkpoint mark and its
/// restart loop (seeded as a forwarded run on a hub, stored as it is).
#[test]
fn runs_show_prints_what_a_run_cost() {
    let dir = tempfile::tempdir().unwrap();
    let head = start_head(dir.path(), &["--cluster", "hub"]).unwrap();
    let run = forwarded_with_goodput("cli-goodput", T0);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(forward(&head.url, &run));
    let shown = Command::new(env!("CARGO_BIN_EXE_trainstate"))
        .args(["runs", "show", run.id().as_str(), "--url", &head.url])
        .output()
        .unwrap();
    let text = String::from_utf8(shown.stdout).unwrap();
    assert!(shown.status.success(), "{text}");
    let lines: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("goodput")).take(4).collect();
    let expected = [
        "goodput         53.8% of 2m10s",
        "                lost to waiting to start 10s, restarting 20s, stalled 30s",
        "                checkpoint: step 40 saved at 2025-10-09 08:54:20 UTC",
        "                restart loop: 3 attempts failed since the last checkpoint",
    ];
    assert_eq!(lines, expected, "{text}");
}

/// The mode bits of the file or directory at `path`.
fn mode_of(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Finding 2 of round three: the data directory was created `0755` and the
/// SQLite store `0644`, so every local user could read every run and the
/// token hashes. Now the directory is `0700` (an existing wider one of
/// this user is tightened) and every file the head creates in it `0600`.
#[test]
fn regression_files_readable_by_every_local_user_are_now_the_owners_alone() {
    use std::os::unix::fs::PermissionsExt;

    let dir = tempfile::tempdir().unwrap();
    let fresh = dir.path().join("fresh");
    let wide = dir.path().join("wide");
    std::fs::create_dir(&wide).unwrap();
    std::fs::set_permissions(&wide, std::fs::Permissions::from_mode(0o755)).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for data in [&fresh, &wide] {
        let mut head = start_head(data, &[]).unwrap();
        // A write, so that the store, its WAL and its shared memory exist.
        let remote = trainstate_client::StateHandle::connect(&head.url, None).unwrap();
        let run = run_with(&RunId::new_v7(), "private-run", "job-private", T0, 2);
        assert!(runtime.block_on(remote.register(run)).unwrap().created);
        assert_eq!(mode_of(data), 0o700, "{}", data.display());
        let files: Vec<_> =
            std::fs::read_dir(data).unwrap().map(|entry| entry.unwrap().path()).collect();
        for suffix in ["trainstate.db", "trainstate.db-wal", "trainstate.db-shm", "trainstate.lock"]
        {
            assert!(files.iter().any(|f| f.ends_with(suffix)), "{suffix} in {files:?}");
        }
        for file in &files {
            assert_eq!(mode_of(file), 0o600, "{}", file.display());
        }
        assert!(head.stop().success());
    }
}

/// Finding 2 of round three, for tokens: a token file every local user
/// could read was taken without a word. Now the head and the client warn
/// on stderr, naming the file and its mode, and still take it.
#[test]
fn regression_a_token_file_readable_by_others_is_warned_about_and_still_works() {
    use std::os::unix::fs::PermissionsExt;

    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("admin.token");
    std::fs::write(&token_file, "admin-secret-of-the-head\n").unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let path = token_file.to_str().unwrap();
    let warning = format!("--token-file {path} is 644: other local users can read the token");
    let head =
        start_head(&dir.path().join("data"), &["--token-file", path, "--protect-reads"]).unwrap();
    head.wait_for_log(&warning, 1);

    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_trainstate"))
            .args(args)
            .args(["--url", head.url.as_str(), "--token-file", path])
            .output()
            .unwrap()
    };
    let listed = cli(&["runs", "list"]);
    let stderr = String::from_utf8(listed.stderr).unwrap();
    assert!(listed.status.success(), "the token still reads: {stderr}");
    assert!(stderr.contains(&warning), "{stderr}");

    // Readable by its owner alone, it is taken without a word.
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let listed = cli(&["runs", "list"]);
    assert!(listed.status.success());
    assert_eq!(String::from_utf8(listed.stderr).unwrap(), "");
}
