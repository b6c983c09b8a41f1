//! The `wrk` path: registrations sent by `wrk` (Debian's package, an
//! external load generator) with `bench/wrk/register.lua` against a release
//! `trainstate serve` on a fresh data directory, then a check through the
//! listing that every acknowledged run is stored.
//!
//! Two phases, each on a fresh server: one connection, one request at a
//! time (`seq`), and 2 threads over 64 connections (`pipelined`), each for
//! `--wrk-duration` seconds (wrk stops on time, not on a count, so a phase
//! stores as many runs as the head takes in that time, usually more than
//! N). A request still in flight when wrk stops may be committed without
//! wrk counting its answer, so the check is:
//! every 2xx answer is a fresh run (201), no other status and no socket
//! error, and `created ≤ stored ≤ created + connections` and
//! `stored ≤ sent`.

use super::paths;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use trainstate_schema::routes::Operation;

use serde_json::{Map, Value, json};

use super::http::{HttpTarget, Server};
use super::unit::{tempdir, total_of};
use super::util::{cpu_time, kib, proc_mem, round};
use super::{Options, StoreKind, records};

/// The placeholder the Lua script replaces with a fresh run id.
const ID_PLACEHOLDER: &str = "@RUN_ID@";

/// The options of `serve` the wrk paths set beyond the defaults, so that a
/// phase measures the head's speed, not its bounds; recorded in each result
/// line (`serve_args`).
///
/// - A pipelined registration phase stores tens of thousands of live runs
///   in its seconds, more than the head's default bound on live runs
///   (10,000, which `--max-runs` also sets), past which it answers 503.
/// - Every connection of the benchmark comes from 127.0.0.1, one client
///   address to the head, which closes at once a connection past
///   `--max-connections-per-client` (64 by default): wrk's 64, the driver's
///   own and, during the burst, the get's would be one too many. It is
///   raised to the head's default `--max-connections` (512), as for a head
///   behind a proxy.
pub(crate) const WRK_SERVE_ARGS: [&str; 4] =
    ["--max-runs", "1000000", "--max-connections-per-client", "512"];

/// A release `trainstate serve` for a wrk phase on a fresh data directory:
/// the defaults, [`WRK_SERVE_ARGS`], and `--in-memory` for the memory store.
pub(crate) fn spawn_server(
    bin: &Path,
    data_dir: &Path,
    store: StoreKind,
) -> Result<(Server, Duration), String> {
    let mut extra = WRK_SERVE_ARGS.map(str::to_owned).to_vec();
    if store == StoreKind::Memory {
        extra.push("--in-memory".to_owned());
    }
    Server::spawn_with(bin, data_dir, &extra)
}

/// The threads and connections of the pipelined phase.
pub(crate) const THREADS: usize = 2;
/// The connections of the pipelined phase.
pub(crate) const CONNECTIONS: usize = 64;

/// What `register.lua`'s `done()` printed, and what it means.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct WrkReport {
    /// Answers by HTTP status.
    pub(crate) status: Map<String, Value>,
    /// Requests the script built (sent or about to be).
    pub(crate) sent: u64,
    /// wrk's measured time.
    pub(crate) duration: Duration,
    /// Socket errors (connect, read, write, timeout).
    pub(crate) socket_errors: u64,
    /// Latency percentiles, microseconds, as wrk gives them: corrected for
    /// coordinated omission (see `bench/wrk/report.lua`).
    pub(crate) latency_us: Map<String, Value>,
    /// Percentiles of each request's time as the script measured it,
    /// uncorrected, microseconds: only of threads with one connection.
    pub(crate) service_latency_us: Option<Map<String, Value>>,
}

impl WrkReport {
    fn count(&self, pred: impl Fn(u16) -> bool) -> u64 {
        self.status
            .iter()
            .filter(|(k, _)| k.parse::<u16>().is_ok_and(&pred))
            .map(|(_, v)| v.as_u64().unwrap_or(0))
            .sum()
    }

    /// 201 answers: runs the head says it created and committed.
    pub(crate) fn created(&self) -> u64 {
        self.count(|s| s == 201)
    }

    /// 2xx answers.
    pub(crate) fn acknowledged(&self) -> u64 {
        self.count(|s| (200..300).contains(&s))
    }

