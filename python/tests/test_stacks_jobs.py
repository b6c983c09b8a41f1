"""When a run hangs, end to end: real 4-rank torchrun jobs (gloo, CPU,
``--standalone``) whose rank 2 stops 30 steps in while its peers block in
``all_reduce``. The head (on a store of its own, with a webhook receiver
in this process) sees the run STALLED from its own stall window (the jobs
set no ``stall_after``), orders a capture, and each rank's watcher answers
with its rank's stacks; the capture names rank 2 and the function it is
stuck in. Under ``on_stall="abort"`` the head then ends rank 2 and torchrun
restarts the job.

These need the head's side of stack captures and torch (they skip without
torch, and fail on CI without it)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from conftest import Head, child_env, health_of, script, wait_until
from test_notify import Post, Receiver

DEADLINE = 150.0
"""The longest any wait here may take on a loaded 2-core machine: the
head's stall window for 0.2 s steps, plus a capture's 20 s deadline."""

JOB = """
    import ctypes, os, time
    import trainstate

    abort_after = os.environ.get("ABORT_AFTER")
    trainstate.init(on_stall=os.environ.get("ON_STALL", "detect"), abort_after=float(abort_after) if abort_after else None)
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    steps = int(os.environ.get("STEPS", "60"))

    def mark(what):
        with open(os.path.join(os.environ["MARK_DIR"], f"{what}-{attempt}"), "w") as out:
            out.write(str(os.getpid()))

    def rank_two_is_stuck():
        mark("stuck")
        time.sleep(600)

    def rank_two_holds_the_gil():
        mark("stuck")
        # PyDLL calls keep the GIL; a signal cuts sleep(3) short, so it sleeps again.
        while True:
            ctypes.PyDLL(None).sleep(600)

    for step in range(1, steps + 1):
        time.sleep(0.2)  # this step's work
        if step == 30 and rank == 2 and attempt == 0:
            {"sleep": rank_two_is_stuck, "gil": rank_two_holds_the_gil}[os.environ.get("HANG", "sleep")]()
        dist.all_reduce(torch.ones(1))  # rank 2's peers wait here for it
        trainstate.report(step=step, total_steps=steps, phase="train")
    dist.barrier()
    dist.destroy_process_group()
"""


def torchrun(path: Path, *args: str) -> List[str]:
    # --redirects 2 --tee 2: torch 1.13 on Python 3.11 crashes with the default (see TRAPS).
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
        "--redirects", "2", "--tee", "2", "--monitor_interval", "0.2", *args, str(path),
    ]


class Job:
    """One torchrun job of :data:`JOB`, in a session of its own."""

    def __init__(self, tmp_path: Path, head: Head, name: str, *args: str, **env: str) -> None:
        self.marks = tmp_path / f"marks-{name}"
        self.marks.mkdir()
        self.errors = tmp_path / f"{name}.err"
        path = script(tmp_path, JOB, filename="train.py")
        with open(self.errors, "w") as stderr:
            self.process = subprocess.Popen(
                torchrun(path, *args),
                env=child_env(head.url, name, OMP_NUM_THREADS="1", MARK_DIR=str(self.marks), **env),
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )

    def stuck(self) -> bool:
        return (self.marks / "stuck-0").exists()

    def teardown_seconds(self) -> float:
        """Sends SIGTERM to torchrun and answers how long it took to exit."""
        began = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(120)
        return time.monotonic() - began

    def stderr(self) -> str:
        return self.errors.read_text()[-3000:]

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    started = Receiver()
    yield started
    started.close()


@pytest.fixture
def job_head(tmp_path: Path, receiver: Receiver) -> Iterator[Head]:
    """A head at its default lease (60 s: a quarter-lease heartbeat is
    15 s, so a capture order reaches a stuck rank by the faster beats), on
    a store of its own, telling the receiver of stalls."""
    started = Head(
        ["--notify-webhook", f"{receiver.url}/hook#events=stalled", "--public-url", "http://trainstate.example:8266"],
        data_dir=tmp_path / "store",
    )
    yield started
    started.stop()


def peers_blocked(head: Head, run_id: str) -> bool:
    """True once ranks 0, 1 and 3 reported step 29: they wait in step
    30's all_reduce for rank 2."""
    served = head.get(f"/api/train/runs/{run_id}").get("rank_progress") or []
    return len(served) == 4 and all(served[r] and served[r].get("step") == 29 for r in (0, 1, 3))


def complete_capture(head: Head, run_id: str, deadline: float = DEADLINE) -> Dict[str, Any]:
    def complete() -> Optional[Dict[str, Any]]:
        try:
            captures = head.get(f"/api/train/runs/{run_id}/stacks").get("captures") or []
        except OSError:
            return None
        return captures[0] if captures and captures[0].get("state") == "COMPLETE" else None

    return dict(wait_until("a complete capture of the run's stacks", complete, deadline=deadline, every=0.5))


