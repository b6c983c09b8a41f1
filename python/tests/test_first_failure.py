"""The first failure is a death, not its echo: real torchrun jobs (gloo,
CPU) whose rank 1 dies while every core is busy, by `kill -9` and by the
kernel's out-of-memory killer, each named as the cause every time; a whole
job stopped by a signal names no rank; a whole job killed outright ends
when its ranks were last heard from.

A busy machine is what made the head blame the survivor: rank 0's
"Connection reset by peer" was raised and reported before rank 1's
watcher got a CPU to see the death. The tests make the machine busy
themselves (one CPU burner per core).

The torchrun tests need torch (they skip without it, and fail on CI). The
same rules are also tested with a job of plain Python ranks under a small
launcher of the test's own, which needs no torch: its ranks talk over a
TCP connection in lock-step, so a dead rank's peer raises "Connection reset
by peer" (or "closed by peer", "Broken pipe") as gloo's ranks do. The
out-of-memory kill is tested with torchrun only: it kills as `kill -9` does,
and ten more jobs would cost CI minutes for nothing new."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from conftest import ROOT, Head, child_env, script, wait_until

KILL_RUNS = 20
OOM_RUNS = 10


@pytest.fixture(scope="module")
def busy() -> Iterator[int]:
    """One CPU burner per core, for the whole module; killed at the end."""
    cores = os.cpu_count() or 1
    burners = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(cores)
    ]
    try:
        yield cores
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


@pytest.fixture(scope="module")
def lease_head() -> Iterator[Head]:
    """One head for the module's jobs, with a lease a busy machine keeps."""
    started = Head(["--lease", "10s"])
    yield started
    started.stop()


def run_by_id(head: Head, run_id: str) -> Dict[str, Any]:
    return head.get(f"/api/train/runs/{run_id}")


def steady(head: Head, name: str, deadline: float = 120) -> Dict[str, Any]:
    """The run once it is RUNNING and both ranks have heartbeated."""
    run = head.run_named(name, "RUNNING", deadline=deadline)
    wait_until(
        "both ranks heartbeating",
        lambda: all(run_by_id(head, run["id"]).get("rank_last_heartbeat_ms") or [None]),
        deadline=30,
    )
    return run


def stop(job: "subprocess.Popen[bytes]") -> None:
    if job.poll() is None:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()


def ended(head: Head, name: str) -> Dict[str, Any]:
    def done() -> Optional[Dict[str, Any]]:
        runs = head.runs_named(name)
        return runs[0] if runs and runs[0]["run_status"] not in ("RUNNING", "INITIALIZING") else None

    return wait_until(f"run {name} ended", done, deadline=60)


def torch_helpers() -> Any:
    """test_torchrun's helpers; importing it skips the test without torch
    (and fails on CI)."""
    import test_torchrun

    return test_torchrun


def test_rank_1_killed_with_sigkill_on_a_busy_machine_is_the_cause_every_time(busy, lease_head, tmp_path):
    tr = torch_helpers()
    ranks_pids, torchrun = tr.ranks_pids, tr.torchrun
    head = lease_head
    blamed: List[Tuple[int, str]] = []
    for attempt in range(KILL_RUNS):
        name = f"busy-kill-{os.getpid()}-{attempt}"
        marks = tmp_path / f"marks{attempt}"
        marks.mkdir()
        started = time.monotonic()
        command, env = torchrun(tmp_path, head, name, STEPS="100000", STEP_SECONDS="0.02", MARK_DIR=str(marks))
        job = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            pids = ranks_pids(marks)
            steady(head, name)
            at_steady = time.monotonic()
            os.kill(pids[1], signal.SIGKILL)
            run = ended(head, name)
            decided = time.monotonic()
            status = job.wait(60)
        finally:
            stop(job)
        cause = run.get("cause") or {}
        print(
            f"run {attempt + 1:2}/{KILL_RUNS}: steady after {at_steady - started:.1f} s, decided {decided - at_steady:.2f} s "
            f"after the kill, torchrun exit {status}; cause rank {cause.get('failed_world_rank')} {cause.get('how')} "
            f"{run['status_detail'].splitlines()[0][:100]!r}"
        )
        if (cause.get("failed_world_rank"), cause.get("how")) != (1, "KILLED"):
            blamed.append((attempt, run["status_detail"]))
    assert not blamed, f"{len(blamed)} of {KILL_RUNS} runs blamed another rank: {blamed}"


