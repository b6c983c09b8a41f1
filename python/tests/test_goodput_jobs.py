"""What a run cost, end to end: a real 2-rank torchrun job (gloo, CPU,
``--standalone``, ``--max_restarts 1``) saves a checkpoint at step 10, trains
on, has rank 1 killed with SIGKILL, and resumes from the checkpoint. The
head counts the work between the checkpoint and the kill as progress lost:
about the steps since the checkpoint times the job's own step time, as the
job measured both.

Needs torch (skips without it, and fails on CI without it) and the head's
side of goodput."""

import importlib.util
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

import pytest

from conftest import Head, child_env, script, wait_until

if importlib.util.find_spec("torch") is None:
    if os.environ.get("CI"):
        raise RuntimeError("torch is required on CI: .ci/run installs python3-torch")
    pytest.skip("torch is not installed (apt-get install --no-install-recommends python3-torch)", allow_module_level=True)

CHECKPOINT_STEP = 10
STEP_SECONDS = 0.25
STEPS_AFTER_CHECKPOINT = 100
"""Rank 1 is killed once rank 0 logged this many steps past the checkpoint:
25 s of work to lose, long against the second or two a report takes to
reach the head."""

JOB = """
    import os, time
    import trainstate

    trainstate.init()
    import torch
    import torch.distributed as dist

    mark = os.environ["MARK_DIR"]
    rank = int(os.environ["RANK"])
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    with open(os.path.join(mark, f"pid-{restart}-{rank}.tmp"), "w") as out:
        out.write(str(os.getpid()))
    os.rename(os.path.join(mark, f"pid-{restart}-{rank}.tmp"), os.path.join(mark, f"pid-{restart}-{rank}"))
    dist.init_process_group("gloo")

    checkpoint_step = int(os.environ["CHECKPOINT_STEP"])
    saved = os.path.join(mark, "checkpoint")
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 1
    if os.path.exists(saved):
        state = torch.load(saved)
        model.load_state_dict(state["model"])
        start = state["step"] + 1
    end = start + 40 if restart else 10**9
    log = open(os.path.join(mark, f"steps-{restart}-{rank}"), "a")
    for step in range(start, end):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        optimizer.step()
        time.sleep(float(os.environ["STEP_SECONDS"]))
        trainstate.report({"loss": float(loss)}, step=step)
        log.write(f"{step} {time.monotonic()}\\n")
        log.flush()
        if restart == 0 and step == checkpoint_step:
            if rank == 0:
                torch.save({"model": model.state_dict(), "step": step}, saved + ".tmp")
                os.rename(saved + ".tmp", saved)
            dist.barrier()
            trainstate.report(step=step, checkpoint=step)
    dist.barrier()
    dist.destroy_process_group()
"""


def logged_steps(path: Path) -> List[Tuple[int, float]]:
    """The (step, monotonic time) lines a rank logged, complete lines only."""
    if not path.exists():
        return []
    lines = path.read_text().split("\n")[:-1]
    return [(int(step), float(at)) for step, at in (line.split() for line in lines)]


def test_a_killed_and_resumed_job_counts_the_work_since_its_checkpoint_as_lost(tmp_path: Path) -> None:
    head = Head([])
    try:
        name = f"goodput-killed-and-resumed-{os.getpid()}"
        path = script(tmp_path, JOB)
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "--max_restarts", "1", "--redirects", "2", "--tee", "2", "--monitor_interval", "0.2", str(path),
        ]
        env = child_env(
            head.url, name, OMP_NUM_THREADS="1", MARK_DIR=str(tmp_path),
            CHECKPOINT_STEP=str(CHECKPOINT_STEP), STEP_SECONDS=str(STEP_SECONDS),
        )
        errors = tmp_path / "torchrun.err"
        with open(errors, "w") as stderr:
            job = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)
        try:
            first = tmp_path / "steps-0-0"
            wait_until(
                "rank 0 well past its checkpoint",
                lambda: any(step >= CHECKPOINT_STEP + STEPS_AFTER_CHECKPOINT for step, _ in logged_steps(first)),
                deadline=180, every=0.1,
            )
            pid = int((tmp_path / "pid-0-1").read_text())
            os.kill(pid, signal.SIGKILL)
            status = job.wait(timeout=240)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
        # Training itself is unchanged: the restart resumed and finished.
        assert status == 0, errors.read_text()[-3000:]

        run = head.run_named(name, "FINISHED", deadline=30)
        goodput = run["goodput"]
        print(f"goodput: {goodput}")

        # What the job measured: the steps rank 0 took after the checkpoint
        # before the kill ended its attempt, at its own median step time.
        steps: List[Tuple[int, float]] = logged_steps(first)
        times = [at for _, at in steps]
        step_time = statistics.median(b - a for a, b in zip(times, times[1:]))
        last_step = max(step for step, _ in steps)
        expected_lost_ms = (last_step - CHECKPOINT_STEP) * step_time * 1000
        lost_ms = goodput["badput"]["progress_lost_ms"]
        print(
            f"progress lost {lost_ms / 1000:.2f} s; expected ({last_step} - {CHECKPOINT_STEP}) steps"
            f" x {step_time:.3f} s = {expected_lost_ms / 1000:.2f} s"
        )
        assert abs(lost_ms - expected_lost_ms) <= 0.10 * expected_lost_ms, (lost_ms, expected_lost_ms)

        # The mark, the restart and the arithmetic the record keeps.
        assert goodput["checkpoint"]["step"] == CHECKPOINT_STEP, goodput
        assert goodput["restarts_since_checkpoint"] == 1 and goodput["restart_loop"] is False, goodput
        assert goodput["badput"]["restarting_ms"] > 0, goodput
        buckets: Dict[str, int] = goodput["badput"]
        assert goodput["wall_ms"] == goodput["productive_ms"] + sum(buckets.values()), goodput
        assert 0 < goodput["ratio"] < 1, goodput
        wall_ms = run["end_time_ms"] - run["start_time_ms"]
        assert abs(goodput["wall_ms"] - wall_ms) <= 0.02 * wall_ms, (goodput["wall_ms"], wall_ms)
    finally:
        head.stop()
