"""Whose fault it was, end to end: real torchrun jobs (gloo, CPU) against a
real head, whose rank is ended by the machine or the scheduler.

- Out of memory: the whole job (torchrun's agent, both ranks and their
  watchers) runs in a memory cgroup of its own with a limit, as a Slurm job
  or a Kubernetes pod does; rank 1 allocates past it and the kernel's
  out-of-memory killer ends it. Ten jobs in a row, each must name rank 1
  (not rank 0, whose gloo raises "Connection closed by peer") and OOM.
- Slurm: Slurm does not run here. The jobs carry Slurm's environment
  (``SLURM_JOB_ID``, ``SLURM_JOB_END_TIME``) and the test sends SIGTERM to
  the job's process group as slurmd does when the time limit is reached,
  or well before it (a person's ``scancel``).

They need torch (skipped without it, failed on CI, as test_torchrun), and
the OOM test a writable memory cgroup (root): skipped locally without one,
failed on CI."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from conftest import Head, child_env, wait_until
from test_first_failure import MemoryCgroup, ended, memory_cgroup_parent, steady, stop

# The misnamed survivor was seen in 3 of 11 tries before the watcher read the
# kill's cause: five tries in each CI run keep that from returning unseen
# (twenty were run by hand, all right) at about half a minute.
OOM_RUNS = 5
OOM_LIMIT = 3 << 29  # 1.5 GiB: torchrun's agent and two idle ranks take about 0.8

TRAIN = """
    import os, time
    import trainstate
    trainstate.init()
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    with open(os.path.join(os.environ["MARK_DIR"], f"rank{rank}.tmp"), "w") as mark:
        mark.write(str(os.getpid()))
    os.rename(os.path.join(os.environ["MARK_DIR"], f"rank{rank}.tmp"), os.path.join(os.environ["MARK_DIR"], f"rank{rank}"))
    dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 1)
    hog = []
    while True:
        loss = model(torch.randn(8, 4)).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        if rank == 1 and os.environ.get("OOM_FILE") and os.path.exists(os.environ["OOM_FILE"]):
            # Allocate, and touch, until the kernel's out-of-memory killer
            # ends this rank.
            hog.append(bytearray(b"\\x01") * (16 << 20))
        else:
            time.sleep(0.02)
"""

# The launcher's first step: it moves itself into the job's memory cgroup,
# then becomes torchrun; everything torchrun starts is in the cgroup.
MOVE_AND_EXEC = "import os, sys; open(sys.argv[1], 'w').write(str(os.getpid())); os.execv(sys.argv[2], sys.argv[2:])"


@pytest.fixture(scope="module")
def job_head() -> Iterator[Head]:
    """One head for the module's jobs, with a lease a loaded machine keeps."""
    started = Head(["--lease", "10s"])
    yield started
    started.stop()


def torchrun(tmp_path: Path, head: Optional[Head], name: Optional[str], **env: str) -> Tuple[List[str], Dict[str, str]]:
    import test_torchrun  # skips without torch (fails on CI)

    path = tmp_path / "causes_train.py"
    path.write_text(textwrap.dedent(TRAIN))
    command, environ = test_torchrun.torchrun(tmp_path, head, name, **env)
    command[-1] = str(path)
    return command, environ


def ranks_pids(marks: Path) -> Dict[int, int]:
    import test_torchrun

    pids: Dict[int, int] = test_torchrun.ranks_pids(marks)
    return pids


