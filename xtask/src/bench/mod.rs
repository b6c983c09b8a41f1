//! `cargo xtask bench`: trainstate measured the way `ray_state_bench.py`
//! measures Ray's state actor, one JSON line per configuration with the
//! same structure and key names.
//!
//! The driver depends on the head only as programs it builds and starts:
//! the release `trainstate` binary (the HTTP paths) and trainstate-actor's
//! `inproc` example (the in-process paths, and filling a store through the
//! store alone), both talked to through their inputs and outputs. It runs
//! every phase in a fresh child process of its own (a release build of
//! this program): `bench-unit` for one path, store and phase, `bench-ready`
//! for the time to be ready with many runs stored, `bench-scale` for the
//! head at scale. It merges each configuration's two phases into one line.
//! Nothing here asserts a time; every phase checks that the runs written
//! are the runs read back, and fails otherwise.

mod goodput;
mod heads;
mod http;
mod instrument;
mod paths;
mod records;
mod scale;
mod unit;
mod util;
mod wrk;
mod wrk_reads;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

use self::unit::Phase;

pub(crate) const USAGE: &str = "usage: cargo xtask bench [--n 2000] [--w 8]
                         [--path inproc|http|store|wrk|wrk-reads|all|none]
                         [--store durable|memory|all] [--rounds 1] [--concurrency 64]
                         [--get-calls 20] [--ready N] [--out FILE] [--no-build]
                         [--postgres URL] [--scale N] [--scale-repeats 21]
                         [--goodput N]
                         [--wrk-duration 5] [--wrk-prefer minimal]
                         [--bin PATH] [--inproc-bin PATH]

  Registers N fresh runs of W workers (sequentially, then pipelined, each phase
  against a fresh state), lists them (unpaged and by pages of 1000), gets one,
  and reads the memory of the process that holds the state. Prints one JSON
  line per path, store and round, shaped like ray_state_bench.py's.
  --ready N also times `trainstate serve` starting on a store of N runs.
  --postgres URL also measures the PostgreSQL store beside SQLite over HTTP
  (register, list, get), with one head and with two heads on one database
  (a fresh schema of URL each); `--path none` measures only that.
  --path wrk registers through `wrk` (apt-get install wrk) with
  bench/wrk/register.lua: one connection, then 2 threads over 64 connections,
  --wrk-duration seconds each, each against a fresh `trainstate serve`,
  then checks that every acknowledged run is stored.
  --wrk-prefer minimal sends `Prefer: return=minimal`.
  --path wrk-reads loads the head's reads and heartbeats with `wrk` and
  bench/wrk/cycle.lua, --wrk-duration seconds a phase, each phase against a
  fresh `trainstate serve`: one run at a time (1 connection, N stored), every
  run unpaged (1 connection), one run at a time during a pipelined
  registration burst, then 1,000 live runs' heartbeats and the heartbeats of
  1,000 ranks assembled through the rendezvous (2 threads, 64 connections),
  with the head's CPU in cores.
  --scale N fills a durable store with N runs of W workers, restarts the
  head on it, and times /healthz, full load, filtered pages of 100
  (matching and not; median of --scale-repeats) and RSS.
  --goodput N fills two durable stores with the same N runs of W workers,
  with and without their goodput, starts the head on each, times
  GET /api/train/goodput by cluster, node and name (p50 and p99 of
  --scale-repeats) and reads the goodput summaries' bytes and RSS.
  Runs release builds: `cargo xtask bench` re-runs itself with --release,
  and builds target/release/trainstate (--bin) and, for inproc, store,
  --ready and --scale, trainstate-actor's example target/release/examples/inproc
  (--inproc-bin) unless --no-build.";

/// Which way the state is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathKind {
    /// `StateHandle` to an actor in the same process (the `inproc` example).
    Inproc,
    /// The HTTP API of `trainstate serve`, a child process, over loopback.
    Http,
    /// The store writer and its committed view, without the actor (the
    /// `inproc` example).
    Store,
    /// The HTTP API loaded by `wrk` (only when asked: it needs wrk).
    Wrk,
    /// The head's reads and heartbeats loaded by `wrk` (only when asked).
    WrkReads,
}

impl PathKind {
    const ALL: [Self; 3] = [Self::Inproc, Self::Http, Self::Store];

