"""End to end with a real torchrun (CPU torch, gloo) against a real head:
every rank joins, and the run ends as the job does."""

import importlib.util
import os
import signal
import subprocess
import sys

import pytest

from conftest import Head, child_env, script, wait_until

if importlib.util.find_spec("torch") is None:
    if os.environ.get("CI"):
        raise RuntimeError("torch is required on CI: .ci/run installs python3-torch")
    pytest.skip("torch is not installed (apt-get install --no-install-recommends python3-torch)", allow_module_level=True)

TRAIN = """
    import os, sys, time
    import trainstate
    run = trainstate.init()
    import torch
    import torch.distributed as dist

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
    dist.barrier()
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()
"""


def torchrun(tmp_path, head, name, *args, **env):
    path = script(tmp_path, TRAIN)
    # --redirects 2 --tee 2: torch 1.13 on Python 3.11 crashes with the default (see TRAPS).
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "--redirects", "2", "--tee", "2", "--monitor_interval", "0.2", *args, str(path),
    ]
    return command, child_env(head.url, name, OMP_NUM_THREADS="1", **env)


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


def test_an_exception_on_rank_1_errors_the_run_with_its_traceback(head, name, tmp_path):
    command, env = torchrun(tmp_path, head, name, FAIL_RANK="1")
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode != 0
    run = head.run_named(name, "ERRORED")
    assert run["cause"] == {"kind": "USER_ERROR", "failed_world_rank": 1}
    assert run["status_detail"].startswith("Rank 1 worker raised an error.")
    assert "ValueError: loss diverged on rank 1" in run["status_detail"]
    assert "Traceback (most recent call last)" in run["status_detail"]


def test_a_job_killed_outright_is_aborted_after_its_lease(head, name, tmp_path):
    command, env = torchrun(tmp_path, head, name, STEPS="1000", STEP_SECONDS="0.05")
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
    assert run["cause"] == {"kind": "LOST_CONTROLLER"}
    assert "stopped heartbeating" in run["status_detail"]


@pytest.fixture(scope="module")
def patient_head():
    """A head whose lease outlasts torchrun's restart of the workers on a
    busy machine: between the failed attempt and the next one's join,
    nobody heartbeats."""
    started = Head(["--lease", "60s"])
    yield started
    started.stop()


def test_a_torchrun_restart_is_a_second_attempt_of_the_same_run(patient_head, name, tmp_path):
    head = patient_head
    command, env = torchrun(tmp_path, head, name, "--max_restarts", "1", FAIL_RANK="1", FAIL_UNTIL="1")
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    run = head.run_named(name, "FINISHED")
    assert [a["attempt_id"] for a in run["attempts"]] == ["0", "1"]
    first, second = run["attempts"]
    assert first["end_time_ms"] is not None and second["end_time_ms"] is not None
    assert [w["world_rank"] for w in first["workers"]] == [0, 1]
    assert {w["pid"] for w in first["workers"]}.isdisjoint(w["pid"] for w in run["workers"])
