//! The `wrk-reads` path: the head's reads and heartbeats loaded by `wrk`
//! with `bench/wrk/cycle.lua`, which sends a fixed list of requests over
//! and over. Five phases, each against a fresh release `trainstate serve`
//! over loopback, each for `--wrk-duration` seconds:
//!
//! - `get_one`: N runs of W workers stored (registered over 64 connections
//!   first), then `GET /api/train/runs/{id}` cycling through them, 1 thread,
//!   1 connection.
//! - `get_all`: N runs stored, then `GET /api/train/v2/runs`, every run
//!   unpaged (the route of the "list all runs, unpaged" row), 1 thread,
//!   1 connection.
//! - `get_during_burst`: N runs stored, then at once the pipelined
//!   registration burst of the `wrk` path (`register.lua`, 2 threads over 64
//!   connections) and the load of `get_one` on one connection of its own.
//! - `run_heartbeats`: [`HEARTBEAT_TARGETS`] live runs registered (leased,
//!   as every registration is), then `POST /api/train/runs/{id}/heartbeat`
//!   cycling through them, 2 threads over 64 connections.
//! - `rank_heartbeats`: groups of W ranks assembled through the rendezvous
//!   (every rank of every group joins; [`HEARTBEAT_TARGETS`] ranks at
//!   least), then `POST /api/train/runs/{id}/ranks/{rank}/heartbeat` with
//!   the rank's attempt, cycling through every rank, 2 threads over 64
//!   connections.
//!
//! Every head runs with the wrk path's options ([`WRK_SERVE_ARGS`]): the
//! burst stores more live runs than the default bound, and its connections
//! with the get's are more than the default bound for one client address.
//!
//! Figures are wrk's (latency percentiles, answers per second) and the
//! head's CPU over the phase in cores: the growth of utime + stime of its
//! process (`/proc/<pid>/stat`) over the wall time wrk ran.
//!
//! Checks: every answer of a read or a heartbeat is 200 and no socket error
//! occurred; the burst's registrations are checked as the `wrk` path checks
//! them (every 201 stored, no other status); the runs a phase stores first
//! are all stored, and the heartbeat phases store no run.

use super::paths;
use std::path::Path;
use std::time::Duration;
use trainstate_schema::routes::Operation;

use serde_json::{Map, Value, json};
use trainstate_schema::api::{JoinRequest, RankHeartbeatRequest, RendezvousResponse};
use trainstate_schema::{RunId, RunStatus};

use super::http::HttpTarget;
use super::unit::{tempdir, total_of};
use super::util::{cpu_time, ids_of_listing, round};
use super::wrk::{self, CONNECTIONS, Load, THREADS, WRK_SERVE_ARGS, WrkReport};
use super::{Options, StoreKind, records};

/// The live runs of the run heartbeat phase, and the least number of ranks
/// of the rank heartbeat phase.
pub(crate) const HEARTBEAT_TARGETS: usize = 1_000;

/// The script that sends a list of requests over and over.
const CYCLE_SCRIPT: &str = "cycle.lua";

/// One request of a list `cycle.lua` sends.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Request {
    method: &'static str,
    path: String,
    body: Option<String>,
}

impl Request {
    fn get(path: String) -> Self {
        Self { method: "GET", path, body: None }
    }

    fn post(path: String, body: Option<String>) -> Self {
        Self { method: "POST", path, body }
    }
}

/// The lines of `cycle.lua`'s request file: `METHOD<tab>PATH[<tab>BODY]`.
fn request_lines(requests: &[Request]) -> String {
    let mut text = String::new();
    for r in requests {
        text.push_str(r.method);
        text.push('\t');
        text.push_str(&r.path);
        if let Some(body) = &r.body {
            text.push('\t');
            text.push_str(body);
        }
        text.push('\n');
    }
    text
}

/// A fresh head on a fresh data directory (kept while the head runs).
struct Head {
    http: HttpTarget,
    dir: tempfile::TempDir,
}