def oom_job(tmp_path: Path, head: Optional[Head], name: Optional[str], cgroup: MemoryCgroup, attempt: str) -> Tuple[int, Optional[Dict[str, Any]], float]:
    """Runs one job in ``cgroup`` until rank 1 is killed for its memory:
    torchrun's exit status, the run (with a head), and how long after the
    allocation began the run was decided."""
    marks = tmp_path / f"oom-{attempt}"
    marks.mkdir()
    oom_file = tmp_path / f"oom-{attempt}.go"
    command, env = torchrun(tmp_path, head, name, MARK_DIR=str(marks), OOM_FILE=str(oom_file))
    job = subprocess.Popen(
        [sys.executable, "-c", MOVE_AND_EXEC, str(cgroup.path / "cgroup.procs"), *command],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        ranks_pids(marks)
        if head is not None:
            assert name is not None
            steady(head, name)  # both watchers joined, and heartbeat
        began = time.monotonic()
        oom_file.touch()
        run = ended(head, name) if head is not None and name is not None else None
        decided = time.monotonic() - began
        status = job.wait(120)
    finally:
        stop(job)
    return status, run, decided


def test_a_rank_killed_by_the_out_of_memory_killer_is_oom_of_the_machine_every_time(job_head, tmp_path):
    parent, version, why = memory_cgroup_parent()
    if parent is None:
        if os.environ.get("CI") == "true":
            raise AssertionError(f"CI needs a writable memory cgroup: {why}")
        pytest.skip(why)
    kernel_path = "/" + str(parent.relative_to("/sys/fs/cgroup/memory" if version == 1 else "/sys/fs/cgroup")).lstrip(".")
    # The same job without trainstate: torchrun's exit status to keep.
    cgroup = MemoryCgroup(parent / f"trainstate-oom-plain-{os.getpid()}", version, OOM_LIMIT)
    try:
        plain, _, _ = oom_job(tmp_path, None, None, cgroup, "plain")
        assert cgroup.oom_kills() == 1, "the kernel's out-of-memory killer ended rank 1 of the job without trainstate"
    finally:
        cgroup.remove()
    assert plain != 0, "torchrun fails when a rank is killed"
    wrong: List[Tuple[int, str]] = []
    for attempt in range(OOM_RUNS):
        name = f"oom-cause-{os.getpid()}-{attempt}"
        cgroup = MemoryCgroup(parent / f"trainstate-oom-{os.getpid()}-{attempt}", version, OOM_LIMIT)
        try:
            status, run, decided = oom_job(tmp_path, job_head, name, cgroup, str(attempt))
            kills = cgroup.oom_kills()
        finally:
            cgroup.remove()
        assert run is not None
        cause = run.get("cause") or {}
        detail = run["status_detail"]
        print(
            f"oom {attempt + 1:2}/{OOM_RUNS}: decided {decided:.2f} s after the allocation began, oom kills {kills}, "
            f"torchrun exit {status} ({plain} without trainstate); cause {cause.get('kind')} {cause.get('class')} "
            f"rank {cause.get('failed_world_rank')}: {detail.splitlines()[0][:160]!r}"
        )
        assert kills == 1, f"the out-of-memory killer ended one process (job {attempt}): {kills}"
        assert status == plain, f"torchrun exits as it does without trainstate (job {attempt})"
        expected = ("ERRORED", "OOM", "INFRASTRUCTURE", 1, "KILLED")
        got = (run["run_status"], cause.get("kind"), cause.get("class"), cause.get("failed_world_rank"), cause.get("how"))
        where = f"cgroup {kernel_path}/trainstate-oom-{os.getpid()}-{attempt}, limit 1.5 GiB"
        if got != expected or "killed by SIGKILL: the kernel's out-of-memory killer" not in detail or where not in detail:
            wrong.append((attempt, f"{got}: {detail}"))
    assert not wrong, f"{len(wrong)} of {OOM_RUNS} jobs were not rank 1's OOM: {wrong}"


def slurm_job(tmp_path: Path, head: Head, name: str, end_in_s: float, at_end: bool) -> Tuple[int, Dict[str, Any], float]:
    """A job that looks like a Slurm job's step (its environment) whose
    time runs out ``end_in_s`` after it starts; the test signals it as
    slurmd does: SIGTERM to every process of the job, at its end time
    (``at_end``; at once when that is past) or as soon as it trains. The run, torchrun's exit status,
    and when the signal was sent relative to the end time (seconds)."""
    marks = tmp_path / f"slurm-{name}"
    marks.mkdir()
    end_time = int(time.time() + end_in_s)
    command, env = torchrun(
        tmp_path, head, name, MARK_DIR=str(marks), SLURM_JOB_ID="4242", SLURM_JOB_END_TIME=str(end_time)
    )
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not (Path(p) / "scontrol").exists())
    job = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        ranks_pids(marks)
        steady(head, name)
        if at_end:
            wait_until("the job's end time", lambda: time.time() >= end_time, deadline=end_in_s + 5)
        signalled = time.time() - end_time
        os.killpg(job.pid, signal.SIGTERM)
        status = job.wait(60)
    finally:
        stop(job)
    return status, head.run_named(name, "ABORTED", deadline=30), signalled


def test_a_slurm_job_signalled_at_its_end_time_timed_out_and_before_it_was_interrupted(job_head, tmp_path):
    name = f"slurm-timeout-{os.getpid()}"
    status, run, signalled = slurm_job(tmp_path, job_head, name, end_in_s=20, at_end=True)
    cause = run["cause"]
    print(f"signalled {signalled:+.1f} s from the end time, torchrun exit {status}: {run['status_detail'][:400]!r}")
    assert (cause["kind"], cause["class"], cause.get("failed_world_rank")) == ("TIMEOUT", "INTERRUPTED", None), run
    assert run["status_detail"].count("reached its time limit (SLURM_JOB_END_TIME") == 2, run["status_detail"]

    name = f"slurm-cancelled-{os.getpid()}"
    status, run, signalled = slurm_job(tmp_path, job_head, name, end_in_s=3600, at_end=False)
    cause = run["cause"]
    print(f"signalled {signalled:+.1f} s from the end time, torchrun exit {status}: {run['status_detail'][:400]!r}")
    assert (cause["kind"], cause["class"], cause.get("failed_world_rank")) == ("USER_INTERRUPT", "INTERRUPTED", None), run
    assert "time limit" not in run["status_detail"], run["status_detail"]
