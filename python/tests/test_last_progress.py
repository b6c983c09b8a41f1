"""The record at a run's edges, end to end from a real rank process: the
last progress a rank reports right before it exits reaches the head (its
ended run's ``rank_progress`` and its metric history), and a rank that
hangs, still heartbeating its latest progress, adds no history point.
Uses the ``head`` fixture (2 s lease: a heartbeat every 0.5 s)."""

import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from conftest import Head, child_env, script, wait_until

EXITS_AT_ONCE = """
    import os, sys, time
    import trainstate

    run = trainstate.init(timeout=2.0)
    for step in range(1, 60):
        trainstate.report({"loss": 1.0 / step}, step=step, total_steps=60, phase="train")
    print("reported", run.run_id, flush=True)
    until = time.monotonic() + 120
    while not os.path.exists("finish"):
        if time.monotonic() > until:
            sys.exit("finish never appeared")
        time.sleep(0.02)
    # The watcher has just sent step 59: step 60 is not due for a second.
    trainstate.report({"loss": 1.0 / 60}, step=60, phase="save")
"""

HANGS = """
    import os, sys, time
    import trainstate

    def wait_for(path):
        until = time.monotonic() + 120
        while not os.path.exists(path):
            if time.monotonic() > until:
                sys.exit(f"{path} never appeared")
            time.sleep(0.05)

    run = trainstate.init(timeout=2.0)
    trainstate.report({"loss": 1.0}, step=1)
    print("reported", run.run_id, flush=True)
    wait_for("at-5")
    trainstate.report({"loss": 0.2}, step=5, phase="train")
    wait_for("advance")
    trainstate.report({"loss": 0.1}, step=6)
"""


def loss_points(head: Head, run_id: str) -> List[Dict[str, Any]]:
    answer = head.get(f"/api/train/runs/{run_id}/metrics?name=loss")
    series = answer.get("series") or []
    return list(series[0]["points"]) if series else []


def test_a_rank_that_reports_its_last_step_and_exits_at_once_leaves_it_with_the_ended_run(head: Head, name: str, tmp_path: Path) -> None:
    path = script(tmp_path, EXITS_AT_ONCE)
    child = subprocess.Popen(
        [sys.executable, str(path)], env=child_env(head.url, name), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path)
    )
    try:
        assert child.stdout is not None
        first = child.stdout.readline()
        assert first.startswith("reported "), (first, child.stderr.read() if child.poll() is not None and child.stderr else "")
        run_id = first.split()[1]

        def rank0() -> Optional[Dict[str, Any]]:
            served = head.get(f"/api/train/runs/{run_id}").get("rank_progress") or [None]
            return served[0]

        wait_until("step 59 at the head", lambda: (rank0() or {}).get("step") == 59, deadline=15)
        (tmp_path / "finish").touch()
        assert child.wait(30) == 0, child.stderr.read() if child.stderr else ""
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    ended = head.run_named(name, "FINISHED")
    assert ended["id"] == run_id
    last = rank0()
    assert last is not None, ended
    assert (last["step"], last["total_steps"], last["phase"]) == (60, 60, "save"), last
    assert last["metrics"] == {"loss": 1.0 / 60}, last
    points = wait_until("step 60 in the loss history", lambda: [p for p in loss_points(head, run_id) if p["step"] == 60], deadline=10)
    assert points == [{"rank": 0, "step": 60, "value": 1.0 / 60}], points


def test_a_hang_with_heartbeats_adds_no_history_point(head: Head, name: str, tmp_path: Path) -> None:
    path = script(tmp_path, HANGS)
    child = subprocess.Popen(
        [sys.executable, str(path)], env=child_env(head.url, name), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path)
    )
    try:
        assert child.stdout is not None
        first = child.stdout.readline()
        assert first.startswith("reported "), (first, child.stderr.read() if child.poll() is not None and child.stderr else "")
        run_id = first.split()[1]
        (tmp_path / "at-5").touch()

        def heard_at_5() -> Optional[int]:
            run = head.get(f"/api/train/runs/{run_id}")
            progress = (run.get("rank_progress") or [None])[0]
            heard = (run.get("rank_last_heartbeat_ms") or [None])[0]
            return heard if progress is not None and progress.get("step") == 5 else None

        since = wait_until("rank 0 at step 5", heard_at_5, deadline=15)
        # The rank hangs at step 5; its watcher heartbeats every 0.5 s with
        # the same progress: wait for at least six of them.
        wait_until(
            "six heartbeats of the hung rank",
            lambda: (head.get(f"/api/train/runs/{run_id}").get("rank_last_heartbeat_ms") or [0])[0] >= since + 3_000,
            deadline=15,
        )
        (tmp_path / "advance").touch()
        assert child.wait(30) == 0, child.stderr.read() if child.stderr else ""
        points = wait_until("step 6 in the loss history", lambda: [p for p in loss_points(head, run_id) if p["step"] == 6] and loss_points(head, run_id), deadline=10)
        steps = [p["step"] for p in points]
        assert steps == [1, 5, 6], f"one point per step, none for the heartbeats of the hang: {points}"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