OOM_TRAIN = """
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
        if rank == 1 and os.path.exists(os.environ["OOM_FILE"]):
            # Moved into a memory cgroup with a limit: allocate (and touch)
            # until the kernel's out-of-memory killer ends this rank.
            hog.append(bytearray(b"\\x01") * (8 << 20))
        else:
            time.sleep(0.02)
"""


class MemoryCgroup:
    """A child memory cgroup of this process's own, v1 or v2, with a limit."""

    def __init__(self, path: Path, version: int, limit: int) -> None:
        self.path = path
        self.version = version
        path.mkdir()
        if version == 1:
            (path / "memory.limit_in_bytes").write_text(str(limit))
        else:
            (path / "memory.max").write_text(str(limit))
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def oom_kills(self) -> int:
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        for line in (self.path / name).read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
        return 0

    def remove(self) -> None:
        def removed() -> bool:
            try:
                self.path.rmdir()
            except FileNotFoundError:
                return True
            except OSError:
                return False
            return True

        wait_until(f"cgroup {self.path} removed", removed, deadline=30)


def memory_cgroup_parent() -> Tuple[Optional[Path], int, str]:
    """Where this process may make a child memory cgroup: (path, version),
    or (None, 0, why not)."""
    own = Path("/proc/self/cgroup").read_text().splitlines()
    v1 = [line.split(":", 2)[2] for line in own if line.split(":", 2)[1].split(",").count("memory")]
    if v1 and Path("/sys/fs/cgroup/memory").is_dir():
        path = Path("/sys/fs/cgroup/memory") / v1[0].lstrip("/")
        if os.access(path, os.W_OK) and (path / "memory.limit_in_bytes").exists():
            return path, 1, ""
        return None, 0, f"the memory cgroup v1 {path} is not writable"
    unified = [line.split(":", 2)[2] for line in own if line.startswith("0::")]
    root = Path("/sys/fs/cgroup")
    if unified and (root / "cgroup.controllers").exists():
        path = root / unified[0].lstrip("/")
        if "memory" not in (path / "cgroup.subtree_control").read_text().split():
            try:
                (path / "cgroup.subtree_control").write_text("+memory")
            except OSError as err:
                return None, 0, f"cannot enable the memory controller below {path} (cgroup v2): {err}"
        if os.access(path, os.W_OK):
            return path, 2, ""
        return None, 0, f"the cgroup v2 {path} is not writable"
    return None, 0, "no memory cgroup (v1 or v2) is mounted for this process"


def test_rank_1_killed_by_the_out_of_memory_killer_is_the_cause_every_time(busy, lease_head, tmp_path):
    parent, version, why = memory_cgroup_parent()
    if parent is None:
        if os.environ.get("CI") == "true":
            raise AssertionError(f"CI needs a writable memory cgroup: {why}")
        pytest.skip(why)
    tr = torch_helpers()
    ranks_pids, torchrun = tr.ranks_pids, tr.torchrun
    head = lease_head
    path = tmp_path / "oom_train.py"
    path.write_text(textwrap.dedent(OOM_TRAIN))
    blamed: List[Tuple[int, str]] = []
    for attempt in range(OOM_RUNS):
        name = f"busy-oom-{os.getpid()}-{attempt}"
        marks = tmp_path / f"oom{attempt}"
        marks.mkdir()
        oom_file = tmp_path / f"oom{attempt}.go"
        command, env = torchrun(tmp_path, head, name, MARK_DIR=str(marks), OOM_FILE=str(oom_file))
        command[-1] = str(path)
        cgroup = MemoryCgroup(parent / f"trainstate-oom-{os.getpid()}-{attempt}", version, 96 << 20)
        started = time.monotonic()
        job = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            pids = ranks_pids(marks)
            steady(head, name)  # rank 1's watcher has joined: it runs beside the rank
            at_steady = time.monotonic()
            cgroup.add(pids[1])
            oom_file.touch()
            run = ended(head, name)
            decided = time.monotonic()
            status = job.wait(60)
            kills = cgroup.oom_kills()
        finally:
            stop(job)
            cgroup.remove()
        cause = run.get("cause") or {}
        print(
            f"oom {attempt + 1:2}/{OOM_RUNS}: steady after {at_steady - started:.1f} s, decided {decided - at_steady:.2f} s "
            f"after the allocation began, oom kills {kills}, torchrun exit {status}; cause rank {cause.get('failed_world_rank')} "
            f"{cause.get('how')} {run['status_detail'].splitlines()[0][:100]!r}"
        )
        assert kills == 1, f"the kernel's out-of-memory killer ended rank 1 (run {attempt}): {kills} kills"
        if (cause.get("failed_world_rank"), cause.get("how")) != (1, "KILLED") or "SIGKILL" not in run["status_detail"]:
            blamed.append((attempt, run["status_detail"]))
    assert not blamed, f"{len(blamed)} of {OOM_RUNS} runs blamed another rank: {blamed}"


