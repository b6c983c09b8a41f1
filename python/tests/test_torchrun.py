"""End to end with a real torchrun (CPU torch, gloo) against a real head:
every rank joins, and the run ends as the job does. What each test asserts
is what a person reading the record would conclude.

Most tests use a head at its default lease (60 s), as people run it; the
`head` fixture's 2 s lease is for the tests that wait for a lease to run
out (they say so)."""

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

from conftest import Events, Head, child_env, health_of, script, wait_until

if importlib.util.find_spec("torch") is None:
    if os.environ.get("CI"):
        raise RuntimeError("torch is required on CI: .ci/run installs python3-torch")
    pytest.skip("torch is not installed (apt-get install --no-install-recommends python3-torch)", allow_module_level=True)

TRAIN = """
    import os, sys, time
    import trainstate
    if not os.environ.get("NO_TRAINSTATE"):
        run = trainstate.init()
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    if os.environ.get("MARK_DIR"):
        # Tells the test this rank's pid, and that it is about to meet its peers.
        with open(os.path.join(os.environ["MARK_DIR"], f"rank{rank}.tmp"), "w") as mark:
            mark.write(str(os.getpid()))
        os.rename(os.path.join(os.environ["MARK_DIR"], f"rank{rank}.tmp"), os.path.join(os.environ["MARK_DIR"], f"rank{rank}"))
    if str(rank) == os.environ.get("HOLD_RANK"):
        time.sleep(600)  # never meets its peers: killed while they wait in init_process_group
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(int(os.environ.get("STEPS", "5"))):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
        if step == 2 and str(rank) == os.environ.get("FAIL_RANK") and restart < int(os.environ.get("FAIL_UNTIL", "99")):
            raise ValueError(f"loss diverged on rank {rank}")
        time.sleep(float(os.environ.get("STEP_SECONDS", "0")))
        if step == 0 and os.environ.get("MARK_DIR"):
            open(os.path.join(os.environ["MARK_DIR"], f"step{rank}"), "w").close()  # its first step is done
    dist.barrier()
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()
"""


def torchrun(tmp_path, head, name, *args: str, standalone: bool = True, **env: str) -> Tuple[List[str], Dict[str, str]]:
    path = script(tmp_path, TRAIN)
    # --redirects 2 --tee 2: torch 1.13 on Python 3.11 crashes with the default (see TRAPS).
    command = [
        sys.executable, "-m", "torch.distributed.run", *(["--standalone"] if standalone else []), "--nproc_per_node", "2",
        "--redirects", "2", "--tee", "2", "--monitor_interval", "0.2", *args, str(path),
    ]
    return command, child_env(head.url if head is not None else None, name, OMP_NUM_THREADS="1", **env)


@pytest.fixture(scope="module")
def default_head():
    """A head at its default lease (60 s), as people run it."""
    started = Head([])
    yield started
    started.stop()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ranks_pids(mark_dir: Path, ranks=(0, 1), deadline: float = 120) -> Dict[int, int]:
    def ready() -> Optional[Dict[int, int]]:
        if all((mark_dir / f"rank{r}").exists() for r in ranks):
            return {r: int((mark_dir / f"rank{r}").read_text()) for r in ranks}
        return None

    return wait_until("every rank started", ready, deadline=deadline)


