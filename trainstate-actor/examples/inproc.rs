//! The in-process half of `cargo xtask bench`: the state in this process,
//! reached through `StateHandle` (`--path inproc`) or through the store
//! writer and its committed view alone (`--path store`, through
//! `bench_support`), and the filling of a durable store through the store
//! alone (for `--ready` and `--scale`).
//!
//! The benchmark driver builds this example and starts it as a process of
//! its own; it never links the actor. It sends the runs and one operation
//! at a time as JSON lines on stdin; this process times each operation
//! where the state lives and answers one JSON line on stdout. The driver
//! makes the figures and checks them.
//!
//! ```sh
//! cargo build --release -p trainstate-actor --example inproc
//! target/release/examples/inproc state --path inproc|store --store durable|memory --dir DIR
//! target/release/examples/inproc fill --dir DIR    # stdin: one run per line
//! ```
//!
//! `state` reads these commands, each answered by one line (`{"error": ...}`
//! on failure):
//!
//! - `{"op":"runs","count":N}` then N lines, one run each: `{}`
//! - `{"op":"start"}`: `{"ready_ns","pid"}`
//! - `{"op":"register_seq"}`: `{"total_ns","lat_ns":[...],"failures"}`
//! - `{"op":"register_pipelined"}`: `{"total_ns","submitted_ns","failures"}`
//! - `{"op":"list_all","ids":bool}`: `{"ns","json_bytes","ids"?}`
//! - `{"op":"list_page","limit":L,"cursor":C|null,"ids":bool}`:
//!   `{"ns","json_bytes","next_cursor","ids"?}`
//! - `{"op":"get_one","id":ID}`: `{"ns","json_bytes","id"}`
//! - `{"op":"restart"}`: `{"ready_ns","count"}` (then stopped)
//! - `{"op":"stop"}`: `{}`
//!
//! `fill` writes every run it reads, 4,096 at a time, and answers
//! `{"fill_ns","runs"}` when the store is closed; with `--summaries
//! loaded` it loads them again as a head does at start and adds
//! `goodput_summary_bytes`, the bytes of the view's goodput summaries.

#![allow(missing_docs)]

use std::io::{BufRead, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use trainstate_actor::bench_support::StoreBench;
use trainstate_actor::{StateConfig, StateService, launch_state_actor};
use trainstate_client::api::RayRunListResponse;
use trainstate_client::{Cursor, RunDocument, RunQuery, StateHandle};
use trainstate_schema::{RunId, TrainRunInfo};

/// The deadline of one call: generous, so that a slow machine shows up as
/// a slow figure rather than a failure.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// The runs `fill` writes before it waits for their commits.
const FILL_BATCH: usize = 4_096;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = Options::parse(&args).and_then(|opts| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        match opts.command.as_str() {
            "state" => runtime.block_on(serve(&opts)),
            "fill" => runtime.block_on(fill(&opts)),
            other => Err(format!("unknown command {other}: state or fill")),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            answer(&json!({ "error": err }));
            ExitCode::FAILURE
        }
    }
}

struct Options {
    command: String,
    path: String,
    durable: bool,
    dir: PathBuf,
    /// `--summaries loaded`: `fill` loads the runs again, as a head does at
    /// start, and reports the bytes of the view's goodput summaries.
    summaries: bool,
}

impl Options {
    fn parse(args: &[String]) -> Result<Self, String> {
        let mut args = args.iter();
        let command = args.next().ok_or("usage: inproc state|fill --dir DIR ...")?.clone();
        let mut opts = Self {
            command,
            path: "inproc".into(),
            durable: true,
            dir: PathBuf::new(),
            summaries: false,
        };
        while let Some(flag) = args.next() {
            let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--path" if ["inproc", "store"].contains(&value.as_str()) => {
                    opts.path = value.clone();
                }
                "--store" if ["durable", "memory"].contains(&value.as_str()) => {
                    opts.durable = value == "durable";
                }
                "--dir" => opts.dir = PathBuf::from(value),
                "--summaries" if value == "loaded" => opts.summaries = true,
                _ => return Err(format!("bad option {flag} {value}")),
            }
        }
        if opts.dir.as_os_str().is_empty() {
            return Err("--dir is required".into());
        }
        Ok(opts)
    }

    fn config(&self) -> StateConfig {
        config(self.durable, &self.dir)
    }
}

/// A file in `dir`, or memory.
fn config(durable: bool, dir: &Path) -> StateConfig {
    if durable { StateConfig::sqlite(dir.join("trainstate.db")) } else { StateConfig::in_memory() }
}

/// Writes one answer line.
fn answer(value: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{value}");
    let _ = out.flush();
}

fn nanos(d: Duration) -> u64 {
    d.as_nanos() as u64
}

/// The state under test.
enum State {
    Inproc { service: StateService, handle: StateHandle },
    Store { store: Arc<StoreBench> },
}