impl Head {
    async fn start(opts: &Options, store: StoreKind) -> Result<Self, String> {
        let dir = tempdir()?;
        let (server, _) = wrk::spawn_server(&opts.trainstate_bin, dir.path(), store)?;
        let http = HttpTarget::new(server, opts.concurrency)?;
        http.get(paths::path(Operation::Health)).await?;
        Ok(Self { http, dir })
    }

    fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn pid(&self) -> u32 {
        self.http.server.pid()
    }

    fn url(&self) -> String {
        self.http.server.url("")
    }

    async fn stored(&self) -> Result<usize, String> {
        total_of(&self.http.get(&paths::runs_query("limit=1")).await?)
    }

    /// Registers `n` fresh live runs of `w` workers over the client's
    /// connections; their ids.
    async fn store_runs(&self, n: usize, w: u32) -> Result<Vec<RunId>, String> {
        let runs = records::runs(n, w);
        let (_, failures) = self.http.register_pipelined(&runs).await;
        if failures > 0 {
            return Err(format!("{failures} of {n} registrations failed"));
        }
        let stored = self.stored().await?;
        if stored != n {
            return Err(format!("{n} runs registered, {stored} stored"));
        }
        Ok(runs.iter().map(|r| r.id().clone()).collect())
    }

    /// Writes `requests` for `cycle.lua`; the file's path.
    fn request_file(&self, name: &str, requests: &[Request]) -> Result<std::path::PathBuf, String> {
        let file = self.dir().join(name);
        std::fs::write(&file, request_lines(requests)).map_err(|e| e.to_string())?;
        Ok(file)
    }

    async fn stop(self) -> Result<(), String> {
        self.http.server.terminate()
    }
}

/// The load of `cycle.lua` over the requests in `file`.
fn cycle_load(opts: &Options, file: &Path, threads: usize, connections: usize) -> Load {
    Load {
        script: CYCLE_SCRIPT,
        threads,
        connections,
        seconds: opts.wrk_duration,
        env: vec![("TRAINSTATE_WRK_REQUESTS", file.as_os_str().to_owned())],
    }
}

/// The head's CPU in cores over `wall`: its CPU time's growth over it.
fn cores(cpu: Duration, wall: Duration) -> f64 {
    round(cpu.as_secs_f64() / wall.as_secs_f64().max(1e-9), 2)
}

/// wrk's figures of a load: answers per second and latencies.
fn summary(report: &WrkReport, threads: usize, connections: usize) -> Map<String, Value> {
    let mut out = Map::new();
    out.insert("answers".into(), json!(report.answered()));
    out.insert("req_per_s".into(), json!(report.per_second(report.answered())));
    // The median is wrk's p50: the key the anchor's tables read.
    out.insert("lat_ms_median".into(), report.latency_ms("p50"));
    for (key, wrk_key) in
        [("lat_ms_p50", "p50"), ("lat_ms_p90", "p90"), ("lat_ms_p99", "p99"), ("lat_ms_max", "max")]
    {
        out.insert(key.into(), report.latency_ms(wrk_key));
    }
    // Each request as the script timed it, where it could (one connection
    // a thread): wrk's own figures are corrected for coordinated omission.
    if report.service_latency_us.is_some() {
        for key in ["p50", "p90", "p99", "max"] {
            out.insert(format!("service_lat_ms_{key}"), report.service_latency_ms(key));
        }
    }
    out.insert("threads".into(), json!(threads));
    out.insert("connections".into(), json!(connections));
    out.insert("total_s".into(), json!(round(report.duration.as_secs_f64(), 3)));
    out
}

/// Every answer is `status`, at least one came, and no socket error.
fn check_every_answer(what: &str, report: &WrkReport, status: u16) -> Result<Value, String> {
    let want = status.to_string();
    let mut wrong = Vec::new();
    let other: u64 = report
        .status
        .iter()
        .filter(|(k, _)| **k != want)
        .map(|(_, v)| v.as_u64().unwrap_or(0))
        .sum();
    if other > 0 {
        wrong.push(format!("{other} answers were not {status} ({:?})", report.status));
    }
    if report.socket_errors > 0 {
        wrong.push(format!("{} socket errors", report.socket_errors));
    }
    if report.answered() == 0 {
        wrong.push("no answer".into());
    }
    if !wrong.is_empty() {
        return Err(format!("{what}: {}", wrong.join("; ")));
    }
    Ok(json!({"answers": report.answered(), "every_answer": status}))
}