    /// Answers that are not 2xx.
    pub(crate) fn failed(&self) -> u64 {
        self.count(|s| !(200..300).contains(&s))
    }

    /// Every answer, whatever its status.
    pub(crate) fn answered(&self) -> u64 {
        self.count(|_| true)
    }

    /// Answers per second over wrk's measured time.
    pub(crate) fn per_second(&self, answers: u64) -> f64 {
        round(answers as f64 / self.duration.as_secs_f64().max(1e-9), 1)
    }

    /// A latency percentile of wrk's (`p50`, `p90`, `p99`, `max`), in
    /// milliseconds; null when wrk did not report it.
    pub(crate) fn latency_ms(&self, key: &str) -> Value {
        ms_of(Some(&self.latency_us), key)
    }

    /// A percentile of the requests as the script timed them, in
    /// milliseconds; null when it did not time them.
    pub(crate) fn service_latency_ms(&self, key: &str) -> Value {
        ms_of(self.service_latency_us.as_ref(), key)
    }
}

/// `percentiles[key]`, microseconds, in milliseconds; null when absent.
fn ms_of(percentiles: Option<&Map<String, Value>>, key: &str) -> Value {
    percentiles
        .and_then(|p| p.get(key))
        .and_then(Value::as_f64)
        .map_or(json!(null), |us| json!(round(us / 1000.0, 3)))
}

/// One wrk load: a script of `bench/wrk/`, its environment, and its shape.
pub(crate) struct Load {
    /// The script's file name in `bench/wrk/`.
    pub(crate) script: &'static str,
    pub(crate) threads: usize,
    pub(crate) connections: usize,
    pub(crate) seconds: u64,
    /// Variables the script reads.
    pub(crate) env: Vec<(&'static str, OsString)>,
}

/// wrk running a [`Load`].
pub(crate) struct Running {
    child: Child,
    started: Instant,
}

impl Load {
    /// Starts wrk with this load against `url`. The script is given the
    /// numbers of threads and connections as its arguments (`cycle.lua`
    /// spreads its threads over its requests by them, and times each
    /// request when a thread has one connection).
    pub(crate) fn start(&self, wrk: &Path, root: &Path, url: &str) -> Result<Running, String> {
        let script = script_path(root, self.script);
        if !script.is_file() {
            return Err(format!("{} is missing", script.display()));
        }
        let mut command = Command::new(wrk);
        command
            .arg(format!("-t{}", self.threads))
            .arg(format!("-c{}", self.connections))
            .args(["--timeout", "60s", "--latency", "-s"])
            .arg(script)
            .arg(format!("-d{}s", self.seconds))
            .arg(url)
            .arg("--")
            .arg(self.threads.to_string())
            .arg(self.connections.to_string())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let child = command.spawn().map_err(|e| format!("cannot run {}: {e}", wrk.display()))?;
        Ok(Running { child, started: Instant::now() })
    }
}

impl Running {
    /// Waits for wrk to stop; its report and the wall time it ran.
    pub(crate) fn finish(self) -> Result<(WrkReport, Duration), String> {
        let output = self.child.wait_with_output().map_err(|e| format!("wrk: {e}"))?;
        let wall = self.started.elapsed();
        let stdout = String::from_utf8_lossy(&output.stdout);
        if !output.status.success() {
            return Err(format!(
                "wrk exited with {}: {stdout}{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok((parse_output(&stdout)?, wall))
    }
}

/// The first line of `wrk -v`: its version.
pub(crate) fn version(wrk: &Path) -> String {
    Command::new(wrk)
        .arg("-v")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).lines().next().map(str::to_owned))
        .unwrap_or_default()
}

/// Reads the `trainstate-wrk {...}` line of wrk's output.
pub(crate) fn parse_output(stdout: &str) -> Result<WrkReport, String> {
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("trainstate-wrk "))
        .ok_or_else(|| format!("wrk printed no `trainstate-wrk` line:\n{stdout}"))?;
    let v: Value = serde_json::from_str(line)
        .map_err(|e| format!("wrk's report does not parse: {e}: {line}"))?;
    let obj = |key: &str| v.get(key).and_then(Value::as_object).cloned();
    let num = |key: &str| {
        v.get(key).and_then(Value::as_u64).ok_or_else(|| format!("wrk's report has no {key}"))
    };
    let errors = obj("errors").ok_or("wrk's report has no errors")?;
    let socket_errors = ["connect", "read", "write", "timeout"]
        .iter()
        .map(|k| errors.get(*k).and_then(Value::as_u64).unwrap_or(0))
        .sum();
    Ok(WrkReport {
        status: obj("status").ok_or("wrk's report has no status counts")?,
        sent: num("sent")?,
        duration: Duration::from_micros(num("duration_us")?),
        socket_errors,
        latency_us: obj("latency_us").unwrap_or_default(),
        service_latency_us: obj("service_latency_us"),
    })
}

/// Every acknowledged run is stored: see the module's documentation.
pub(crate) fn check_stored(
    report: &WrkReport,
    stored: u64,
    connections: usize,
) -> Result<Value, String> {
    let created = report.created();
    let acknowledged = report.acknowledged();
    let mut wrong = Vec::new();
    if report.failed() > 0 {
        wrong.push(format!("{} answers were not 2xx ({:?})", report.failed(), report.status));
    }
    if acknowledged != created {
        wrong.push(format!("{} 2xx answers did not create a fresh run", acknowledged - created));
    }
    if report.socket_errors > 0 {
        wrong.push(format!("{} socket errors", report.socket_errors));
    }
    if stored < created {
        wrong.push(format!("{created} runs acknowledged, only {stored} stored"));
    }
    if stored > created + connections as u64 || stored > report.sent {
        wrong.push(format!(
            "{stored} runs stored, {created} acknowledged and {} sent over {connections} connections",
            report.sent
        ));
    }
    if created == 0 {
        wrong.push("no run was created".into());
    }
    if !wrong.is_empty() {
        return Err(format!("wrk: {}", wrong.join("; ")));
    }
    Ok(json!({
        "sent": report.sent,
        "acknowledged": acknowledged,
        "created": created,
        "stored": stored,
        "in_flight_at_stop": stored - created,
    }))
}

/// The `wrk` executable on the PATH, or a clear error.
pub(crate) fn find_wrk() -> Result<PathBuf, String> {
    find_wrk_in(std::env::var_os("PATH"))
}

/// [`find_wrk`] on this `PATH`.
fn find_wrk_in(path: Option<std::ffi::OsString>) -> Result<PathBuf, String> {
    path.iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("wrk"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            "wrk is not installed: `apt-get install wrk` (Debian's package); \
             see docs/benchmarks.md"
                .to_owned()
        })
}

