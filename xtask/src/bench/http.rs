//! The HTTP path: `trainstate serve` as a child process, and a lean load
//! generator (reqwest, the HTTP stack of `StateHandle::connect`, with every
//! request body encoded before the clock starts).
//!
//! Every answer that is not 2xx, and every transport error, is a failure:
//! nothing is retried.

use super::paths;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use trainstate_schema::routes::Operation;

use bytes::Bytes;
use serde_json::{Value, json};
use trainstate_schema::TrainRunInfo;

use super::StoreKind;
use super::util::{ms, pct, round};

/// How long a server may take to say it listens.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The routes the client's ceiling is measured on: no store behind the
/// first; one read of the actor behind the second.
const CEILING_ROUTES: [Operation; 2] = [Operation::GetVersion, Operation::Health];

/// The options of `serve` the benchmark sets beyond its defaults: none. The
/// head bounds request bodies by bytes in flight (256 MiB), so every
/// connection's registration is taken at once with the defaults, as a user
/// gets them; the value is recorded in each result line.
pub(crate) const BENCH_SERVE_ARGS: [&str; 0] = [];

/// `trainstate serve` running as a child process.
pub(crate) struct Server {
    child: Option<Child>,
    base: String,
    log: PathBuf,
}

impl Server {
    /// Starts `trainstate serve` on a free loopback port and waits for its
    /// "listening on" line; returns it and the time from spawn to that line.
    pub(crate) fn spawn(
        bin: &Path,
        data_dir: &Path,
        store: StoreKind,
    ) -> Result<(Self, Duration), String> {
        let mut extra = BENCH_SERVE_ARGS.map(str::to_owned).to_vec();
        if store == StoreKind::Memory {
            extra.push("--in-memory".to_owned());
        }
        Self::spawn_with(bin, data_dir, &extra)
    }

    /// [`spawn`](Self::spawn) with these extra arguments of `serve`. Returns
    /// once the head is ready: it listens and its `/healthz` says its stored
    /// runs are loaded (a head serves while it loads); the duration is the
    /// time to that moment.
    pub(crate) fn spawn_with(
        bin: &Path,
        data_dir: &Path,
        extra: &[String],
    ) -> Result<(Self, Duration), String> {
        let started = Instant::now();
        let (server, _) = Self::spawn_listening(bin, data_dir, extra)?;
        server.wait_loaded()?;
        Ok((server, started.elapsed()))
    }