/// Runs one load against `head` and measures the head's CPU over it.
fn measure(
    wrk: &Path,
    root: &Path,
    head: &Head,
    load: &Load,
) -> Result<(WrkReport, Map<String, Value>), String> {
    let before = cpu_time(head.pid());
    let (report, wall) = load.start(wrk, root, &head.url())?.finish()?;
    let cpu = cpu_time(head.pid()).saturating_sub(before);
    let mut out = summary(&report, load.threads, load.connections);
    out.insert("head_cpu_cores".into(), json!(cores(cpu, wall)));
    out.insert("head_cpu_s".into(), json!(round(cpu.as_secs_f64(), 2)));
    Ok((report, out))
}

/// The get of one stored run after another, on one connection.
fn get_requests(ids: &[RunId]) -> Vec<Request> {
    ids.iter().map(|id| Request::get(paths::run_path(Operation::GetRun, id))).collect()
}

/// `get_one`: one run at a time, cycling through N stored runs.
async fn get_one(
    opts: &Options,
    store: StoreKind,
    wrk: &Path,
    root: &Path,
) -> Result<Value, String> {
    let head = Head::start(opts, store).await?;
    let ids = head.store_runs(opts.n, opts.w).await?;
    let body = head.http.get(&paths::run_path(Operation::GetRun, &ids[0])).await?;
    let got: Value = serde_json::from_slice(&body).map_err(|e| format!("a run: {e}"))?;
    if got["id"] != json!(ids[0].as_str()) {
        return Err(format!("asked for run {}, got {}", ids[0], got["id"]));
    }
    let file = head.request_file("get.tsv", &get_requests(&ids))?;
    let (report, mut out) = measure(wrk, root, &head, &cycle_load(opts, &file, 1, 1))?;
    let checks = check_every_answer("get one run", &report, 200)?;
    head.stop().await?;
    out.insert("runs_stored".into(), json!(ids.len()));
    out.insert("json_bytes".into(), json!(body.len()));
    out.insert("route".into(), json!("GET /api/train/runs/{id}"));
    out.insert("checks".into(), checks);
    Ok(Value::Object(out))
}

/// `get_all`: every run, unpaged, one listing at a time.
async fn get_all(
    opts: &Options,
    store: StoreKind,
    wrk: &Path,
    root: &Path,
) -> Result<Value, String> {
    let route = paths::path(Operation::ListRunsRay);
    let head = Head::start(opts, store).await?;
    let ids = head.store_runs(opts.n, opts.w).await?;
    let body = head.http.get(route).await?;
    let listed = ids_of_listing(&body)?;
    let mut want: Vec<&str> = ids.iter().map(RunId::as_str).collect();
    let mut got: Vec<&str> = listed.iter().map(String::as_str).collect();
    want.sort_unstable();
    got.sort_unstable();
    if want != got {
        return Err(format!("the listing holds {} runs, not the {} stored", got.len(), want.len()));
    }
    let file = head.request_file("list.tsv", &[Request::get(route.into())])?;
    let (report, mut out) = measure(wrk, root, &head, &cycle_load(opts, &file, 1, 1))?;
    let checks = check_every_answer("list every run", &report, 200)?;
    head.stop().await?;
    out.insert("runs_stored".into(), json!(ids.len()));
    out.insert("json_bytes".into(), json!(body.len()));
    out.insert("route".into(), json!(format!("GET {route}")));
    out.insert("checks".into(), checks);
    Ok(Value::Object(out))
}

