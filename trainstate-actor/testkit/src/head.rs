//! `trainstate serve` as a child process.

use std::fmt;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::HANG;

/// How long [`Head::stop`] waits after SIGTERM before SIGKILL.
pub const STOP_GRACE: Duration = Duration::from_secs(30);

/// How to start a head: `trainstate serve --listen LISTEN --data-dir DIR
/// ARGS…`, with `RUST_LOG=warn` unless [`Serve::env`] says otherwise.
#[derive(Debug, Clone)]
pub struct Serve {
    bin: PathBuf,
    data_dir: PathBuf,
    listen: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Serve {
    /// The `trainstate` binary at `bin`, serving from `data_dir`, on a
    /// free loopback port.
    pub fn new(bin: impl Into<PathBuf>, data_dir: &Path) -> Self {
        Self {
            bin: bin.into(),
            data_dir: data_dir.to_owned(),
            listen: "127.0.0.1:0".into(),
            args: Vec::new(),
            env: vec![("RUST_LOG".into(), "warn".into())],
        }
    }

    /// Listens on `listen` instead.
    pub fn listen(mut self, listen: &str) -> Self {
        self.listen = listen.to_owned();
        self
    }

    /// More arguments after the data directory.
    pub fn args<S: AsRef<str>>(mut self, args: impl IntoIterator<Item = S>) -> Self {
        self.args.extend(args.into_iter().map(|a| a.as_ref().to_owned()));
        self
    }

    /// An environment variable of the head.
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Starts the head and waits for its `listening on` line; if it exits
    /// first, what it logged and how it exited.
    pub fn start(self) -> Result<Head, Refused> {
        let mut child = Command::new(&self.bin)
            .args(["serve", "--listen", &self.listen, "--data-dir"])
            .arg(&self.data_dir)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        // Read as it comes, so that a chatty head never blocks on a full pipe.
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let lines = log.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = lines.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = tx.send(lines.next().and_then(Result::ok));
            for _ in lines {}
        });
        match rx.recv_timeout(HANG) {
            Ok(Some(line)) => {
                let url = line
                    .strip_prefix("listening on ")
                    .unwrap_or_else(|| panic!("the first line was {line:?}"))
                    .to_owned();
                Ok(Head { child, url, log })
            }
            _ => {
                let _ = child.kill();
                let status = child.wait().unwrap();
                reader.join().unwrap();
                let log = log.lock().unwrap().clone();
                Err(Refused { status, log })
            }
        }
    }
}

/// A head that exited before `listening on`.
#[derive(Debug)]
pub struct Refused {
    /// How it exited.
    pub status: ExitStatus,
    /// Everything it logged.
    pub log: String,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status, self.log)
    }
}

/// A running head; killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct Head {
    child: Child,
    /// The URL of its `listening on` line.
    pub url: String,
    log: Arc<Mutex<String>>,
}

impl Head {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.url.rsplit(':').next().unwrap().parse().unwrap()
    }

    /// `host:port` of its URL.
    pub fn address(&self) -> &str {
        self.url.split_once("://").map_or(&self.url, |(_, rest)| rest)
    }

    /// Everything it has logged on stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Sends `signal` (`-TERM`, `-STOP`, …) with `kill`.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([signal, &self.pid().to_string()]).status().unwrap();
        assert!(status.success(), "kill {signal} {}", self.pid());
    }

    /// How it exited, if it has.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().unwrap()
    }

    /// Waits for it to exit by itself (a guard of [`HANG`] ends a hung test).
    pub fn wait(&mut self) -> ExitStatus {
        self.wait_within(HANG).unwrap_or_else(|| panic!("the head did not exit: {}", self.log()))
    }

    /// Waits for it to exit, on Tokio's timer (for async tests whose
    /// other tasks must go on meanwhile).
    pub async fn exited(&mut self) -> ExitStatus {
        let until = Instant::now() + HANG;
        loop {
            if let Some(status) = self.try_exit() {
                return status;
            }
            assert!(Instant::now() < until, "the head did not exit: {}", self.log());
            tokio::time::sleep(crate::POLL).await;
        }
    }

    /// Stops it: SIGTERM, then SIGKILL if it has not exited within
    /// [`STOP_GRACE`]. Returns how it exited.
    pub fn stop(&mut self) -> ExitStatus {
        if let Some(status) = self.try_exit() {
            return status;
        }
        self.signal("-TERM");
        match self.wait_within(STOP_GRACE) {
            Some(status) => status,
            None => self.kill(),
        }
    }

    /// Kills it (SIGKILL) and reaps it.
    pub fn kill(&mut self) -> ExitStatus {
        let _ = self.child.kill();
        self.child.wait().unwrap()
    }

    /// Waits until it has logged `what` at least `times` times; returns the log.
    pub fn wait_for_log(&self, what: &str, times: usize) -> String {
        let until = Instant::now() + HANG;
        loop {
            let log = self.log();
            if log.matches(what).count() >= times {
                return log;
            }
            assert!(Instant::now() < until, "never logged {what:?} {times} times: {log}");
            std::thread::sleep(crate::POLL);
        }
    }

    /// [`Head::wait_for_log`] on Tokio's timer.
    pub async fn logged(&self, what: &str, times: usize) -> String {
        let what_ = format!("{what:?} logged {times} times");
        crate::eventually(&what_, HANG, || {
            let log = self.log();
            std::future::ready((log.matches(what).count() >= times).then_some(log))
        })
        .await
    }

    fn wait_within(&mut self, deadline: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + deadline;
        loop {
            if let Some(status) = self.try_exit() {
                return Some(status);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(crate::POLL);
        }
    }
}

impl Drop for Head {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
