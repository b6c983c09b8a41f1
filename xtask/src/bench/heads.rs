//! `cargo xtask bench --postgres URL`: the PostgreSQL store beside SQLite,
//! over HTTP, with one head and with two heads on one database.
//!
//! Each configuration starts release `trainstate serve` processes on a
//! fresh store (a new SQLite directory, or a new schema of the given
//! database), then registers N runs (pipelined over `--concurrency`
//! connections, spread round-robin over the heads), lists every run by
//! pages of 1000 through each head (after the other heads' writes have
//! reached it), and gets `--get-calls` × 100 runs at random (spread over
//! the heads). Every phase checks that the runs read are the runs written.

use super::paths;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use trainstate_schema::routes::Operation;

use bytes::Bytes;
use serde_json::{Value, json};

use super::Options;
use super::http::Server;
use super::records;
use super::util::{ms, pct, round};

/// One configuration: a store and how many heads share it.
#[derive(Debug, Clone, Copy)]
struct Config {
    store: &'static str,
    heads: usize,
}

const CONFIGS: [Config; 3] = [
    Config { store: "sqlite", heads: 1 },
    Config { store: "postgres", heads: 1 },
    Config { store: "postgres", heads: 2 },
];

/// Every configuration, one JSON line each.
pub(crate) async fn run_all(opts: &Options, postgres: &str) -> Vec<Value> {
    let mut lines = Vec::new();
    for config in CONFIGS {
        eprintln!("[bench] heads: {} x{} N={} W={}", config.store, config.heads, opts.n, opts.w);
        let line = match run_one(opts, postgres, config).await {
            Ok(result) => result,
            Err(err) => json!({ "error": err }),
        };
        let mut line = line.as_object().cloned().unwrap_or_default();
        line.insert("bench".into(), json!("trainstate-heads"));
        line.insert("store".into(), json!(config.store));
        line.insert("heads".into(), json!(config.heads));
        line.insert("N".into(), json!(opts.n));
        line.insert("W".into(), json!(opts.w));
        line.insert("concurrency".into(), json!(opts.concurrency));
        lines.push(Value::Object(line));
    }
    lines
}

/// A new schema in the database at `url`, and a URL that uses it.
async fn fresh_schema(url: &str) -> Result<String, String> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;
    let driver = tokio::spawn(connection);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let schema = format!("bench_{stamp}");
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .await
        .map_err(|e| format!("cannot create schema {schema}: {e}"))?;
    drop(client);
    let _ = driver.await;
    let separator = if url.contains('?') { '&' } else { '?' };
    Ok(format!("{url}{separator}options=-c%20search_path%3D{schema}"))
}