impl State {
    async fn start(path: &str, config: StateConfig) -> Result<Self, String> {
        if path == "store" {
            let store = StoreBench::open(&config).map_err(|e| e.to_string())?;
            store.load().await.map_err(|e| e.to_string())?;
            Ok(Self::Store { store: Arc::new(store) })
        } else {
            let service = launch_state_actor(config).await.map_err(|e| e.to_string())?;
            let handle = service.handle().with_timeout(CALL_TIMEOUT);
            Ok(Self::Inproc { service, handle })
        }
    }

    /// Registers each run and waits for its answer before the next.
    async fn register_seq(&self, runs: &[TrainRunInfo]) -> Value {
        let mut lat = Vec::with_capacity(runs.len());
        let mut failures = 0;
        let started = Instant::now();
        match self {
            Self::Inproc { handle, .. } => {
                for run in runs {
                    let t = Instant::now();
                    match handle.register(run.clone()).await {
                        Ok(reg) if reg.created => {}
                        _ => failures += 1,
                    }
                    lat.push(nanos(t.elapsed()));
                }
            }
            Self::Store { store } => {
                for run in runs {
                    let t = Instant::now();
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    store.put(run, move |result| {
                        let _ = tx.send(result);
                    });
                    if !matches!(rx.await, Ok(Ok(()))) {
                        failures += 1;
                    }
                    lat.push(nanos(t.elapsed()));
                }
            }
        }
        json!({"total_ns": nanos(started.elapsed()), "lat_ns": lat, "failures": failures})
    }

    /// Registers every run with all of them in flight.
    async fn register_pipelined(&self, runs: &[TrainRunInfo]) -> Value {
        let started = Instant::now();
        let mut failures = 0;
        let submitted = match self {
            Self::Inproc { handle, .. } => {
                let mut tasks = tokio::task::JoinSet::new();
                for run in runs {
                    let handle = handle.clone();
                    let run = run.clone();
                    tasks.spawn(async move { handle.register(run).await });
                }
                let submitted = started.elapsed();
                while let Some(result) = tasks.join_next().await {
                    if !matches!(result, Ok(Ok(ref reg)) if reg.created) {
                        failures += 1;
                    }
                }
                submitted
            }
            Self::Store { store } => {
                let mut answers = Vec::with_capacity(runs.len());
                for run in runs {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    store.put(run, move |result| {
                        let _ = tx.send(result);
                    });
                    answers.push(rx);
                }
                let submitted = started.elapsed();
                for rx in answers {
                    if !matches!(rx.await, Ok(Ok(()))) {
                        failures += 1;
                    }
                }
                submitted
            }
        };
        json!({
            "total_ns": nanos(started.elapsed()),
            "submitted_ns": nanos(submitted),
            "failures": failures,
        })
    }

    /// One page of `query`, and how long it took.
    async fn list(
        &self,
        query: RunQuery,
    ) -> Result<(Vec<RunDocument>, Option<Cursor>, Duration), String> {
        let t = Instant::now();
        let page = match self {
            Self::Inproc { handle, .. } => handle.list(query).await.map_err(|e| e.to_string())?,
            Self::Store { store } => store.list(&query),
        };
        let took = t.elapsed();
        Ok((page.runs, page.next_cursor, took))
    }

    /// One run, and how long it took.
    async fn get(&self, id: RunId) -> Result<(RunDocument, Duration), String> {
        let t = Instant::now();
        let doc = match self {
            Self::Inproc { handle, .. } => handle.get(id).await.map_err(|e| e.to_string())?,
            Self::Store { store } => store.get(&id).ok_or_else(|| format!("run {id} not found"))?,
        };
        Ok((doc, t.elapsed()))
    }

    async fn stop(self) {
        match self {
            Self::Inproc { service, .. } => service.shutdown().await,
            Self::Store { store } => store.close(),
        }
    }

    /// Stops, then starts again on the same store; returns how long the
    /// start took and the runs it loaded.
    async fn restart(self, config: StateConfig) -> Result<(Duration, usize), String> {
        match self {
            Self::Inproc { service, .. } => {
                service.shutdown().await;
                drop(service);
                let started = Instant::now();
                let service = launch_state_actor(config).await.map_err(|e| e.to_string())?;
                let ready = started.elapsed();
                let count = service.run_count();
                service.shutdown().await;
                Ok((ready, count))
            }
            Self::Store { store } => {
                store.close();
                drop(store);
                let started = Instant::now();
                let store = StoreBench::open(&config).map_err(|e| e.to_string())?;
                let count = store.load().await.map_err(|e| e.to_string())?;
                let ready = started.elapsed();
                store.close();
                Ok((ready, count))
            }
        }
    }
}

/// `{"train_runs":[...]}` of documents, as the HTTP API writes it.
fn listing_bytes(docs: &[RunDocument]) -> usize {
    let listing = RayRunListResponse::new(docs.iter().collect::<Vec<_>>());
    serde_json::to_string(&listing).map_or(0, |s| s.len())
}

fn ids(docs: &[RunDocument]) -> Result<Vec<String>, String> {
    docs.iter().map(doc_id).collect()
}