/// `get_during_burst`: the get of `get_one` while the pipelined
/// registrations of the `wrk` path run against the same head.
async fn get_during_burst(
    opts: &Options,
    store: StoreKind,
    wrk: &Path,
    root: &Path,
) -> Result<Value, String> {
    let head = Head::start(opts, store).await?;
    let ids = head.store_runs(opts.n, opts.w).await?;
    let get_file = head.request_file("get.tsv", &get_requests(&ids))?;
    let body = head.dir().join("run.json");
    std::fs::write(&body, wrk::body_template(opts.w)?).map_err(|e| e.to_string())?;
    let prefix = format!("burst{:x}", std::process::id());
    let burst = wrk::register_load(opts, &body, prefix, THREADS, CONNECTIONS);
    let get = cycle_load(opts, &get_file, 1, 1);

    let before = cpu_time(head.pid());
    let registering = burst.start(wrk, root, &head.url())?;
    let getting = get.start(wrk, root, &head.url())?;
    let (get_report, get_wall) = getting.finish()?;
    let (burst_report, burst_wall) = registering.finish()?;
    let cpu = cpu_time(head.pid()).saturating_sub(before);

    let get_checks = check_every_answer("get during the burst", &get_report, 200)?;
    let stored = (head.stored().await? - ids.len()) as u64;
    let burst_checks = wrk::check_stored(&burst_report, stored, CONNECTIONS)?;
    head.stop().await?;

    let mut register = summary(&burst_report, THREADS, CONNECTIONS);
    register.insert("runs_per_s".into(), json!(burst_report.per_second(burst_report.created())));
    Ok(json!({
        "get": summary(&get_report, 1, 1),
        "register": register,
        "runs_stored_before": ids.len(),
        "head_cpu_cores": cores(cpu, get_wall.max(burst_wall)),
        "checks": {"get": get_checks, "register": burst_checks},
    }))
}

/// `run_heartbeats`: [`HEARTBEAT_TARGETS`] live runs heartbeat.
async fn run_heartbeats(
    opts: &Options,
    store: StoreKind,
    wrk: &Path,
    root: &Path,
) -> Result<Value, String> {
    let head = Head::start(opts, store).await?;
    let ids = head.store_runs(HEARTBEAT_TARGETS, opts.w).await?;
    let requests: Vec<Request> = ids
        .iter()
        .map(|id| Request::post(paths::run_path(Operation::HeartbeatRun, id), None))
        .collect();
    let file = head.request_file("heartbeat.tsv", &requests)?;
    let load = cycle_load(opts, &file, THREADS, CONNECTIONS);
    let (report, mut out) = measure(wrk, root, &head, &load)?;
    let checks = check_every_answer("run heartbeats", &report, 200)?;
    let stored = head.stored().await?;
    if stored != ids.len() {
        return Err(format!("run heartbeats: {} runs before, {stored} after", ids.len()));
    }
    head.stop().await?;
    out.insert("runs".into(), json!(ids.len()));
    out.insert("route".into(), json!("POST /api/train/runs/{id}/heartbeat"));
    out.insert("checks".into(), checks);
    Ok(Value::Object(out))
}

/// One rank of an assembled group: its run, its rank and its attempt.
#[derive(Debug, Clone)]
struct Rank {
    run_id: RunId,
    rank: u32,
    attempt_id: String,
}

/// Assembles `groups` groups of `world_size` ranks: every rank joins in
/// turn; the join that completes a group must answer it registered and
/// running, and every rank of a group must be given the same run and attempt.
async fn assemble(head: &Head, groups: usize, world_size: u32) -> Result<Vec<Rank>, String> {
    let mut ranks = Vec::with_capacity(groups * world_size as usize);
    for group in 0..groups {
        let key = format!("bench-group-{group}");
        let mut first: Option<(RunId, String)> = None;
        for rank in 0..world_size {
            let join = JoinRequest::new(
                world_size,
                records::worker(group as u64, rank),
                format!("bench-rendezvous-{group}"),
                format!("{:08x}", group + 1),
            );
            let path = paths::key_path(Operation::JoinRendezvous, &key);
            let body = serde_json::to_vec(&join).map_err(|e| e.to_string())?;
            let (status, answer) = head.http.post_json(&path, body).await?;
            if status != 200 {
                return Err(format!("POST {path}: {status}: {}", String::from_utf8_lossy(&answer)));
            }
            let answer: RendezvousResponse =
                serde_json::from_slice(&answer).map_err(|e| format!("a join's answer: {e}"))?;
            let this = (answer.run_id.clone(), answer.attempt_id.clone());
            if first.get_or_insert_with(|| this.clone()) != &this {
                return Err(format!("group {key}: rank {rank} was given {this:?}, not {first:?}"));
            }
            let complete = rank + 1 == world_size;
            if complete && answer.run_status != Some(RunStatus::Running) {
                return Err(format!(
                    "group {key}: the last join answered {:?}, not a running run",
                    answer.run_status
                ));
            }
            ranks.push(Rank { run_id: answer.run_id, rank, attempt_id: answer.attempt_id });
        }
    }
    Ok(ranks)
}

