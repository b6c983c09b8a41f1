"""What the machine says of a rank's death (trainstate._causes), read from
trees and logs laid out as the kernel and Slurm lay them out: memory
cgroups (v1 and v2), kernel log records, Slurm's job states. And the
head's warning about a rank's node, passed from the watcher to the rank.

The jobs that die for real (the out-of-memory killer, Slurm's signals)
are in test_causes_jobs.py."""

import json
import logging
import os
import signal
import socket
from pathlib import Path
from typing import Dict, Optional, Tuple

import pytest

from trainstate import _causes, _run, _watch

# Records as /dev/kmsg gives them (prio,seq,usec,flags;message), from a
# memory cgroup's out-of-memory kill and from the NVIDIA driver.
OOM_RECORDS = [
    "6,1201,88231234,-;python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
    "6,1202,88231240,-;memory: usage 1572864kB, limit 1572864kB, failcnt 412",
    "6,1203,88231301,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,"
    "oom_memcg=/slurm/uid_1000/job_4242,task_memcg=/slurm/uid_1000/job_4242/step_0,task=python3,pid=31337,uid=1000",
    "3,1204,88231310,-;Memory cgroup out of memory: Killed process 31337 (python3) total-vm:2871236kB, "
    "anon-rss:1324900kB, file-rss:102400kB, shmem-rss:0kB, UID:1000 pgtables:3120kB oom_score_adj:0",
]
GLOBAL_OOM = "3,88,1000,-;Out of memory: Killed process 4040 (python3) total-vm:9000000kB, anon-rss:8000000kB"
XID_79 = "4,2201,99000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=31337, name=python3, GPU has fallen off the bus."
XID_48 = "4,2202,99000100,-;NVRM: Xid (PCI:0000:86:00): 48, pid=31337, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 1, subpartition 0."
XID_13 = "4,2203,99000200,-;NVRM: Xid (PCI:0000:3b:00): 13, pid=31337, name=python3, Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Out Of Range Address"
XID_45 = "4,2204,99000300,-;NVRM: Xid (PCI:0000:3b:00): 45, pid=31337, name=python3, Ch 00000010"


def kmsg_file(tmp_path: Path) -> Path:
    path = tmp_path / "kmsg"
    path.write_text("3,1,100,-;an old record, before the watcher started\n")
    return path


def append(path: Path, *records: str) -> None:
    with path.open("a") as f:
        for record in records:
            f.write(record + "\n")


def test_the_kernel_log_is_read_from_where_the_watcher_started(tmp_path):
    path = kmsg_file(tmp_path)
    log = _causes.KernelLog(str(path))
    assert log.readable
    append(path, *OOM_RECORDS, XID_79)
    messages = log.new_messages()
    assert messages[0].startswith("python3 invoked oom-killer"), messages
    assert not any("an old record" in m for m in messages), "records before the start are skipped"
    assert len(messages) == 5
    assert log.new_messages(max_records=2) == [], "each record is read once"
    assert not _causes.KernelLog(str(tmp_path / "missing")).readable


def test_the_kernel_log_read_is_bounded_in_records(tmp_path):
    path = kmsg_file(tmp_path)
    log = _causes.KernelLog(str(path))
    append(path, *[f"6,{n},1,-;record {n}" for n in range(50)])
    assert len(log.new_messages(max_records=10)) == 10


def test_the_real_kernel_log_opens_at_its_end_without_blocking():
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    log = _causes.KernelLog()
    assert log.readable
    # Nothing waits: at most the few records written since it was opened.
    assert len(log.new_messages()) < 100
    log.close()


def test_an_out_of_memory_kill_of_the_rank_is_found_in_the_kernel_log():
    messages = _causes.kmsg_messages("\n".join(OOM_RECORDS).encode())
    record = _causes.oom_kill_of(messages, 31337)
    assert record is not None
    assert record.cgroup == "/slurm/uid_1000/job_4242"
    assert record.line.startswith("Memory cgroup out of memory: Killed process 31337 (python3)")
    assert _causes.oom_kill_of(messages, 3133) is None, "another pid is another process"
    machine = _causes.oom_kill_of(_causes.kmsg_messages(GLOBAL_OOM.encode()), 4040)
    assert machine is not None and (machine.cgroup, machine.memcg) == (None, False)


