//! One measured phase in a process of its own: a fresh state behind one
//! path (in-process handle, HTTP, or the store alone), filled with N fresh
//! runs, then read back and checked. Over HTTP this process is the load
//! generator and times each request; in process the state lives in the
//! `inproc` example, which times each operation and reports it.
//!
//! The sequential phase and the pipelined phase each get a fresh process
//! and a fresh state, so that every registration carries a fresh id and N
//! runs are stored when the reads are measured.

use super::paths;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use trainstate_schema::routes::Operation;

use bytes::Bytes;
use serde::de::IgnoredAny;
use serde_json::{Map, Value, json};
use trainstate_client::api::RunListResponse;
use trainstate_schema::{RunId, TrainRunInfo};

use super::http::{HttpTarget, Server};
use super::instrument::{Instrument, fill_with};
use super::records;
use super::util::{
    check_ids, cpu_time, ids_of_listing, kib, latency_summary, proc_mem, round, seq_summary,
};
use super::{Options, PathKind, StoreKind};

/// The page size of the paged walk.
pub(crate) const PAGE_LIMIT: usize = trainstate_schema::limits::MAX_PAGE_LIMIT;

/// Which half of a configuration a unit measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Register N runs one at a time, waiting for each answer.
    Seq,
    /// Register N runs with many in flight, then read, then restart.
    Main,
}

impl Phase {
    pub(crate) fn parse(text: &str) -> Option<Self> {
        match text {
            "seq" => Some(Self::Seq),
            "main" => Some(Self::Main),
            _ => None,
        }
    }

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Seq => "seq",
            Self::Main => "main",
        }
    }
}

/// What a listing or a get answered, before it is checked.
pub(crate) enum Answer {
    /// What the process holding the state reported of its answer (the
    /// ids only when asked for).
    Reported { ids: Option<Vec<String>>, json_bytes: usize },
    /// A JSON body received over HTTP.
    Body(Bytes),
}

impl Answer {
    /// An in-process answer, from the example's reply.
    fn reported(reply: &Value) -> Result<Self, String> {
        let ids = match reply.get("ids") {
            Some(ids) => {
                Some(serde_json::from_value(ids.clone()).map_err(|e| format!("ids: {e}"))?)
            }
            None => None,
        };
        let json_bytes = reply["json_bytes"].as_u64().unwrap_or(0) as usize;
        Ok(Self::Reported { ids, json_bytes })
    }

    /// The JSON bytes of the answer: what a REST layer ships.
    fn json_bytes(&self) -> usize {
        match self {
            Self::Reported { json_bytes, .. } => *json_bytes,
            Self::Body(body) => body.len(),
        }
    }

    fn ids(&self) -> Result<Vec<String>, String> {
        match self {
            Self::Reported { ids: Some(ids), .. } => Ok(ids.clone()),
            Self::Reported { ids: None, .. } => Err("the ids were not asked for".into()),
            Self::Body(body) => ids_of_listing(body),
        }
    }
}

/// The duration in a reply's field of nanoseconds.
fn reported_time(reply: &Value, key: &str) -> Result<Duration, String> {
    reply[key].as_u64().map(Duration::from_nanos).ok_or_else(|| format!("no {key} in {reply}"))
}

/// The state under test, behind one path.
pub(crate) enum Target {
    /// `inproc` or `store`: the state in the `inproc` example's process.
    InProcess(Instrument),
    Http(HttpTarget),
}