def test_a_whole_job_killed_outright_ends_when_its_ranks_were_last_heard_from(head, name, tmp_path):
    """kill -9 of the job's process group, watchers included: nobody
    reports; the `head` fixture's 2 s lease concludes it. The run ends at
    its ranks' last heartbeat, and says so without naming a controller."""
    torchrun = torch_helpers().torchrun
    command, env = torchrun(tmp_path, head, name, STEPS="100000", STEP_SECONDS="0.05")
    job = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        steady(head, name)
    finally:
        stop(job)
    killed_ms = int(time.time() * 1000)
    aborted = head.run_named(name, "ABORTED", deadline=30)
    served = run_by_id(head, aborted["id"])
    last_heard = max(t for t in served["rank_last_heartbeat_ms"] if t is not None)
    print(f"ended {served['end_time_ms'] - last_heard} ms after the last heartbeat; killed {killed_ms - last_heard} ms after it")
    assert served["cause"]["kind"] == "LOST_CONTROLLER", served
    assert abs(served["end_time_ms"] - last_heard) <= 5_000, (served["end_time_ms"], last_heard)
    assert served["end_time_ms"] <= killed_ms, "the run ended when its ranks were last heard from, not when the lease ran out"
    detail = served["status_detail"]
    assert detail.startswith("No rank of this run has been heard from since "), detail
    assert "controller" not in detail.lower(), detail
    # What the page shows for such a run: its own label, and a launch, not a controller.
    app = (ROOT / "trainstate-actor" / "web" / "app.js").read_text()
    assert re.search(r"RANK_CAUSES = \{ LOST_CONTROLLER: 'No rank heard from' \}", app), "the page's label of a rendezvous run's LOST_CONTROLLER"


def test_a_whole_job_stopped_by_sigterm_names_no_rank_and_keeps_torchruns_exit_status(lease_head, tmp_path):
    tr = torch_helpers()
    ranks_pids, torchrun = tr.ranks_pids, tr.torchrun
    head = lease_head
    name = f"sigterm-all-{os.getpid()}"

    def stopped(with_trainstate: bool) -> int:
        extra = {} if with_trainstate else {"NO_TRAINSTATE": "1"}
        marks = tmp_path / f"marks-{with_trainstate}"
        marks.mkdir()
        command, env = torchrun(tmp_path, head if with_trainstate else None, name if with_trainstate else None, STEPS="100000", STEP_SECONDS="0.05", MARK_DIR=str(marks), **extra)
        job = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            ranks_pids(marks)
            # Both ranks training: each marks its first step done.
            wait_until("both ranks' first step", lambda: all((marks / f"step{r}").exists() for r in (0, 1)), deadline=120)
            if with_trainstate:
                steady(head, name)
            # What Slurm or a person does: SIGTERM to every process of the job.
            os.killpg(job.pid, signal.SIGTERM)
            return job.wait(60)
        finally:
            stop(job)

    status = stopped(True)
    run = head.run_named(name, "ABORTED", deadline=30)
    cause = run["cause"]
    assert cause["kind"] == "USER_INTERRUPT", run
    assert cause.get("failed_world_rank") is None, run
    assert "All 2 ranks were stopped by a signal to the whole job" in run["status_detail"], run["status_detail"]
    assert "SIGTERM" in run["status_detail"], run["status_detail"]
    plain = stopped(False)
    print(f"torchrun exit status {status} with trainstate, {plain} without")
    assert status == plain, "torchrun exits as it does without trainstate"


