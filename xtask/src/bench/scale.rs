//! `--scale N`: the head with N runs retained. A durable store is filled
//! with N runs of W workers through the store alone (the documents the
//! head stores; a retained history, mostly ended runs over 1,000 jobs and
//! 10,000 nodes, see [`records::retained_run`]), then `trainstate serve` is started on it three times; each
//! start times the "listening" line, the first 2xx `/healthz`, and the
//! moment `/healthz` says the runs are fully loaded (when it says so: a
//! boolean `loaded` or `ready`; otherwise the first 2xx answer), checks
//! that the listing's total is N, and the last start times a page of 100
//! for filters that match and that match nothing.

use super::paths;
use std::time::{Duration, Instant};
use trainstate_schema::routes::Operation;

use serde_json::{Map, Value, json};

use super::http::{HttpTarget, Server};
use super::instrument::fill_with;
use super::unit::{tempdir, total_of};
use super::util::{kib, median, proc_mem, round};
use super::{Options, records};

/// Starts of the head on the filled store.
const STARTS: usize = 3;

/// How long a start may take to load before the measurement fails.
const LOAD_DEADLINE: Duration = Duration::from_secs(300);

/// The pause between two `/healthz` probes while the head starts.
const PROBE_EVERY: Duration = Duration::from_millis(1);

/// Whether a filter is meant to match some runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expect {
    /// At least one run.
    Some,
    /// No run.
    None,
}

/// The filtered pages timed at scale: (label, query, expectation). The
/// runs are [`records::retained_run`]'s: 1,000 jobs (`00000001`…), node
/// ids `…01` to `…3e8` at `10.0.x.y`, one run in 100 `RUNNING`, none
/// `ABORTED`, named `bench-run-<i>`.
pub(crate) fn filters(n: usize) -> Vec<(String, String, Expect)> {
    let node = format!("{:056x}", 8);
    let name = format!("bench-run-{}", n / 2);
    [
        ("no filter", String::new(), Expect::Some),
        ("status=RUNNING (1 in 100)", "status=RUNNING".into(), Expect::Some),
        ("status=FINISHED (most)", "status=FINISHED".into(), Expect::Some),
        ("status=ABORTED, none", "status=ABORTED".into(), Expect::None),
        ("job_id, matching", "job_id=00000007".into(), Expect::Some),
        ("job_id, none", "job_id=ffffffff".into(), Expect::None),
        ("node_id, matching", format!("node_id={node}"), Expect::Some),
        ("node_id, none", format!("node_id={:056x}", u64::MAX), Expect::None),
        ("node_ip, matching", "node_ip=10.0.0.7".into(), Expect::Some),
        ("node_ip, none", "node_ip=10.255.255.254".into(), Expect::None),
        ("name, matching", format!("name={name}"), Expect::Some),
        ("name, every run", "name=bench-run-".into(), Expect::Some),
        ("name, none", "name=no-such-run".into(), Expect::None),
        ("job_id and status, none", "job_id=00000007&status=ABORTED".into(), Expect::None),
    ]
    .into_iter()
    .map(|(label, query, expect)| (label.to_owned(), query, expect))
    .collect()
}

