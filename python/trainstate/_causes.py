"""Whose fault a rank's death was: what the machine says beside the signal.

A rank killed by ``SIGKILL`` may have been ended by the kernel's
out-of-memory killer; one ended by ``SIGTERM`` under Slurm may have run out
of time, been preempted, or been cancelled by a person; a node whose GPU
faulted says so in its kernel log. The watcher reads these at two moments
only, at its own start (a baseline) and at the rank's death, each read
bounded in count, bytes and time, so nothing here slows a training rank:

- the rank's memory cgroup (``/proc/<pid>/cgroup``; cgroup v2's ``0::``
  line and ``memory.events``, or cgroup v1's ``memory`` line and
  ``memory.oom_control``), its own and its ancestors' ``oom_kill`` counters
  and memory limits;
- the kernel log (``/dev/kmsg``, where readable), opened at the start and
  read from there at the death: ``Killed process <pid>`` and ``NVRM: Xid``
  records;
- Slurm: ``scontrol show job -o <id>`` when ``scontrol`` is on the
  ``PATH``, else ``SLURM_JOB_END_TIME``.

Every reader takes its roots (``/proc``, ``/sys/fs/cgroup``, the kernel
log's path, the environment) as parameters, and returns ``None`` or nothing
where the machine does not say.
"""

import errno
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .types import CauseKind

PROC = "/proc"
CGROUP_ROOT = "/sys/fs/cgroup"
KMSG = "/dev/kmsg"

MAX_KMSG_RECORDS = 10_000
"""The most kernel log records read at a rank's death."""
MAX_KMSG_BYTES = 2 << 20
"""The most bytes of kernel log read at a rank's death (the kernel's ring
buffer is usually smaller: the read is bounded by it anyway)."""
MAX_CGROUP_DEPTH = 32
"""The most cgroups read, the rank's own and its ancestors."""
SCONTROL_TIMEOUT = 2.0
"""How long ``scontrol show job`` may take at a rank's death, in seconds."""
SLURM_END_MARGIN_S = 30
"""How long before ``SLURM_JOB_END_TIME`` a signal still counts as the
job's time running out, in seconds: Slurm's controller checks time limits
about every 30 s, and the variable is in whole seconds."""
_UNLIMITED = 1 << 60
"""cgroup v1 says "no limit" with a huge number (the largest page count)."""

APPLICATION_XIDS = frozenset({13, 31, 43, 45})
"""NVIDIA Xid errors the driver's documentation ascribes to the application
(13: graphics engine exception, 31: memory page fault, 43: GPU stopped
processing) or to a process ending (45: preemptive cleanup, logged whenever
a CUDA process is killed): they do not make a death the machine's fault."""


# The memory cgroup.


@dataclass(frozen=True)
class MemoryCgroup:
    """One memory cgroup: its path as the kernel names it (``/a/b``), and
    the files that hold its ``oom_kill`` counter and its limit."""

    path: str
    events: str
    limit: str
    version: int


def memory_cgroups(pid: int, proc: str = PROC, root: str = CGROUP_ROOT) -> List[MemoryCgroup]:
    """The memory cgroup of ``pid`` and its ancestors up to the mount's
    root, the process's own first; empty where none is mounted readably."""
    try:
        with open(os.path.join(proc, str(pid), "cgroup"), encoding="utf-8", errors="replace") as f:
            lines = f.read(65536).splitlines()
    except OSError:
        return []
    unified: Optional[str] = None
    v1: Optional[str] = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            unified = parts[2]
        elif "memory" in parts[1].split(","):
            v1 = parts[2]
    if v1 is not None:
        return _chain(os.path.join(root, "memory"), v1, "memory.oom_control", "memory.limit_in_bytes", 1)
    if unified is not None and os.path.exists(os.path.join(root, "cgroup.controllers")):
        return _chain(root, unified, "memory.events", "memory.max", 2)
    return []


def _chain(mount: str, path: str, events: str, limit: str, version: int) -> List[MemoryCgroup]:
    chain: List[MemoryCgroup] = []
    parts = [p for p in path.split("/") if p and p not in (".", "..")]
    while len(chain) < MAX_CGROUP_DEPTH:
        directory = os.path.join(mount, *parts)
        if os.path.exists(os.path.join(directory, events)):
            chain.append(
                MemoryCgroup(
                    "/" + "/".join(parts), os.path.join(directory, events), os.path.join(directory, limit), version
                )
            )
        if not parts:
            break
        parts.pop()
    return chain


