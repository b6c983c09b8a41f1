"""Notifications end to end: real torchrun jobs (CPU torch, gloo) report to
a real head on a store of its own, and the head tells a receiver in this
process, a small HTTP server that records every POST and answers from a
script of statuses. What each test asserts is what a person on call would
see: one message per event, however the head fared meanwhile.

Each head here keeps its store in ``tmp_path`` (notification positions are
durable, and ``--in-memory`` is refused with a target), so it can be killed
and started again on the same store."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

import pytest

from conftest import Head, binary, child_env, run_script, script, wait_until

if importlib.util.find_spec("torch") is None:
    if os.environ.get("CI"):
        raise RuntimeError("torch is required on CI: .ci/run installs python3-torch")
    pytest.skip("torch is not installed (apt-get install --no-install-recommends python3-torch)", allow_module_level=True)

PUBLIC_URL = "http://trainstate.test"

# Every wait is on a condition; these deadlines only bound a test that
# would otherwise hang, generous for a loaded 2-core machine.
DEADLINE = 120.0


class Post:
    """One request the receiver got, and the status it was answered."""

    def __init__(self, path: str, headers: Dict[str, str], body: Any, status: int) -> None:
        self.path = path
        self.headers = headers
        self.body = body
        self.status = status
        self.received_ms = int(time.time() * 1000)

    def __repr__(self) -> str:
        return f"Post({self.path} -> {self.status}: {json.dumps(self.body)[:300]})"


class Receiver:
    """An HTTP server on a loopback port, in a thread of its own: it records
    every POST (path, headers, JSON body) and answers the n-th with
    ``statuses[n]``, then ``then`` for ever. The first ``hold`` requests
    are recorded at once but answered only when :meth:`release` is called,
    so the test decides what the sender learns, and when."""

    def __init__(self, statuses: Sequence[int] = (), then: int = 200, hold: int = 0) -> None:
        self.posts: List[Post] = []
        self.changed = threading.Condition()
        self.released = threading.Event()
        statuses = list(statuses)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                with receiver.changed:
                    index = len(receiver.posts)
                    status = statuses[index] if index < len(statuses) else then
                    receiver.posts.append(Post(self.path, {k.lower(): v for k, v in self.headers.items()}, body, status))
                    receiver.changed.notify_all()
                if index < hold:
                    receiver.released.wait(DEADLINE)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                except OSError:
                    pass  # the sender is gone (killed while it waited)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:{}".format(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait_for(self, what: str, condition: Callable[[List[Post]], Any], deadline: float = DEADLINE) -> Any:
        """Waits until ``condition`` holds of the POSTs received, and answers
        what it returned; fails after ``deadline`` seconds."""
        with self.changed:
            found: Any = None

            def holds() -> bool:
                nonlocal found
                found = condition(list(self.posts))
                return bool(found)

            if not self.changed.wait_for(holds, deadline):
                raise AssertionError(f"timed out after {deadline} s waiting for {what}; received {self.posts}")
            return found

    def received(self) -> List[Post]:
        with self.changed:
            return list(self.posts)

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver_factory() -> Iterator[Callable[..., Receiver]]:
    started: List[Receiver] = []

    def start(statuses: Sequence[int] = (), then: int = 200, hold: int = 0) -> Receiver:
        receiver = Receiver(statuses, then, hold)
        started.append(receiver)
        return receiver

    yield start
    for receiver in started:
        receiver.close()


def torchrun(path: Path) -> List[str]:
    # --redirects 2 --tee 2: torch 1.13 on Python 3.11 crashes with the default (see TRAPS).
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "--redirects", "2", "--tee", "2", "--monitor_interval", "0.2", str(path),
    ]


def kill_group(job: "subprocess.Popen[bytes]") -> None:
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def ms_of(rfc3339: str) -> int:
    return round(datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp() * 1000)


ERRORING = """
    import os
    import trainstate
    trainstate.init()
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
        if step == 2 and rank == 1:
            raise ValueError(f"loss diverged on rank {rank}")
    dist.barrier()
    dist.destroy_process_group()
"""

RAISES = """
    import trainstate
    trainstate.init()
    raise ValueError("a later run errors too")