impl Target {
    /// Starts the state (the runs handed over first, in process); returns
    /// it and how long it took to be ready.
    pub(crate) async fn start(
        path: PathKind,
        store: StoreKind,
        dir: &Path,
        opts: &Options,
        runs: &[TrainRunInfo],
    ) -> Result<(Self, Duration), String> {
        match path {
            PathKind::Inproc | PathKind::Store => {
                let instrument = Instrument::spawn(&opts.inproc_bin, path, store, dir, runs)?;
                let reply = instrument.call(json!({"op": "start"}))?;
                Ok((Self::InProcess(instrument), reported_time(&reply, "ready_ns")?))
            }
            PathKind::Wrk | PathKind::WrkReads => Err("the wrk paths run in the driver".into()),
            PathKind::Http => {
                let (server, ready) = Server::spawn(&opts.trainstate_bin, dir, store)?;
                Ok((Self::Http(HttpTarget::new(server, opts.concurrency)?), ready))
            }
        }
    }

    /// The process that holds the state.
    pub(crate) fn pid(&self) -> u32 {
        match self {
            Self::Http(http) => http.server.pid(),
            Self::InProcess(instrument) => instrument.pid(),
        }
    }

    /// Registers each run and waits for its answer before the next.
    async fn register_seq(
        &self,
        runs: &[TrainRunInfo],
    ) -> Result<(Duration, Vec<Duration>, usize), String> {
        match self {
            Self::InProcess(instrument) => {
                let reply = instrument.call(json!({"op": "register_seq"}))?;
                let lat: Vec<u64> = serde_json::from_value(reply["lat_ns"].clone())
                    .map_err(|e| format!("lat_ns: {e}"))?;
                Ok((
                    reported_time(&reply, "total_ns")?,
                    lat.into_iter().map(Duration::from_nanos).collect(),
                    reply["failures"].as_u64().unwrap_or(0) as usize,
                ))
            }
            Self::Http(http) => Ok(http.register_seq(runs).await),
        }
    }

    /// Registers every run with all of them in flight (in process), or
    /// over many concurrent connections (HTTP). Returns the total time, the
    /// time to hand every request over (in process), and the failures.
    async fn register_pipelined(
        &self,
        runs: &[TrainRunInfo],
    ) -> Result<(Duration, Option<Duration>, usize), String> {
        match self {
            Self::InProcess(instrument) => {
                let reply = instrument.call(json!({"op": "register_pipelined"}))?;
                Ok((
                    reported_time(&reply, "total_ns")?,
                    Some(reported_time(&reply, "submitted_ns")?),
                    reply["failures"].as_u64().unwrap_or(0) as usize,
                ))
            }
            Self::Http(http) => {
                let (total, failures) = http.register_pipelined(runs).await;
                Ok((total, None, failures))
            }
        }
    }

    /// Every run, unpaged (Ray's route), and how long it took; in process,
    /// the ids and bytes of the answer only when `read` (reading them
    /// costs the process that holds the state).
    async fn list_all(&self, read: bool) -> Result<(Answer, Duration), String> {
        match self {
            Self::InProcess(instrument) => {
                let reply = instrument.call(json!({"op": "list_all", "ids": read}))?;
                Ok((Answer::reported(&reply)?, reported_time(&reply, "ns")?))
            }
            Self::Http(http) => {
                let t = Instant::now();
                let body = http.get(paths::path(Operation::ListRunsRay)).await?;
                Ok((Answer::Body(body), t.elapsed()))
            }
        }
    }

    /// One page of [`PAGE_LIMIT`] runs after `cursor`, the next cursor,
    /// and how long the page took, without the time the driver spent
    /// reading an HTTP answer into the API's page type to find the next
    /// cursor (the driver's own work).
    async fn list_page(
        &self,
        cursor: Option<String>,
        ids: bool,
    ) -> Result<(Answer, Option<String>, Duration), String> {
        match self {
            Self::InProcess(instrument) => {
                let reply = instrument.call(json!({
                    "op": "list_page", "limit": PAGE_LIMIT, "cursor": cursor, "ids": ids,
                }))?;
                let next = reply["next_cursor"].as_str().map(str::to_owned);
                Ok((Answer::reported(&reply)?, next, reported_time(&reply, "ns")?))
            }
            Self::Http(http) => {
                let path = match cursor {
                    Some(c) => paths::runs_query(&format!("limit={PAGE_LIMIT}&cursor={c}")),
                    None => paths::runs_query(&format!("limit={PAGE_LIMIT}")),
                };
                let t = Instant::now();
                let body = http.get(&path).await?;
                let got = t.elapsed();
                let next = next_cursor_of(&body)?;
                Ok((Answer::Body(body), next, got))
            }
        }
    }