def test_a_hung_rank_is_named_with_the_function_it_is_stuck_in(job_head: Head, receiver: Receiver, name: str, tmp_path: Path) -> None:
    head = job_head
    # The same job with the capture turned off: how long torchrun takes to
    # end it, stuck the same way.
    plain = Job(tmp_path, head, name + "-plain", TRAINSTATE_STACKS="off")
    try:
        plain_run = head.run_named(name + "-plain", "RUNNING", deadline=DEADLINE)["id"]
        wait_until("the plain job stuck", lambda: plain.stuck() and peers_blocked(head, plain_run), deadline=DEADLINE, every=0.2)
        plain_teardown = plain.teardown_seconds()
    finally:
        plain.kill()

    job = Job(tmp_path, head, name)
    try:
        run_id = head.run_named(name, "RUNNING", deadline=DEADLINE)["id"]
        wait_until("rank 2 stuck", lambda: job.stuck() and peers_blocked(head, run_id), deadline=DEADLINE, every=0.2)
        stalled = health_of(head, run_id, "STALLED", deadline=DEADLINE)
        health = stalled["health"]
        last_advance_ms = max(p["last_advance_ms"] for p in stalled["rank_progress"])
        print(f"STALLED {(health['since_ms'] - last_advance_ms) / 1000:.1f} s after the last advance")
        assert health["since_ms"] - last_advance_ms <= 90_000, health

        capture = complete_capture(head, run_id)
        ranks = capture["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1, 2, 3], ranks
        assert all(r["answered"] and r["source"] == "faulthandler" for r in ranks), [(r["rank"], r.get("note")) for r in ranks]
        assert "in rank_two_is_stuck" in ranks[2]["stack"], ranks[2]["stack"]
        assert capture["groups"][0]["ranks"] == [0, 1, 3], capture["groups"]
        suspects = capture["suspects"]
        assert [s["rank"] for s in suspects] == [2], suspects
        assert suspects[0]["innermost"].startswith("rank_two_is_stuck"), suspects

        def told(posts: List[Post]) -> Optional[Dict[str, Any]]:
            for post in posts:
                body = post.body if isinstance(post.body, dict) else {}
                if body.get("run_id") == run_id and body.get("event") == "STALLED":
                    named = [s for s in body.get("suspects") or [] if s.get("rank") == 2]
                    if named and str(named[0].get("innermost", "")).startswith("rank_two_is_stuck"):
                        return body
            return None

        event = receiver.wait_for("a STALLED event naming rank 2 and its frame", told, deadline=60)
        print("STALLED event:", event)
        assert [s["rank"] for s in event["suspects"]] == [2], event
        assert event.get("stacks_url") == f"http://trainstate.example:8266/api/train/runs/{run_id}/stacks", event
        stalled_events = [p for p in receiver.posts if isinstance(p.body, dict) and p.body.get("run_id") == run_id and p.body.get("event") == "STALLED"]
        assert len(stalled_events) == 1, "one STALLED event, sent once its capture was complete"
        assert job.process.poll() is None, "the capture ended nothing"
        teardown = job.teardown_seconds()
    finally:
        job.kill()
    print(f"torchrun's teardown: {teardown:.2f} s with the capture armed, {plain_teardown:.2f} s without")
    assert teardown <= plain_teardown + 5.0, (teardown, plain_teardown)


def test_a_rank_holding_the_gil_in_c_gives_its_stack_or_is_listed_not_answering(job_head: Head, name: str, tmp_path: Path) -> None:
    head = job_head
    job = Job(tmp_path, head, name, HANG="gil")
    try:
        run_id = head.run_named(name, "RUNNING", deadline=DEADLINE)["id"]
        wait_until("rank 2 holding the GIL", lambda: job.stuck() and peers_blocked(head, run_id), deadline=DEADLINE, every=0.2)
        capture = complete_capture(head, run_id)
    finally:
        job.kill()
    rank = capture["ranks"][2]
    if rank["answered"]:
        assert "in rank_two_holds_the_gil" in rank["stack"], rank["stack"]
    else:
        assert rank.get("note"), rank
    assert 2 in [s["rank"] for s in capture["suspects"]], capture["suspects"]


def test_on_stall_abort_ends_the_hung_rank_and_torchrun_restarts_the_job(job_head: Head, name: str, tmp_path: Path) -> None:
    head = job_head
    job = Job(tmp_path, head, name, "--max_restarts", "1", ON_STALL="abort", ABORT_AFTER="1", STEPS="40")
    try:
        status = job.process.wait(DEADLINE + 60)
    finally:
        job.kill()
    assert status == 0, job.stderr()
    run = head.run_named(name, "FINISHED", deadline=30)
    assert [a["attempt_id"] for a in run["attempts"]] == ["0", "1"], run["attempts"]
    first = run["attempts"][0]
    assert first["cause"]["kind"] == "NO_PROGRESS", first
    assert first["cause"]["failed_world_rank"] == 2, first
    assert "killed by SIGTERM" not in first["status_detail"], first["status_detail"]