/// The node ledger's routes at scale, each timed `opts.scale_repeats`
/// times: the whole list, the suspects, the exclude list and one node.
async fn time_node_routes(opts: &Options, http: &HttpTarget) -> Result<Vec<Value>, String> {
    let list = paths::path(Operation::ListNodes);
    let first = match http.get(list).await {
        Ok(body) => body,
        Err(e) => {
            // A head from before the ledger: its memory and pages are
            // still measured, beside a head that has it.
            eprintln!("[bench] scale: no node ledger on this head ({e}): its routes not timed");
            return Ok(Vec::new());
        }
    };
    let first: Value =
        serde_json::from_slice(&first).map_err(|e| format!("the node list does not parse: {e}"))?;
    let nodes = first["nodes"].as_array().map_or(0, Vec::len);
    let suspects = first["nodes"]
        .as_array()
        .map_or(0, |nodes| nodes.iter().filter(|n| n["suspect"] == json!(true)).count());
    if nodes == 0 || suspects == 0 {
        return Err(format!("scale: the node list has {nodes} nodes, {suspects} suspects"));
    }
    let one = first["nodes"][0]["node"].as_str().ok_or("scale: a node without a name")?;
    let routes = [
        ("every node", list.to_owned()),
        ("suspects", format!("{list}?suspect=true")),
        ("exclude list", format!("{list}?format=exclude")),
        ("one node", paths::node_path(Operation::GetNode, one)),
    ];
    let mut timed = Vec::new();
    for (label, path) in routes {
        let mut lat = Vec::with_capacity(opts.scale_repeats);
        let mut bytes = 0;
        for _ in 0..opts.scale_repeats {
            let t = Instant::now();
            bytes = http.get(&path).await?.len();
            lat.push(round(t.elapsed().as_secs_f64() * 1000.0, 3));
        }
        timed.push(json!({
            "route": label,
            "path": path,
            "nodes": nodes,
            "suspects": suspects,
            "bytes": bytes,
            "lat_ms_median": round(median(&lat), 3),
            "lat_ms_min": lat.iter().copied().fold(f64::INFINITY, f64::min),
            "lat_ms_max": lat.iter().copied().fold(0.0, f64::max),
        }));
    }
    Ok(timed)
}

/// Whether a `/healthz` body says the runs are loaded: `Some(bool)` when it
/// has a boolean `loaded` or `ready`, `None` when it does not say.
pub(crate) fn says_loaded(body: &[u8]) -> Option<bool> {
    let v: Value = serde_json::from_slice(body).ok()?;
    ["loaded", "ready"].iter().find_map(|k| v.get(*k).and_then(Value::as_bool))
}

/// The number of runs on a page.
fn page_len(body: &[u8]) -> Result<usize, String> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("a page does not parse: {e}"))?;
    v.get("train_runs")
        .and_then(Value::as_array)
        .map(Vec::len)
        .ok_or_else(|| "a page has no train_runs".into())
}

/// One start: (listening, healthz, loaded) since spawn, whether /healthz
/// said it, the server.
pub(crate) async fn start(
    opts: &Options,
    dir: &std::path::Path,
) -> Result<(Value, bool, HttpTarget), String> {
    let started = Instant::now();
    let (server, listening) = Server::spawn_listening(&opts.trainstate_bin, dir, &[])?;
    let http = HttpTarget::new(server, 1)?;
    let mut healthz = None;
    let mut says = false;
    let loaded = loop {
        if started.elapsed() > LOAD_DEADLINE {
            return Err(format!("the head was not loaded within {LOAD_DEADLINE:?}"));
        }
        if let Ok(body) = http.get(paths::path(Operation::Health)).await {
            let now = started.elapsed();
            healthz.get_or_insert(now);
            match says_loaded(&body) {
                Some(true) => {
                    says = true;
                    break now;
                }
                Some(false) => says = true,
                None => break now,
            }
        }
        tokio::time::sleep(PROBE_EVERY).await;
    };
    let s = |d: Duration| json!(round(d.as_secs_f64(), 4));
    let times = json!({
        "listening_s": s(listening),
        "healthz_s": s(healthz.unwrap_or(loaded)),
        "loaded_s": s(loaded),
    });
    Ok((times, says, http))
}