"""


def _timed_job(path: Path, env: Dict[str, str], errors: Path) -> "tuple[subprocess.Popen[bytes], float]":
    with open(errors, "w") as stderr:
        job = subprocess.Popen(torchrun(path), env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    return job, time.monotonic()


def test_an_errored_torchrun_job_is_told_once_across_a_kill_9_between_commit_and_delivery(
    head: Head, name: str, tmp_path: Path, receiver_factory: Callable[..., Receiver]
) -> None:
    """Rank 1 of a 2-rank job raises. The receiver holds the head's first
    POST of the ERRORED event while the head is killed with SIGKILL (the
    event committed, its delivery unknown to the head), then answers it
    500, and 500 again to the restarted head, then 200. The event arrives
    with one id throughout and is accepted once; a later run's event,
    sent after it, proves it was not sent again. The job exits as it does
    against a head that notifies nobody, in about the same time."""
    receiver = receiver_factory([500, 500], hold=1)
    store = tmp_path / "store"
    flags = ["--notify-webhook", f"{receiver.url}/hook#events=errored", "--public-url", PUBLIC_URL]
    path = script(tmp_path, ERRORING)
    notifying = Head(flags, data_dir=store)
    job, started = _timed_job(path, child_env(notifying.url, name, OMP_NUM_THREADS="1"), tmp_path / "torchrun.err")
    try:
        receiver.wait_for("the head's first POST", lambda posts: posts)
        notifying.process.kill()  # SIGKILL, while its POST waits for an answer
        notifying.process.wait()
        assert [p.status for p in receiver.received()] == [500], "nothing was accepted before the kill"
        receiver.release()
        status = job.wait(DEADLINE)
        took = time.monotonic() - started
    finally:
        kill_group(job)
        notifying.stop()

    notifying = Head(flags, data_dir=store)
    try:
        run = notifying.run_named(name, "ERRORED")
        run_id = run["id"]
        receiver.wait_for("a POST answered 200", lambda posts: [p for p in posts if p.status == 200])
        # A later run's event is sent after every earlier one the head has
        # to send: once it is here, a repeat of the first would be too.
        later = name + "-later"
        raised = run_script(script(tmp_path, RAISES, "later.py"), child_env(notifying.url, later))
        assert raised.returncode == 1, raised.stderr
        later_id = notifying.run_named(later, "ERRORED")["id"]
        receiver.wait_for("the later run's event", lambda posts: [p for p in posts if p.body.get("run_id") == later_id])
        # The restarted head's account of the target: one failed try (the
        # 500), both events delivered, nothing left and nothing dropped.
        target = wait_until(
            "the target's account of both deliveries",
            lambda: next((t for t in notifying.get("/api/notify")["targets"] if t["sent"] == 2 and t["pending"] == 0), None),
            deadline=DEADLINE,
        )
    finally:
        notifying.stop()

    posts = receiver.received()
    ours = [p for p in posts if p.body.get("run_id") == run_id]
    assert [p.status for p in ours] == [500, 500, 200], posts
    assert posts.index(ours[-1]) < len(posts) - 1, "the later run's event came after the accepted one"
    assert all(p.path == "/hook" for p in posts), posts
    assert {p.body["event_id"] for p in ours} == {f"{run_id}:ERRORED"}, ours
    assert {p.headers.get("idempotency-key") for p in ours} == {f"{run_id}:ERRORED"}, ours
    assert len({p.body["event_id"] for p in posts if p.status == 200}) == len([p for p in posts if p.status == 200]) == 2
    event = ours[-1].body
    assert (event["event"], event["status"], event["name"]) == ("ERRORED", "ERRORED", name), event
    assert (event["cause"]["kind"], event["cause"]["failed_world_rank"], event["cause"]["how"]) == ("USER_ERROR", 1, "RAISED"), event
    assert event["ranks"] == [1], event
    assert event["link"] == f"{PUBLIC_URL}/runs/{run_id}", event
    # The detail is the cause's first line and its last: rank 1's
    # exception, not what its peer said after it.
    assert event["detail"].startswith("Rank 1 worker raised an error."), event["detail"]
    assert event["detail"].endswith("ValueError: loss diverged on rank 1"), event["detail"]
    assert len(event["detail"]) <= 500, event["detail"]
    assert (target["kind"], target["sending"], target["failures"], target["dropped"]) == ("webhook", True, 1, 0), target
    assert target["events"] == ["ERRORED"] and "500" in (target["last_error"] or ""), target
    assert target["url"] == f"{receiver.url}/…", target

    # The same job against a head that notifies nobody: the same exit, and
    # about the same time (generously: two torchrun jobs on a busy machine).
    plain, plain_started = _timed_job(path, child_env(head.url, name + "-plain", OMP_NUM_THREADS="1"), tmp_path / "plain.err")
    try:
        plain_status = plain.wait(DEADLINE)
        plain_took = time.monotonic() - plain_started
    finally:
        kill_group(plain)
    print(f"the job took {took:.1f} s with the notifying head killed under it, {plain_took:.1f} s against a head that notifies nobody")
    assert status == plain_status == 1, (status, plain_status, (tmp_path / "torchrun.err").read_text()[-3000:])
    assert took < 2 * plain_took + 10, (took, plain_took)


HANGING = """
    import time
    import trainstate
    trainstate.init(stall_after=5)
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 20
    for step in range(1, steps + 1):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
        if step == 10 and rank == 1:
            time.sleep(15)  # hangs inside step 10: rank 0 waits in step 11's collective
        trainstate.report({"loss": loss.item()}, step=step, total_steps=steps, phase="train")
        time.sleep(0.2)
    dist.barrier()
    dist.destroy_process_group()
