"""What Linux's ``/proc`` says about a process: when it started, who its
parent is, and how a dead one ended.

Every reader takes the ``/proc`` root as a parameter, so tests can hand in
a fake tree, and returns ``None`` where the kernel does not say (another
system, a process already gone).
"""

import os
import signal
import struct
import time
from typing import List, Optional, Tuple

from .types import CauseKind, FailureMode, RunStatus

PROC = "/proc"

# Fields of /proc/<pid>/stat, numbered as proc(5) numbers them (1-based).
_STATE = 3
_PPID = 4
_STARTTIME = 22
_EXIT_CODE = 52

INTERRUPTS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""The signals that end a process because someone asked it to stop."""


def stat(pid: int, proc: str = PROC) -> Optional[List[str]]:
    """The fields of ``/proc/<pid>/stat``, numbered from 1 as in proc(5)
    (index 0 is unused); ``None`` when there is no such process. The
    command name (field 2) may hold spaces and parentheses, so the fields
    after it are read after the last ``)``."""
    try:
        with open(os.path.join(proc, str(pid), "stat"), "rb") as f:
            raw = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    close = raw.rfind(")")
    open_ = raw.find("(")
    if close < 0 or open_ < 0:
        return None
    return ["", raw[:open_].strip(), raw[open_ + 1 : close]] + raw[close + 1 :].split()


def _field(fields: Optional[List[str]], number: int) -> Optional[str]:
    if fields is None or len(fields) <= number:
        return None
    return fields[number]


def _int_field(fields: Optional[List[str]], number: int) -> Optional[int]:
    value = _field(fields, number)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def parent(pid: int, proc: str = PROC) -> Optional[int]:
    """The parent's pid of ``pid``."""
    return _int_field(stat(pid, proc), _PPID)


def start_ticks(pid: int, proc: str = PROC) -> Optional[int]:
    """When ``pid`` started, in clock ticks since boot (field 22): with the
    pid, it names one process for as long as the machine is up."""
    return _int_field(stat(pid, proc), _STARTTIME)


def boot_time_s(proc: str = PROC) -> Optional[int]:
    """When the machine booted (``btime`` of ``/proc/stat``), Unix seconds."""
    try:
        with open(os.path.join(proc, "stat"), encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("btime "):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _ticks_per_second() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK")) or 100
    except (ValueError, OSError, AttributeError):
        return 100


def start_ms(pid: int, proc: str = PROC) -> Optional[int]:
    """When ``pid`` started, Unix milliseconds (by this machine's clock)."""
    ticks = start_ticks(pid, proc)
    boot = boot_time_s(proc)
    if ticks is None or boot is None:
        return None
    return boot * 1000 + ticks * 1000 // _ticks_per_second()


def exit_code(pid: int, started: Optional[int], proc: str = PROC) -> Optional[int]:
    """How the dead process ``pid`` ended, in ``waitpid`` form, while it is
    a zombie (not reaped yet by its parent); ``None`` once it is reaped, or
    if ``pid`` is now another process (``started``, its start in ticks,
    tells them apart)."""
    fields = stat(pid, proc)
    if _field(fields, _STATE) != "Z":
        return None
    if started is not None and _int_field(fields, _STARTTIME) != started:
        return None
    return _int_field(fields, _EXIT_CODE)


# Linux 6.15+: PIDFD_GET_INFO answers, through a pidfd opened while the
# process lived, how it ended, even after its parent reaped it.
_PIDFD_GET_INFO = 0xC040FF0B  # _IOWR(0xFF, 11, struct pidfd_info), 64 bytes (version 0)
_PIDFD_INFO_EXIT = 1 << 3
_PIDFD_INFO_SIZE = 64
_PIDFD_EXIT_CODE_OFFSET = 60


def open_pidfd(pid: int) -> Optional[int]:
    """A pidfd of ``pid`` (Linux 5.3+), or ``None``."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def pidfd_exit_code(pidfd: Optional[int]) -> Optional[int]:
    """How the process of ``pidfd`` ended, in ``waitpid`` form, once it has
    been reaped (Linux 6.15+); ``None`` before, or where the kernel does
    not tell."""
    if pidfd is None:
        return None
    try:
        import fcntl

        buffer = bytearray(_PIDFD_INFO_SIZE)
        struct.pack_into("=Q", buffer, 0, _PIDFD_INFO_EXIT)
        fcntl.ioctl(pidfd, _PIDFD_GET_INFO, buffer, True)
    except (ImportError, OSError, ValueError):
        return None
    (mask,) = struct.unpack_from("=Q", buffer, 0)
    if not mask & _PIDFD_INFO_EXIT:
        return None
    (code,) = struct.unpack_from("=i", buffer, _PIDFD_EXIT_CODE_OFFSET)
    return int(code)


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal 42`` for a signal Python does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


Ending = Tuple[RunStatus, Optional[CauseKind], Optional[FailureMode], str]
"""A rank's end as the head takes it: status, cause, how, detail."""


def describe(code: Optional[int]) -> Ending:
    """The end of a rank that died without reporting, from its exit status
    in ``waitpid`` form (``None``: unknown)."""
    if code is None:
        return ("ERRORED", "SYSTEM_ERROR", "VANISHED", "")
    signum = code & 0x7F
    if signum == 0:
        status = (code >> 8) & 0xFF
        if status == 0:
            return ("FINISHED", None, None, "")
        return ("ERRORED", "USER_ERROR", "EXITED", f"exited with status {status}")
    if signum in INTERRUPTS:
        return ("ABORTED", "USER_INTERRUPT", "KILLED", f"terminated by {signal_name(signum)}")
    core = " (core dumped)" if code & 0x80 else ""
    return ("ERRORED", "SYSTEM_ERROR", "KILLED", f"killed by {signal_name(signum)}{core}")


def now_ms() -> int:
    """Now, Unix milliseconds."""
    return int(time.time() * 1000)


def run_delay_ns(proc: str = PROC) -> Optional[int]:
    """How long the calling thread has waited, runnable, for a CPU since it
    started, in nanoseconds (the second field of
    ``/proc/thread-self/schedstat``); ``None`` where the kernel does not
    keep it. The difference across a blocking call is how late the thread
    ran after the call could return."""
    try:
        fd = os.open(os.path.join(proc, "thread-self", "schedstat"), os.O_RDONLY)
        try:
            raw = os.read(fd, 128)
        finally:
            os.close(fd)
        return int(raw.split()[1])
    except (OSError, ValueError, IndexError):
        return None