    /// One run: the id it carries, its JSON bytes, and how long it took.
    async fn get_one(&self, id: &RunId) -> Result<(String, usize, Duration), String> {
        match self {
            Self::InProcess(instrument) => {
                let reply = instrument.call(json!({"op": "get_one", "id": id.as_str()}))?;
                let got = reply["id"].as_str().unwrap_or_default().to_owned();
                let bytes = reply["json_bytes"].as_u64().unwrap_or(0) as usize;
                Ok((got, bytes, reported_time(&reply, "ns")?))
            }
            Self::Http(http) => {
                let t = Instant::now();
                let body = http.get(&paths::run_path(Operation::GetRun, id)).await?;
                let took = t.elapsed();
                let got = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|v| v.get("id")?.as_str().map(str::to_owned))
                    .unwrap_or_default();
                Ok((got, body.len(), took))
            }
        }
    }

    /// Stops the state and starts it again on the same store; returns how
    /// long it took to be ready and the runs it loaded.
    async fn restart(self, dir: &Path, opts: &Options) -> Result<(Duration, usize), String> {
        match self {
            Self::InProcess(instrument) => {
                let reply = instrument.call(json!({"op": "restart"}))?;
                instrument.finish()?;
                let count = reply["count"].as_u64().unwrap_or(0) as usize;
                Ok((reported_time(&reply, "ready_ns")?, count))
            }
            Self::Http(http) => {
                http.server.terminate()?;
                let (server, ready) = Server::spawn(&opts.trainstate_bin, dir, StoreKind::Durable)?;
                let http = HttpTarget::new(server, 1)?;
                let body = http.get(&paths::runs_query("limit=1")).await?;
                let total = total_of(&body)?;
                http.server.terminate()?;
                Ok((ready, total))
            }
        }
    }

    async fn stop(self) -> Result<(), String> {
        match self {
            Self::InProcess(instrument) => {
                instrument.call(json!({"op": "stop"}))?;
                instrument.finish()
            }
            Self::Http(http) => http.server.terminate(),
        }
    }
}

/// The `next_cursor` of a page, read into the API's own page type.
fn next_cursor_of(body: &[u8]) -> Result<Option<String>, String> {
    let page: RunListResponse<IgnoredAny> =
        serde_json::from_slice(body).map_err(|e| format!("a page does not parse: {e}"))?;
    Ok(page.next_cursor.map(|c| c.to_string()))
}

pub(crate) fn total_of(body: &[u8]) -> Result<usize, String> {
    let page: RunListResponse<IgnoredAny> =
        serde_json::from_slice(body).map_err(|e| format!("a page does not parse: {e}"))?;
    Ok(page.total as usize)
}