    fn parse(text: &str) -> Option<Self> {
        [Self::Inproc, Self::Http, Self::Store, Self::Wrk, Self::WrkReads]
            .into_iter()
            .find(|p| p.as_str() == text)
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Inproc => "inproc",
            Self::Http => "http",
            Self::Store => "store",
            Self::Wrk => "wrk",
            Self::WrkReads => "wrk-reads",
        }
    }
}

/// Where runs are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreKind {
    /// SQLite, WAL, synchronous=FULL (the default of `trainstate serve`).
    Durable,
    /// Memory only.
    Memory,
}

impl StoreKind {
    const ALL: [Self; 2] = [Self::Durable, Self::Memory];

    fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Durable => "durable",
            Self::Memory => "memory",
        }
    }
}

/// The options of every command of the benchmark.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) n: usize,
    pub(crate) w: u32,
    paths: Vec<PathKind>,
    stores: Vec<StoreKind>,
    phase: Option<Phase>,
    rounds: usize,
    pub(crate) concurrency: usize,
    pub(crate) get_calls: usize,
    ready: usize,
    out: Option<PathBuf>,
    build: bool,
    pub(crate) trainstate_bin: PathBuf,
    /// `--inproc-bin`: the release build of trainstate-actor's `inproc` example.
    pub(crate) inproc_bin: PathBuf,
    postgres: Option<String>,
    /// `--wrk-duration`: the seconds a wrk phase runs.
    pub(crate) wrk_duration: u64,
    /// `--wrk-prefer minimal`: wrk sends `Prefer: return=minimal`.
    pub(crate) wrk_prefer: Option<String>,
    /// `--scale N`: the runs stored for the scale measurement (0: none).
    pub(crate) scale: usize,
    /// Repeats of each timed page at scale.
    pub(crate) scale_repeats: usize,
    /// `--goodput N`: the runs stored for the fleet-goodput measurement.
    goodput: usize,
}

impl Options {
    fn parse(args: &[&str], root: &Path) -> Result<Self, String> {
        let mut opts = Self {
            n: 2_000,
            w: 8,
            paths: PathKind::ALL.to_vec(),
            stores: StoreKind::ALL.to_vec(),
            phase: None,
            rounds: 1,
            concurrency: 64,
            get_calls: 20,
            ready: 0,
            out: None,
            build: true,
            trainstate_bin: unit::trainstate_bin(root),
            inproc_bin: instrument::inproc_bin(root),
            postgres: None,
            wrk_duration: 5,
            wrk_prefer: None,
            scale: 0,
            scale_repeats: 21,
            goodput: 0,
        };
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            if *flag == "--no-build" {
                opts.build = false;
                continue;
            }
            let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
            let number = || value.parse::<usize>().map_err(|_| format!("{flag}: not a number"));
            match *flag {
                "--n" => opts.n = number()?.max(1),
                "--w" => opts.w = number()?.clamp(1, 100_000) as u32,
                "--rounds" => opts.rounds = number()?.max(1),
                "--concurrency" => opts.concurrency = number()?.max(1),
                "--get-calls" => opts.get_calls = number()?.max(1),
                "--ready" => opts.ready = number()?,
                "--out" => opts.out = Some(PathBuf::from(value)),
                "--postgres" => opts.postgres = Some((*value).to_owned()),
                "--wrk-duration" => opts.wrk_duration = number()?.max(1) as u64,
                "--wrk-prefer" => {
                    if *value != "minimal" {
                        return Err("--wrk-prefer: only `minimal`".into());
                    }
                    opts.wrk_prefer = Some((*value).to_owned());
                }
                "--scale" => opts.scale = number()?,
                "--scale-repeats" => opts.scale_repeats = number()?.max(1),
                "--goodput" => opts.goodput = number()?,
                "--bin" => opts.trainstate_bin = PathBuf::from(value),
                "--inproc-bin" => opts.inproc_bin = PathBuf::from(value),
                "--phase" => {
                    opts.phase = Some(Phase::parse(value).ok_or("--phase: seq or main")?);
                }
                "--path" => {
                    opts.paths = match *value {
                        "all" => PathKind::ALL.to_vec(),
                        "none" => vec![],
                        one => vec![
                            PathKind::parse(one)
                                .ok_or("--path: inproc, http, store, wrk, wrk-reads or all")?,
                        ],
                    }
                }
                "--store" => {
                    opts.stores = match *value {
                        "all" => StoreKind::ALL.to_vec(),
                        one => {
                            vec![StoreKind::parse(one).ok_or("--store: durable, memory or all")?]
                        }
                    }
                }
                other => return Err(format!("unknown option {other}")),
            }
        }
        Ok(opts)
    }

    /// The options a child process is given.
    fn unit_args(&self) -> Vec<String> {
        vec![
            "--n".into(),
            self.n.to_string(),
            "--w".into(),
            self.w.to_string(),
            "--concurrency".into(),
            self.concurrency.to_string(),
            "--get-calls".into(),
            self.get_calls.to_string(),
            "--scale-repeats".into(),
            self.scale_repeats.to_string(),
            "--bin".into(),
            self.trainstate_bin.display().to_string(),
            "--inproc-bin".into(),
            self.inproc_bin.display().to_string(),
        ]
    }
}