def test_the_gpu_drivers_fault_reports_are_hardware_and_an_applications_are_not():
    messages = _causes.kmsg_messages("\n".join([XID_13, XID_79, XID_45, XID_48, OOM_RECORDS[0]]).encode())
    assert _causes.hardware_xids(messages) == [
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=31337, name=python3, GPU has fallen off the bus.",
        XID_48.split(";", 1)[1],
    ]
    assert _causes.hardware_xids(_causes.kmsg_messages(XID_13.encode())) == []


@pytest.mark.parametrize(
    "state, reason, kind",
    [
        ("TIMEOUT", "TimeLimit", "TIMEOUT"),
        ("DEADLINE", "DeadLine", "TIMEOUT"),
        ("PREEMPTED", "None", "PREEMPTED"),
        ("CANCELLED", "None", "USER_INTERRUPT"),
        ("CANCELLED by 1000", "", "USER_INTERRUPT"),
        ("cancelled", "", "USER_INTERRUPT"),
        ("NODE_FAIL", "NodeDown", "NODE_LOST"),
        ("BOOT_FAIL", "", "NODE_LOST"),
        ("OUT_OF_MEMORY", "OutOfMemory", "OOM"),
        ("REQUEUED", "Preempted", "PREEMPTED"),
        ("PENDING", "BeginTime,Preempted", "PREEMPTED"),
        ("PENDING", "Priority", None),
        ("RUNNING", "None", None),
        ("COMPLETING", "None", None),
        ("COMPLETED", "None", None),
        ("FAILED", "NonZeroExitCode", None),
        ("SUSPENDED", "", None),
        ("", "", None),
    ],
)
def test_slurms_job_states_map_to_causes(state, reason, kind):
    assert _causes.slurm_cause(state, reason) == kind


def test_scontrols_one_line_answer_gives_the_state_and_the_reason():
    line = (
        "JobId=4242 JobName=train UserId=ada(1000) GroupId=ada(1000) MCS_label=N/A Priority=1 Nice=0 "
        "Account=ml QOS=normal JobState=TIMEOUT Reason=TimeLimit Dependency=(null) Requeue=1 Restarts=0 "
        "BatchFlag=1 Reboot=0 ExitCode=0:15 RunTime=01:00:04 TimeLimit=01:00:00"
    )
    assert _causes.scontrol_fields(line) == ("TIMEOUT", "TimeLimit")
    assert _causes.scontrol_fields("slurm_load_jobs error: Invalid job id specified") is None


def no_scontrol(job: str) -> Optional[Tuple[str, str]]:
    return None


def test_slurm_says_why_a_task_was_signalled_scontrol_first_then_the_end_time():
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_END_TIME": "1780000000"}
    end = 1_780_000_000
    margin = _causes.SLURM_END_MARGIN_S
    assert _causes.slurm_end(env, end + 40, no_scontrol) == (
        "TIMEOUT",
        "Slurm job 4242 reached its time limit (SLURM_JOB_END_TIME 1780000000)",
    )
    assert _causes.slurm_end(env, end - margin, no_scontrol) is not None, "within the margin before the end"
    assert _causes.slurm_end(env, end - margin - 1, no_scontrol) is None, "well before the end: not told"
    assert _causes.slurm_end({"SLURM_JOB_END_TIME": "1780000000"}, end, no_scontrol) is None, "not a Slurm job"
    assert _causes.slurm_end({"SLURM_JOB_ID": "4242"}, end, no_scontrol) is None
    preempted = _causes.slurm_end(env, end + 40, lambda job: ("PREEMPTED", "None"))
    assert preempted == ("PREEMPTED", "Slurm job 4242 is PREEMPTED"), "scontrol's word comes first"
    cancelled = _causes.slurm_end(env, end - 3600, lambda job: ("CANCELLED", "None"))
    assert cancelled == ("USER_INTERRUPT", "Slurm job 4242 is CANCELLED")
    # A state that says nothing of the signal: the end time tells.
    assert _causes.slurm_end(env, end + 1, lambda job: ("RUNNING", "None"))[0] == "TIMEOUT"


