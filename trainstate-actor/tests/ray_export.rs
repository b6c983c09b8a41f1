//! `trainstate ingest ray-export` as a child process against a real head
//! (`trainstate serve`, also a child process): Ray's export event file,
//! appended to as Ray appends to it, ends up as Ray's own dashboard answer,
//! across kills of the ingester and of the head, truncation, replacement,
//! rotation and malformed lines.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use reqwest::{Client, Method, StatusCode};
use serde_json::{Value, json};

use crate::common::{Head, eventually, serve};
use crate::contract::send;
use crate::ray_v2::{assert_valid_under_rays_model, fixture, shared_fields};

const EVENTS_FILE: &str = "event_EXPORT_TRAIN_STATE.log";
const DEADLINE: Duration = Duration::from_secs(60);

/// Starts `trainstate serve` on `listen` with `extra` flags and waits for
/// its first line.
fn start(data_dir: &Path, listen: &str, extra: &[&str]) -> Head {
    serve(data_dir)
        .listen(listen)
        .args(extra)
        .start()
        .unwrap_or_else(|refused| panic!("the head does not start ({refused})"))
}

/// The places one test uses: Ray's export events directory, the
/// ingester's position file and log, the head's data directory.
struct Site {
    _dir: tempfile::TempDir,
    events: PathBuf,
    position: PathBuf,
    log: PathBuf,
    data: PathBuf,
}

impl Site {
    fn new() -> Site {
        let dir = tempfile::tempdir().unwrap();
        let events = dir.path().join("session/logs/export_events");
        std::fs::create_dir_all(&events).unwrap();
        Site {
            events,
            position: dir.path().join("ingest/position.json"),
            log: dir.path().join("ingest.log"),
            data: dir.path().join("head"),
            _dir: dir,
        }
    }

    fn file(&self) -> PathBuf {
        self.events.join(EVENTS_FILE)
    }

    /// The session directory the ingester is given.
    fn session(&self) -> &Path {
        self.events.parent().unwrap().parent().unwrap()
    }

    /// Appends to Ray's file the way Ray's logger does: one write a line.
    fn append(&self, text: &str) {
        let mut file = OpenOptions::new().create(true).append(true).open(self.file()).unwrap();
        file.write_all(text.as_bytes()).unwrap();
        file.flush().unwrap();
    }

    fn append_lines(&self, lines: &[String]) {
        for line in lines {
            self.append(&format!("{line}\n"));
        }
    }

    fn file_len(&self) -> u64 {
        std::fs::metadata(self.file()).unwrap().len()
    }

    /// The saved position in Ray's file: (byte offset, line).
    fn position(&self) -> Option<(u64, u64)> {
        self.position_in(EVENTS_FILE)
    }

    /// The saved position in the file `name`: (byte offset, line).
    fn position_in(&self, name: &str) -> Option<(u64, u64)> {
        let text = std::fs::read_to_string(&self.position).ok()?;
        let positions: Value = serde_json::from_str(&text).unwrap();
        let position = positions["files"].get(name)?;
        Some((position["offset"].as_u64().unwrap(), position["line"].as_u64().unwrap()))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Starts `trainstate ingest ray-export` on the session directory,
    /// logging to the site's log (appended across restarts).
    fn ingester(&self, head: &Head, once: bool) -> Ingester {
        self.ingester_on(self.events.parent().unwrap().parent().unwrap(), head, once)
    }

    /// The same, on `dir`.
    fn ingester_on(&self, dir: &Path, head: &Head, once: bool) -> Ingester {
        self.ingester_at(dir, &head.url, once, &[])
    }

    /// The same, with more flags.
    fn ingester_with(&self, dir: &Path, head: &Head, once: bool, extra: &[&str]) -> Ingester {
        self.ingester_at(dir, &head.url, once, extra)
    }

    /// The same, given `url` as the head's, with more flags.
    fn ingester_at(&self, dir: &Path, url: &str, once: bool, extra: &[&str]) -> Ingester {
        let log = OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_trainstate"));
        command
            .args(["ingest", "ray-export"])
            .arg(dir)
            .args(["--url", url, "--poll-interval", "10ms", "--position-file"])
            .arg(&self.position)
            .args(extra)
            .env("RUST_LOG", "info")
            .env_remove("TRAINSTATE_TOKEN_FILE")
            .env_remove("TRAINSTATE_CA_CERT")
            .stdout(Stdio::null())
            .stderr(log);
        if once {
            command.arg("--once");
        }
        Ingester { child: command.spawn().unwrap() }
    }

    /// Waits until the saved position is `line` lines into the file.
    async fn wait_for_line(&self, line: u64) {
        eventually(&format!("the position at line {line}"), DEADLINE, || {
            std::future::ready(self.position().is_some_and(|(_, at)| at == line).then_some(()))
        })
        .await;
    }

    /// Waits until the saved position is at the end of the file.
    async fn wait_for_end(&self) {
        eventually("the position at the end of the file", DEADLINE, || {
            std::future::ready(
                self.position().is_some_and(|(offset, _)| offset == self.file_len()).then_some(()),
            )
        })
        .await;
    }

    /// The last `stopped` summary in the log, as key → value.
    fn summary(&self) -> std::collections::BTreeMap<String, String> {
        let log = self.log();
        let line = log.lines().rfind(|l| l.contains(" stopped ")).expect("a summary line");
        fields(line)
    }
}

/// The `key=value` fields of a log line.
fn fields(line: &str) -> std::collections::BTreeMap<String, String> {
    line.split_whitespace()
        .filter_map(|f| f.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
        .collect()
}

struct Ingester {
    child: Child,
}

impl Ingester {
    fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn terminate(&mut self) -> ExitStatus {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
        self.wait()
    }

    fn wait(&mut self) -> ExitStatus {
        let until = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < until, "the ingester did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Ingester {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The lines of Ray's export event file in the fixtures.
fn rays_lines() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/ray-v2").join(EVENTS_FILE);
    let mut text = String::new();
    File::open(path).unwrap().read_to_string(&mut text).unwrap();
    text.lines().map(str::to_owned).collect()
}

/// The events of the fixture's run `v2-ok` as those of another run, `name`,
/// with fresh run and attempt ids.
fn another_run(name: &str, n: u8) -> Vec<String> {
    let (run_id, attempt_id) =
        ("9a8b3f687361445ebe89f056750690d5", "83878b55ae6e404882e14dae79ac9d63");
    rays_lines()
        .into_iter()
        .filter(|l| l.contains(run_id))
        .map(|l| {
            l.replace(run_id, &format!("{n:02x}{}", &run_id[2..]))
                .replace(attempt_id, &format!("{n:02x}{}", &attempt_id[2..]))
                .replace("\"v2-ok\"", &format!("\"{name}\""))
        })
        .collect()
}

/// JSON numbers by value: Ray's dashboard writes some whole floats as
/// integers (`0` where Ray's event has `0.0`); JSON does not tell them apart.
fn by_value(value: &Value) -> Value {
    match value {
        Value::Number(n) => json!(n.as_f64().unwrap()),
        Value::Array(items) => Value::Array(items.iter().map(by_value).collect()),
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), by_value(v))).collect())
        }
        other => other.clone(),
    }
}