def oom_kills(cgroup: MemoryCgroup) -> Optional[int]:
    """The cgroup's ``oom_kill`` counter: how many of its processes the
    out-of-memory killer has ended."""
    try:
        with open(cgroup.events, encoding="ascii", errors="replace") as f:
            for line in f.read(4096).splitlines():
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return None


def memory_limit(cgroup: MemoryCgroup) -> Optional[int]:
    """The cgroup's memory limit in bytes; ``None`` when it has none."""
    try:
        with open(cgroup.limit, encoding="ascii", errors="replace") as f:
            text = f.read(64).strip()
        value = int(text)
    except (OSError, ValueError):
        return None  # v2 says "max"
    return value if 0 < value < _UNLIMITED else None


def size_text(size: int) -> str:
    """``1.5 GiB``, ``96 MiB``: a memory limit as people write it."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift:
            return f"{size / (1 << shift):.1f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{size} B"


# The kernel log.


class KernelLog:
    """``/dev/kmsg`` from the moment it was opened: the records written
    after, read once, at the rank's death."""

    def __init__(self, path: str = KMSG) -> None:
        self.fd: Optional[int] = None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            return
        try:
            os.lseek(fd, 0, os.SEEK_END)
        except OSError:
            pass  # a plain file (a test's): read it from its start
        self.fd = fd

    @property
    def readable(self) -> bool:
        return self.fd is not None

    def new_messages(self, max_records: int = MAX_KMSG_RECORDS, max_bytes: int = MAX_KMSG_BYTES) -> List[str]:
        """The messages of the records written since the last read, oldest
        first, at most ``max_records`` of them and ``max_bytes`` in all."""
        fd = self.fd
        messages: List[str] = []
        if fd is None:
            return messages
        taken = 0
        while len(messages) < max_records and taken < max_bytes:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break
            except InterruptedError:
                continue
            except OSError as err:
                if err.errno == errno.EPIPE:
                    continue  # older records were overwritten: go on with the next
                break
            if not record:
                break
            taken += len(record)
            messages.extend(kmsg_messages(record))
        return messages[:max_records]

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


def kmsg_messages(raw: bytes) -> List[str]:
    """The messages of ``/dev/kmsg`` records (``prio,seq,usec,flags;text``,
    continuation lines beginning with a space dropped); a file of several
    records, one a line, gives each."""
    messages = []
    for line in raw.decode("utf-8", "replace").splitlines():
        if not line or line.startswith(" "):
            continue
        header, sep, text = line.partition(";")
        messages.append(text if sep and "," in header else line)
    return messages


_KILLED = re.compile(r"Killed process (\d+) \(")
_OOM_MEMCG = re.compile(r"oom-kill:.*?\boom_memcg=([^,\s]*).*?\bpid=(\d+)")
_XID = re.compile(r"NVRM: Xid \([^)]*\): (\d+)")


@dataclass(frozen=True)
class OomRecord:
    """What the kernel log says of an out-of-memory kill of one process."""

    line: str
    cgroup: Optional[str]
    """The cgroup whose limit was hit (``oom_memcg``); ``None`` when the
    machine itself was out of memory."""
    memcg: bool


def oom_kill_of(messages: Sequence[str], pid: int) -> Optional[OomRecord]:
    """The out-of-memory killer's record that it killed ``pid``, if any."""
    cgroup: Optional[str] = None
    for message in messages:
        memcg = _OOM_MEMCG.search(message)
        if memcg is not None and int(memcg.group(2)) == pid:
            cgroup = memcg.group(1) or None
        killed = _KILLED.search(message)
        if killed is not None and int(killed.group(1)) == pid:
            is_memcg = message.startswith("Memory cgroup out of memory") or cgroup not in (None, "/")
            return OomRecord(message.strip(), cgroup if is_memcg else None, is_memcg)
    return None