def fake_tree(tmp_path: Path, version: int, pid: int, path: str, limits: Dict[str, str]) -> Tuple[Path, Path]:
    """A /proc with ``pid``'s cgroup file, and a cgroup mount with ``path``
    and its ancestors, each with its counter at 0 and a limit."""
    proc = tmp_path / "proc"
    (proc / str(pid)).mkdir(parents=True)
    root = tmp_path / "cgroup"
    if version == 1:
        (proc / str(pid) / "cgroup").write_text(f"5:devices:/\n4:memory:{path}\n3:cpu,cpuacct:/\n0::/\n")
        mount = root / "memory"
    else:
        (proc / str(pid) / "cgroup").write_text(f"0::{path}\n")
        mount = root
        root.mkdir()
        (root / "cgroup.controllers").write_text("cpu memory pids\n")
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts) + 1):
        directory = mount.joinpath(*parts[:depth])
        directory.mkdir(parents=True, exist_ok=True)
        key = "/" + "/".join(parts[:depth])
        if version == 1:
            (directory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
            (directory / "memory.limit_in_bytes").write_text(limits.get(key, "9223372036854771712") + "\n")
        else:
            (directory / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 0\noom_kill 0\noom_group_kill 0\n")
            (directory / "memory.max").write_text(limits.get(key, "max") + "\n")
    return proc, root


def kill(root: Path, version: int, path: str) -> None:
    """The out-of-memory killer ended a process of ``path``: its counter
    (and, in v2, its ancestors') goes up."""
    mount = root / "memory" if version == 1 else root
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), -1 if version == 2 else len(parts) - 1, -1):
        directory = mount.joinpath(*parts[:depth])
        name = "memory.oom_control" if version == 1 else "memory.events"
        text = (directory / name).read_text()
        (directory / name).write_text(text.replace("oom_kill 0", "oom_kill 1"))


@pytest.mark.parametrize("version", [1, 2])
def test_a_sigkill_after_the_cgroups_oom_kill_counter_rose_is_oom_naming_the_limit(tmp_path, version):
    pid = 31337
    path = "/slurm/uid_1000/job_4242/step_0"
    proc, root = fake_tree(tmp_path, version, pid, path, {"/slurm/uid_1000/job_4242": str(3 << 29)})
    chain = _causes.memory_cgroups(pid, str(proc), str(root))
    assert [c.path for c in chain] == [path, "/slurm/uid_1000/job_4242", "/slurm/uid_1000", "/slurm", "/"]
    kmsg = kmsg_file(tmp_path)
    observer = _causes.Observer(pid, {}, proc=str(proc), cgroup_root=str(root), kmsg=str(kmsg), scontrol=no_scontrol)
    # A SIGKILL with no counter risen is what it was.
    assert observer.judge("ERRORED", "SYSTEM_ERROR", "KILLED", "killed by SIGKILL", signal.SIGKILL, 0) == (
        "SYSTEM_ERROR",
        "killed by SIGKILL",
    )
    kill(root, version, path)
    observer = _causes.Observer(pid, {}, proc=str(proc), cgroup_root=str(root), kmsg=str(kmsg), scontrol=no_scontrol)
    assert observer.judge("ERRORED", "SYSTEM_ERROR", "KILLED", "killed by SIGKILL", signal.SIGKILL, 0)[0] == "SYSTEM_ERROR", "the baseline counts"
    kill_again = (root / "memory" if version == 1 else root).joinpath(*path.strip("/").split("/"))
    name = "memory.oom_control" if version == 1 else "memory.events"
    (kill_again / name).write_text((kill_again / name).read_text().replace("oom_kill 1", "oom_kill 2"))
    assert observer.judge("ERRORED", "SYSTEM_ERROR", "KILLED", "killed by SIGKILL", signal.SIGKILL, 0) == (
        "OOM",
        "killed by SIGKILL: the kernel's out-of-memory killer (cgroup /slurm/uid_1000/job_4242, limit 1.5 GiB)",
    )
    # Only a SIGKILL is the out-of-memory killer's.
    assert observer.judge("ERRORED", "SYSTEM_ERROR", "KILLED", "killed by SIGSEGV", signal.SIGSEGV, 0)[0] == "SYSTEM_ERROR"