def test_two_ranks_make_one_finished_run_with_every_worker(head, name, tmp_path):
    command, env = torchrun(tmp_path, head, name)
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    run = head.run_named(name, "FINISHED")
    workers = run["workers"]
    assert [w["world_rank"] for w in workers] == [0, 1]
    assert [w["local_rank"] for w in workers] == [0, 1]
    assert len({w["pid"] for w in workers}) == 2
    assert len({w["node_id"] for w in workers}) == 1
    assert run["controller_actor_id"].startswith("rendezvous:torchrun:")
    assert [a["attempt_id"] for a in run["attempts"]] == ["0"]
    # Each worker was given its share of the node, not the whole node.
    node = len(os.sched_getaffinity(0))
    assert all(w["resources"]["CPU"] == max(node // 2, 1) for w in workers), workers


def test_an_exception_on_rank_1_errors_the_run_with_its_traceback(head, name, tmp_path):
    command, env = torchrun(tmp_path, head, name, FAIL_RANK="1")
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode != 0
    run = head.run_named(name, "ERRORED")
    cause = run["cause"]
    assert (cause["kind"], cause["failed_world_rank"], cause["how"]) == ("USER_ERROR", 1, "RAISED")
    assert run["status_detail"].startswith("Rank 1 worker raised an error.")
    assert "ValueError: loss diverged on rank 1" in run["status_detail"]
    assert "Traceback (most recent call last)" in run["status_detail"]


def test_two_plain_launches_in_a_row_are_two_finished_runs(default_head, name, tmp_path):
    # No --standalone and no --rdzv-id: torchrun says TORCHELASTIC_RUN_ID=none
    # to both launches, on the same master address and port.
    port = str(free_port())
    command, env = torchrun(tmp_path, default_head, name, "--master_port", port, standalone=False)
    for launch in range(2):
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
        assert result.returncode == 0, (launch, result.stderr[-3000:])
    runs = wait_until(
        "two finished runs",
        lambda: [r for r in default_head.runs_named(name) if r["run_status"] == "FINISHED"] if len(default_head.runs_named(name)) == 2 else None,
        deadline=30,
    )
    assert len(runs) == 2, default_head.runs_named(name)
    assert runs[0]["controller_actor_id"] != runs[1]["controller_actor_id"]
    assert all(len(r["workers"]) == 2 for r in runs)


def test_a_rank_killed_mid_training_is_named_as_the_cause(default_head, name, tmp_path):
    head = default_head
    command, env = torchrun(tmp_path, head, name, STEPS="100000", STEP_SECONDS="0.05", MARK_DIR=str(tmp_path))
    job = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        pids = ranks_pids(tmp_path)
        run = head.run_named(name, "RUNNING", deadline=120)
        assert {w["world_rank"]: w["pid"] for w in run["workers"]} == pids
        os.kill(pids[1], signal.SIGKILL)
        killed = time.monotonic()
        run = head.run_named(name, "ERRORED", deadline=30)
        assert time.monotonic() - killed < 30
        assert job.wait(60) != 0
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    cause = run["cause"]
    assert (cause["failed_world_rank"], cause["how"]) == (1, "KILLED"), run
    assert "killed by SIGKILL" in run["status_detail"], run["status_detail"]


def _held_in_init(command: List[str], env: Dict[str, str], mark_dir: Path) -> Tuple[int, float]:
    """Runs the job whose rank 1 never meets rank 0 (which goes on to wait
    for it in init_process_group), kills rank 1 with SIGKILL, and answers
    torchrun's exit status and how long it took to exit after."""
    mark_dir.mkdir()
    env = {**env, "MARK_DIR": str(mark_dir), "HOLD_RANK": "1"}
    job = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        pids = ranks_pids(mark_dir)
        os.kill(pids[1], signal.SIGKILL)
        killed = time.monotonic()
        status = job.wait(120)
        return status, time.monotonic() - killed
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


def test_a_rank_killed_while_its_peer_waits_in_init_is_named_and_torchrun_is_not_delayed(default_head, name, tmp_path):
    head = default_head
    command, env = torchrun(tmp_path, head, name)
    status, teardown = _held_in_init(command, env, tmp_path / "with")
    run = head.run_named(name, "ERRORED", deadline=30)
    cause = run["cause"]
    assert (cause["failed_world_rank"], cause["how"]) == (1, "KILLED"), run
    assert "killed by SIGKILL" in run["status_detail"], run["status_detail"]

    plain_command, plain_env = torchrun(tmp_path, None, None, NO_TRAINSTATE="1")
    plain_status, plain_teardown = _held_in_init(plain_command, plain_env, tmp_path / "without")
    assert status == plain_status, "torchrun exits as it does without trainstate"
    print(f"teardown {teardown:.2f} s with trainstate, {plain_teardown:.2f} s without; exit status {status}")
    assert teardown - plain_teardown < 5, (teardown, plain_teardown)


class Statuses:
    """Every status a run goes through, read from the head's live stream."""

    def __init__(self, head: Head, name: str) -> None:
        self.seen: List[str] = []
        self.name = name
        self.stream = urllib.request.urlopen(head.url + "/api/train/events", timeout=300)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        data: List[str] = []
        try:
            for raw in self.stream:
                line = raw.decode("utf-8").rstrip("\n")
                if line.startswith("data:"):
                    data.append(line[5:].strip())
                elif not line and data:
                    self._take("\n".join(data))
                    data = []
        except Exception:  # noqa: BLE001 - the stream was closed under the reader
            pass

    def _take(self, text: str) -> None:
        try:
            event = json.loads(text)
        except ValueError:
            return
        # A snapshot has train_runs; a change has the run as it now is.
        runs = event.get("train_runs") or ([event["run"]] if isinstance(event.get("run"), dict) else [])
        for run in runs:
            if isinstance(run, dict) and run.get("name") == self.name:
                status = run.get("status") or run.get("run_status")  # V2's status: RESTARTING is live
                if status and (not self.seen or self.seen[-1] != status):
                    self.seen.append(status)

    def close(self) -> None:
        self.stream.close()


def test_a_torchrun_restart_keeps_the_failure_that_caused_it(default_head, name, tmp_path):
    head = default_head
    statuses = Statuses(head, name)
    try:
        command, env = torchrun(tmp_path, head, name, "--max_restarts", "1", FAIL_RANK="1", FAIL_UNTIL="1")
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
        assert result.returncode == 0, result.stderr[-3000:]
        run = head.run_named(name, "FINISHED")
        wait_until("the stream to show the end", lambda: statuses.seen and statuses.seen[-1] == "FINISHED", deadline=10)
    finally:
        statuses.close()
    assert [a["attempt_id"] for a in run["attempts"]] == ["0", "1"]
    first, second = run["attempts"]
    assert first["status"] == "ERRORED", first
    assert first["cause"]["failed_world_rank"] == 1, first
    assert "ValueError: loss diverged on rank 1" in first["status_detail"]
    assert "Traceback (most recent call last)" in first["status_detail"]
    assert first["end_time_ms"] is not None and second["end_time_ms"] is not None
    assert [w["world_rank"] for w in first["workers"]] == [0, 1]
    assert {w["pid"] for w in first["workers"]}.isdisjoint(w["pid"] for w in run["workers"])
    assert "RESTARTING" in statuses.seen, statuses.seen
    assert statuses.seen.index("RESTARTING") < len(statuses.seen) - 1


def test_sigterm_to_torchrun_aborts_the_run_as_a_user_interrupt(default_head, name, tmp_path):
    head = default_head
    command, env = torchrun(tmp_path, head, name, STEPS="100000", STEP_SECONDS="0.05")
    job = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        run = head.run_named(name, "RUNNING", deadline=120)
        wait_until("both ranks heartbeating", lambda: all(head.get(f"/api/train/runs/{run['id']}").get("rank_last_heartbeat_ms") or [None]), deadline=30)
        job.send_signal(signal.SIGTERM)
        job.wait(60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    run = head.run_named(name, "ABORTED", deadline=30)
    assert run["cause"]["kind"] == "USER_INTERRUPT", run
    assert "SIGTERM" in run["status_detail"], run["status_detail"]


def test_a_job_killed_outright_is_aborted_after_its_lease(head, name, tmp_path):
    """The whole job, watchers included, killed at once: nobody reports,
    and the lease ends the run. With the `head` fixture's 2 s lease, not
    the default 60 s: the outcome is the same, a minute sooner."""
    command, env = torchrun(tmp_path, head, name, STEPS="100000", STEP_SECONDS="0.05")
    job = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        run = head.run_named(name, "RUNNING", deadline=120)
        assert len(run["workers"]) == 2
        wait_until("both ranks heartbeating", lambda: all(head.get(f"/api/train/runs/{run['id']}").get("rank_last_heartbeat_ms") or [None]), deadline=30)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    # The lease is 2 s and the sweep runs every 0.5 s.
    run = head.run_named(name, "ABORTED", deadline=30)
    assert run["cause"]["kind"] == "LOST_CONTROLLER", run
    assert "lease" in run["status_detail"], run["status_detail"]


HEALTH_TRAIN = """
    import os, time
    import trainstate
    trainstate.init(stall_after=10)
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 60
    for step in range(1, steps + 1):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
        if step == 10 and rank == 0:
            # A checkpoint longer than the stall window, announced: rank 1
            # waits for rank 0 in the next step's collective meanwhile.
            trainstate.report(step=step, total_steps=steps, phase="checkpoint", expect_next_within=30)
            time.sleep(15)
        if step == 50 and rank == 1:
            time.sleep(40)  # hangs inside step 50: rank 0 waits in step 51's collective
        trainstate.report({"loss": loss.item()}, step=step, total_steps=steps, phase="train")
        time.sleep(0.5)
    dist.barrier()
    dist.destroy_process_group()
"""


def test_a_hung_rank_stalls_the_run_and_an_announced_checkpoint_does_not(head, name, tmp_path):
    """Two ranks report every step; rank 0 checkpoints for 15 s having
    announced 30 s (no stall), then rank 1 hangs 40 s inside step 50: with a
    10 s stall window the run is STALLED within the window and a sweep (the
    `head` fixture sweeps every 0.5 s), naming rank 1, and PROGRESSING again
    once rank 1 wakes. The hang starts after the announced 30 s are over
    (the head keeps an announced wait to its end, advance or not), so only
    the window decides when it is seen. Needs run health on the head's side."""
    events = Events(head, name)
    path = script(tmp_path, HEALTH_TRAIN)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "--redirects", "2", "--tee", "2", "--monitor_interval", "0.2", str(path),
    ]
    errors = tmp_path / "torchrun.err"
    with open(errors, "w") as stderr:
        job = subprocess.Popen(command, env=child_env(head.url, name, OMP_NUM_THREADS="1"), stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    try:
        run_id = head.run_named(name, "RUNNING", deadline=120)["id"]

        def steps() -> List[Optional[int]]:
            served = head.get(f"/api/train/runs/{run_id}").get("rank_progress") or []
            return [p.get("step") if p else None for p in served]

        def health_state() -> Optional[str]:
            return (head.get(f"/api/train/runs/{run_id}").get("health") or {}).get("state")

        try:
            wait_until("rank 0 in its checkpoint", lambda: steps()[:1] == [10] and health_state() is not None, deadline=60, every=0.2)
        except AssertionError:
            health_of(head, run_id, "PROGRESSING", deadline=0)  # says whether the head serves health at all
            raise
        # The checkpoint takes 15 s, longer than the window, but was announced.
        wait_until("training after the checkpoint", lambda: min(s or 0 for s in steps()) > 10, deadline=30, every=0.2)
        run = head.get(f"/api/train/runs/{run_id}")
        assert "STALLED" not in [h["state"] for h in run.get("health_history", [])], run.get("health_history")

        # Rank 1 hangs inside step 50.
        wait_until("rank 0 at step 50", lambda: steps()[:1] == [50], deadline=60, every=0.1)
        stalled = health_of(head, run_id, "STALLED", deadline=10 + 0.5 + 5)
        now_ms = int(time.time() * 1000)
        last_advance_ms = max(p["last_advance_ms"] for p in stalled["rank_progress"])
        print(f"STALLED seen {(now_ms - last_advance_ms) / 1000:.2f} s after the last advance (window 10 s, sweep 0.5 s)")
        assert now_ms - last_advance_ms < 10_000 + 500 + 2_000
        health = stalled["health"]
        # Rank 1 is the one behind: its last step is 49, rank 0's 50 (rank 0
        # finished step 50's compute and waits for rank 1 in the next
        # all_reduce). When the ranks' steps differ the head names the ranks
        # at the lowest step, whichever report reached it first.
        served = stalled["rank_progress"]
        assert served[1]["step"] < served[0]["step"], served
        assert health["ranks"] == [1], health
        # The detail lists the ranks oldest advance first, so rank 1 opens
        # the sentence ("Rank 1 last advanced at") or follows rank 0.
        assert re.search(r"\b[Rr]ank 1 (last advanced )?at \S+ \(step 49\b", health["detail"]), health
        print(f"STALLED names ranks {health['ranks']}: {health['detail']}")
        wait_until(
            "a health_changed event to STALLED",
            lambda: any(kind == "health_changed" and (run.get("health") or {}).get("state") == "STALLED" for kind, run in events.seen),
            deadline=10,
        )

        progressing = health_of(head, run_id, "PROGRESSING", deadline=40 + 15)
        assert [h["state"] for h in progressing["health_history"]][-2:] == ["STALLED", "PROGRESSING"]
        assert job.wait(120) == 0, errors.read_text()[-3000:]
        head.run_named(name, "FINISHED")
    finally:
        events.close()
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()


STRAGGLER_TRAIN = """
    import os, time
    import trainstate
    trainstate.init()
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    compute = 0.05 * (rank + 1)  # rank 1's own work takes twice rank 0's
    until = time.monotonic() + 90
    step = 0
    while True:
        step += 1
        started = time.monotonic()
        time.sleep(compute)  # this step's work
        step_time = time.monotonic() - started
        # Lock-step: every rank waits here for the slowest, and learns
        # whether the test asked the job to stop.
        stop = torch.tensor([1.0 if os.path.exists(os.environ["STOP_FILE"]) or time.monotonic() > until else 0.0])
        dist.all_reduce(stop)
        trainstate.report(step=step, step_time=step_time, phase="train")
        if stop.item() > 0:
            break
    dist.barrier()
    dist.destroy_process_group()
"""


def test_a_rank_twice_as_slow_as_its_peer_is_named_a_straggler(head, name, tmp_path):
    """Two ranks in lock-step (an all_reduce every step): each step's wall
    time is the same on both, but rank 1's own work (a sleep) takes twice
    rank 0's, and each reports its own as `step_time`. The head names rank
    1, and only rank 1, a straggler, with about twice its peer's time, once
    it has been slow for 10 s (the `head` fixture sweeps every 0.5 s); then
    the job stops and exits 0."""
    path = script(tmp_path, STRAGGLER_TRAIN)
    stop = tmp_path / "stop"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "--redirects", "2", "--tee", "2", "--monitor_interval", "0.2", str(path),
    ]
    errors = tmp_path / "torchrun.err"
    env = child_env(head.url, name, OMP_NUM_THREADS="1", STOP_FILE=str(stop))
    with open(errors, "w") as stderr:
        job = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
    try:
        run_id = head.run_named(name, "RUNNING", deadline=120)["id"]
        wait_until(
            "both ranks' first steps",
            lambda: all(p and p.get("step") for p in head.get(f"/api/train/runs/{run_id}").get("rank_progress") or [None]),
            deadline=60,
        )
        first_steps = time.monotonic()

        def stragglers() -> Optional[Dict[str, Any]]:
            run = head.get(f"/api/train/runs/{run_id}")
            return run if (run.get("health") or {}).get("stragglers") else None

        try:
            run = wait_until("a straggler named", stragglers, deadline=40, every=0.2)
        except AssertionError:
            health_of(head, run_id, "PROGRESSING", deadline=0)  # says whether the head serves health at all
            raise
        print(f"straggler named {time.monotonic() - first_steps:.1f} s after both ranks' first steps: {run['health']['detail']}")
        health = run["health"]
        assert [s["rank"] for s in health["stragglers"]] == [1], health
        straggler = health["stragglers"][0]
        assert 1.6 <= straggler["ratio"] <= 2.5, straggler
        assert straggler["step_time_ms"] > straggler["peers_step_time_ms"] > 0, straggler
        assert health["state"] == "PROGRESSING" and health["ranks"] == [], health
        assert "Rank 1 is a straggler" in health["detail"], health
        steps = [p["step"] for p in run["rank_progress"]]
        assert max(steps) - min(steps) <= 2, f"lock-step: the ranks' steps agree ({steps})"

        stop.touch()
        assert job.wait(60) == 0, errors.read_text()[-3000:]
        finished = head.run_named(name, "FINISHED")
        assert [s["rank"] for s in finished["health"]["stragglers"]] == [1], "a run that ended keeps the health it had"
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