def hardware_xids(messages: Sequence[str]) -> List[str]:
    """The NVIDIA driver's Xid reports among ``messages`` that tell of a
    fault of the machine (not of :data:`APPLICATION_XIDS`)."""
    found = []
    for message in messages:
        match = _XID.search(message)
        if match is not None and int(match.group(1)) not in APPLICATION_XIDS:
            found.append(message.strip())
    return found


# Slurm.

SLURM_STATES: Dict[str, CauseKind] = {
    "TIMEOUT": "TIMEOUT",
    "DEADLINE": "TIMEOUT",
    "PREEMPTED": "PREEMPTED",
    "CANCELLED": "USER_INTERRUPT",
    "NODE_FAIL": "NODE_LOST",
    "BOOT_FAIL": "NODE_LOST",
    "OUT_OF_MEMORY": "OOM",
}
"""Slurm's job states that say why its tasks were signalled, and the cause
each is; the other states (RUNNING, COMPLETING, FAILED...) say nothing of it."""


def slurm_cause(state: str, reason: str = "") -> Optional[CauseKind]:
    """The cause Slurm's job state (``JobState=``, or ``sacct``'s
    ``CANCELLED by 1000``) and reason (``Reason=``) say a signalled task
    was ended for; ``None`` when they do not say. A job requeued by
    preemption says so in its reason."""
    words = state.strip().upper().split()
    word = words[0] if words else ""
    word = word.split("+")[0]
    if word in SLURM_STATES:
        return SLURM_STATES[word]
    if word in ("REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "PENDING") and "PREEMPT" in reason.upper():
        return "PREEMPTED"
    return None


def scontrol_job(job_id: str, timeout: float = SCONTROL_TIMEOUT) -> Optional[Tuple[str, str]]:
    """``JobState`` and ``Reason`` of Slurm job ``job_id`` from ``scontrol
    show job -o``, within ``timeout`` seconds; ``None`` without ``scontrol``
    or an answer."""
    scontrol = shutil.which("scontrol")
    if scontrol is None or not job_id:
        return None
    try:
        done = subprocess.run(
            [scontrol, "show", "job", "-o", job_id],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return scontrol_fields(done.stdout.decode("utf-8", "replace"))


def scontrol_fields(text: str) -> Optional[Tuple[str, str]]:
    """``JobState`` and ``Reason`` of a line of ``scontrol show job -o``."""
    state = re.search(r"(?:^|\s)JobState=(\S+)", text)
    if state is None:
        return None
    reason = re.search(r"(?:^|\s)Reason=(\S+)", text)
    return state.group(1), reason.group(1) if reason else ""


Scontrol = Callable[[str], Optional[Tuple[str, str]]]


def slurm_end(env: Mapping[str, str], signalled_at_s: float, scontrol: Scontrol = scontrol_job) -> Optional[Tuple[CauseKind, str]]:
    """Why Slurm signalled this task, and the words that say so: from
    ``scontrol`` first, else ``SLURM_JOB_END_TIME`` (a signal at most
    :data:`SLURM_END_MARGIN_S` before it, or after it, is the time limit);
    ``None`` outside Slurm or when neither tells."""
    job = env.get("SLURM_JOB_ID", "").strip()
    if not job:
        return None
    answer = scontrol(job)
    if answer is not None:
        kind = slurm_cause(*answer)
        if kind is not None:
            state, reason = answer
            because = f", reason {reason}" if reason and reason != "None" else ""
            return kind, f"Slurm job {job} is {state}{because}"
    end = env.get("SLURM_JOB_END_TIME", "").strip()
    if end.isdigit() and signalled_at_s >= int(end) - SLURM_END_MARGIN_S:
        return "TIMEOUT", f"Slurm job {job} reached its time limit (SLURM_JOB_END_TIME {end})"
    return None


# What a rank's watcher asks.


class Observer:
    """What the machine says of one rank: a baseline read at the watcher's
    start, and :meth:`judge` at the rank's end."""

    def __init__(
        self,
        pid: int,
        env: Mapping[str, str],
        *,
        proc: str = PROC,
        cgroup_root: str = CGROUP_ROOT,
        kmsg: str = KMSG,
        scontrol: Scontrol = scontrol_job,
    ) -> None:
        self.pid = pid
        self.env = env
        self.scontrol = scontrol
        self.cgroups = memory_cgroups(pid, proc, cgroup_root)
        self.baseline = {cgroup.path: oom_kills(cgroup) for cgroup in self.cgroups}
        self.log = KernelLog(kmsg)
        self.messages: Optional[List[str]] = None

    def new_messages(self) -> List[str]:
        """The kernel log's records since the start, read once."""
        if self.messages is None:
            self.messages = self.log.new_messages()
            self.log.close()
        return self.messages

    def out_of_memory(self) -> Optional[str]:
        """The words that say the kernel's out-of-memory killer ended the
        rank, when a counter of its cgroups rose or the kernel log names
        it; ``None`` else."""
        record = oom_kill_of(self.new_messages(), self.pid)
        risen = [c for c in self.cgroups if _rose(self.baseline.get(c.path), oom_kills(c))]
        if record is None and not risen:
            return None
        # The cgroup whose limit was hit: the kernel log names it; else the
        # smallest limit from the deepest cgroup whose counter rose upward.
        chain = self.cgroups[self.cgroups.index(risen[0]) :] if risen else self.cgroups
        named = record.cgroup if record is not None else None
        limits = [(memory_limit(c), c) for c in chain]
        bound = [(size, c) for size, c in limits if size is not None and (named is None or c.path == named)]
        if not bound and named is not None:
            # A cgroup below the rank's own (the rank was moved after the
            # watcher started): its limit, where the mount shows it.
            below = self.cgroup_named(named)
            size = memory_limit(below) if below is not None else None
            bound = [(size, below)] if size is not None and below is not None else []
        if not bound and named is not None:
            bound = [(size, c) for size, c in limits if size is not None]
        where = []
        if bound:
            size, cgroup = min(bound, key=lambda pair: pair[0])
            where = [f"cgroup {named or cgroup.path}", f"limit {size_text(size)}"]
        elif named is not None or risen:
            where = [f"cgroup {named or risen[0].path}"]
        elif record is not None and not record.memcg:
            where = ["the machine was out of memory"]
        return "the kernel's out-of-memory killer" + (f" ({', '.join(where)})" if where else "")

    def cgroup_named(self, path: str) -> Optional[MemoryCgroup]:
        """The memory cgroup at ``path`` of the mount the rank's own is on."""
        root = next((c for c in self.cgroups if c.path == "/"), None)
        if root is None or ".." in path.split("/"):
            return None
        mount = os.path.dirname(root.limit)
        parts = [p for p in path.split("/") if p]
        return MemoryCgroup(
            path,
            os.path.join(mount, *parts, os.path.basename(root.events)),
            os.path.join(mount, *parts, os.path.basename(root.limit)),
            root.version,
        )

    def judge(self, status: str, cause: Optional[str], how: Optional[str], detail: str, signum: Optional[int], at_ms: int) -> Tuple[Optional[str], str]:
        """The cause of a rank's end, and its detail, with what the machine
        says: a SIGKILL by the out-of-memory killer is ``OOM``; a signal
        Slurm sent is ``TIMEOUT``, ``PREEMPTED``, ``USER_INTERRUPT`` or
        ``NODE_LOST``; an error (not an interrupt) beside the GPU driver's
        fault report is ``HARDWARE``. Else ``cause`` and ``detail`` as they
        were."""
        if status == "FINISHED":
            return cause, detail
        if how == "KILLED" and signum == signal.SIGKILL:
            oom = self.out_of_memory()
            if oom is not None:
                return "OOM", f"{detail}: {oom}"
        slurm_signals = (signal.SIGTERM, signal.SIGKILL, signal.SIGINT)
        # A signal Slurm sends, or the rank's own report that it was
        # interrupted (a KeyboardInterrupt, a handler of SIGTERM).
        if (how == "KILLED" and signum in slurm_signals) or (status == "ABORTED" and signum is None):
            slurm = slurm_end(self.env, at_ms / 1000.0, self.scontrol)
            if slurm is not None:
                return slurm[0], f"{detail}: {slurm[1]}"
        xids = hardware_xids(self.new_messages()) if status == "ERRORED" else []
        if xids:
            return "HARDWARE", f"{detail}\nThe GPU driver reported a fault on this node: {xids[-1]}".lstrip("\n")
        return cause, detail


def _rose(before: Optional[int], after: Optional[int]) -> bool:
    return before is not None and after is not None and after > before