def test_the_kernel_logs_record_of_the_ranks_kill_is_oom_with_the_cgroup_it_names(tmp_path):
    pid = 31337
    proc, root = fake_tree(tmp_path, 1, pid, "/slurm/uid_1000/job_4242/step_0", {"/slurm/uid_1000/job_4242": str(96 << 20)})
    kmsg = kmsg_file(tmp_path)
    observer = _causes.Observer(pid, {}, proc=str(proc), cgroup_root=str(root), kmsg=str(kmsg), scontrol=no_scontrol)
    append(kmsg, *OOM_RECORDS)
    assert observer.judge("ERRORED", "SYSTEM_ERROR", "KILLED", "killed by SIGKILL", signal.SIGKILL, 0) == (
        "OOM",
        "killed by SIGKILL: the kernel's out-of-memory killer (cgroup /slurm/uid_1000/job_4242, limit 96 MiB)",
    )


def test_the_machine_out_of_memory_and_no_cgroup_at_all(tmp_path):
    kmsg = kmsg_file(tmp_path)
    observer = _causes.Observer(4040, {}, proc=str(tmp_path / "noproc"), cgroup_root=str(tmp_path), kmsg=str(kmsg), scontrol=no_scontrol)
    assert observer.cgroups == []
    append(kmsg, GLOBAL_OOM)
    assert observer.judge("ERRORED", "SYSTEM_ERROR", "KILLED", "killed by SIGKILL", signal.SIGKILL, 0) == (
        "OOM",
        "killed by SIGKILL: the kernel's out-of-memory killer (the machine was out of memory)",
    )


def test_an_error_beside_a_gpu_fault_is_hardware_and_an_interrupt_is_not(tmp_path):
    kmsg = kmsg_file(tmp_path)
    observer = _causes.Observer(31337, {}, proc=str(tmp_path), cgroup_root=str(tmp_path), kmsg=str(kmsg), scontrol=no_scontrol)
    append(kmsg, XID_45, XID_79)
    cause, detail = observer.judge("ERRORED", "USER_ERROR", "RAISED", "RuntimeError: CUDA error: unknown error", None, 0)
    assert cause == "HARDWARE"
    assert detail == (
        "RuntimeError: CUDA error: unknown error\nThe GPU driver reported a fault on this node: "
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=31337, name=python3, GPU has fallen off the bus."
    )
    assert observer.judge("ABORTED", "USER_INTERRUPT", "KILLED", "terminated by SIGTERM", signal.SIGTERM, 0)[0] == "USER_INTERRUPT"
    assert observer.judge("FINISHED", None, None, "", None, 0) == (None, "")


def test_under_slurm_a_sigterm_at_the_end_time_is_timeout_and_before_it_an_interrupt(tmp_path):
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_END_TIME": "1780000000"}
    observer = _causes.Observer(1, env, proc=str(tmp_path), cgroup_root=str(tmp_path), kmsg=str(tmp_path / "none"), scontrol=no_scontrol)
    assert observer.judge("ABORTED", "USER_INTERRUPT", "KILLED", "terminated by SIGTERM", signal.SIGTERM, 1_780_000_002_000) == (
        "TIMEOUT",
        "terminated by SIGTERM: Slurm job 77 reached its time limit (SLURM_JOB_END_TIME 1780000000)",
    )
    assert observer.judge("ABORTED", "USER_INTERRUPT", "KILLED", "terminated by SIGTERM", signal.SIGTERM, 1_779_990_000_000)[0] == "USER_INTERRUPT"
    # The rank's own report of an interrupt (it handled the signal) at the end time.
    assert observer.judge("ABORTED", "USER_INTERRUPT", None, "KeyboardInterrupt", None, 1_780_000_002_000)[0] == "TIMEOUT"
    # SIGKILL after Slurm's KillWait is the time limit too; SIGHUP is not Slurm's.
    assert observer.judge("ERRORED", "SYSTEM_ERROR", "KILLED", "killed by SIGKILL", signal.SIGKILL, 1_780_000_030_000)[0] == "TIMEOUT"
    assert observer.judge("ABORTED", "USER_INTERRUPT", "KILLED", "terminated by SIGHUP", signal.SIGHUP, 1_780_000_030_000)[0] == "USER_INTERRUPT"


