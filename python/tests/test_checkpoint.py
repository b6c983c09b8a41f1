"""A rank's checkpoint mark (``report(checkpoint=step)``: progress up to
``step`` is saved): the rules the rank checks before anything is sent, how
the mark rides on the hand-overs and the watcher's merging without ever
being lost, and the mark reaching a real head from a real rank process."""

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

import pytest

from conftest import Head, child_env, script, wait_until

from trainstate._progress import CheckpointError, Progress
from trainstate._run import Run
from trainstate._watch import Watcher


class Pipe:
    """The rank's end of a socket pair, which a :class:`Progress` writes
    through :meth:`Run._send`, and the watcher's end, read back as lines."""

    def __init__(self) -> None:
        self.rank, self.watcher = socket.socketpair()
        self.watcher.setblocking(False)
        self.run = Run(url=None, token=None, launch=None, worker=None, name="", timeout=1.0, join_timeout=None, reason="a test's pipe")
        self.run._socket = self.rank
        self.buffer = b""

    def lines(self) -> List[Dict[str, Any]]:
        import json

        while True:
            try:
                chunk = self.watcher.recv(1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                break
            self.buffer += chunk
        found = []
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            found.append(json.loads(line))
        return found

    def close(self) -> None:
        self.rank.close()
        self.watcher.close()


@pytest.fixture
def pipe() -> Iterator[Pipe]:
    opened = Pipe()
    yield opened
    opened.close()


def marks(lines: List[Dict[str, Any]]) -> List[Optional[int]]:
    return [line["progress"].get("checkpoint") for line in lines]


def test_a_mark_is_a_whole_number_and_the_error_names_checkpoint(pipe: Pipe) -> None:
    progress = Progress(pipe.run._send, 3600.0)
    progress.report(None, 10, None, None, None)
    for bad in [True, False, 2.0, "5", -1, 2**64]:
        with pytest.raises(ValueError, match="checkpoint"):
            progress.report(None, None, None, None, None, checkpoint=bad)  # type: ignore[arg-type]
    # The same rules hold on a run without a head, and before anything is taken.
    run = Run(url=None, token=None, launch=None, worker=None, name="", timeout=1.0, join_timeout=None, reason="no head")
    with pytest.raises(ValueError, match="checkpoint"):
        run.report(step=3, checkpoint=True)
    with pytest.raises(ValueError, match="checkpoint"):
        run.report(step=3, checkpoint=-4)
    run.report(step=3, checkpoint=3)  # valid: nothing to send it to, nothing raised


def test_a_mark_is_never_ahead_of_the_ranks_step_nor_below_its_previous_mark(pipe: Pipe) -> None:
    progress = Progress(pipe.run._send, 3600.0)
    with pytest.raises(CheckpointError, match="needs the rank's step"):
        progress.report(None, None, None, None, None, checkpoint=0)
    with pytest.raises(CheckpointError, match="ahead of the rank's step 10"):
        progress.report({"loss": 1.0}, 10, None, None, None, checkpoint=11)
    assert pipe.lines() == [], "a refused report is not taken: nothing of it is handed over"
    progress.report(None, 10, None, None, None, checkpoint=10)  # this call's step
    progress.report(None, None, None, None, None, checkpoint=10)  # the same mark again
    with pytest.raises(CheckpointError, match="ahead of the rank's step 10"):
        progress.report(None, None, None, None, None, checkpoint=12)  # the latest reported step
    with pytest.raises(CheckpointError, match="lower than the rank's previous mark 10"):
        progress.report(None, 20, None, None, None, checkpoint=9)
    with pytest.raises(CheckpointError, match="ahead of the rank's step 10"):
        progress.report(None, None, None, None, None, checkpoint=20)  # the refused report's step was not taken
    progress.report(None, 20, None, None, None)
    with pytest.raises(CheckpointError, match="ahead of the rank's step 20"):
        progress.report(None, 7, None, None, None, checkpoint=25)  # a step that goes back is no step of its own
    assert isinstance(CheckpointError("x"), ValueError)


def test_a_mark_rides_on_every_hand_over_until_a_higher_one(pipe: Pipe) -> None:
    progress = Progress(pipe.run._send, 3600.0)
    progress.report(None, 5, None, None, None, checkpoint=5)
    progress.report(None, 6, None, None, None)
    assert progress.flush()
    progress.report(None, 8, None, None, None, checkpoint=8)
    assert progress.flush()
    progress.report({"loss": 0.5}, 9, None, None, None)
    assert progress.flush()
    assert marks(pipe.lines()) == [5, 5, 8, 8], "a report without a mark keeps the latest one"


def test_the_watcher_keeps_the_higher_of_two_marks_and_a_mark_through_reports_without_one(pipe: Pipe) -> None:
    watcher = Watcher({"url": "http://127.0.0.1:9", "rank": 0, "pid": os.getpid(), "warn": False}, os.dup(pipe.watcher.fileno()))
    try:
        with watcher.lock:
            watcher.take_progress({"step": 40, "checkpoint": 40})
            watcher.take_progress({"step": 41, "metrics": {"loss": 1.0}})
        sent = watcher.take_progress_to_send()
        assert sent is not None and (sent["step"], sent.get("checkpoint")) == (41, 40), sent
        with watcher.lock:
            watcher.take_progress({"step": 50, "checkpoint": 50})
            watcher.take_progress({"step": 51, "checkpoint": 45})  # out of order: the higher stays
        sent = watcher.take_progress_to_send()
        assert sent is not None and (sent["step"], sent.get("checkpoint")) == (51, 50), sent
        again = watcher.take_progress_to_send()
        assert again is not None and again.get("checkpoint") == 50, "every heartbeat carries the mark"
    finally:
        watcher.out.close()


MARKS = """
    import os, sys, time
    import trainstate

    run = trainstate.init(timeout=2.0)
    for step in range(1, 41):
        trainstate.report({"loss": 1.0 / step}, step=step, total_steps=100)
    trainstate.report(step=40, phase="save", checkpoint=40)
    for step in range(41, 46):
        trainstate.report({"loss": 1.0 / step}, step=step)
    try:
        trainstate.report(step=46, checkpoint=47)
    except ValueError as err:
        print("refused", err, flush=True)
    print("reported", run.run_id, flush=True)
    until = time.monotonic() + 60
    while not os.path.exists("done"):
        if time.monotonic() > until:
            sys.exit("done never appeared")
        time.sleep(0.05)
"""


def test_a_mark_reaches_the_head_through_the_watcher(head: Head, name: str, tmp_path: Path) -> None:
    path = script(tmp_path, MARKS)
    child = subprocess.Popen(
        [sys.executable, str(path)], env=child_env(head.url, name), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path)
    )
    try:
        assert child.stdout is not None
        refused = child.stdout.readline()
        assert refused.startswith("refused checkpoint=47 is ahead of the rank's step 46"), (
            refused,
            child.stderr.read() if child.poll() is not None and child.stderr else "",
        )
        first = child.stdout.readline()
        assert first.startswith("reported "), first
        run_id = first.split()[1]

        def rank0() -> Dict[str, Any]:
            served = head.get(f"/api/train/runs/{run_id}").get("rank_progress") or [None]
            return served[0] or {}

        at_45 = wait_until("rank 0 at step 45 at the head", lambda: rank0() if rank0().get("step") == 45 else None, deadline=15)
        assert at_45.get("checkpoint") == 40, f"the mark rode on later heartbeats without one: {at_45}"
        (tmp_path / "done").touch()
        assert child.wait(30) == 0, child.stderr.read() if child.stderr else ""
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