# A job without torch: a launcher of two plain Python ranks in lock-step
# over TCP, which stops the survivors with SIGTERM when a rank fails, as
# torchrun does. With AS_TORCHRUN set it gives its ranks torchrun's
# variables, so each rank's watcher takes it for the ranks' launcher.
LAUNCHER = """
    import os, signal, subprocess, sys, time, uuid
    port = sys.argv[2]
    run_id = uuid.uuid4().hex
    ranks = []
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        if os.environ.get("AS_TORCHRUN"):
            env.update(TORCHELASTIC_RUN_ID=run_id, TORCHELASTIC_RESTART_COUNT="0", TORCHELASTIC_MAX_RESTARTS="0")
        ranks.append(subprocess.Popen([sys.executable, sys.argv[1]], env=env))
    stopping = False
    def stop(signum, frame):
        global stopping
        stopping = True
        for r in ranks:
            if r.poll() is None:
                r.send_signal(signum)
    signal.signal(signal.SIGTERM, stop)
    while any(r.poll() is None for r in ranks):
        if not stopping and any(r.poll() not in (None, 0) for r in ranks):
            stop(signal.SIGTERM, None)
        time.sleep(0.1)
    sys.exit(0 if all(r.returncode == 0 for r in ranks) else 1)
"""

RANK = """
    import os, socket, sys, time
    import trainstate
    trainstate.init()
    rank = int(os.environ["RANK"])
    port = int(os.environ["MASTER_PORT"])
    if rank == 0:
        server = socket.create_server(("127.0.0.1", port))
        peer, _ = server.accept()
    else:
        until = time.monotonic() + 60
        while True:
            try:
                peer = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                if time.monotonic() > until:
                    raise
                time.sleep(0.02)
    mark = os.path.join(os.environ["MARK_DIR"], f"rank{rank}")
    with open(mark + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(mark + ".tmp", mark)
    while True:
        # One step: both ranks exchange a block, as a collective does.
        peer.sendall(b"x" * 4096)
        got = 0
        while got < 4096:
            data = peer.recv(4096 - got)
            if not data:
                raise RuntimeError("Connection closed by peer")
            got += len(data)
        time.sleep(0.01)
"""