"""


def test_a_stalled_torchrun_job_fires_an_alertmanager_alert_and_resolves_it(
    name: str, tmp_path: Path, receiver_factory: Callable[..., Receiver]
) -> None:
    """Two ranks report every step with a 5 s stall window; rank 1 hangs
    15 s inside step 10, then the job finishes. The Alertmanager stub gets
    the run's stall alert, firing, while the run is STALLED (sent again
    every second), and the same alert resolved once it progresses again.
    The head's 2 s lease makes it sweep every 0.5 s."""
    receiver = receiver_factory()
    cluster = "notify-e2e"
    head = Head(
        ["--lease", "2s", "--cluster", cluster, "--public-url", PUBLIC_URL,
         "--notify-alertmanager", f"{receiver.url}#events=stalled&resend=1s"],
        data_dir=tmp_path / "store",
    )
    path = script(tmp_path, HANGING)
    job, _ = _timed_job(path, child_env(head.url, name, OMP_NUM_THREADS="1"), tmp_path / "torchrun.err")
    try:
        run_id = head.run_named(name, "RUNNING", deadline=DEADLINE)["id"]

        def alerts(posts: List[Post]) -> List[Dict[str, Any]]:
            """The run's alerts, each with when it was received."""
            return [
                {**alert, "received_ms": post.received_ms}
                for post in posts
                if isinstance(post.body, list)
                for alert in post.body
                if alert.get("labels", {}).get("run_id") == run_id
            ]

        def resolved(posts: List[Post]) -> bool:
            return any(ms_of(a["endsAt"]) <= a["received_ms"] for a in alerts(posts))

        receiver.wait_for("the run's stall alert, resolved", resolved)
        assert job.wait(DEADLINE) == 0, (tmp_path / "torchrun.err").read_text()[-3000:]
        run = head.run_named(name, "FINISHED")
    finally:
        kill_group(job)
        head.stop()

    posts = receiver.received()
    assert all(p.path == "/api/v2/alerts" for p in posts), posts
    sent = alerts(posts)
    history = run["health_history"]
    states = [h["state"] for h in history]
    assert states[-2:] == ["STALLED", "PROGRESSING"], history
    stalled_ms, recovered_ms = history[-2]["at_ms"], history[-1]["at_ms"]
    firing = [a for a in sent if ms_of(a["endsAt"]) > a["received_ms"]]
    ended = [a for a in sent if ms_of(a["endsAt"]) <= a["received_ms"]]
    print(f"{len(firing)} firing and {len(ended)} resolved alerts over a stall of {(recovered_ms - stalled_ms) / 1000:.1f} s")
    assert firing and ended, sent
    assert firing[0]["received_ms"] < recovered_ms, "an alert fired while the run was STALLED"
    assert sent.index(ended[0]) > sent.index(firing[-1]), "nothing fires after it was resolved"

    labels = firing[0]["labels"]
    assert (labels["alertname"], labels["severity"], labels["run_id"], labels["run_name"]) == (
        "TrainRunStalled", "warning", run_id, name
    ), labels
    # The cluster label is the run's cluster. A run a torchrun job registers
    # through the rendezvous is not stamped with the head's --cluster (yet):
    # the label follows the run document either way.
    assert labels.get("cluster") == run.get("cluster"), (labels, run.get("cluster"))
    assert labels["job_id"] == run["job_id"] and labels["job_id"], (labels, run["job_id"])
    assert labels["node"] == "127.0.0.1", labels
    assert all(a["labels"] == labels for a in sent), "every alert of the stall is the same alert"
    assert {ms_of(a["startsAt"]) for a in sent} == {stalled_ms}, (sent, history)
    assert firing[0]["generatorURL"] == f"{PUBLIC_URL}/runs/{run_id}", firing[0]
    assert ms_of(ended[0]["endsAt"]) >= recovered_ms, (ended[0], history)