fn doc_id(doc: &RunDocument) -> Result<String, String> {
    #[derive(serde::Deserialize)]
    struct IdOnly {
        id: String,
    }
    serde_json::from_str::<IdOnly>(&doc.body())
        .map(|r| r.id)
        .map_err(|e| format!("a stored run does not parse: {e}"))
}

/// `state`: one operation per command line, until stdin closes.
async fn serve(opts: &Options) -> Result<(), String> {
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    let mut runs: Vec<TrainRunInfo> = Vec::new();
    let mut state: Option<State> = None;
    while let Some(line) = lines.next() {
        let command: Value = serde_json::from_str(&line.map_err(|e| e.to_string())?)
            .map_err(|e| format!("a command does not parse: {e}"))?;
        let want_ids = command["ids"].as_bool().unwrap_or(false);
        let running = || state.as_ref().ok_or_else(|| "not started".to_owned());
        let reply = match command["op"].as_str().unwrap_or_default() {
            "runs" => {
                let count = command["count"].as_u64().unwrap_or(0) as usize;
                runs = Vec::with_capacity(count);
                for line in lines.by_ref().take(count) {
                    let line = line.map_err(|e| e.to_string())?;
                    runs.push(serde_json::from_str(&line).map_err(|e| format!("a run: {e}"))?);
                }
                json!({})
            }
            "start" => {
                let started = Instant::now();
                state = Some(State::start(&opts.path, opts.config()).await?);
                json!({"ready_ns": nanos(started.elapsed()), "pid": std::process::id()})
            }
            "register_seq" => running()?.register_seq(&runs).await,
            "register_pipelined" => running()?.register_pipelined(&runs).await,
            "list_all" => {
                let (docs, _, took) = running()?.list(RunQuery::all()).await?;
                let mut reply = json!({"ns": nanos(took)});
                if want_ids {
                    reply["json_bytes"] = json!(listing_bytes(&docs));
                    reply["ids"] = json!(ids(&docs)?);
                }
                reply
            }
            "list_page" => {
                let limit = command["limit"].as_u64().unwrap_or(1_000) as usize;
                let mut query = RunQuery::new().limit(limit);
                if let Some(cursor) = command["cursor"].as_str() {
                    query = query.after(cursor.parse().map_err(|e| format!("cursor: {e}"))?);
                }
                let (docs, next, took) = running()?.list(query).await?;
                let mut reply = json!({
                    "ns": nanos(took),
                    "json_bytes": listing_bytes(&docs),
                    "next_cursor": next.map(|c| c.to_string()),
                });
                if want_ids {
                    reply["ids"] = json!(ids(&docs)?);
                }
                reply
            }
            "get_one" => {
                let id = command["id"].as_str().unwrap_or_default();
                let id = RunId::parse(id).map_err(|e| format!("id {id}: {e}"))?;
                let (doc, took) = running()?.get(id).await?;
                json!({"ns": nanos(took), "json_bytes": doc.to_json().len(), "id": doc_id(&doc)?})
            }
            "restart" => {
                let state = state.take().ok_or("not started")?;
                let (ready, count) = state.restart(opts.config()).await?;
                json!({"ready_ns": nanos(ready), "count": count})
            }
            "stop" => {
                if let Some(state) = state.take() {
                    state.stop().await;
                }
                json!({})
            }
            other => return Err(format!("unknown op {other:?}")),
        };
        answer(&reply);
    }
    if let Some(state) = state {
        state.stop().await;
    }
    Ok(())
}

/// `fill`: every run read from stdin through the store alone, committed
/// [`FILL_BATCH`] at a time.
async fn fill(opts: &Options) -> Result<(), String> {
    if !opts.durable {
        return Err("fill writes a durable store".into());
    }
    let started = Instant::now();
    let store = StoreBench::open(&opts.config()).map_err(|e| e.to_string())?;
    let mut lines = std::io::stdin().lock().lines();
    let mut written = 0usize;
    loop {
        let mut answers = Vec::with_capacity(FILL_BATCH);
        for line in lines.by_ref().take(FILL_BATCH) {
            let run: TrainRunInfo = serde_json::from_str(&line.map_err(|e| e.to_string())?)
                .map_err(|e| format!("a run: {e}"))?;
            let (tx, rx) = tokio::sync::oneshot::channel();
            store.put(&run, move |result| {
                let _ = tx.send(result);
            });
            answers.push(rx);
        }
        if answers.is_empty() {
            break;
        }
        written += answers.len();
        for rx in answers {
            if !matches!(rx.await, Ok(Ok(()))) {
                return Err("filling the store failed".into());
            }
        }
    }
    let mut answered = json!({"runs": written});
    if opts.summaries {
        // Loaded again as a head loads it at start: the view's goodput
        // summaries, allocated once for every run, as a head holds them.
        store.load().await.map_err(|e| e.to_string())?;
        answered["goodput_summary_bytes"] = json!(store.goodput_summary_bytes());
    }
    store.close();
    answered["fill_ns"] = json!(nanos(started.elapsed()));
    answer(&answered);
    Ok(())
}