/// The head's answer on Ray's V2 route.
async fn v2_runs(client: &Client, head: &Head) -> Value {
    let url = format!("{}/api/train/v2/runs/v1", head.url);
    let (status, answer) = send(client, Method::GET, &url, None, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    answer
}

/// The status of the run `name` on the V2 route, if it is there.
async fn status_of(client: &Client, head: &Head, name: &str) -> Option<String> {
    let answer = v2_runs(client, head).await;
    let run = answer["train_runs"].as_array().unwrap().iter().find(|r| r["name"] == name)?;
    Some(run["status"].as_str().unwrap().to_owned())
}

/// Waits until the run `name` has `status` on the V2 route.
async fn wait_for_status(client: &Client, head: &Head, name: &str, status: &str) {
    let until = Instant::now() + DEADLINE;
    while status_of(client, head, name).await.as_deref() != Some(status) {
        assert!(Instant::now() < until, "timed out waiting for {name} to be {status}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The head answers Ray's V2 route as Ray's own dashboard did, on every
/// field both carry, for every run of the fixture (and maybe others).
async fn assert_rays_answer(client: &Client, head: &Head) {
    let answer = v2_runs(client, head).await;
    assert_valid_under_rays_model(&answer);
    let rays = fixture("ray-v2/dashboard-v2-runs.json");
    for rays_run in rays["train_runs"].as_array().unwrap() {
        let ours = answer["train_runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == rays_run["id"])
            .unwrap_or_else(|| panic!("run {} missing", rays_run["name"]));
        assert_eq!(
            by_value(&shared_fields(ours)),
            by_value(&shared_fields(rays_run)),
            "run {}",
            rays_run["name"]
        );
    }
}

/// The head's runs (trainstate's own route), by name.
async fn runs_by_name(client: &Client, head: &Head) -> std::collections::BTreeMap<String, Value> {
    let url = format!("{}/api/train/runs?limit=1000", head.url);
    let (status, answer) = send(client, Method::GET, &url, None, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let runs = answer["train_runs"].as_array().unwrap();
    runs.iter().map(|r| (r["name"].as_str().unwrap().to_owned(), r.clone())).collect()
}

/// Every run replayed from `lines` has its history of status changes, each
/// at Ray's time of the event that made it (Ray's `timestamp`, in seconds),
/// not when the head took it.
async fn assert_histories_are_rays(client: &Client, head: &Head, lines: &[String]) {
    let runs = runs_by_name(client, head).await;
    assert!(!runs.is_empty());
    for (name, run) in runs {
        let history = run["status_history"].as_array().unwrap_or_else(|| panic!("{name}: {run}"));
        let status = run.get("status").unwrap_or(&run["run_status"]);
        assert_eq!(history.first().unwrap()["status"], "INITIALIZING", "{name}: {history:?}");
        assert_eq!(&history.last().unwrap()["status"], status, "{name}: {history:?}");
        // Ray's time of each run event that changed the status, in order.
        let mut expected = Vec::new();
        for line in lines {
            let event: Value = serde_json::from_str(line).unwrap();
            let data = &event["event_data"];
            if event["source_type"] != "EXPORT_TRAIN_RUN" || data["id"] != run["id"] {
                continue;
            }
            if expected.last().map(|(s, _): &(Value, u64)| s) != Some(&data["status"]) {
                expected.push((data["status"].clone(), event["timestamp"].as_u64().unwrap()));
            }
        }
        let got: Vec<(Value, u64)> = history
            .iter()
            .map(|change| (change["status"].clone(), change["at_ms"].as_u64().unwrap() / 1000))
            .collect();
        if run["status"] != "ABORTED" {
            assert_eq!(got, expected, "{name}: {history:?}");
        }
        for change in history {
            assert_eq!(change["at_ms"].as_u64().unwrap() % 1000, 0, "{name}: Ray's seconds");
        }
    }
}

#[tokio::test]
async fn replaying_rays_file_as_ray_writes_it_gives_back_rays_dashboard_answer() {
    let site = Site::new();
    let head = start(&site.data, "127.0.0.1:0", &[]);
    let client = Client::new();
    let mut ingester = site.ingester(&head, false);
    let lines = rays_lines();

    // Before Ray writes anything, the ingester waits for the file.
    eventually("the ingester waiting for Ray", DEADLINE, || {
        std::future::ready(site.log().contains("waiting for Ray to write").then_some(()))
    })
    .await;
    site.append_lines(&lines[..10]);
    site.wait_for_line(10).await;
    // A line whose end has not been written yet is left for later.
    let (first, rest) = lines[10].split_at(lines[10].len() / 2);
    site.append(first);
    site.append(&format!("{rest}\n"));
    site.append_lines(&lines[11..]);
    site.wait_for_end().await;
    assert_eq!(site.position().unwrap().1, 31);

    assert_rays_answer(&client, &head).await;
    // The V1 view of the same runs.
    let (_, v1) =
        send(&client, Method::GET, &format!("{}/api/train/v2/runs", head.url), None, None).await;
    let statuses: Vec<&Value> =
        v1["train_runs"].as_array().unwrap().iter().map(|r| &r["run_status"]).collect();
    assert_eq!(statuses, [&json!("ERRORED"), &json!("FINISHED"), &json!("FINISHED")]);

    assert_histories_are_rays(&client, &head, &lines).await;

    assert!(ingester.terminate().success(), "SIGTERM stops it cleanly: {}", site.log());
    let summary = site.summary();
    assert_eq!(summary["applied"], "31", "{summary:?}");
    assert_eq!((&*summary["malformed"], &*summary["rejected"]), ("0", "0"));
}

#[tokio::test]
async fn an_ingester_killed_mid_file_resumes_from_its_position_without_loss_or_double_effect() {
    let site = Site::new();
    let head = start(&site.data, "127.0.0.1:0", &[]);
    let client = Client::new();
    let lines = rays_lines();

    let mut ingester = site.ingester(&head, false);
    site.append_lines(&lines[..12]);
    site.wait_for_line(12).await;
    let saved_at_12 = std::fs::read(&site.position).unwrap();
    // Ray goes on writing; the ingester dies somewhere in it.
    site.append_lines(&lines[12..]);
    ingester.kill9();
    let (offset, line) = site.position().unwrap();
    assert!(line >= 12, "{line}");

    let mut again = site.ingester(&head, true);
    assert!(again.wait().success(), "{}", site.log());
    let resumed = site.log();
    let resumed = resumed.lines().rfind(|l| l.contains(" resuming ")).unwrap();
    assert_eq!(fields(resumed)["offset"], offset.to_string(), "{resumed}");
    assert_eq!(site.position().unwrap(), (site.file_len(), 31));
    let summary = site.summary();
    let handled: u64 =
        ["applied", "stale"].iter().map(|k| summary[*k].parse::<u64>().unwrap()).sum();
    assert_eq!(handled, 31 - line, "each event after the position, once: {summary:?}");
    assert_eq!((&*summary["malformed"], &*summary["rejected"]), ("0", "0"));
    assert_rays_answer(&client, &head).await;

    // Killed after applying a batch but before saving its position: the
    // batch is applied again on restart, to no effect.
    let (_, before) =
        send(&client, Method::GET, &format!("{}/api/train/runs", head.url), None, None).await;
    std::fs::write(&site.position, saved_at_12).unwrap();
    let mut replay = site.ingester(&head, true);
    assert!(replay.wait().success(), "{}", site.log());
    let summary = site.summary();
    assert_eq!((&*summary["malformed"], &*summary["rejected"]), ("0", "0"), "{summary:?}");
    let (_, after) =
        send(&client, Method::GET, &format!("{}/api/train/runs", head.url), None, None).await;
    assert_eq!(after, before, "applying events again changes nothing");
    assert_rays_answer(&client, &head).await;
}

#[tokio::test]
async fn a_truncated_or_replaced_file_is_noticed_and_read_from_its_start() {
    let site = Site::new();
    let head = start(&site.data, "127.0.0.1:0", &[]);
    let client = Client::new();
    let mut ingester = site.ingester(&head, false);
    site.append_lines(&rays_lines());
    site.wait_for_end().await;

    // Truncated in place, then written again: shorter than the position.
    let again = another_run("v2-again", 1);
    let mut file = OpenOptions::new().write(true).truncate(true).open(site.file()).unwrap();
    file.write_all(format!("{}\n", again.join("\n")).as_bytes()).unwrap();
    drop(file);
    wait_for_status(&client, &head, "v2-again", "FINISHED").await;
    site.wait_for_end().await;
    assert_eq!(site.position().unwrap().1, again.len() as u64);
    assert!(site.log().contains("reading it from the start"), "{}", site.log());

    // Replaced: another file renamed over the name.
    let third = another_run("v2-replaced", 2);
    let tmp = site.events.join("new.tmp");
    std::fs::write(&tmp, format!("{}\n", third.join("\n"))).unwrap();
    std::fs::rename(&tmp, site.file()).unwrap();
    wait_for_status(&client, &head, "v2-replaced", "FINISHED").await;
    site.wait_for_end().await;
    assert_eq!(site.position().unwrap().1, third.len() as u64);
    assert!(site.log().contains("a new file under the name"), "{}", site.log());
    assert_rays_answer(&client, &head).await;
    assert!(ingester.terminate().success());
}

#[tokio::test]
async fn a_rotated_file_is_read_to_its_end_before_the_new_one() {
    let site = Site::new();
    let head = start(&site.data, "127.0.0.1:0", &[]);
    let client = Client::new();
    let lines = rays_lines();
    let mut ingester = site.ingester(&head, false);
    site.append_lines(&lines[..12]);
    site.wait_for_line(12).await;
    ingester.kill9();

    // While no ingester runs, Ray writes the rest, and its logger rotates
    // the file (event_EXPORT_TRAIN_STATE.log → .log.1) and starts a new one.
    site.append_lines(&lines[12..]);
    std::fs::rename(site.file(), site.events.join(format!("{EVENTS_FILE}.1"))).unwrap();
    let next = another_run("v2-next", 3);
    site.append_lines(&next);

    let mut again = site.ingester(&head, true);
    assert!(again.wait().success(), "{}", site.log());
    assert!(site.log().contains("reading the rest of the previous one first"), "{}", site.log());
    assert_eq!(site.position().unwrap(), (site.file_len(), next.len() as u64));
    assert_rays_answer(&client, &head).await;
    assert_eq!(status_of(&client, &head, "v2-next").await.as_deref(), Some("FINISHED"));
}

#[tokio::test]
async fn a_new_ray_session_is_followed_once_the_previous_one_is_read_to_its_end() {
    // Ray's sessions: /tmp/ray/session_<time>/, and session_latest, a link
    // to the current one, which is what the ingester is told to follow.
    let site = Site::new();
    let sessions = site.events.ancestors().nth(3).unwrap().to_owned();
    let latest = sessions.join("session_latest");
    std::os::unix::fs::symlink(sessions.join("session"), &latest).unwrap();
    let events = latest.join("logs/export_events");
    let head = start(&site.data, "127.0.0.1:0", &[]);
    let client = Client::new();
    let lines = rays_lines();

    let mut ingester = site.ingester_on(&events, &head, false);
    site.append_lines(&lines[..12]);
    site.wait_for_line(12).await;
    ingester.kill9();
    // Ray writes the rest, stops, and starts again in a new session that
    // has not written its file yet.
    site.append_lines(&lines[12..]);
    let next_session = sessions.join("session_2");
    std::fs::create_dir_all(next_session.join("logs/export_events")).unwrap();
    std::fs::remove_file(&latest).unwrap();
    std::os::unix::fs::symlink(&next_session, &latest).unwrap();

    let mut again = site.ingester_on(&events, &head, true);
    assert!(again.wait().success(), "{}", site.log());
    assert_rays_answer(&client, &head).await;
    assert_eq!(site.position().unwrap(), (site.file_len(), 31));

    // The new session writes: its file is read from the start.
    let next = another_run("v2-next-session", 4);
    let next_file = next_session.join("logs/export_events").join(EVENTS_FILE);
    std::fs::write(&next_file, format!("{}\n", next.join("\n"))).unwrap();
    let mut third = site.ingester_on(&events, &head, true);
    assert!(third.wait().success(), "{}", site.log());
    assert_eq!(status_of(&client, &head, "v2-next-session").await.as_deref(), Some("FINISHED"));
    let len = std::fs::metadata(&next_file).unwrap().len();
    assert_eq!(site.position().unwrap(), (len, next.len() as u64));
}

#[tokio::test]
async fn the_file_name_of_earlier_ray_releases_is_followed_too() {
    // Before Ray named the file after the Train state, one logger named
    // after the run events' source type wrote runs and attempts alike.
    let site = Site::new();
    let head = start(&site.data, "127.0.0.1:0", &[]);
    let client = Client::new();
    let earlier = site.events.join("event_EXPORT_TRAIN_RUN.log");
    std::fs::write(&earlier, format!("{}\n", rays_lines().join("\n"))).unwrap();
    let mut ingester = site.ingester(&head, true);
    assert!(ingester.wait().success(), "{}", site.log());
    assert_rays_answer(&client, &head).await;
    let len = std::fs::metadata(&earlier).unwrap().len();
    assert_eq!(site.position_in("event_EXPORT_TRAIN_RUN.log"), Some((len, 31)));
    assert_eq!(site.position(), None);
}

#[tokio::test]
async fn a_malformed_line_is_logged_with_its_position_and_skipped() {
    let site = Site::new();
    let head = start(&site.data, "127.0.0.1:0", &[]);
    let client = Client::new();
    let mut lines = rays_lines();
    let bad_id = lines[4].replacen("\"job_id\": \"AQAAAA==\"", "\"job_id\": \"!!\"", 1);
    assert_ne!(bad_id, lines[4]);
    // Line 3: not JSON. Line 6: an id that is not base64, beside its good
    // twin. Line 9: an event of another source. Line 12: blank.
    lines.insert(2, "{\"event_id\": \"x\", this is not JSON".to_owned());
    lines.insert(5, bad_id);
    lines.insert(
        8,
        r#"{"event_id": "y", "source_type": "EXPORT_SUBMISSION_JOB", "event_data": {}}"#.to_owned(),
    );
    lines.insert(11, String::new());
    site.append_lines(&lines);
    let offset_of = |n: usize| lines[..n - 1].iter().map(|l| l.len() as u64 + 1).sum::<u64>();

    let mut ingester = site.ingester(&head, true);
    assert!(ingester.wait().success(), "{}", site.log());
    let log = site.log();
    let malformed: Vec<_> = log
        .lines()
        .filter(|l| l.contains("skipping a malformed line"))
        .map(|l| {
            let f = fields(l);
            (f["line"].clone(), f["offset"].clone())
        })
        .collect();
    assert_eq!(
        malformed,
        [("3".to_owned(), offset_of(3).to_string()), ("6".to_owned(), offset_of(6).to_string()),],
        "{log}"
    );
    assert!(log.contains("event_data.job_id"), "names the field: {log}");
    let summary = site.summary();
    assert_eq!(
        (&*summary["applied"], &*summary["malformed"], &*summary["other"]),
        ("31", "2", "1"),
        "{summary:?}"
    );
    assert_rays_answer(&client, &head).await;
}

#[tokio::test]
async fn a_head_that_restarts_mid_ingest_loses_nothing() {
    let site = Site::new();
    let mut head = start(&site.data, "127.0.0.1:0", &[]);
    let client = Client::new();
    let lines = rays_lines();
    let _ingester = site.ingester(&head, false);
    site.append_lines(&lines[..12]);
    site.wait_for_line(12).await;

    head.kill();
    site.append_lines(&lines[12..]);
    eventually("the ingester to find the head down", DEADLINE, || {
        std::future::ready(site.log().contains("the head cannot take an event now").then_some(()))
    })
    .await;
    assert_eq!(site.position().unwrap().1, 12, "nothing is skipped while the head is down");

    let head = start(&site.data, head.address(), &[]);
    site.wait_for_end().await;
    assert_rays_answer(&client, &head).await;
}

/// The export events of a Ray cluster that died under a live run
/// (`fixtures/ray-v2/cluster-died/`): Ray Train wrote nothing more, Ray's
/// GCS reports the node, the controller and the driver job dead. Replayed,
/// the run ends ABORTED with Ray's words for the death, at Ray's time.
#[tokio::test]
async fn a_cluster_that_died_under_a_live_run_ends_it_aborted_with_rays_cause() {
    let site = Site::new();
    let head = start(&site.data, "127.0.0.1:0", &[]);
    let client = Client::new();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/ray-v2/cluster-died");
    for name in [
        "event_EXPORT_TRAIN_STATE.log",
        "event_EXPORT_NODE.log",
        "event_EXPORT_ACTOR.log",
        "event_EXPORT_DRIVER_JOB.log",
    ] {
        std::fs::copy(fixtures.join(name), site.events.join(name)).unwrap();
    }
    let mut ingester = site.ingester(&head, true);
    assert!(ingester.wait().success(), "{}", site.log());

    let runs = runs_by_name(&client, &head).await;
    let run = &runs["v2-cluster-died"];
    assert_eq!(run["run_status"], "ABORTED", "{run}");
    // The node died under it, unexpectedly: its rank 0 was lost with it.
    assert_eq!(
        run["cause"],
        json!({"kind": "NODE_LOST", "class": "INFRASTRUCTURE", "failed_world_rank": 0}),
        "{run}"
    );
    let detail = run["status_detail"].as_str().unwrap();
    // The controller's death, in Ray's words, and the node's.
    let controller = "f7be0523d5996eb52c01ecc901000000";
    assert!(
        detail.contains(&format!(
            "controller (actor {controller}, TrainController) dead (OWNER_DIED)"
        )),
        "{detail}"
    );
    assert!(detail.contains("The actor is dead because its owner has died."), "{detail}");
    let node = "677236be428cbd47c16fa632bada4a00266e5ad0272b9713695488fc";
    assert!(
        detail.contains(&format!(
            "node {node} (192.0.2.2), where the run had workers, dead: UNEXPECTED_TERMINATION: \
             health check failed due to missing too many heartbeats"
        )),
        "{detail}"
    );
    // Ended at Ray's time of the controller's death; so did its attempt,
    // with the same cause.
    assert_eq!(run["end_time_ms"], 1_796_182_706_000_u64, "{run}");
    let attempt = run["attempts"].as_array().unwrap().last().unwrap();
    assert_eq!(attempt["status"], "ABORTED", "{attempt}");
    assert_eq!(attempt["status_detail"], run["status_detail"]);
    assert_eq!(attempt["cause"], run["cause"]);
    assert!(run["workers"].as_array().unwrap().iter().all(|w| w["status"] == "DEAD"), "{run}");
    // Its history, at Ray's times.
    let history: Vec<(&str, u64)> = run["status_history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["status"].as_str().unwrap(), c["at_ms"].as_u64().unwrap()))
        .collect();
    assert_eq!(
        history,
        [
            ("INITIALIZING", 1_796_182_696_000),
            ("SCHEDULING", 1_796_182_696_000),
            ("RUNNING", 1_796_182_700_000),
            ("ABORTED", 1_796_182_706_000),
        ]
    );
    // Ray's own V2 route shows it ended too, valid under Ray's model.
    assert_valid_under_rays_model(&v2_runs(&client, &head).await);
    assert_eq!(status_of(&client, &head, "v2-cluster-died").await.as_deref(), Some("ABORTED"));

    let summary = site.summary();
    assert_eq!(summary["ended"], "1", "{summary:?}");
    assert_eq!((&*summary["malformed"], &*summary["rejected"]), ("0", "0"), "{summary:?}");
    // The node's death, the controller's and the others' actors', the job's.
    assert_eq!(summary["deaths"], "10", "{summary:?}");
    // The driver job's death came after the controller's: the run had
    // ended, nothing was written for it.
    assert_eq!(summary["stale"], "0", "{summary:?}");

    // Read again from the start, nothing changes.
    std::fs::remove_file(&site.position).unwrap();
    let mut again = site.ingester(&head, true);
    assert!(again.wait().success(), "{}", site.log());
    assert_eq!(runs_by_name(&client, &head).await["v2-cluster-died"], *run);
}

/// The same capture with its node preempted rather than lost
/// (`fixtures/ray-v2/node-preempted/`, its node's death reason changed to
/// `AUTOSCALER_DRAIN_PREEMPTED`): the run ends PREEMPTED, an interruption,
/// with Ray's words for the node's death in its detail.
#[tokio::test]
async fn a_run_whose_node_was_preempted_ends_preempted_an_interruption() {
    let site = Site::new();
    let head = start(&site.data, "127.0.0.1:0", &[]);
    let client = Client::new();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/ray-v2/node-preempted");
    for name in [
        "event_EXPORT_TRAIN_STATE.log",
        "event_EXPORT_NODE.log",
        "event_EXPORT_ACTOR.log",
        "event_EXPORT_DRIVER_JOB.log",
    ] {
        std::fs::copy(fixtures.join(name), site.events.join(name)).unwrap();
    }
    let mut ingester = site.ingester(&head, true);
    assert!(ingester.wait().success(), "{}", site.log());

    let runs = runs_by_name(&client, &head).await;
    let run = &runs["v2-cluster-died"];
    assert_eq!(run["run_status"], "ABORTED", "{run}");
    assert_eq!(
        run["cause"],
        json!({"kind": "PREEMPTED", "class": "INTERRUPTED", "failed_world_rank": 0}),
        "{run}"
    );
    let attempt = run["attempts"].as_array().unwrap().last().unwrap();
    assert_eq!(attempt["cause"], run["cause"], "{attempt}");
    let detail = run["status_detail"].as_str().unwrap();
    let node = "677236be428cbd47c16fa632bada4a00266e5ad0272b9713695488fc";
    assert!(
        detail.contains(&format!(
            "node {node} (192.0.2.2), where the run had workers, dead: AUTOSCALER_DRAIN_PREEMPTED"
        )),
        "the node's death in Ray's words: {detail}"
    );
    assert_eq!(site.summary()["ended"], "1");
}

/// The same cluster, its deaths read one by one by a following ingester:
/// the node's death reaches the live attempt that had workers on it (the
/// run stays live: its controller may still report), and the driver job's
/// end, with no word of the controller's death, ends the run.
#[tokio::test]
async fn a_node_s_death_reaches_the_attempt_and_the_driver_job_s_end_ends_the_run() {
    let site = Site::new();
    let head = start(&site.data, "127.0.0.1:0", &[]);
    let client = Client::new();
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/ray-v2/cluster-died");
    let copy = |name: &str| std::fs::copy(fixtures.join(name), site.events.join(name)).unwrap();
    copy("event_EXPORT_TRAIN_STATE.log");
    let mut ingester = site.ingester(&head, false);
    let run_of = || async { runs_by_name(&client, &head).await.remove("v2-cluster-died") };
    let until = Instant::now() + DEADLINE;
    while run_of().await.is_none_or(|run| run["status"] != json!(null)) {
        assert!(Instant::now() < until, "the run is not RUNNING: {}", site.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    copy("event_EXPORT_NODE.log");
    let node = "677236be428cbd47c16fa632bada4a00266e5ad0272b9713695488fc";
    let line = format!(
        "Ray reports node {node} (192.0.2.2), where this attempt had workers, dead: \
         UNEXPECTED_TERMINATION: health check failed due to missing too many heartbeats"
    );
    let until = Instant::now() + DEADLINE;
    let run = loop {
        let run = run_of().await.unwrap();
        let attempt = run["attempts"].as_array().unwrap().last().unwrap().clone();
        if attempt["status_detail"].as_str().is_some_and(|d| d.contains(&line)) {
            break run;
        }
        assert!(Instant::now() < until, "no node death on the attempt: {run}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(run["run_status"], "RUNNING", "{run}");

    // The actors' deaths without the controller's, then the job's end.
    let actors = std::fs::read_to_string(fixtures.join("event_EXPORT_ACTOR.log")).unwrap();
    let others: String = actors
        .lines()
        .filter(|l| !(l.contains("\"TrainController\"") && l.contains("\"DEAD\"")))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(site.events.join("event_EXPORT_ACTOR.log"), others).unwrap();
    copy("event_EXPORT_DRIVER_JOB.log");
    let until = Instant::now() + DEADLINE;
    let run = loop {
        let run = run_of().await.unwrap();
        if run["run_status"] == "ABORTED" {
            break run;
        }
        assert!(Instant::now() < until, "the run did not end: {}", site.log());
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(
        run["cause"],
        json!({"kind": "NODE_LOST", "class": "INFRASTRUCTURE", "failed_world_rank": 0}),
        "{run}"
    );
    let detail = run["status_detail"].as_str().unwrap();
    assert!(
        detail.starts_with(
            "Ray reports the run's driver job 01000000 (driver pid 12946) ended while the run was live"
        ),
        "{detail}"
    );
    assert!(
        detail.contains(&format!("node {node} (192.0.2.2), where the run had workers")),
        "{detail}"
    );
    // At the job's end, as Ray's GCS stamped it.
    assert_eq!(run["end_time_ms"], 1_796_182_706_097_u64, "{run}");
    let last = run["status_history"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        (&last["status"], &last["at_ms"]),
        (&json!("ABORTED"), &json!(1_796_182_706_097_u64))
    );
    assert!(ingester.terminate().success(), "{}", site.log());
    assert_eq!(site.summary()["ended"], "1");
}

#[tokio::test]
async fn regression_the_ingester_delivers_to_a_tls_head_with_its_ca() {
    use crate::tls::{Ca, Pki, client_trusting, path};
    let site = Site::new();
    let ca = Ca::new("head CA");
    let pki = Pki::write(site.data.parent().unwrap(), "head", &ca);
    let head = start(&site.data, "127.0.0.1:0", &pki.serve_flags());
    assert!(head.url.starts_with("https://"), "{}", head.url);
    let lines = rays_lines();
    site.append_lines(&lines);
    let session = site.events.parent().unwrap().parent().unwrap().to_owned();

    // Without the CA the ingester cannot deliver, and says which flag helps.
    let mut untrusting = site.ingester_with(&session, &head, false, &[]);
    eventually("an error naming --ca-cert", DEADLINE, || {
        std::future::ready(site.log().contains("--ca-cert").then_some(()))
    })
    .await;
    assert!(site.log().contains("not trusted"), "{}", site.log());
    assert!(site.position().is_none_or(|(_, line)| line == 0), "nothing was delivered");
    assert!(untrusting.terminate().success(), "{}", site.log());

    // With it, every event reaches the head.
    let mut ingester = site.ingester_with(&session, &head, true, &["--ca-cert", path(&pki.ca)]);
    assert!(ingester.wait().success(), "{}", site.log());
    assert_eq!(site.position().unwrap().1, lines.len() as u64);
    assert_eq!(site.summary()["applied"], lines.len().to_string(), "{}", site.log());
    assert_rays_answer(&client_trusting(&ca.pem()), &head).await;
}

/// A server in front of the head that passes `GET …/api/version` on (the
/// head's own answer, fetched once) and answers every other request as a
/// misconfigured proxy does: 404 with a page of its own. It counts the
/// writes it refused.
struct MisroutingProxy {
    url: String,
    writes: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl MisroutingProxy {
    async fn start(head: &Head) -> MisroutingProxy {
        use std::io::{BufRead, BufReader};
        use std::sync::atomic::{AtomicU64, Ordering};
        let version = Client::new()
            .get(format!("{}/api/version", head.url))
            .send()
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let writes = std::sync::Arc::new(AtomicU64::new(0));
        let counted = writes.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut request_line = String::new();
                if reader.read_line(&mut request_line).is_err() {
                    continue;
                }
                let mut length = 0_usize;
                loop {
                    let mut header = String::new();
                    if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
                        break;
                    }
                    if let Some((name, value)) = header.split_once(':')
                        && name.eq_ignore_ascii_case("content-length")
                    {
                        length = value.trim().parse().unwrap();
                    }
                }
                // The body is read whole, so that closing is not a reset.
                let mut body = vec![0_u8; length];
                let _ = reader.read_exact(&mut body);
                let (status, content_type, answer): (&str, &str, &[u8]) =
                    if request_line.starts_with("GET ") && request_line.contains("/api/version ") {
                        ("200 OK", "application/json", &version)
                    } else {
                        if request_line.starts_with("PUT ") {
                            counted.fetch_add(1, Ordering::SeqCst);
                        }
                        ("404 Not Found", "text/html", b"<html><body>404 Not Found</body></html>")
                    };
                let head = format!(
                    "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    answer.len()
                );
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(answer);
            }
        });
        MisroutingProxy { url, writes }
    }

    fn writes(&self) -> u64 {
        self.writes.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Finding 3 of round two: with a path in `--url` (a proxy's prefix, a
/// typo) the head answered every write "no such route", read as "run not
/// found", and the ingester skipped all 8 events and saved its position.
/// Now the ingester checks the URL first and refuses it naming `--url`,
/// having read nothing; restarted with the right URL, it applies all 8.
#[tokio::test]
async fn regression_an_ingester_given_a_url_with_a_path_applies_nothing_and_then_all_eight() {
    let site = Site::new();
    let head = start(&site.data, "127.0.0.1:0", &[]);
    let client = Client::new();
    site.append_lines(&rays_lines()[..8]);

    let mut wrong = site.ingester_at(site.session(), &format!("{}/prefix", head.url), false, &[]);
    let status = wrong.wait();
    let log = site.log();
    assert!(!status.success(), "a URL that is no head's is refused: {log}");
    assert!(log.contains("--url") && log.contains("no route"), "says why, naming the flag: {log}");
    assert_eq!(site.position(), None, "nothing read: {log}");
    assert!(runs_by_name(&client, &head).await.is_empty(), "nothing applied");

    let mut right = site.ingester(&head, true);
    assert!(right.wait().success(), "{}", site.log());
    let summary = site.summary();
    assert_eq!((&*summary["applied"], &*summary["rejected"]), ("8", "0"), "{summary:?}");
    assert_eq!(site.position().unwrap().1, 8);
    assert!(!runs_by_name(&client, &head).await.is_empty());
}

/// Finding 3 of round two, after the start: a URL that answers as a head
/// at first and then reaches no route for the writes (a proxy in front of
/// it) never costs an event: each is sent again, the position stays
/// before it, and an ingester with the head's own URL applies them all.
#[tokio::test]
async fn regression_a_write_that_reaches_no_route_is_sent_again_and_never_skipped() {
    let site = Site::new();
    let head = start(&site.data, "127.0.0.1:0", &[]);
    let client = Client::new();
    let proxy = MisroutingProxy::start(&head).await;
    site.append_lines(&rays_lines()[..8]);

    let mut misrouted =
        site.ingester_at(site.session(), &format!("{}/prefix", proxy.url), false, &[]);
    eventually("the same event sent three times", DEADLINE, || {
        std::future::ready((proxy.writes() >= 3).then_some(()))
    })
    .await;
    assert!(site.log().contains("the head's URL reaches no route"), "{}", site.log());
    assert!(misrouted.terminate().success(), "{}", site.log());
    let summary = site.summary();
    assert_eq!(
        (&*summary["applied"], &*summary["rejected"], &*summary["stale"]),
        ("0", "0", "0"),
        "{summary:?}"
    );
    assert_eq!(site.position(), Some((0, 0)), "the position never passes an event not applied");
    assert!(runs_by_name(&client, &head).await.is_empty(), "nothing applied");

    let mut right = site.ingester(&head, true);
    assert!(right.wait().success(), "{}", site.log());
    assert_eq!(site.summary()["applied"], "8");
    assert_eq!(site.position().unwrap().1, 8);
}

/// Finding 11 of round two (the position's temporary file): a symlink
/// planted at `<position file>.tmp` was followed, and the position written
/// into its target. Now it is removed and a new file created in its place:
/// the targets of a planted link, existing or dangling, are untouched.
#[tokio::test]
async fn regression_a_planted_position_tmp_symlink_is_replaced_and_never_followed() {
    let site = Site::new();
    let head = start(&site.data, "127.0.0.1:0", &[]);
    site.append_lines(&rays_lines()[..4]);
    let dir = site.position.parent().unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let tmp = dir.join("position.json.tmp");
    let victim = dir.join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    std::os::unix::fs::symlink(&victim, &tmp).unwrap();

    let mut ingester = site.ingester(&head, true);
    assert!(ingester.wait().success(), "{}", site.log());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n", "the target untouched");
    assert_eq!(site.position().unwrap().1, 4, "the position is saved all the same");

    // A dangling link: its target is not created.
    let absent = dir.join("absent");
    std::os::unix::fs::symlink(&absent, &tmp).unwrap();
    site.append_lines(&rays_lines()[4..8]);
    let mut ingester = site.ingester(&head, true);
    assert!(ingester.wait().success(), "{}", site.log());
    assert!(std::fs::symlink_metadata(&absent).is_err(), "the dangling link's target not created");
    assert_eq!(site.position().unwrap().1, 8);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
}

/// Finding 11 of round two (the lock file): the ingester opened
/// `<position file>.lock` through a dangling symlink, creating its target.
/// Now a symlinked lock file (dangling or not) is refused, naming it, and
/// nothing is read; its target is neither created nor changed.
#[tokio::test]
async fn regression_a_symlinked_lock_file_is_refused_and_its_target_never_created() {
    let site = Site::new();
    let head = start(&site.data, "127.0.0.1:0", &[]);
    site.append_lines(&rays_lines()[..4]);
    let dir = site.position.parent().unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let lock = dir.join("position.json.lock");
    let absent = dir.join("absent");
    std::os::unix::fs::symlink(&absent, &lock).unwrap();

    let mut ingester = site.ingester(&head, true);
    assert!(!ingester.wait().success(), "{}", site.log());
    let log = site.log();
    assert!(log.contains("position.json.lock is a symlink"), "names the lock file: {log}");
    assert!(std::fs::symlink_metadata(&absent).is_err(), "the link's target not created");
    assert_eq!(site.position(), None, "nothing read");

    // A link to an existing file: refused too, the file unchanged.
    let victim = dir.join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    std::fs::remove_file(&lock).unwrap();
    std::os::unix::fs::symlink(&victim, &lock).unwrap();
    let mut ingester = site.ingester(&head, true);
    assert!(!ingester.wait().success(), "{}", site.log());
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");

    // Once the link is gone, the ingester makes its own lock file.
    std::fs::remove_file(&lock).unwrap();
    let mut ingester = site.ingester(&head, true);
    assert!(ingester.wait().success(), "{}", site.log());
    assert!(std::fs::symlink_metadata(&lock).unwrap().is_file());
    assert_eq!(site.position().unwrap().1, 4);
}

/// Finding 11 of round two (the unended line): a last line without its
/// line break was read again from its start on every poll; one of 17 MiB
/// (over the 16 MiB limit) cost 17 MiB of reading every 10 ms. Now it is
/// read on as it grows, each byte once (the ingester's count of bytes read
/// equals the files' sizes after many polls), said once to be over the
/// limit, and skipped when it ends, naming its line and offset.
#[tokio::test]
async fn regression_an_unended_line_over_the_limit_is_read_once_and_skipped_when_it_ends() {
    const LIMIT: usize = 16 << 20;
    let site = Site::new();
    let head = start(&site.data, "127.0.0.1:0", &[]);
    let lines = rays_lines();
    site.append_lines(&lines[..4]);
    let mut ingester = site.ingester(&head, false);
    site.wait_for_line(4).await;
    let long_at = site.file_len();
    site.append(&"x".repeat(LIMIT + (1 << 20)));
    eventually("the long line said to be over the limit", DEADLINE, || {
        std::future::ready(site.log().contains("not ended yet").then_some(()))
    })
    .await;
    // Each blank line appended to the node events file is read in a round
    // of its own, and every round polls Ray's Train file first.
    let node_file = site.events.join("event_EXPORT_NODE.log");
    for k in 1..=5 {
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node_file)
            .unwrap()
            .write_all(b"\n")
            .unwrap();
        eventually("a round of polls", DEADLINE, || {
            std::future::ready(
                (site.position_in("event_EXPORT_NODE.log") == Some((k, k))).then_some(()),
            )
        })
        .await;
    }
    site.append("\n");
    site.append_lines(&lines[4..8]);
    site.wait_for_line(9).await;
    assert!(ingester.terminate().success(), "{}", site.log());

    let log = site.log();
    let said: Vec<_> = log.lines().filter(|l| l.contains("not ended yet")).collect();
    assert_eq!(said.len(), 1, "said once: {log}");
    let skipped = log.lines().find(|l| l.contains("skipping a line longer than")).expect("skipped");
    let skipped = fields(skipped);
    assert_eq!((&*skipped["line"], skipped["offset"].clone()), ("5", long_at.to_string()));
    let summary = site.summary();
    assert_eq!((&*summary["applied"], &*summary["malformed"]), ("8", "1"), "{summary:?}");
    let files = site.file_len() + std::fs::metadata(&node_file).unwrap().len();
    assert_eq!(summary["line_bytes_read"], files.to_string(), "each byte read once");
}

/// Finding 3 of round two, the other side of the URL check: a head that is
/// down when the ingester starts is still waited for (asked again with
/// backoff), not taken for a wrong URL; once it answers, every event is
/// applied.
#[tokio::test]
async fn regression_an_ingester_started_before_its_head_waits_for_it_and_applies_every_event() {
    let site = Site::new();
    // A relay to a port nothing listens on: connections close at once.
    let relay = crate::process::Relay::start("http://127.0.0.1:1").await;
    site.append_lines(&rays_lines()[..8]);
    let mut ingester = site.ingester_at(site.session(), &relay.url, false, &[]);
    eventually("the ingester waiting for its head", DEADLINE, || {
        std::future::ready(site.log().contains("the head does not answer yet").then_some(()))
    })
    .await;
    assert_eq!(site.position(), None, "nothing read before the head answers");

    let head = start(&site.data, "127.0.0.1:0", &[]);
    relay.point_to(&head.url);
    site.wait_for_line(8).await;
    assert!(ingester.terminate().success(), "{}", site.log());
    assert_eq!(site.summary()["applied"], "8");
}

#[tokio::test]
async fn regression_the_ingester_dies_on_sighup_no_more_it_keeps_ingesting() {
    let site = Site::new();
    let head = start(&site.data, "127.0.0.1:0", &[]);
    let client = Client::new();
    let lines = rays_lines();
    let mut ingester = site.ingester(&head, false);
    site.append_lines(&lines[..10]);
    site.wait_for_line(10).await;

    // The terminal it ran in closes (or a log rotator signals it).
    let pid = ingester.child.id().to_string();
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
    eventually("the SIGHUP logged", DEADLINE, || {
        let exited = ingester.child.try_wait().unwrap();
        assert!(exited.is_none(), "SIGHUP stopped the ingester ({exited:?}): {}", site.log());
        std::future::ready(site.log().contains("SIGHUP: ignored").then_some(()))
    })
    .await;

    // What Ray writes after the signal still reaches the head.
    site.append_lines(&lines[10..]);
    site.wait_for_end().await;
    assert_rays_answer(&client, &head).await;
    assert!(ingester.child.try_wait().unwrap().is_none(), "still running");
    assert!(ingester.terminate().success(), "SIGTERM still stops it cleanly: {}", site.log());
}

#[tokio::test]
async fn regression_the_ray_ingesters_position_file_is_its_owners_alone() {
    use std::os::unix::fs::PermissionsExt;

    let site = Site::new();
    let head = start(&site.data, "127.0.0.1:0", &[]);
    site.append_lines(&rays_lines()[..5]);
    let mut ingester = site.ingester(&head, true);
    assert!(ingester.wait().success(), "{}", site.log());
    assert_eq!(site.position().unwrap().1, 5);
    let mut lock = site.position.clone().into_os_string();
    lock.push(".lock");
    for path in [site.position.clone(), PathBuf::from(lock)] {
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{} is {mode:03o}", path.display());
    }
}

/// Round three: Ray V2 runs were never swept. Now they are leased, and the
/// ingester, while it follows Ray's events, renews the leases of the live
/// V2 runs (Ray writes a run only when it changes): a RUNNING run outlives
/// several leases while the ingester runs, and is aborted
/// `LOST_CONTROLLER`, in words naming Ray Train V2, once it stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regression_ray_v2_runs_are_kept_by_the_ingesters_renewals_and_aborted_without_them() {
    let site = Site::new();
    let head = start(&site.data, "127.0.0.1:0", &["--lease", "2s"]);
    let client = Client::new();
    site.append_lines(&[]);
    let mut ingester = site.ingester(&head, false);

    let id = trainstate_schema::RunId::new_v7().to_string();
    let now_ns =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
            as u64;
    let run = json!({"id": id, "name": "v2-renewed", "job_id": "01000000",
        "controller_actor_id": "c0ffee", "status": "RUNNING", "start_time_ns": now_ns});
    let url = format!("{}/api/train/v2/runs/{id}", head.url);
    let body = Some(("application/json", serde_json::to_vec(&run).unwrap()));
    let (status, answer) = send(&client, Method::PUT, &url, body, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");

    // Renewed past three leases, and still RUNNING.
    let v1_url = format!("{}/api/train/runs/{id}", head.url);
    let written_ms = now_ns / 1_000_000;
    let until = Instant::now() + DEADLINE;
    loop {
        let (status, run) = send(&client, Method::GET, &v1_url, None, None).await;
        assert_eq!(status, StatusCode::OK, "{run}");
        assert_eq!(run["run_status"], "RUNNING", "{run}\n{}", site.log());
        if run["last_heartbeat_ms"].as_u64().is_some_and(|t| t > written_ms + 6_000) {
            break;
        }
        assert!(Instant::now() < until, "never renewed: {run}\n{}", site.log());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Without the ingester, nothing tells about it: aborted.
    ingester.terminate();
    let until = Instant::now() + DEADLINE;
    let run = loop {
        let (_, run) = send(&client, Method::GET, &v1_url, None, None).await;
        if run["run_status"] == "ABORTED" {
            break run;
        }
        assert!(Instant::now() < until, "never aborted: {run}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(run["cause"]["kind"], "LOST_CONTROLLER", "{run}");
    let detail = run["status_detail"].as_str().unwrap();
    assert!(detail.contains("this Ray Train V2 run"), "{detail}");
}
