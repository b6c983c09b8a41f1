"""Run health end to end, from one process: what ``trainstate.report()``
sends reaches the head's run document (``rank_progress``), and the head
calls a run that stops advancing STALLED, then PROGRESSING again when it
advances. Uses the ``head`` fixture (2 s lease, a sweep every 0.5 s) and a
stall window of 2 s asked for by ``init(stall_after=2)``.

These need run health on the head's side: without it they fail, saying so."""

import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Optional

from conftest import Head, child_env, health_of, script, wait_until

RANK = """
    import os, sys, time
    import trainstate

    def wait_for(path):
        until = time.monotonic() + 120
        while not os.path.exists(path):
            if time.monotonic() > until:
                sys.exit(f"{path} never appeared")
            time.sleep(0.05)

    run = trainstate.init(stall_after=2, timeout=1.0)
    for step in range(1, 6):
        trainstate.report({"loss": 1.0 / step, "lr": 0.1}, step=step, total_steps=100, phase="train")
    print("reported", run.run_id, flush=True)
    wait_for("advance")
    trainstate.report({"loss": 0.1}, step=6)
    wait_for("finish")
"""


def test_progress_reaches_the_head_and_a_quiet_run_is_stalled_until_it_advances(head: Head, name: str, tmp_path: Path) -> None:
    path = script(tmp_path, RANK)
    child = subprocess.Popen(
        [sys.executable, str(path)], env=child_env(head.url, name), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path)
    )
    try:
        assert child.stdout is not None
        first = child.stdout.readline()
        assert first.startswith("reported "), (first, child.stderr.read() if child.poll() is not None and child.stderr else "")
        run_id = first.split()[1]

        def progress_at(step: int) -> Optional[Dict[str, Any]]:
            served = head.get(f"/api/train/runs/{run_id}").get("rank_progress") or [None]
            return served[0] if served[0] is not None and served[0].get("step") == step else None

        try:
            rank0 = wait_until("rank 0's progress at step 5", lambda: progress_at(5), deadline=15)
        except AssertionError:
            health_of(head, run_id, "PROGRESSING", deadline=0)  # says whether the head serves health at all
            raise
        assert rank0["total_steps"] == 100 and rank0["phase"] == "train", rank0
        assert rank0["metrics"] == {"loss": 0.2, "lr": 0.1}, rank0
        assert isinstance(rank0["last_advance_ms"], int), rank0

        # No step for the 2 s window: stalled, with rank 0 named.
        stalled = health_of(head, run_id, "STALLED", deadline=15)
        health = stalled["health"]
        assert health["ranks"] == [0], health
        assert "Rank 0 last advanced" in health["detail"] and "step 5" in health["detail"], health
        assert str(rank0["last_advance_ms"]) not in health["detail"], "the detail is for a person: no raw milliseconds"
        assert stalled["run_status"] == "RUNNING"

        (tmp_path / "advance").touch()
        progressing = health_of(head, run_id, "PROGRESSING", deadline=15)
        wait_until("rank 0's progress at step 6", lambda: progress_at(6), deadline=10)
        states = [change["state"] for change in progressing["health_history"]]
        assert states[-2:] == ["STALLED", "PROGRESSING"], progressing["health_history"]

        (tmp_path / "finish").touch()
        assert child.wait(30) == 0, child.stderr.read() if child.stderr else ""
        head.run_named(name, "FINISHED")
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_progress_the_head_refuses_is_dropped_and_heartbeats_go_on(head: Head, name: str) -> None:
    import os
    import socket

    import trainstate
    from trainstate._watch import Watcher

    run = trainstate._make(head.url, None, name, None, None, 1.0, None, None, child_env(head.url, name))
    assert run._launch is not None
    launch = run._launch
    config = {
        "url": head.url, "token": None, "timeout": 2.0, "key": launch.key, "rank": launch.rank, "world_size": launch.world_size,
        "attempt": launch.attempt, "restarts_remaining": 0, "worker": run.worker, "name": name, "job_id": launch.job_id,
        "pid": os.getpid(), "start_ticks": None, "warn": False,
    }
    ours, theirs = socket.socketpair()
    watcher = Watcher(config, os.dup(theirs.fileno()))
    try:
        watcher.join()
        assert watcher.joined and watcher.run_id is not None

        def beat(progress: Dict[str, Any]) -> Dict[str, Any]:
            with watcher.lock:
                watcher.take_progress(progress)
            watcher.heartbeat()
            assert not watcher.heartbeats_stopped
            return head.get(f"/api/train/runs/{watcher.run_id}")

        served = beat({"step": 10, "metrics": {"loss": 1.0}})
        if "rank_progress" not in served:
            health_of(head, str(watcher.run_id), "PROGRESSING", deadline=0)  # fails, saying why
        assert served["rank_progress"][0]["step"] == 10, served["rank_progress"]
        assert not watcher.progress_warned

        # A step that goes back (409): dropped, said once, the heartbeat still lands.
        before = served["rank_last_heartbeat_ms"][0]
        served = beat({"step": 3})
        assert watcher.progress_warned and watcher.progress == {}
        assert served["rank_progress"][0]["step"] == 10
        assert served["rank_last_heartbeat_ms"][0] >= before

        # A metric the head finds invalid (422): dropped, and later progress goes through.
        served = beat({"metrics": {"bad name": 1.0}})
        assert "bad name" not in served["rank_progress"][0]["metrics"]
        served = beat({"step": 11, "metrics": {"loss": 0.5}})
        assert served["rank_progress"][0]["step"] == 11
        assert served["rank_progress"][0]["metrics"]["loss"] == 0.5
    finally:
        watcher.out.close()
        ours.close()
        theirs.close()