/// Runs one phase of one configuration and returns its JSON result.
pub(crate) async fn run_unit(
    path: PathKind,
    store: StoreKind,
    phase: Phase,
    opts: &Options,
) -> Result<Value, String> {
    let dir = tempdir()?;
    let mut out = Map::new();

    let built = Instant::now();
    let runs = records::runs(opts.n, opts.w);
    out.insert("driver_build_records_s".into(), json!(round(built.elapsed().as_secs_f64(), 3)));
    out.insert(
        "json_bytes_per_run".into(),
        json!(serde_json::to_vec(&runs[0]).map(|v| v.len()).unwrap_or(0)),
    );
    let written: BTreeSet<String> = runs.iter().map(|r| r.id().to_string()).collect();

    let (target, ready) = Target::start(path, store, dir.path(), opts, &runs).await?;
    out.insert("actor_create_s".into(), json!(round(ready.as_secs_f64(), 4)));
    let pid = target.pid();
    out.insert("actor_pid".into(), json!(pid));
    let mut mem = Map::new();
    mem.insert("after_create".into(), proc_mem(pid));

    if let Target::Http(http) = &target {
        if phase == Phase::Main {
            out.insert("client_ceiling".into(), http.ceiling(2_000).await);
        } else {
            http.warm_up().await;
        }
    }

    let mut checks = Map::new();
    match phase {
        Phase::Seq => {
            let cpu = Cpu::start(pid, path);
            let (total, lat, failures) = target.register_seq(&runs).await?;
            let mut seq = seq_summary(total, &lat, failures);
            cpu.stop(&mut seq, runs.len());
            out.insert("seq".into(), seq);
            mem.insert("after_seq".into(), proc_mem(pid));
            checks.insert("failures".into(), json!(failures));
            let read = target.list_all(true).await?.0.ids()?;
            checks.insert("runs_read_back".into(), json!(check_ids("seq", &written, read)?));
            if failures > 0 {
                return Err(format!("seq: {failures} registrations failed"));
            }
        }
        Phase::Main => {
            let cpu = Cpu::start(pid, path);
            let (total, submitted, failures) = target.register_pipelined(&runs).await?;
            let mut pipelined = Value::Object(Map::new());
            cpu.stop(&mut pipelined, runs.len());
            let Value::Object(mut pipelined) = pipelined else { unreachable!() };
            pipelined.insert("total_s".into(), json!(round(total.as_secs_f64(), 3)));
            pipelined
                .insert("submit_s".into(), json!(submitted.map(|s| round(s.as_secs_f64(), 3))));
            pipelined.insert(
                "runs_per_s".into(),
                json!(round(runs.len() as f64 / total.as_secs_f64(), 1)),
            );
            pipelined.insert(
                "in_flight".into(),
                json!(if path == PathKind::Http { opts.concurrency } else { opts.n }),
            );
            pipelined.insert("failures".into(), json!(failures));
            out.insert("pipelined".into(), Value::Object(pipelined));
            mem.insert("after_pipelined".into(), proc_mem(pid));
            checks.insert("failures".into(), json!(failures));
            if failures > 0 {
                return Err(format!("pipelined: {failures} registrations failed"));
            }

            // Ray's route: every run, unpaged.
            let mut lat = Vec::new();
            let mut last = None;
            for call in 0..opts.get_calls {
                let (answer, took) = target.list_all(call + 1 == opts.get_calls).await?;
                lat.push(took);
                last = Some(answer);
            }
            let last = last.ok_or("--get-calls must be at least 1")?;
            let mut get_all = Map::new();
            get_all.insert("method".into(), json!(list_method(path)));
            get_all.extend(latency_summary(&lat));
            let ids = last.ids()?;
            get_all.insert("runs_returned".into(), json!(ids.len()));
            get_all.insert("json_bytes".into(), json!(last.json_bytes()));
            checks.insert("runs_read_back".into(), json!(check_ids("get_all", &written, ids)?));
            out.insert("get_all".into(), Value::Object(get_all));

            // Every page at limit=1000, summed.
            let mut lat = Vec::new();
            let mut pages = 0;
            let mut bytes = 0;
            let mut ids = Vec::new();
            for call in 0..opts.get_calls {
                let mut cursor = None;
                let mut walk = Duration::ZERO;
                pages = 0;
                bytes = 0;
                loop {
                    let (answer, next, took) = target.list_page(cursor, call == 0).await?;
                    walk += took;
                    pages += 1;
                    bytes += answer.json_bytes();
                    if call == 0 {
                        ids.extend(answer.ids()?);
                    }
                    cursor = next;
                    if cursor.is_none() {
                        break;
                    }
                }
                lat.push(walk);
            }
            let mut paged = Map::new();
            paged.insert("method".into(), json!(paged_method(path)));
            paged.insert("limit".into(), json!(PAGE_LIMIT));
            paged.insert("pages".into(), json!(pages));
            paged.extend(latency_summary(&lat));
            paged.insert("runs_returned".into(), json!(ids.len()));
            paged.insert("json_bytes".into(), json!(bytes));
            checks.insert("runs_read_back_paged".into(), json!(check_ids("paged", &written, ids)?));
            out.insert("get_all_paged".into(), Value::Object(paged));

            // One run, as the Ray anchor picks them.
            let mut lat = Vec::new();
            let mut bytes = 0;
            for k in 0..opts.get_calls {
                let id = runs[(k * 7919) % runs.len()].id();
                let (got, json_bytes, took) = target.get_one(id).await?;
                lat.push(took);
                bytes = json_bytes;
                if got != id.as_str() {
                    return Err(format!("get_one: asked for {id}, got {got:?}"));
                }
            }
            let mut get_one = latency_summary(&lat);
            get_one.insert("json_bytes".into(), json!(bytes));
            out.insert("get_one".into(), Value::Object(get_one));
            mem.insert("after_get_all".into(), proc_mem(pid));
        }
    }

    let last =
        mem.get("after_get_all").or_else(|| mem.get("after_seq")).cloned().unwrap_or_default();
    let first = mem["after_create"].clone();
    let after_writes = mem.get("after_pipelined").or_else(|| mem.get("after_seq")).cloned();
    out.insert("actor_peak_rss_mib".into(), json!(round(kib(&last, "VmHWM") / 1024.0, 1)));
    if let Some(after_writes) = after_writes {
        out.insert(
            "actor_rss_growth_mib".into(),
            json!(round((kib(&after_writes, "RssAnon") - kib(&first, "RssAnon")) / 1024.0, 1)),
        );
        out.insert("base_rss_mib".into(), json!(round(kib(&first, "VmRSS") / 1024.0, 1)));
        out.insert(
            "mem_per_run_kib".into(),
            json!(round((kib(&after_writes, "VmRSS") - kib(&first, "VmRSS")) / opts.n as f64, 2)),
        );
    }
    out.insert("actor_mem_kib".into(), Value::Object(mem));

    if phase == Phase::Main && store == StoreKind::Durable {
        let (ready, count) = target.restart(dir.path(), opts).await?;
        if count != opts.n {
            return Err(format!("restart: {count} runs loaded, {} written", opts.n));
        }
        out.insert("ready_with_runs_s".into(), json!(round(ready.as_secs_f64(), 4)));
        checks.insert("runs_after_restart".into(), json!(count));
    } else {
        target.stop().await?;
    }
    checks.insert("runs_written".into(), json!(written.len()));
    out.insert("checks".into(), Value::Object(checks));
    Ok(Value::Object(out))
}