    /// Polls `/healthz` (over a plain socket, so that no client's start-up
    /// counts) until it says the stored runs are loaded, or does not say.
    fn wait_loaded(&self) -> Result<(), String> {
        use std::io::{Read, Write};
        let addr = self.base.trim_start_matches("http://").to_owned();
        let started = Instant::now();
        loop {
            if started.elapsed() > START_TIMEOUT {
                return Err(format!("trainstate serve did not load within {START_TIMEOUT:?}"));
            }
            let mut answer = Vec::new();
            let asked = std::net::TcpStream::connect(&addr).and_then(|mut socket| {
                write!(
                    socket,
                    "GET {} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n",
                    paths::path(Operation::Health)
                )?;
                socket.read_to_end(&mut answer)
            });
            // The body is the JSON object after the headers.
            let body = answer.iter().position(|b| *b == b'{').map(|at| &answer[at..]);
            if asked.is_ok() && body.is_some_and(|b| super::scale::says_loaded(b) != Some(false)) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Starts the server and returns at its `listening on` line, loaded or
    /// not, with the time to that line.
    pub(crate) fn spawn_listening(
        bin: &Path,
        data_dir: &Path,
        extra: &[String],
    ) -> Result<(Self, Duration), String> {
        let log = data_dir.join("serve.log");
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("cannot open {}: {e}", log.display()))?;
        let mut command = Command::new(bin);
        command.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"]).arg(data_dir).args(extra);
        // The benchmark sets every option itself.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("TRAINSTATE_") || key == "RUST_LOG" {
                command.env_remove(key);
            }
        }
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(stderr);
        let started = Instant::now();
        let mut child =
            command.spawn().map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            for line in lines.by_ref() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.strip_prefix("listening on ") {
                    let _ = tx.send(addr.trim().to_owned());
                    break;
                }
            }
            // Keep draining so the server never writes to a closed pipe.
            for _ in lines {}
        });
        let mut server = Self { child: Some(child), base: String::new(), log };
        match rx.recv_timeout(START_TIMEOUT) {
            Ok(base) => {
                let ready = started.elapsed();
                server.base = base;
                Ok((server, ready))
            }
            Err(_) => {
                let log = std::fs::read_to_string(&server.log).unwrap_or_default();
                Err(format!("trainstate serve did not start within {START_TIMEOUT:?}:\n{log}"))
            }
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// SIGTERM, then waits for a clean exit (SIGKILL after 30 s).
    pub(crate) fn terminate(mut self) -> Result<(), String> {
        let Some(mut child) = self.child.take() else { return Ok(()) };
        let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match child.try_wait() {
                Ok(Some(status)) if status.success() => return Ok(()),
                Ok(Some(status)) => {
                    let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                    return Err(format!("trainstate serve exited with {status}:\n{log}"));
                }
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err("trainstate serve did not stop within 30 s of SIGTERM".into());
                }
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A server and the client that loads it.
pub(crate) struct HttpTarget {
    pub(crate) server: Server,
    client: reqwest::Client,
    concurrency: usize,
}

impl HttpTarget {
    pub(crate) fn new(server: Server, concurrency: usize) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .tcp_nodelay(true)
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))?;
        Ok(Self { server, client, concurrency: concurrency.max(1) })
    }

    /// GET `path`; the body of a 2xx answer, else an error.
    pub(crate) async fn get(&self, path: &str) -> Result<Bytes, String> {
        let response =
            self.client.get(self.server.url(path)).send().await.map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response.bytes().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("GET {path}: {status}: {}", String::from_utf8_lossy(&body)));
        }
        Ok(body)
    }

    /// POST `path` with a JSON body: the status and the body of the answer.
    pub(crate) async fn post_json(
        &self,
        path: &str,
        body: Vec<u8>,
    ) -> Result<(u16, Bytes), String> {
        let response = self
            .client
            .post(self.server.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| format!("POST {path}: {e}"))?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(|e| format!("POST {path}: {e}"))?;
        Ok((status, body))
    }

    /// Opens the connection, so the first measured request does not pay for it.
    pub(crate) async fn warm_up(&self) {
        let _ = self.get(paths::path(Operation::GetVersion)).await;
    }

    async fn post(client: &reqwest::Client, url: &str, body: &Bytes) -> bool {
        let sent = client
            .post(url)
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(response) => {
                let created = response.status() == reqwest::StatusCode::CREATED;
                response.bytes().await.is_ok() && created
            }
            Err(_) => false,
        }
    }

    fn bodies(runs: &[TrainRunInfo]) -> Vec<Bytes> {
        runs.iter().map(|r| serde_json::to_vec(r).expect("a run serializes").into()).collect()
    }

    /// One connection, one registration at a time.
    pub(crate) async fn register_seq(
        &self,
        runs: &[TrainRunInfo],
    ) -> (Duration, Vec<Duration>, usize) {
        let bodies = Self::bodies(runs);
        let url = self.server.url(paths::path(Operation::RegisterRun));
        let mut lat = Vec::with_capacity(bodies.len());
        let mut failures = 0;
        let started = Instant::now();
        for body in &bodies {
            let t = Instant::now();
            if !Self::post(&self.client, &url, body).await {
                failures += 1;
            }
            lat.push(t.elapsed());
        }
        (started.elapsed(), lat, failures)
    }

    /// `concurrency` connections, each sending its next registration as
    /// soon as the previous is answered.
    pub(crate) async fn register_pipelined(&self, runs: &[TrainRunInfo]) -> (Duration, usize) {
        let bodies = Arc::new(Self::bodies(runs));
        let url = Arc::new(self.server.url(paths::path(Operation::RegisterRun)));
        let next = Arc::new(AtomicUsize::new(0));
        let failures = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..self.concurrency {
            let (client, bodies, url) = (self.client.clone(), bodies.clone(), url.clone());
            let (next, failures) = (next.clone(), failures.clone());
            tasks.spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(body) = bodies.get(i) else { break };
                    if !Self::post(&client, &url, body).await {
                        failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        while tasks.join_next().await.is_some() {}
        (started.elapsed(), failures.load(Ordering::Relaxed))
    }

    /// The same client against trivial routes: `requests` GETs one at a
    /// time on one connection, then over `concurrency` connections.
    pub(crate) async fn ceiling(&self, requests: usize) -> Value {
        let mut out = serde_json::Map::new();
        for route in CEILING_ROUTES {
            let url = Arc::new(self.server.url(paths::path(route)));
            let mut lat = Vec::with_capacity(requests);
            let mut failures = 0;
            let started = Instant::now();
            for _ in 0..requests {
                let t = Instant::now();
                if !get_ok(&self.client, &url).await {
                    failures += 1;
                }
                lat.push(t.elapsed());
            }
            let seq = started.elapsed();

            let next = Arc::new(AtomicUsize::new(0));
            let failed = Arc::new(AtomicUsize::new(0));
            let started = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..self.concurrency {
                let (client, url, next, failed) =
                    (self.client.clone(), url.clone(), next.clone(), failed.clone());
                tasks.spawn(async move {
                    while next.fetch_add(1, Ordering::Relaxed) < requests {
                        if !get_ok(&client, &url).await {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
            while tasks.join_next().await.is_some() {}
            let pipelined = started.elapsed();
            out.insert(
                paths::path(route).to_owned(),
                json!({
                    "requests": requests,
                    "seq_req_per_s": round(requests as f64 / seq.as_secs_f64(), 1),
                    "seq_lat_ms_p50": ms(pct(&lat, 50.0)),
                    "pipelined_req_per_s": round(requests as f64 / pipelined.as_secs_f64(), 1),
                    "concurrency": self.concurrency,
                    "failures": failures + failed.load(Ordering::Relaxed),
                }),
            );
        }
        Value::Object(out)
    }
}

async fn get_ok(client: &reqwest::Client, url: &str) -> bool {
    match client.get(url).send().await {
        Ok(response) => {
            let ok = response.status().is_success();
            response.bytes().await.is_ok() && ok
        }
        Err(_) => false,
    }
}