async fn run_one(opts: &Options, postgres: &str, config: Config) -> Result<Value, String> {
    let dir = super::unit::tempdir()?;
    let store_url = match config.store {
        "postgres" => Some(fresh_schema(postgres).await?),
        _ => None,
    };
    let mut servers = Vec::new();
    for i in 0..config.heads {
        let data_dir = dir.path().join(format!("head{i}"));
        std::fs::create_dir_all(&data_dir).map_err(|e| e.to_string())?;
        let mut extra = super::http::BENCH_SERVE_ARGS.map(str::to_owned).to_vec();
        if let Some(url) = &store_url {
            extra.extend(["--store".to_owned(), url.clone()]);
        }
        let (server, _) = Server::spawn_with(&opts.trainstate_bin, &data_dir, &extra)?;
        servers.push(server);
    }
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(120))
        .build()
        .map_err(|e| e.to_string())?;
    let bases: Arc<Vec<String>> = Arc::new(servers.iter().map(|s| s.url("")).collect());
    for base in bases.iter() {
        let _ = client.get(format!("{base}/api/version")).send().await;
    }

    // Register: pipelined, round-robin over the heads.
    let runs = records::runs(opts.n, opts.w);
    let ids: Arc<Vec<String>> = Arc::new(runs.iter().map(|r| r.id().to_string()).collect());
    let bodies: Arc<Vec<Bytes>> =
        Arc::new(runs.iter().map(|r| serde_json::to_vec(r).unwrap().into()).collect());
    drop(runs);
    let (register_time, register_lat, failures) =
        load(&client, opts.concurrency, bodies.len(), bases.clone(), move |client, base, i| {
            let body = bodies[i].clone();
            async move {
                let response = client
                    .post(format!("{base}{}", paths::path(Operation::RegisterRun)))
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await;
                match response {
                    Ok(r) => r.status() == reqwest::StatusCode::CREATED && r.bytes().await.is_ok(),
                    Err(_) => false,
                }
            }
        })
        .await;
    if failures > 0 {
        return Err(format!("{failures} registrations failed"));
    }

    // List every run through each head, once the others' writes have
    // reached it (with two heads: how long that took after the last answer).
    let written_at = Instant::now();
    let mut listings = Vec::new();
    let mut converged_ms = 0.0;
    for base in bases.iter() {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let body = get(&client, &format!("{base}{}", paths::runs_query("limit=1"))).await?;
            let page: Value = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
            if page["total"].as_u64() == Some(opts.n as u64) {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("{base} lists {} of {} runs", page["total"], opts.n));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        converged_ms = f64::max(converged_ms, ms(written_at.elapsed()));
        // Timed: fetching the pages (reading only each page's cursor);
        // checked after: that they hold exactly the runs written.
        let started = Instant::now();
        let mut bodies = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let mut url = format!("{base}{}", paths::runs_query("limit=1000"));
            if let Some(cursor) = &cursor {
                url.push_str(&format!("&cursor={cursor}"));
            }
            let body = get(&client, &url).await?;
            let next: PageCursor = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
            bodies.push(body);
            match next.next_cursor {
                Some(next) => cursor = Some(next),
                None => break,
            }
        }
        let elapsed = started.elapsed();
        let pages = bodies.len();
        let mut seen = Vec::with_capacity(opts.n);
        for body in &bodies {
            let page: Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
            for run in page["train_runs"].as_array().into_iter().flatten() {
                seen.push(run["id"].as_str().unwrap_or_default().to_owned());
            }
        }
        let mut want: Vec<&String> = ids.iter().collect();
        let mut got: Vec<&String> = seen.iter().collect();
        want.sort();
        got.sort();
        if want != got {
            return Err(format!("{base} listed {} runs, not the {} written", seen.len(), opts.n));
        }
        listings.push(json!({ "pages": pages, "ms": ms(elapsed) }));
    }

    // Get: random runs, round-robin over the heads.
    let calls = opts.get_calls * 100;
    let picks: Arc<Vec<usize>> =
        Arc::new((0..calls).map(|i| (i * 7919 + 13) % ids.len()).collect());
    let (get_time, get_lat, failures) =
        load(&client, opts.concurrency, calls, bases.clone(), move |client, base, i| {
            let id = ids[picks[i]].clone();
            async move {
                match client
                    .get(format!("{base}{}", paths::run_path(Operation::GetRun, &id)))
                    .send()
                    .await
                {
                    Ok(r) => {
                        r.status().is_success()
                            && r.bytes().await.is_ok_and(|b| {
                                serde_json::from_slice::<Value>(&b)
                                    .is_ok_and(|v| v["id"].as_str() == Some(id.as_str()))
                            })
                    }
                    Err(_) => false,
                }
            }
        })
        .await;
    if failures > 0 {
        return Err(format!("{failures} gets failed"));
    }

    for server in servers {
        server.terminate()?;
    }
    let rate = |n: usize, d: Duration| round(n as f64 / d.as_secs_f64(), 1);
    Ok(json!({
        "register": {
            "runs_per_s": rate(opts.n, register_time),
            "lat_ms_p50": ms(pct(&register_lat, 50.0)),
            "lat_ms_p99": ms(pct(&register_lat, 99.0)),
        },
        "visible_on_every_head_ms": converged_ms,
        "list_all": listings,
        "get": {
            "calls": calls,
            "per_s": rate(calls, get_time),
            "lat_ms_p50": ms(pct(&get_lat, 50.0)),
            "lat_ms_p99": ms(pct(&get_lat, 99.0)),
        },
    }))
}

/// A page of a listing, of which only the cursor is read while timing.
#[derive(serde::Deserialize)]
struct PageCursor {
    next_cursor: Option<String>,
}

async fn get(client: &reqwest::Client, url: &str) -> Result<Bytes, String> {
    let response = client.get(url).send().await.map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response.bytes().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!("GET {url}: {status}"));
    }
    Ok(body)
}

/// `count` requests over `concurrency` connections, request `i` to head
/// `i % heads`; the total time, each request's latency, and the failures.
async fn load<F, Fut>(
    client: &reqwest::Client,
    concurrency: usize,
    count: usize,
    bases: Arc<Vec<String>>,
    request: F,
) -> (Duration, Vec<Duration>, usize)
where
    F: Fn(reqwest::Client, String, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let request = Arc::new(request);
    let next = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let (client, bases, request) = (client.clone(), bases.clone(), request.clone());
        let (next, failures) = (next.clone(), failures.clone());
        tasks.spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let base = bases[i % bases.len()].clone();
                let t = Instant::now();
                if !request(client.clone(), base, i).await {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                lat.push(t.elapsed());
            }
            lat
        });
    }
    let mut lat = Vec::with_capacity(count);
    while let Some(done) = tasks.join_next().await {
        lat.extend(done.unwrap_or_default());
    }
    (started.elapsed(), lat, failures.load(Ordering::Relaxed))
}