/// CPU time of the process that holds the state over a phase, and over
/// HTTP of this one (the load generator), per run, in microseconds.
struct Cpu {
    pid: u32,
    state: Duration,
    driver: Option<Duration>,
}

impl Cpu {
    fn start(pid: u32, path: PathKind) -> Self {
        let driver = (path == PathKind::Http).then(|| cpu_time(std::process::id()));
        Self { pid, state: cpu_time(pid), driver }
    }

    fn stop(self, into: &mut Value, runs: usize) {
        let per_run = |d: Duration| round(d.as_secs_f64() * 1e6 / runs as f64, 1);
        let state = cpu_time(self.pid).saturating_sub(self.state);
        into["cpu_us_per_run_state"] = json!(per_run(state));
        if let Some(driver) = self.driver {
            let driver = cpu_time(std::process::id()).saturating_sub(driver);
            into["cpu_us_per_run_driver"] = json!(per_run(driver));
        }
    }
}

fn list_method(path: PathKind) -> &'static str {
    match path {
        PathKind::Http => "GET /api/train/v2/runs",
        _ => "list(RunQuery::all())",
    }
}

fn paged_method(path: PathKind) -> &'static str {
    match path {
        PathKind::Http => "GET /api/train/runs?limit=1000&cursor=...",
        _ => "list(RunQuery::new().limit(1000).after(cursor))",
    }
}

