"""Fixtures: a real `trainstate serve` on a loopback port, and child scripts.

The binary is `$TRAINSTATE_BIN`, else `target/debug/trainstate` of this
repository (or of `$CARGO_TARGET_DIR`). Nothing is mocked: scripts run in
child processes that report to the real head over real sockets.
"""

import json
import os
import queue
import re
import signal
import ssl
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import pytest

import trainstate

ROOT = Path(__file__).resolve().parents[2]
LEASE = "2s"


def binary() -> Path:
    explicit = os.environ.get("TRAINSTATE_BIN")
    if explicit:
        return Path(explicit)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    return target / "debug" / "trainstate"


def wait_until(what: str, condition: Callable[[], Any], deadline: float = 30.0, every: float = 0.05) -> Any:
    """Polls ``condition`` until it returns something truthy, or fails after ``deadline`` seconds."""
    until = time.monotonic() + deadline
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > until:
            raise AssertionError(f"timed out after {deadline} s waiting for {what}")
        time.sleep(every)


class Head:
    """A `trainstate serve` child process: in memory, or on the store in
    ``data_dir`` (which a later head may be started on again)."""

    def __init__(self, extra: List[str], ca_cert: Optional[str] = None, data_dir: Optional[Path] = None) -> None:
        self.context = ssl.create_default_context(cafile=ca_cert) if ca_cert else None
        path = binary()
        if not path.exists():
            raise RuntimeError(f"{path} is missing: build it with `cargo build -p trainstate-actor --bin trainstate`")
        self.process = subprocess.Popen(
            [str(path), "serve", *(["--data-dir", str(data_dir)] if data_dir else ["--in-memory"]), "--listen", "127.0.0.1:0", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": "warn"},
            text=True,
        )
        lines: "queue.Queue[str]" = queue.Queue()
        assert self.process.stdout is not None
        stdout = self.process.stdout
        threading.Thread(target=lambda: [lines.put(line) for line in stdout], daemon=True).start()
        try:
            first = lines.get(timeout=30)
        except queue.Empty:
            self.stop()
            raise RuntimeError("the head printed no `listening on` line within 30 s") from None
        assert first.startswith("listening on "), first
        self.url = first[len("listening on ") :].strip()

    def get(self, path: str) -> Dict[str, Any]:
        with urllib.request.urlopen(self.url + path, timeout=5, context=self.context) as response:
            return json.loads(response.read())

    def runs_named(self, name: str) -> List[Dict[str, Any]]:
        return [r for r in self.get("/api/train/runs?limit=1000&name=" + name)["train_runs"] if r["name"] == name]

    def run_named(self, name: str, status: Optional[str] = None, deadline: float = 30.0) -> Dict[str, Any]:
        """The one run named ``name``, once it exists (and has ``status``)."""

        def found() -> Optional[Dict[str, Any]]:
            runs = self.runs_named(name)
            assert len(runs) <= 1, f"more than one run named {name}: {runs}"
            if runs and (status is None or runs[0]["run_status"] == status):
                return runs[0]
            return None

        try:
            return wait_until(f"run {name} {status or ''}", found, deadline)
        except AssertionError as err:
            raise AssertionError(f"{err}; runs named so: {self.runs_named(name)}") from None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="session")
def head():
    started = Head(["--lease", LEASE])
    yield started
    started.stop()


_counter = iter(range(10**9))


@pytest.fixture
def name(request) -> str:
    """A run name of this test's own."""
    base = re.sub(r"[^A-Za-z0-9-]+", "-", request.node.name.replace("_", "-"))[:60]
    return "{}-{}-{}".format(base, os.getpid(), next(_counter))


def package_path() -> str:
    return str(Path(trainstate.__file__).resolve().parents[1])


def child_env(url: Optional[str], name: Optional[str] = None, **extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINSTATE_", "RANK", "WORLD_SIZE", "LOCAL_", "TORCHELASTIC", "SLURM_", "MASTER_", "GROUP_"))}
    env["PYTHONPATH"] = package_path() + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    if url is not None:
        env["TRAINSTATE_URL"] = url
    if name is not None:
        env["TRAINSTATE_RUN_NAME"] = name
    env.update(extra)
    return env


def script(tmp_path: Path, source: str, filename: str = "train.py") -> Path:
    path = tmp_path / filename
    path.write_text(textwrap.dedent(source))
    return path


def run_script(path: Path, env: Dict[str, str], timeout: float = 120, args: Optional[List[str]] = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(path), *(args or [])],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(path.parent),
    )


def health_of(head: Head, run_id: str, state: str, deadline: float) -> Dict[str, Any]:
    """The run once its ``health`` is ``state``. Fails (never skips) when
    the head serves no ``health`` at all: run health must be on the head's
    side for the tests that call this."""

    def reached() -> Optional[Dict[str, Any]]:
        run = head.get(f"/api/train/runs/{run_id}")
        health = run.get("health")
        return run if isinstance(health, dict) and health.get("state") == state else None

    try:
        return wait_until(f"run {run_id} {state}", reached, deadline)
    except AssertionError as err:
        run = head.get(f"/api/train/runs/{run_id}")
        if "health" not in run and "rank_progress" not in run:
            raise AssertionError(
                f"{err}: the head serves neither `health` nor `rank_progress` for the run; "
                f"is run health on the head's side (the binary at {binary()})?"
            ) from None
        raise AssertionError(f"{err}; health is {run.get('health')}, rank_progress {run.get('rank_progress')}") from None


class Events:
    """Every event of the head's live stream about the run named ``name``:
    ``(kind, run)`` pairs, in order."""

    def __init__(self, head: Head, name: str) -> None:
        self.name = name
        self.seen: List[Any] = []
        self.stream = urllib.request.urlopen(head.url + "/api/train/events", timeout=600, context=head.context)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        kind = ""
        data: List[str] = []
        try:
            for raw in self.stream:
                line = raw.decode("utf-8").rstrip("\n")
                if line.startswith("event:"):
                    kind = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
                elif not line and data:
                    self._take(kind, "\n".join(data))
                    kind, data = "", []
        except Exception:  # noqa: BLE001 - the stream was closed under the reader
            pass

    def _take(self, kind: str, text: str) -> None:
        try:
            event = json.loads(text)
        except ValueError:
            return
        run = event.get("run") if isinstance(event, dict) else None
        if isinstance(run, dict) and run.get("name") == self.name:
            self.seen.append((event.get("kind") or kind, run))

    def kinds(self) -> List[str]:
        return [kind for kind, _ in self.seen]

    def close(self) -> None:
        self.stream.close()