/// `rank_heartbeats`: every rank of the assembled groups heartbeats.
async fn rank_heartbeats(
    opts: &Options,
    store: StoreKind,
    wrk: &Path,
    root: &Path,
) -> Result<Value, String> {
    let head = Head::start(opts, store).await?;
    let groups = HEARTBEAT_TARGETS.div_ceil(opts.w as usize);
    let ranks = assemble(&head, groups, opts.w).await?;
    let stored = head.stored().await?;
    if stored != groups {
        return Err(format!("{groups} groups assembled, {stored} runs stored"));
    }
    let mut requests = Vec::with_capacity(ranks.len());
    for r in &ranks {
        let body = serde_json::to_string(&RankHeartbeatRequest::new(r.attempt_id.clone()))
            .map_err(|e| e.to_string())?;
        let path = paths::rank_path(Operation::HeartbeatRank, &r.run_id, r.rank);
        requests.push(Request::post(path, Some(body)));
    }
    let file = head.request_file("rank-heartbeat.tsv", &requests)?;
    let load = cycle_load(opts, &file, THREADS, CONNECTIONS);
    let (report, mut out) = measure(wrk, root, &head, &load)?;
    let checks = check_every_answer("rank heartbeats", &report, 200)?;
    let after = head.stored().await?;
    if after != groups {
        return Err(format!("rank heartbeats: {groups} runs before, {after} after"));
    }
    head.stop().await?;
    out.insert("groups".into(), json!(groups));
    out.insert("world_size".into(), json!(opts.w));
    out.insert("ranks".into(), json!(ranks.len()));
    out.insert("route".into(), json!("POST /api/train/runs/{id}/ranks/{rank}/heartbeat"));
    out.insert("checks".into(), checks);
    Ok(Value::Object(out))
}

/// A phase of the `wrk-reads` path.
#[derive(Debug, Clone, Copy)]
enum Phase {
    GetOne,
    GetAll,
    GetDuringBurst,
    RunHeartbeats,
    RankHeartbeats,
}

impl Phase {
    const ALL: [Self; 5] = [
        Self::GetOne,
        Self::GetAll,
        Self::GetDuringBurst,
        Self::RunHeartbeats,
        Self::RankHeartbeats,
    ];

    /// Its key in the JSON line.
    fn key(self) -> &'static str {
        match self {
            Self::GetOne => "get_one",
            Self::GetAll => "get_all",
            Self::GetDuringBurst => "get_during_burst",
            Self::RunHeartbeats => "run_heartbeats",
            Self::RankHeartbeats => "rank_heartbeats",
        }
    }

    async fn run(
        self,
        opts: &Options,
        store: StoreKind,
        wrk: &Path,
        root: &Path,
    ) -> Result<Value, String> {
        match self {
            Self::GetOne => get_one(opts, store, wrk, root).await,
            Self::GetAll => get_all(opts, store, wrk, root).await,
            Self::GetDuringBurst => get_during_burst(opts, store, wrk, root).await,
            Self::RunHeartbeats => run_heartbeats(opts, store, wrk, root).await,
            Self::RankHeartbeats => rank_heartbeats(opts, store, wrk, root).await,
        }
    }
}