/// A fresh directory for a durable store (and the server's logs).
pub(crate) fn tempdir() -> Result<tempfile::TempDir, String> {
    tempfile::Builder::new()
        .prefix("trainstate-bench-")
        .tempdir()
        .map_err(|e| format!("cannot create a temporary directory: {e}"))
}

/// Time to be ready with `n` runs of `w` workers stored: the store is
/// filled once (through the store alone), then `trainstate serve` is
/// started on it `rounds` times.
pub(crate) async fn run_ready(opts: &Options, rounds: usize) -> Result<Value, String> {
    let dir = tempdir()?;
    let fill_s = fill_with(&opts.inproc_bin, dir.path(), opts.n, opts.w, records::run)?;
    let db_bytes = std::fs::metadata(dir.path().join("trainstate.db")).map_or(0, |m| m.len());
    // The same server on an empty store, for the memory the runs take.
    let empty = tempdir()?;
    let (server, _) = Server::spawn(&opts.trainstate_bin, empty.path(), StoreKind::Durable)?;
    let rss_empty = kib(&proc_mem(server.pid()), "VmRSS") / 1024.0;
    let http = HttpTarget::new(server, 1)?;
    // Serving, so a SIGTERM is handled rather than fatal.
    http.get(paths::path(Operation::Health)).await?;
    http.server.terminate()?;
    let mut ready = Vec::new();
    let mut rss = Vec::new();
    for _ in 0..rounds {
        let (server, took) = Server::spawn(&opts.trainstate_bin, dir.path(), StoreKind::Durable)?;
        rss.push(kib(&proc_mem(server.pid()), "VmRSS") / 1024.0);
        let http = HttpTarget::new(server, 1)?;
        let total = total_of(&http.get(&paths::runs_query("limit=1")).await?)?;
        http.server.terminate()?;
        if total != opts.n {
            return Err(format!("ready: {total} runs loaded, {} written", opts.n));
        }
        ready.push(round(took.as_secs_f64(), 4));
    }
    Ok(json!({
        "bench": "trainstate",
        "config": "ready",
        "path": "http",
        "store": "durable",
        "N": opts.n,
        "W": opts.w,
        "fill_s": round(fill_s.as_secs_f64(), 3),
        "db_bytes": db_bytes,
        "ready_with_runs_s": ready,
        "ready_with_runs_s_median": round(super::util::median(&ready), 4),
        "rss_when_ready_mib": rss.iter().map(|x| round(*x, 1)).collect::<Vec<_>>(),
        "rss_empty_mib": round(rss_empty, 1),
        "rss_per_run_kib": round((super::util::median(&rss) - rss_empty) * 1024.0 / opts.n as f64, 2),
        "checks": {"runs_written": opts.n, "runs_after_restart": opts.n},
    }))
}

/// The release binary of the head service.
pub(crate) fn trainstate_bin(root: &Path) -> PathBuf {
    root.join("target").join("release").join("trainstate")
}

#[cfg(test)]
mod tests {
    use super::next_cursor_of;

    #[test]
    fn the_cursor_is_read_from_a_page() {
        let page = br#"{"train_runs":[{"id":"a"}],"next_cursor":"v1.ff.a","total":2}"#;
        assert_eq!(next_cursor_of(page).unwrap().as_deref(), Some("v1.ff.a"));
        let last = br#"{"train_runs":[],"next_cursor":null,"total":2}"#;
        assert_eq!(next_cursor_of(last).unwrap(), None);
    }
}