def plain_job(tmp_path: Path, head: Head, name: str, marks: Path, **extra: str) -> "subprocess.Popen[bytes]":
    """Starts the torch-free two-rank job; its ranks mark their pids in ``marks``."""
    launcher = script(tmp_path, LAUNCHER, "launcher.py")
    rank = script(tmp_path, RANK, "rank.py")
    with socket_port() as port:
        pass
    env = child_env(head.url, name, MARK_DIR=str(marks), **extra)
    return subprocess.Popen(
        [sys.executable, str(launcher), str(rank), str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


class socket_port:
    """A free loopback port (released on exit, for the job to take)."""

    def __enter__(self) -> int:
        import socket

        self.probe = socket.socket()
        self.probe.bind(("127.0.0.1", 0))
        port: int = self.probe.getsockname()[1]
        return port

    def __exit__(self, *exc: Any) -> None:
        self.probe.close()


def pids_of(marks: Path) -> Dict[int, int]:
    def ready() -> Optional[Dict[int, int]]:
        if all((marks / f"rank{r}").exists() for r in (0, 1)):
            return {r: int((marks / f"rank{r}").read_text()) for r in (0, 1)}
        return None

    return wait_until("both ranks in lock-step", ready, deadline=60)


def test_a_plain_rank_killed_on_a_busy_machine_is_the_cause_and_its_peers_reset_only_an_echo(busy, lease_head, tmp_path):
    head = lease_head
    blamed: List[Tuple[int, str]] = []
    echoed = 0
    for attempt in range(KILL_RUNS):
        name = f"plain-kill-{os.getpid()}-{attempt}"
        marks = tmp_path / f"marks{attempt}"
        marks.mkdir()
        started = time.monotonic()
        job = plain_job(tmp_path, head, name, marks)
        try:
            pids = pids_of(marks)
            steady(head, name)
            at_steady = time.monotonic()
            os.kill(pids[1], signal.SIGKILL)
            run = ended(head, name)
            decided = time.monotonic()
            status = job.wait(60)
        finally:
            stop(job)
        cause = run.get("cause") or {}
        detail = run["status_detail"]
        echoed += "(a peer was gone)" in detail
        print(
            f"run {attempt + 1:2}/{KILL_RUNS}: steady after {at_steady - started:.1f} s, decided {decided - at_steady:.2f} s "
            f"after the kill, launcher exit {status}; cause rank {cause.get('failed_world_rank')} {cause.get('how')}; "
            f"{' | '.join(line for line in detail.splitlines() if line.startswith('- rank'))}"
        )
        if (cause.get("failed_world_rank"), cause.get("how")) != (1, "KILLED"):
            blamed.append((attempt, detail))
    print(f"rank 0's echo was in {echoed} of {KILL_RUNS} runs' details")
    assert not blamed, f"{len(blamed)} of {KILL_RUNS} runs blamed another rank: {blamed}"


def test_a_plain_job_stopped_by_sigterm_names_no_rank(lease_head, tmp_path):
    head = lease_head
    name = f"plain-sigterm-{os.getpid()}"
    marks = tmp_path / "marks"
    marks.mkdir()
    job = plain_job(tmp_path, head, name, marks)
    try:
        pids_of(marks)
        steady(head, name)
        os.killpg(job.pid, signal.SIGTERM)
        job.wait(60)
    finally:
        stop(job)
    run = head.run_named(name, "ABORTED", deadline=30)
    cause = run["cause"]
    assert (cause["kind"], cause.get("failed_world_rank")) == ("USER_INTERRUPT", None), run
    detail = run["status_detail"]
    assert detail.startswith("All 2 ranks were stopped by a signal to the whole job"), detail
    assert detail.count("terminated by SIGTERM") == 2, detail


def test_a_plain_job_killed_outright_ends_when_its_ranks_were_last_heard_from(head, tmp_path):
    name = f"plain-killed-{os.getpid()}"
    marks = tmp_path / "marks"
    marks.mkdir()
    job = plain_job(tmp_path, head, name, marks)
    try:
        pids_of(marks)
        steady(head, name)
    finally:
        stop(job)  # kill -9 of the process group: launcher, ranks and watchers
    killed_ms = int(time.time() * 1000)
    aborted = head.run_named(name, "ABORTED", deadline=30)
    served = run_by_id(head, aborted["id"])
    last_heard = max(t for t in served["rank_last_heartbeat_ms"] if t is not None)
    print(f"ended {served['end_time_ms'] - last_heard} ms after the last heartbeat, concluded after the lease of 2 s")
    assert served["cause"]["kind"] == "LOST_CONTROLLER", served
    assert abs(served["end_time_ms"] - last_heard) <= 5_000, (served["end_time_ms"], last_heard)
    assert served["end_time_ms"] <= killed_ms, "ended when its ranks were last heard from, not when the lease ran out"
    assert served["status_detail"].startswith("No rank of this run has been heard from since "), served["status_detail"]
    assert "controller" not in served["status_detail"].lower(), served["status_detail"]


def test_a_rank_whose_launcher_died_first_says_so(lease_head, tmp_path):
    """The launcher (taken for torchrun's agent) is killed with SIGKILL; its
    ranks live on, re-parented. Then rank 1 is killed: its end, and the
    run's detail, say the launcher had exited before it."""
    head = lease_head
    name = f"plain-orphan-{os.getpid()}"
    marks = tmp_path / "marks"
    marks.mkdir()
    job = plain_job(tmp_path, head, name, marks, AS_TORCHRUN="1")
    try:
        pids = pids_of(marks)
        steady(head, name)
        os.kill(job.pid, signal.SIGKILL)
        job.wait(10)
        os.kill(pids[1], signal.SIGKILL)
        run = ended(head, name)
    finally:
        for pid in pids.values() if "pids" in locals() else ():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        stop(job)
    cause = run["cause"]
    assert (cause["failed_world_rank"], cause["how"]) == (1, "KILLED"), run
    assert f"the launcher (torchrun, pid {job.pid}) had exited before this rank" in run["status_detail"], run["status_detail"]