/// `cargo xtask bench ...`
pub(crate) fn main(args: &[&str], root: &Path) -> ExitCode {
    let opts = match Options::parse(args, root) {
        Ok(opts) => opts,
        Err(err) => {
            eprintln!("error: {err}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if cfg!(debug_assertions) {
        // Measure release builds only.
        eprintln!("[bench] re-running as a release build");
        let status = Command::new(cargo())
            .args(["run", "--release", "--quiet", "--package", "xtask", "--", "bench"])
            .args(args)
            .current_dir(root)
            .status();
        return match status {
            Ok(status) if status.success() => ExitCode::SUCCESS,
            _ => ExitCode::FAILURE,
        };
    }
    // The in-process paths, and filling a store, run the actor's example.
    let inproc = opts.ready > 0
        || opts.scale > 0
        || opts.goodput > 0
        || opts.paths.iter().any(|p| matches!(p, PathKind::Inproc | PathKind::Store));
    if opts.build {
        // Two builds: the example's build turns on the actor's dev-dependency
        // features, which the measured binary must not have.
        let mut builds = vec![("--bin", "trainstate")];
        if inproc {
            builds.push(("--example", "inproc"));
        }
        for (kind, name) in builds {
            eprintln!("[bench] cargo build --release -p trainstate-actor {kind} {name}");
            let built = Command::new(cargo())
                .args(["build", "--release", "--quiet", "--package", "trainstate-actor"])
                .args([kind, name])
                .current_dir(root)
                .status();
            if !matches!(built, Ok(s) if s.success()) {
                eprintln!("error: building the release {name} failed");
                return ExitCode::FAILURE;
            }
        }
    }
    let mut needed = vec![&opts.trainstate_bin];
    if inproc {
        needed.push(&opts.inproc_bin);
    }
    for bin in needed {
        if !bin.exists() {
            eprintln!("error: {} does not exist", bin.display());
            return ExitCode::FAILURE;
        }
    }

    let about = about(root);
    let mut ok = true;
    for round in 1..=opts.rounds {
        for &path in &opts.paths {
            for &store in &opts.stores {
                let measured = match path {
                    PathKind::Wrk => wrk::configuration(&opts, store),
                    PathKind::WrkReads => wrk_reads::configuration(&opts, store),
                    _ => configuration(&opts, path, store),
                };
                let line = match measured {
                    Ok(result) => {
                        let mut line = header(&opts, &about, round);
                        line.insert("path".into(), json!(path.as_str()));
                        line.insert("store".into(), json!(store.as_str()));
                        line.insert("durability".into(), json!(durability(store)));
                        line.extend(result);
                        line
                    }
                    Err(err) => {
                        ok = false;
                        let mut line = header(&opts, &about, round);
                        line.insert("path".into(), json!(path.as_str()));
                        line.insert("store".into(), json!(store.as_str()));
                        line.insert("error".into(), json!(err));
                        line
                    }
                };
                ok &= emit(&opts, &Value::Object(line));
            }
        }
    }
    if let Some(postgres) = &opts.postgres {
        match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
            Ok(runtime) => {
                for round in 1..=opts.rounds {
                    for line in runtime.block_on(heads::run_all(&opts, postgres)) {
                        let mut full = header(&opts, &about, round);
                        full.extend(line.as_object().cloned().unwrap_or_default());
                        ok &= emit(&opts, &Value::Object(full));
                    }
                }
            }
            Err(err) => {
                eprintln!("error: cannot start a runtime: {err}");
                ok = false;
            }
        }
    }
    if opts.ready > 0 {
        let mut ready_opts = opts.clone();
        ready_opts.n = opts.ready;
        let mut args = ready_opts.unit_args();
        args.extend(["--rounds".into(), opts.rounds.max(3).to_string()]);
        let line = match child(root, "bench-ready", &args) {
            Ok(Value::Object(mut result)) => {
                let mut line = header(&ready_opts, &about, 1);
                line.append(&mut result);
                line
            }
            Ok(other) => Map::from_iter([("error".into(), json!(format!("{other}")))]),
            Err(err) => {
                let mut line = header(&ready_opts, &about, 1);
                line.insert("config".into(), json!("ready"));
                line.insert("error".into(), json!(err));
                line
            }
        };
        ok &= line.get("error").is_none();
        ok &= emit(&opts, &Value::Object(line));
    }
    if opts.scale > 0 {
        let mut scale_opts = opts.clone();
        scale_opts.n = opts.scale;
        let mut line = header(&scale_opts, &about, 1);
        match child(root, "bench-scale", &scale_opts.unit_args()) {
            Ok(Value::Object(mut result)) => line.append(&mut result),
            Ok(other) => {
                line.insert("error".into(), json!(format!("{other}")));
            }
            Err(err) => {
                line.insert("config".into(), json!("scale"));
                line.insert("error".into(), json!(err));
            }
        }
        ok &= emit(&opts, &Value::Object(line));
    }
    if opts.goodput > 0 {
        let mut goodput_opts = opts.clone();
        goodput_opts.n = opts.goodput;
        let mut line = header(&goodput_opts, &about, 1);
        match child(root, "bench-goodput", &goodput_opts.unit_args()) {
            Ok(Value::Object(mut result)) => line.append(&mut result),
            Ok(other) => {
                line.insert("error".into(), json!(format!("{other}")));
            }
            Err(err) => {
                line.insert("config".into(), json!("goodput"));
                line.insert("error".into(), json!(err));
            }
        }
        ok &= emit(&opts, &Value::Object(line));
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

fn durability(store: StoreKind) -> &'static str {
    match store {
        StoreKind::Durable => "sqlite WAL synchronous=FULL",
        StoreKind::Memory => "none (memory only)",
    }
}

/// Prints a result line (and appends it to `--out`); false if it holds an error.
fn emit(opts: &Options, line: &Value) -> bool {
    let text = line.to_string();
    println!("{text}");
    let _ = std::io::stdout().flush();
    if let Some(out) = &opts.out {
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(out)
            .and_then(|mut f| writeln!(f, "{text}"));
        if let Err(err) = appended {
            eprintln!("error: cannot append to {}: {err}", out.display());
            return false;
        }
    }
    line.get("error").is_none()
}

/// What is the same on every line of a run of the benchmark.
struct About {
    version: &'static str,
    rustc: String,
    nproc: usize,
    date: String,
}

fn about(root: &Path) -> About {
    let output = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .current_dir(root)
            .output()
            .ok()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default()
    };
    About {
        version: env!("CARGO_PKG_VERSION"),
        rustc: output("rustc", &["--version"]),
        nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
        date: output("date", &["+%Y-%m-%dT%H:%M:%S%z"]),
    }
}

fn header(opts: &Options, about: &About, round: usize) -> Map<String, Value> {
    let mut line = Map::new();
    line.insert("bench".into(), json!("trainstate"));
    line.insert("api".into(), json!("v1"));
    line.insert("N".into(), json!(opts.n));
    line.insert("W".into(), json!(opts.w));
    line.insert("datasets_per_run".into(), json!(1));
    line.insert("trainstate".into(), json!(about.version));
    line.insert("rustc".into(), json!(about.rustc));
    line.insert("nproc".into(), json!(about.nproc));
    line.insert("date".into(), json!(about.date));
    line.insert("round".into(), json!(round));
    line.insert("serve_args".into(), json!(http::BENCH_SERVE_ARGS.join(" ")));
    line
}

/// Both phases of one configuration, merged into the anchor's shape.
fn configuration(
    opts: &Options,
    path: PathKind,
    store: StoreKind,
) -> Result<Map<String, Value>, String> {
    let root = xtask::workspace_root();
    let unit = |phase: Phase| {
        let mut args = opts.unit_args();
        args.extend([
            "--path".into(),
            path.as_str().into(),
            "--store".into(),
            store.as_str().into(),
            "--phase".into(),
            phase.as_str().into(),
        ]);
        child(&root, "bench-unit", &args)
    };
    eprintln!("[bench] {} {} N={} W={}: sequential", path.as_str(), store.as_str(), opts.n, opts.w);
    let seq = unit(Phase::Seq)?;
    eprintln!(
        "[bench] {} {} N={} W={}: pipelined and reads",
        path.as_str(),
        store.as_str(),
        opts.n,
        opts.w
    );
    let main = unit(Phase::Main)?;

    let mut out = Map::new();
    // No runtime to start before the state: the process is the state.
    out.insert("ray_init_s".into(), json!(0.0));
    for key in ["actor_create_s", "ready_with_runs_s", "driver_build_records_s"] {
        if let Some(v) = main.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    out.insert("json_bytes_per_run".into(), main["json_bytes_per_run"].clone());
    out.insert("actor_pid".into(), main["actor_pid"].clone());
    if let Some(ceiling) = main.get("client_ceiling") {
        out.insert("client_ceiling".into(), ceiling.clone());
    }
    out.insert("seq".into(), seq["seq"].clone());
    for key in ["pipelined", "get_all", "get_all_paged", "get_one"] {
        out.insert(key.into(), main[key].clone());
    }
    let mut mem = main["actor_mem_kib"].as_object().cloned().unwrap_or_default();
    mem.insert("after_seq".into(), seq["actor_mem_kib"]["after_seq"].clone());
    let order = ["after_create", "after_seq", "after_pipelined", "after_get_all"];
    let mem: Map<String, Value> =
        order.iter().filter_map(|k| mem.get(*k).map(|v| ((*k).to_owned(), v.clone()))).collect();
    out.insert("actor_mem_kib".into(), Value::Object(mem));
    for key in ["actor_peak_rss_mib", "actor_rss_growth_mib", "base_rss_mib", "mem_per_run_kib"] {
        out.insert(key.into(), main[key].clone());
    }
    out.insert(
        "seq_process".into(),
        json!({
            "actor_create_s": seq["actor_create_s"],
            "after_create": seq["actor_mem_kib"]["after_create"],
            "actor_peak_rss_mib": seq["actor_peak_rss_mib"],
            "mem_per_run_kib": seq["mem_per_run_kib"],
        }),
    );
    out.insert("checks".into(), json!({"seq": seq["checks"], "main": main["checks"]}));
    Ok(out)
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// The most one child process may take.
const CHILD_TIMEOUT: Duration = Duration::from_secs(900);

/// Runs this program as `command args...` and parses the JSON line it prints.
fn child(root: &Path, command: &str, args: &[String]) -> Result<Value, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut process = Command::new(exe)
        .arg(command)
        .args(args)
        .current_dir(root)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start {command}: {e}"))?;
    let stdout = process.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap_or_default());
    let started = Instant::now();
    let status = loop {
        match process.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if started.elapsed() < CHILD_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(20));
            }
            _ => {
                let _ = process.kill();
                let _ = process.wait();
                return Err(format!("{command} took longer than {CHILD_TIMEOUT:?}"));
            }
        }
    };
    let text = reader.join().unwrap_or_default();
    let last = text.lines().rev().find(|l| l.starts_with('{')).unwrap_or("");
    let value: Value = serde_json::from_str(last)
        .map_err(|_| format!("{command} printed no result ({status})"))?;
    if let Some(err) = value.get("error") {
        return Err(err.as_str().unwrap_or_default().to_owned());
    }
    if !status.success() {
        return Err(format!("{command} exited with {status}"));
    }
    Ok(value)
}

/// `xtask bench-unit ...`, `bench-ready ...`, `bench-scale ...` and `bench-goodput ...`: one measurement in
/// this process; prints one JSON line (`{"error": ...}` on failure).
pub(crate) fn child_main(command: &str, args: &[&str], root: &Path) -> ExitCode {
    let result = Options::parse(args, root).and_then(|opts| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(|e| e.to_string())?;
        runtime.block_on(async {
            match command {
                "bench-ready" => unit::run_ready(&opts, opts.rounds).await,
                "bench-scale" => scale::run_scale(&opts).await,
                "bench-goodput" => goodput::run_goodput(&opts).await,
                _ => {
                    let phase = opts.phase.ok_or("--phase is required")?;
                    let (&[path], &[store]) = (opts.paths.as_slice(), opts.stores.as_slice())
                    else {
                        return Err("one --path and one --store".to_owned());
                    };
                    unit::run_unit(path, store, phase, &opts).await
                }
            }
        })
    });
    match result {
        Ok(value) => {
            println!("{value}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            println!("{}", json!({ "error": err }));
            ExitCode::FAILURE
        }
    }
}