/// Every phase of the `wrk-reads` path, one JSON line's fields.
pub(crate) fn configuration(
    opts: &Options,
    store: StoreKind,
) -> Result<Map<String, Value>, String> {
    let wrk = wrk::find_wrk()?;
    let root = xtask::workspace_root();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut out = Map::new();
    out.insert("serve_args".into(), json!(WRK_SERVE_ARGS.join(" ")));
    let mut checks = Map::new();
    for phase in Phase::ALL {
        let key = phase.key();
        eprintln!("[bench] wrk-reads {} N={} W={}: {key}", store.as_str(), opts.n, opts.w);
        let mut measured = runtime
            .block_on(phase.run(opts, store, &wrk, &root))
            .map_err(|e| format!("{key}: {e}"))?;
        if let Some(check) = measured.as_object_mut().and_then(|m| m.remove("checks")) {
            checks.insert(key.into(), check);
        }
        out.insert(key.into(), measured);
    }
    out.insert(
        "wrk".into(),
        json!({
            "version": wrk::version(&wrk),
            "script": format!("bench/wrk/{CYCLE_SCRIPT}"),
            "burst_script": format!("bench/wrk/{}", wrk::REGISTER_SCRIPT),
            "prefer": opts.wrk_prefer,
            "mode": format!("{} s a phase", opts.wrk_duration),
        }),
    );
    out.insert("checks".into(), Value::Object(checks));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_file_has_one_request_a_line_with_its_body_after_a_tab() {
        let text = request_lines(&[
            Request::get("/api/train/runs/a".into()),
            Request::post("/api/train/runs/a/heartbeat".into(), None),
            Request::post("/api/train/runs/a/ranks/3/heartbeat".into(), Some("{\"x\":1}".into())),
        ]);
        assert_eq!(
            text,
            "GET\t/api/train/runs/a\n\
             POST\t/api/train/runs/a/heartbeat\n\
             POST\t/api/train/runs/a/ranks/3/heartbeat\t{\"x\":1}\n"
        );
    }

    fn report(status: &[(&str, u64)], socket_errors: u64) -> WrkReport {
        WrkReport {
            status: status.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect(),
            sent: 0,
            duration: Duration::from_secs(2),
            socket_errors,
            latency_us: Map::from_iter([
                ("p50".to_owned(), json!(150)),
                ("p99".into(), json!(900)),
            ]),
            service_latency_us: None,
        }
    }

    #[test]
    fn a_read_or_heartbeat_phase_fails_on_any_other_status_or_a_socket_error() {
        assert!(check_every_answer("x", &report(&[("200", 10)], 0), 200).is_ok());
        let err = check_every_answer("x", &report(&[("200", 10), ("404", 1)], 0), 200).unwrap_err();
        assert!(err.contains("1 answers were not 200"), "{err}");
        let err = check_every_answer("x", &report(&[("200", 10)], 2), 200).unwrap_err();
        assert!(err.contains("2 socket errors"), "{err}");
        let err = check_every_answer("x", &report(&[], 0), 200).unwrap_err();
        assert!(err.contains("no answer"), "{err}");
    }

    #[test]
    fn the_summary_gives_answers_per_second_and_wrks_latencies_in_milliseconds() {
        let summary = summary(&report(&[("200", 10)], 0), 2, 64);
        assert_eq!(summary["req_per_s"], json!(5.0));
        assert_eq!(summary["lat_ms_median"], json!(0.15));
        assert_eq!(summary["lat_ms_p99"], json!(0.9));
        assert_eq!(summary["lat_ms_max"], json!(null));
        assert_eq!(summary["connections"], json!(64));
        assert!(summary.get("service_lat_ms_p99").is_none());
        let mut timed = report(&[("200", 10)], 0);
        timed.service_latency_us = Some(Map::from_iter([("p99".to_owned(), json!(400))]));
        let summary = super::summary(&timed, 1, 1);
        assert_eq!(summary["service_lat_ms_p99"], json!(0.4));
        assert_eq!(summary["service_lat_ms_p50"], json!(null));
    }

    #[test]
    fn the_heads_cpu_is_in_cores_of_the_wall_time() {
        assert_eq!(cores(Duration::from_millis(7_500), Duration::from_secs(5)), 1.5);
        assert_eq!(cores(Duration::ZERO, Duration::from_secs(5)), 0.0);
    }
}