/// One run document of `w` workers with [`ID_PLACEHOLDER`] as its id.
pub(crate) fn body_template(w: u32) -> Result<String, String> {
    let run = records::run(0, w, 1_700_000_000_000);
    let mut doc = serde_json::to_value(&run).map_err(|e| e.to_string())?;
    doc["id"] = json!(ID_PLACEHOLDER);
    Ok(doc.to_string())
}

/// The registration script.
pub(crate) const REGISTER_SCRIPT: &str = "register.lua";

/// A script of `bench/wrk/`.
pub(crate) fn script_path(root: &Path, name: &str) -> PathBuf {
    root.join("bench").join("wrk").join(name)
}

/// The registration load: fresh run documents of the body in `body`, run
/// ids starting with `prefix`.
pub(crate) fn register_load(
    opts: &Options,
    body: &Path,
    prefix: String,
    threads: usize,
    connections: usize,
) -> Load {
    Load {
        script: REGISTER_SCRIPT,
        threads,
        connections,
        seconds: opts.wrk_duration,
        env: vec![
            ("TRAINSTATE_WRK_BODY", body.as_os_str().to_owned()),
            ("TRAINSTATE_WRK_PREFIX", prefix.into()),
            ("TRAINSTATE_WRK_PREFER", opts.wrk_prefer.clone().unwrap_or_default().into()),
        ],
    }
}

