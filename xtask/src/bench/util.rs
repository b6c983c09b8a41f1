//! Measuring helpers: process memory, percentiles, timings.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Map, Value, json};

/// VmRSS, VmHWM, RssAnon, RssFile and RssShmem of `pid`, in KiB, from
/// `/proc/<pid>/status` (the keys the Ray anchor reads).
pub(crate) fn proc_mem(pid: u32) -> Value {
    let mut out = Map::new();
    if let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
        for line in text.lines() {
            let (key, rest) = line.split_once(':').unwrap_or((line, ""));
            if ["VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"].contains(&key)
                && let Some(kib) =
                    rest.split_whitespace().next().and_then(|v| v.parse::<u64>().ok())
            {
                out.insert(key.to_owned(), json!(kib));
            }
        }
    }
    Value::Object(out)
}

/// CPU time (user + system, every thread) `pid` has used so far, from
/// `/proc/<pid>/stat` (in clock ticks of 10 ms).
pub(crate) fn cpu_time(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // The command name may hold spaces; the fields after it do not.
    let fields: Vec<&str> =
        stat.rsplit_once(')').map_or("", |(_, r)| r).split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

/// One field of a [`proc_mem`] answer, in KiB.
pub(crate) fn kib(mem: &Value, key: &str) -> f64 {
    mem.get(key).and_then(Value::as_f64).unwrap_or(0.0)
}

/// Seconds, in milliseconds rounded to the microsecond.
pub(crate) fn ms(d: Duration) -> f64 {
    round(d.as_secs_f64() * 1000.0, 3)
}

pub(crate) fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

/// The `p`th percentile, nearest rank (as the Ray anchor computes it).
pub(crate) fn pct(xs: &[Duration], p: f64) -> Duration {
    let mut xs = xs.to_vec();
    xs.sort();
    if xs.is_empty() {
        return Duration::ZERO;
    }
    let k = ((p / 100.0 * (xs.len() - 1) as f64).round() as usize).min(xs.len() - 1);
    xs[k]
}

/// The median (the mean of the two middle values for an even count).
pub(crate) fn median(xs: &[f64]) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    match xs.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => xs[n / 2],
        n => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// `{"total_s", "runs_per_s", "lat_ms_p50", "lat_ms_p99", "lat_ms_max"}` of a
/// sequential phase, as the Ray anchor's `seq`.
pub(crate) fn seq_summary(total: Duration, lat: &[Duration], failures: usize) -> Value {
    json!({
        "total_s": round(total.as_secs_f64(), 3),
        "runs_per_s": round(lat.len() as f64 / total.as_secs_f64(), 1),
        "lat_ms_p50": ms(pct(lat, 50.0)),
        "lat_ms_p99": ms(pct(lat, 99.0)),
        "lat_ms_max": ms(lat.iter().copied().max().unwrap_or_default()),
        "failures": failures,
    })
}

/// `{"calls", "lat_ms_median", "lat_ms_min", "lat_ms_max", "lat_ms_all"}`.
pub(crate) fn latency_summary(lat: &[Duration]) -> Map<String, Value> {
    let all: Vec<f64> = lat.iter().map(|d| round(d.as_secs_f64() * 1000.0, 3)).collect();
    let mut out = Map::new();
    out.insert("calls".into(), json!(lat.len()));
    out.insert("lat_ms_median".into(), json!(round(median(&all), 3)));
    out.insert("lat_ms_min".into(), json!(all.iter().copied().fold(f64::INFINITY, f64::min)));
    out.insert("lat_ms_max".into(), json!(all.iter().copied().fold(0.0, f64::max)));
    out.insert("lat_ms_all".into(), json!(all));
    out
}

/// The outcome of reading back what was written.
pub(crate) fn check_ids(
    what: &str,
    written: &BTreeSet<String>,
    read: impl IntoIterator<Item = String>,
) -> Result<usize, String> {
    let read: Vec<String> = read.into_iter().collect();
    let count = read.len();
    let read: BTreeSet<String> = read.into_iter().collect();
    if count != written.len() || read != *written {
        let missing = written.difference(&read).count();
        let extra = read.difference(written).count();
        return Err(format!(
            "{what}: wrote {} runs, read back {count} ({missing} missing, {extra} unexpected)",
            written.len()
        ));
    }
    Ok(count)
}

/// The `id` of every run in a `{"train_runs": [...]}` document.
pub(crate) fn ids_of_listing(body: &[u8]) -> Result<Vec<String>, String> {
    #[derive(serde::Deserialize)]
    struct IdOnly {
        id: String,
    }
    let listing: trainstate_client::api::RayRunListResponse<IdOnly> =
        serde_json::from_slice(body).map_err(|e| format!("listing does not parse: {e}"))?;
    Ok(listing.train_runs.into_iter().map(|r| r.id).collect())
}
