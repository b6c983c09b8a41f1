//! The in-process paths (`--path inproc` and `--path store`) and the
//! filling of a durable store (for `--ready` and `--scale`), through
//! trainstate-actor's `inproc` example: a process of its own that holds
//! the state and times each operation where the state lives. The driver
//! builds it and starts it as a black box; it sends the runs, then one
//! operation at a time, as JSON lines, and makes the figures from the
//! answers (the example's documentation lists the commands).

use std::io::{BufRead, BufReader, BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use trainstate_schema::TrainRunInfo;

use super::{PathKind, StoreKind, records};

/// The release build of the example.
pub(crate) fn inproc_bin(root: &Path) -> PathBuf {
    root.join("target").join("release").join("examples").join("inproc")
}

/// The example in its `state` mode, holding one state.
pub(crate) struct Instrument {
    child: Child,
    /// Its input and output; `None` once closed.
    pipes: Mutex<Option<Pipes>>,
}

type Pipes = (BufWriter<ChildStdin>, BufReader<ChildStdout>);

impl Instrument {
    /// Starts the example for one path and store, its store (if durable)
    /// in `dir`, and hands it `runs`; the state itself is not started yet.
    pub(crate) fn spawn(
        bin: &Path,
        path: PathKind,
        store: StoreKind,
        dir: &Path,
        runs: &[TrainRunInfo],
    ) -> Result<Self, String> {
        let mut command = Command::new(bin);
        command
            .args(["state", "--path", path.as_str(), "--store", store.as_str(), "--dir"])
            .arg(dir);
        let (child, stdin, stdout) = spawn(command)?;
        let mut pipes = (BufWriter::new(stdin), stdout);
        {
            let send = |stdin: &mut BufWriter<ChildStdin>| -> std::io::Result<()> {
                writeln!(stdin, "{}", json!({"op": "runs", "count": runs.len()}))?;
                for run in runs {
                    serde_json::to_writer(&mut *stdin, run)?;
                    stdin.write_all(b"\n")?;
                }
                stdin.flush()
            };
            send(&mut pipes.0).map_err(|e| format!("cannot hand the runs over: {e}"))?;
            read_answer(&mut pipes.1)?;
        }
        Ok(Self { child, pipes: Mutex::new(Some(pipes)) })
    }

    /// Sends one command and returns its answer.
    pub(crate) fn call(&self, command: Value) -> Result<Value, String> {
        let mut pipes = self.pipes.lock().unwrap_or_else(|e| e.into_inner());
        let pipes = pipes.as_mut().ok_or("the inproc example's input is closed")?;
        let sent = writeln!(pipes.0, "{command}").and_then(|()| pipes.0.flush());
        sent.map_err(|e| format!("the inproc example does not listen: {e}"))?;
        read_answer(&mut pipes.1)
    }

    /// The process that holds the state.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Closes its input and waits for it to exit cleanly.
    pub(crate) fn finish(mut self) -> Result<(), String> {
        drop(self.pipes.lock().unwrap_or_else(|e| e.into_inner()).take());
        let status = self.child.wait().map_err(|e| e.to_string())?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("the inproc example exited with {status}"))
        }
    }
}

impl Drop for Instrument {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts `command` with its input and output piped (its errors go to ours).
fn spawn(mut command: Command) -> Result<(Child, ChildStdin, BufReader<ChildStdout>), String> {
    let program = command.get_program().to_string_lossy().into_owned();
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| {
            format!("cannot start {program}: {e} (build it: cargo build --release -p trainstate-actor --example inproc)")
        })?;
    let stdin = child.stdin.take().expect("stdin is piped");
    let stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
    Ok((child, stdin, stdout))
}

/// The next answer line; its `error`, if it has one, as an error.
fn read_answer(stdout: &mut BufReader<ChildStdout>) -> Result<Value, String> {
    let mut line = String::new();
    let read = stdout.read_line(&mut line).map_err(|e| e.to_string())?;
    if read == 0 {
        return Err("the inproc example stopped without an answer".into());
    }
    let value: Value = serde_json::from_str(&line)
        .map_err(|e| format!("the inproc example answered {line:?}: {e}"))?;
    match value.get("error") {
        Some(err) => Err(err.as_str().unwrap_or_default().to_owned()),
        None => Ok(value),
    }
}

/// Writes `n` runs of `w` workers (`make(i, w, start_ms)`) into a durable
/// store in `dir` through the store alone, streamed to the example's
/// `fill`; returns the time from its start to the store closed.
pub(crate) fn fill_with(
    bin: &Path,
    dir: &Path,
    n: usize,
    w: u32,
    make: fn(u64, u32, u64) -> TrainRunInfo,
) -> Result<Duration, String> {
    fill_with_answer(bin, dir, n, w, make, false).map(|(filled, _)| filled)
}

/// [`fill_with`], with the `inproc` example's answer (`runs`, `fill_ns`,
/// and with `summaries` the loaded view's `goodput_summary_bytes`).
pub(crate) fn fill_with_answer(
    bin: &Path,
    dir: &Path,
    n: usize,
    w: u32,
    make: fn(u64, u32, u64) -> TrainRunInfo,
    summaries: bool,
) -> Result<(Duration, Value), String> {
    let started = Instant::now();
    let mut command = Command::new(bin);
    command.args(["fill", "--dir"]).arg(dir);
    if summaries {
        command.args(["--summaries", "loaded"]);
    }
    let (mut child, stdin, mut stdout) = spawn(command)?;
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut stdin = BufWriter::new(stdin);
        let start_ms = records::now_ms();
        for i in 0..n as u64 {
            serde_json::to_writer(&mut stdin, &make(i, w, start_ms))?;
            stdin.write_all(b"\n")?;
        }
        stdin.flush()
    });
    let written = writer.join().map_err(|_| "the run writer panicked".to_owned())?;
    let answer = read_answer(&mut stdout);
    let status = child.wait().map_err(|e| e.to_string())?;
    written.map_err(|e| format!("cannot hand the runs over: {e}"))?;
    let answer = answer?;
    let filled = started.elapsed();
    if !status.success() {
        return Err(format!("filling the store: the inproc example exited with {status}"));
    }
    if answer["runs"].as_u64() != Some(n as u64) {
        return Err(format!("filling the store: {answer} for {n} runs"));
    }
    Ok((filled, answer))
}