/// One phase: a fresh server, wrk against it, the check.
async fn phase(
    opts: &Options,
    store: StoreKind,
    wrk: &Path,
    root: &Path,
    threads: usize,
    connections: usize,
) -> Result<Map<String, Value>, String> {
    let dir = tempdir()?;
    let body = dir.path().join("run.json");
    std::fs::write(&body, body_template(opts.w)?).map_err(|e| e.to_string())?;
    let (server, ready) = spawn_server(&opts.trainstate_bin, dir.path(), store)?;
    let pid = server.pid();
    let http = HttpTarget::new(server, 1)?;
    http.get(paths::path(Operation::Health)).await?;
    let mem_before = proc_mem(pid);
    let cpu_before = cpu_time(pid);

    let prefix = format!("wrk{:x}", std::process::id());
    let load = register_load(opts, &body, prefix, threads, connections);
    let (report, _) = load.start(wrk, root, &http.server.url(""))?.finish()?;
    let cpu = cpu_time(pid).saturating_sub(cpu_before);
    let mem_after = proc_mem(pid);
    let stored = total_of(&http.get(&paths::runs_query("limit=1")).await?)? as u64;
    let checks = check_stored(&report, stored, connections)?;
    http.server.terminate()?;

    let created = report.created();
    let secs = report.duration.as_secs_f64();
    let lat = |k: &str| report.latency_ms(k);
    let mut out = Map::new();
    out.insert("actor_create_s".into(), json!(round(ready.as_secs_f64(), 4)));
    out.insert(
        "summary".into(),
        json!({
            "total_s": round(secs, 3),
            "runs_per_s": round(created as f64 / secs, 1),
            "lat_ms_p50": lat("p50"),
            "lat_ms_p90": lat("p90"),
            "lat_ms_p99": lat("p99"),
            "lat_ms_max": lat("max"),
            "in_flight": connections,
            "threads": threads,
            "cpu_us_per_run_state": round(cpu.as_secs_f64() * 1e6 / created.max(1) as f64, 0),
            "failures": report.failed(),
        }),
    );
    let growth = kib(&mem_after, "VmRSS") - kib(&mem_before, "VmRSS");
    out.insert(
        "mem".into(),
        json!({"after_create": mem_before, "after_wrk": mem_after,
               "per_run_kib": round(growth / stored.max(1) as f64, 2)}),
    );
    out.insert("checks".into(), checks);
    Ok(out)
}