RESUMING = """
    import os, time
    import trainstate
    trainstate.init(stall_after=2)
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 30
    for step in range(1, steps + 1):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
        if step == 10 and rank == 1:
            time.sleep(8)  # hangs inside step 10: rank 0 waits in step 11's collective
        trainstate.report({"loss": loss.item()}, step=step, total_steps=steps, phase="train")
        if step == 11:
            # The first advance after the stall, on this machine's clock.
            with open(os.path.join(os.environ["MARK_DIR"], f"resumed-{rank}"), "w") as out:
                out.write(str(round(time.time() * 1000)))
        time.sleep(0.2)
    dist.barrier()
    dist.destroy_process_group()
"""


def test_a_torchrun_job_that_stalls_resumes_and_finishes_within_one_sweep_ends_with_its_stall_resolved(
    name: str, tmp_path: Path, receiver_factory: Callable[..., Receiver]
) -> None:
    """Two ranks report every step with a 2 s stall window; rank 1 hangs
    8 s inside step 10, then the job runs 4 s more and finishes. The head's
    lease is the default 60 s, so its lease sweep comes every 15 s: the
    stall, its end and the run's end all fall within one sweep. The run
    ends FINISHED with the stall resolved (its history ends STALLED,
    PROGRESSING, the latter dated by the ranks' first advance), the
    webhook gets STALLED then RECOVERED then FINISHED, and `trainstate
    runs show` of the stalled run says how long it stood still, with no
    estimate of the time left."""
    receiver = receiver_factory()
    head = Head(["--notify-webhook", f"{receiver.url}/hook#events=stalled,finished"], data_dir=tmp_path / "store")
    path = script(tmp_path, RESUMING)
    job, _ = _timed_job(path, child_env(head.url, name, OMP_NUM_THREADS="1", MARK_DIR=str(tmp_path)), tmp_path / "torchrun.err")
    try:
        run_id = head.run_named(name, "RUNNING", deadline=DEADLINE)["id"]

        def stalled_run() -> Optional[Dict[str, Any]]:
            run = head.get(f"/api/train/runs/{run_id}")
            return run if (run.get("health") or {}).get("state") == "STALLED" else None

        stalled = wait_until("the run STALLED", stalled_run, deadline=DEADLINE, every=0.1)
        shown = subprocess.run(
            [str(binary()), "runs", "show", "--url", head.url, run_id], capture_output=True, text=True, timeout=30
        )
        assert job.wait(DEADLINE) == 0, (tmp_path / "torchrun.err").read_text()[-3000:]
        run = head.run_named(name, "FINISHED")
        receiver.wait_for("the run's FINISHED event", lambda posts: [p for p in posts if p.body.get("event") == "FINISHED"])
    finally:
        kill_group(job)
        head.stop()

    assert shown.returncode == 0, shown.stderr
    progress = [line for line in shown.stdout.splitlines() if line.startswith("progress")]
    assert progress and "stalled for" in progress[0] and "left" not in progress[0], shown.stdout
    assert stalled["health"]["last_advance_ms"] <= stalled["health"]["since_ms"], stalled["health"]

    history = run["health_history"]
    assert [h["state"] for h in history][-2:] == ["STALLED", "PROGRESSING"], history
    assert run["health"]["state"] == "PROGRESSING" and "ended_ms" not in run["health"], run["health"]
    resumed_ms = min(int((tmp_path / f"resumed-{rank}").read_text()) for rank in (0, 1))
    recovered_ms = history[-1]["at_ms"]
    print(f"the stall ended at the first advance + {(recovered_ms - resumed_ms) / 1000:.2f} s; the run ended {(run['end_time_ms'] - recovered_ms) / 1000:.1f} s later")
    assert abs(recovered_ms - resumed_ms) <= 2000, (recovered_ms, resumed_ms, history)
    assert run["end_time_ms"] - history[-2]["at_ms"] < 15_000, "the stall and the end fell within one sweep"

    ours = [p.body for p in receiver.received() if p.body.get("run_id") == run_id]
    assert [e["event"] for e in ours] == ["STALLED", "RECOVERED", "FINISHED"], ours
    recovered = ours[1]
    assert recovered["at_ms"] == recovered_ms, (recovered, history)
    # The stall's length runs from the last advance before it to the one that ended it.
    assert "without an advance" in recovered["detail"], recovered
