//! `--goodput N`: the fleet's goodput with N runs retained. Two durable
//! stores are filled through the store alone with the same N runs of W
//! workers ([`records::goodput_run`]: four clusters, 1,000 training jobs
//! of 100 launches each, mostly ended), one
//! with each run's `goodput` and one without; `trainstate serve` is
//! started on each. On the first, `GET /api/train/goodput` is timed by
//! cluster, node and name (p50 and p99 of `--scale-repeats`); the memory
//! per run is the goodput summaries' bytes in the loaded view (exact: the
//! `inproc` example loads the store and reports them) and the head's RSS
//! per run on each store (whose difference also holds each record's
//! larger JSON).

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use trainstate_schema::routes::Operation;

use super::instrument::fill_with_answer;
use super::scale::start;
use super::unit::tempdir;
use super::util::{kib, pct, proc_mem, round};
use super::{Options, paths, records};

/// The slowest p99 the route may take over 100,000 runs.
const BUDGET_MS: f64 = 50.0;

/// One store filled with `make`'s runs and a head started on it: the
/// fill's answer, the database's bytes, the head's RSS in MiB and its
/// start's times.
async fn head_on(
    opts: &Options,
    make: fn(u64, u32, u64) -> trainstate_schema::TrainRunInfo,
) -> Result<(Value, u64, f64, Value, super::http::HttpTarget, tempfile::TempDir), String> {
    let dir = tempdir()?;
    let (_, answer) = fill_with_answer(&opts.inproc_bin, dir.path(), opts.n, opts.w, make, true)?;
    let db_bytes = std::fs::metadata(dir.path().join("trainstate.db")).map_or(0, |m| m.len());
    let (times, _, http) = start(opts, dir.path()).await?;
    let rss_mib = kib(&proc_mem(http.server.pid()), "VmRSS") / 1024.0;
    Ok((answer, db_bytes, rss_mib, times, http, dir))
}

/// The fleet-goodput measurement; one JSON object.
pub(crate) async fn run_goodput(opts: &Options) -> Result<Value, String> {
    let n = opts.n;
    eprintln!("[bench] goodput: {n} runs of {} workers, without goodput", opts.w);
    let (_, plain_db, plain_rss, plain_times, plain_http, _plain_dir) =
        head_on(opts, records::fleet_run).await?;
    plain_http.server.terminate()?;
    eprintln!("[bench] goodput: the same {n} runs with goodput");
    let (filled, goodput_db, goodput_rss, goodput_times, http, _dir) =
        head_on(opts, records::goodput_run).await?;
    let summary_bytes = filled["goodput_summary_bytes"].as_u64().unwrap_or(0);

    let mut routes = Vec::new();
    for by in ["cluster", "node", "name"] {
        let path = format!("{}?by={by}", paths::path(Operation::GetGoodput));
        let first: Value = serde_json::from_slice(&http.get(&path).await?)
            .map_err(|e| format!("the goodput answer does not parse: {e}"))?;
        let counted = first["total"]["runs"].as_u64().unwrap_or(0);
        if counted != n as u64 {
            return Err(format!("goodput by {by}: {counted} runs counted of {n}"));
        }
        let groups = first["groups"].as_array().map_or(0, Vec::len);
        let mut lat: Vec<Duration> = Vec::with_capacity(opts.scale_repeats);
        let mut bytes = 0;
        for _ in 0..opts.scale_repeats {
            let t = Instant::now();
            bytes = http.get(&path).await?.len();
            lat.push(t.elapsed());
        }
        let ms = |d: Duration| round(d.as_secs_f64() * 1000.0, 3);
        let p99 = ms(pct(&lat, 99.0));
        routes.push(json!({
            "by": by,
            "path": path,
            "groups": groups,
            "bytes": bytes,
            "lat_ms_p50": ms(pct(&lat, 50.0)),
            "lat_ms_max": ms(pct(&lat, 100.0)),
            "lat_ms_p99": p99,
            "within_budget": p99 < BUDGET_MS,
        }));
    }
    http.server.terminate()?;
    let per_run = |x: f64| round(x / n as f64, 1);
    Ok(json!({
        "bench": "trainstate",
        "config": "goodput",
        "path": "http",
        "store": "durable",
        "runs": n,
        "workers": opts.w,
        "repeats": opts.scale_repeats,
        "routes": routes,
        "summary_bytes": summary_bytes,
        "summary_bytes_per_run": per_run(summary_bytes as f64),
        "start_with_goodput": goodput_times,
        "start_without_goodput": plain_times,
        "rss_mib_with_goodput": round(goodput_rss, 1),
        "rss_mib_without_goodput": round(plain_rss, 1),
        "rss_bytes_per_run_difference": per_run((goodput_rss - plain_rss) * 1024.0 * 1024.0),
        "db_bytes_per_run_difference": per_run(goodput_db as f64 - plain_db as f64),
    }))
}