@pytest.mark.parametrize("size, text", [(3 << 29, "1.5 GiB"), (1 << 30, "1 GiB"), (96 << 20, "96 MiB"), (1536, "1.5 KiB"), (10, "10 B")])
def test_limits_are_written_as_people_write_them(size, text):
    assert _causes.size_text(size) == text


def test_the_heads_warning_about_the_node_reaches_the_rank_and_is_logged_once(caplog):
    """The watcher takes a join answer's ``warning`` and passes it on; the
    rank logs it once on the "trainstate" logger, however often it comes."""
    ours, theirs = socket.socketpair()
    watcher = _watch.Watcher({"url": "http://127.0.0.1:9", "rank": 1, "pid": os.getpid()}, theirs.fileno())
    run = _run.Run(url=None, token=None, launch=None, worker=None, name="n", timeout=1.0, join_timeout=None)
    answer = {"run_id": "r1", "attempt_id": "0", "world_size": 2, "joined": 2, "ranks_ended": 0, "lease_ms": 60000}
    with caplog.at_level(logging.WARNING, logger="trainstate"):
        watcher.accept(dict(answer, warning=""))  # type: ignore[arg-type]
        watcher.accept(dict(answer, warning="node gpu-7 failed 3 of its last 5 runs (HARDWARE)"))  # type: ignore[arg-type]
        watcher.accept(dict(answer, warning="node gpu-7 failed 3 of its last 5 runs (HARDWARE)", lease_ms=30000))  # type: ignore[arg-type]
        lines = ours.recv(65536).decode().splitlines()
        for line in lines:
            run._take(line.encode())
    states = [json.loads(line) for line in lines]
    assert "warning" not in states[0], "an empty warning is none"
    assert states[-1]["warning"] == "node gpu-7 failed 3 of its last 5 runs (HARDWARE)"
    logged = [r for r in caplog.records if r.name == "trainstate"]
    assert [(r.levelno, r.getMessage()) for r in logged] == [
        (logging.WARNING, "trainstate: node gpu-7 failed 3 of its last 5 runs (HARDWARE)")
    ]
    ours.close()
    theirs.close()


def test_a_rank_moved_into_a_cgroup_below_its_own_is_told_by_the_kernel_log_with_that_limit(tmp_path):
    """The baseline was read in the rank's first cgroup; it was then moved
    into a child with a limit (v1 counts a kill in the child only): the
    kernel log names the child, whose limit is read where the mount has it."""
    pid = 4242
    proc, root = fake_tree(tmp_path, 1, pid, "/batch", {})
    moved = root / "memory" / "batch" / "moved"
    moved.mkdir()
    (moved / "memory.oom_control").write_text("oom_kill 1\n")
    (moved / "memory.limit_in_bytes").write_text(str(64 << 20))
    kmsg = kmsg_file(tmp_path)
    observer = _causes.Observer(pid, {}, proc=str(proc), cgroup_root=str(root), kmsg=str(kmsg), scontrol=no_scontrol)
    append(
        kmsg,
        "6,9,1,-;oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/batch/moved,task_memcg=/batch/moved,task=python3,pid=4242,uid=0",
        "3,10,2,-;Memory cgroup out of memory: Killed process 4242 (python3) total-vm:80000kB, anon-rss:65000kB",
    )
    assert observer.judge("ERRORED", "SYSTEM_ERROR", "KILLED", "killed by SIGKILL", signal.SIGKILL, 0) == (
        "OOM",
        "killed by SIGKILL: the kernel's out-of-memory killer (cgroup /batch/moved, limit 64 MiB)",
    )