/// The scale measurement; one JSON object.
pub(crate) async fn run_scale(opts: &Options) -> Result<Value, String> {
    let dir = tempdir()?;
    eprintln!("[bench] scale: filling a durable store with {} runs of {} workers", opts.n, opts.w);
    let fill_s = fill_with(&opts.inproc_bin, dir.path(), opts.n, opts.w, records::retained_run)?;
    let db_bytes = std::fs::metadata(dir.path().join("trainstate.db")).map_or(0, |m| m.len());

    let mut starts = Vec::new();
    let mut says = false;
    let mut rss = Vec::new();
    let mut last = None;
    for i in 0..STARTS {
        let (times, said, http) = start(opts, dir.path()).await?;
        says |= said;
        rss.push(round(kib(&proc_mem(http.server.pid()), "VmRSS") / 1024.0, 1));
        let total = total_of(&http.get(&paths::runs_query("limit=1")).await?)?;
        if total != opts.n {
            return Err(format!("scale: {total} runs loaded, {} written", opts.n));
        }
        starts.push(times);
        if i + 1 < STARTS {
            http.server.terminate()?;
        } else {
            last = Some(http);
        }
    }
    let http = last.ok_or("no start")?;

    let mut pages = Vec::new();
    for (label, query, expect) in filters(opts.n) {
        let path = if query.is_empty() {
            paths::runs_query("limit=100")
        } else {
            paths::runs_query(&format!("limit=100&{query}"))
        };
        let runs = page_len(&http.get(&path).await?)?;
        match expect {
            Expect::Some if runs == 0 => return Err(format!("scale: {path} found no run")),
            Expect::None if runs > 0 => return Err(format!("scale: {path} found {runs} runs")),
            _ => {}
        }
        let mut lat = Vec::with_capacity(opts.scale_repeats);
        for _ in 0..opts.scale_repeats {
            let t = Instant::now();
            http.get(&path).await?;
            lat.push(round(t.elapsed().as_secs_f64() * 1000.0, 3));
        }
        pages.push(json!({
            "filter": label,
            "query": path,
            "runs": runs,
            "lat_ms_median": round(median(&lat), 3),
            "lat_ms_min": lat.iter().copied().fold(f64::INFINITY, f64::min),
            "lat_ms_max": lat.iter().copied().fold(0.0, f64::max),
        }));
    }
    let node_routes = time_node_routes(opts, &http).await?;
    let rss_after_pages = round(kib(&proc_mem(http.server.pid()), "VmRSS") / 1024.0, 1);
    http.server.terminate()?;

    let pick = |key: &str| -> Vec<f64> {
        starts.iter().filter_map(|s| s.get(key).and_then(Value::as_f64)).collect()
    };
    let mut out = Map::new();
    for (key, value) in [
        ("bench", json!("trainstate")),
        ("config", json!("scale")),
        ("path", json!("http")),
        ("store", json!("durable")),
        ("fill_s", json!(round(fill_s.as_secs_f64(), 3))),
        ("db_bytes", json!(db_bytes)),
        ("starts", json!(starts)),
        ("listening_s_median", json!(round(median(&pick("listening_s")), 4))),
        ("healthz_s_median", json!(round(median(&pick("healthz_s")), 4))),
        ("loaded_s_median", json!(round(median(&pick("loaded_s")), 4))),
        ("healthz_says_loaded", json!(says)),
        ("rss_when_ready_mib", json!(rss)),
        ("rss_after_pages_mib", json!(rss_after_pages)),
        ("page_limit", json!(100)),
        ("repeats", json!(opts.scale_repeats)),
        ("pages", json!(pages)),
        ("node_routes", json!(node_routes)),
        ("checks", json!({"runs_written": opts.n, "runs_after_restart": opts.n})),
    ] {
        out.insert(key.into(), value);
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_says_loaded_only_with_a_boolean_field() {
        assert_eq!(says_loaded(br#"{"status":"ok"}"#), None);
        assert_eq!(says_loaded(br#"{"status":"ok","loaded":false}"#), Some(false));
        assert_eq!(says_loaded(br#"{"status":"ok","ready":true}"#), Some(true));
        assert_eq!(says_loaded(b"not json"), None);
    }

    #[test]
    fn every_filter_has_a_matching_and_an_empty_case() {
        let filters = filters(100_000);
        for key in ["status=", "job_id=", "node_id=", "node_ip=", "name="] {
            let of_key: Vec<_> = filters.iter().filter(|(_, q, _)| q.starts_with(key)).collect();
            assert!(of_key.iter().any(|(_, _, e)| *e == Expect::Some), "{key}");
            assert!(of_key.iter().any(|(_, _, e)| *e == Expect::None), "{key}");
        }
        assert!(filters.iter().any(|(_, q, _)| q == "name=bench-run-50000"));
    }

    #[test]
    fn a_page_is_counted() {
        assert_eq!(page_len(br#"{"train_runs":[{"id":"a"},{"id":"b"}],"total":9}"#).unwrap(), 2);
        assert!(page_len(br#"{"runs":[]}"#).is_err());
    }
}