/// Both phases of the wrk path, merged into the anchor's shape.
pub(crate) fn configuration(
    opts: &Options,
    store: StoreKind,
) -> Result<Map<String, Value>, String> {
    let wrk = find_wrk()?;
    let root = xtask::workspace_root();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    eprintln!("[bench] wrk {} N={} W={}: one connection", store.as_str(), opts.n, opts.w);
    let seq = runtime.block_on(phase(opts, store, &wrk, &root, 1, 1))?;
    eprintln!(
        "[bench] wrk {} N={} W={}: {THREADS} threads, {CONNECTIONS} connections",
        store.as_str(),
        opts.n,
        opts.w
    );
    let main = runtime.block_on(phase(opts, store, &wrk, &root, THREADS, CONNECTIONS))?;
    let version = version(&wrk);
    let mut out = Map::new();
    out.insert("serve_args".into(), json!(WRK_SERVE_ARGS.join(" ")));
    out.insert("ray_init_s".into(), json!(0.0));
    out.insert("actor_create_s".into(), main["actor_create_s"].clone());
    out.insert("seq".into(), seq["summary"].clone());
    out.insert("pipelined".into(), main["summary"].clone());
    // Only the start: the runs stored differ from N (see the module's docs).
    out.insert("actor_mem_kib".into(), json!({"after_create": main["mem"]["after_create"]}));
    out.insert("wrk_mem".into(), main["mem"].clone());
    out.insert(
        "wrk".into(),
        json!({
            "version": version,
            "script": "bench/wrk/register.lua",
            "prefer": opts.wrk_prefer,
            "mode": format!("{} s a phase", opts.wrk_duration),
        }),
    );
    out.insert("checks".into(), json!({"seq": seq["checks"], "main": main["checks"]}));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const OUTPUT: &str = "Running 2s test @ http://127.0.0.1:4000/\n  2 threads and 64 connections\n\
        Requests/sec:   5000.00\n\
        trainstate-wrk {\"status\":{\"201\":990,\"500\":2},\"sent\":1050,\"duration_us\":2000000,\
        \"responses\":992,\"errors\":{\"connect\":0,\"read\":1,\"write\":0,\"status\":2,\"timeout\":0},\
        \"latency_us\":{\"min\":100,\"p50\":900,\"p90\":1500,\"p99\":3000,\"max\":9000,\"mean\":950.5}}\n";

    #[test]
    fn the_report_of_the_lua_script_is_read_from_wrks_output() {
        let report = parse_output(OUTPUT).unwrap();
        assert_eq!(report.created(), 990);
        assert_eq!(report.acknowledged(), 990);
        assert_eq!(report.failed(), 2);
        assert_eq!(report.sent, 1050);
        assert_eq!(report.socket_errors, 1);
        assert_eq!(report.duration, Duration::from_secs(2));
        assert_eq!(report.latency_us["p99"], json!(3000));
        assert_eq!(report.service_latency_us, None);
        assert_eq!(report.service_latency_ms("p50"), json!(null));
    }

    #[test]
    fn the_requests_the_script_timed_are_read_beside_wrks_latencies() {
        let output = OUTPUT.replace(
            "\"responses\":992,",
            "\"responses\":992,\"service_latency_us\":{\"count\":992,\"p50\":40,\"p99\":700},",
        );
        let report = parse_output(&output).unwrap();
        assert_eq!(report.service_latency_ms("p50"), json!(0.04));
        assert_eq!(report.service_latency_ms("p99"), json!(0.7));
        assert_eq!(report.latency_ms("p99"), json!(3.0));
    }

    #[test]
    fn output_without_the_report_is_an_error() {
        let err = parse_output("Requests/sec: 1.0\n").unwrap_err();
        assert!(err.contains("trainstate-wrk"), "{err}");
    }

    fn clean(created: u64, sent: u64) -> WrkReport {
        let mut report = parse_output(OUTPUT).unwrap();
        report.status = Map::from_iter([("201".to_owned(), json!(created))]);
        report.sent = sent;
        report.socket_errors = 0;
        report
    }

    #[test]
    fn every_acknowledged_run_must_be_stored() {
        let report = clean(1000, 1064);
        let ok = check_stored(&report, 1010, 64).unwrap();
        assert_eq!(ok["in_flight_at_stop"], json!(10));
        assert!(check_stored(&report, 1000, 64).is_ok());
        let lost = check_stored(&report, 999, 64).unwrap_err();
        assert!(lost.contains("1000 runs acknowledged, only 999 stored"), "{lost}");
    }

    #[test]
    fn more_runs_stored_than_in_flight_is_an_error() {
        let report = clean(1000, 2000);
        assert!(check_stored(&report, 1065, 64).is_err());
        assert!(check_stored(&clean(1000, 1003), 1004, 64).is_err());
        assert!(check_stored(&clean(10, 11), 12, 1).is_err());
    }

    #[test]
    fn a_failed_answer_a_reused_id_or_a_socket_error_fails_the_check() {
        let failed = parse_output(OUTPUT).unwrap();
        let err = check_stored(&failed, 990, 64).unwrap_err();
        assert!(err.contains("2 answers were not 2xx") && err.contains("1 socket errors"), "{err}");
        let mut reused = clean(10, 20);
        reused.status.insert("200".into(), json!(3));
        let err = check_stored(&reused, 10, 64).unwrap_err();
        assert!(err.contains("3 2xx answers did not create a fresh run"), "{err}");
    }

    #[test]
    fn a_missing_wrk_is_named_with_how_to_install_it() {
        let empty = tempfile::tempdir().unwrap();
        let err = find_wrk_in(Some(empty.path().as_os_str().to_owned())).unwrap_err();
        assert!(err.contains("apt-get install wrk"), "{err}");
        assert!(find_wrk_in(None).is_err());
        std::fs::write(empty.path().join("wrk"), "").unwrap();
        let found = find_wrk_in(Some(empty.path().as_os_str().to_owned())).unwrap();
        assert_eq!(found, empty.path().join("wrk"));
    }

    #[test]
    fn the_body_template_holds_the_placeholder_once_in_place_of_the_id() {
        let body = body_template(8).unwrap();
        assert_eq!(body.matches(ID_PLACEHOLDER).count(), 1);
        let doc: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(doc["id"], json!(ID_PLACEHOLDER));
        assert_eq!(doc["workers"].as_array().map(Vec::len), Some(8));
    }
}
