"""A rank's Python stacks, captured from outside the rank when the head asks.

Two sides, one job. In the rank, :func:`arm` (called by
:func:`trainstate.init`) registers Python's ``faulthandler`` on one
real-time signal, writing every thread's stack to a file of the rank's own
(``faulthandler.register(sig, file=fd, all_threads=True, chain=False)``).
Nothing else runs in the rank: no thread, no Python signal handler, no
timer. The handler is C code that runs without the GIL, so a rank blocked
in C while holding the GIL (a collective that never returns) still writes
its stacks.

In the watcher, :func:`capture` answers one capture order: it empties the
file, sends the signal to the rank, waits until the file is non-empty and
has stopped growing (or the order's time is up), and reads at most
:data:`MAX_STACK_BYTES`, cut at a line. When the rank wrote nothing it asks
``py-spy dump`` (when it is on ``PATH``), else it answers with no stack and
a note saying why. It never kills or stops the rank.

The signal is ``SIGRTMIN + 7`` (41 on Linux with glibc), chosen because
nothing a training job runs under uses it: torchrun's agent and
torchelastic send SIGTERM, SIGINT, SIGHUP and SIGQUIT (and SIGKILL); Slurm
sends SIGTERM, SIGKILL, SIGCONT and what ``--signal`` names (SIGUSR1 or
SIGUSR2 by custom); PyTorch Lightning's Slurm requeue listens on SIGUSR1 and
SIGTERM; glibc keeps the first two real-time signals for itself (Python's
``signal.SIGRTMIN`` already starts after them), and profilers use SIGPROF.
``init(stacks_signal=...)`` or ``TRAINSTATE_STACKS_SIGNAL`` chooses another;
``init(capture_stacks=False)`` or ``TRAINSTATE_STACKS=off`` turns the
capture off and leaves the signal alone. A signal that already has a
handler is never taken: one warning says so, and the capture goes on
without it (``py-spy``, else "no answer").
"""

import ctypes
import faulthandler
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Union

from .types import RankStackReport

logger = logging.getLogger("trainstate")

MAX_STACK_BYTES = 64 * 1024
"""The most bytes of one rank's stacks a capture sends: the head's
``MAX_STACK_BYTES``. A capture over it is cut at a line and marked
``truncated``."""

MAX_STACK_NOTE_LEN = 1024
"""The longest note of a rank's capture: the head's ``MAX_STACK_NOTE_LEN``."""

DEFAULT_STACKS_SIGNAL_OFFSET = 7
"""The default signal is ``SIGRTMIN`` plus this."""

SETTLE = 0.1
"""How long the stacks file must stay the same size to be complete, in seconds."""

_POLL = 0.01
"""How often the stacks file is looked at while the rank writes it, in seconds."""

_OFF_WORDS = ("off", "0", "false", "no", "none", "disabled")


def default_signal() -> int:
    """``SIGRTMIN + 7``: 41 on Linux with glibc."""
    return int(signal.SIGRTMIN) + DEFAULT_STACKS_SIGNAL_OFFSET


class Armed(NamedTuple):
    """What the rank armed, as the watcher needs it: the signal and the
    stacks file (both ``None`` when the capture is armed without a signal),
    the file's private directory, and why there is no signal, if there is
    none."""

    signal: Optional[int]
    path: Optional[str]
    directory: Optional[str]
    reason: Optional[str]

    def config(self) -> Dict[str, Any]:
        """The watcher's share of the configuration."""
        return {"signal": self.signal, "path": self.path, "directory": self.directory, "reason": self.reason}


class _Held:
    """The rank's open stacks file: kept open for the rank's life (the
    handler writes to its descriptor) and removed at exit."""

    fd: Optional[int] = None
    signal: Optional[int] = None
    path: Optional[str] = None
    directory: Optional[str] = None


_held = _Held()


def wants_capture(capture_stacks: Optional[bool], env: Mapping[str, str]) -> bool:
    """False when the capture is turned off: ``capture_stacks=False``, else
    ``TRAINSTATE_STACKS=off`` (or ``0``, ``false``, ``no``)."""
    if capture_stacks is not None:
        return bool(capture_stacks)
    return (env.get("TRAINSTATE_STACKS") or "").strip().lower() not in _OFF_WORDS


def parse_signal(value: Union[int, str, None]) -> int:
    """The signal ``value`` names: a number (``41``), a name (``SIGUSR2``,
    ``USR2``) or ``SIGRTMIN+N``/``SIGRTMAX-N``; the default for ``None`` or
    an empty text. Raises ``ValueError`` naming the rule otherwise."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return default_signal()
    if isinstance(value, bool):
        raise ValueError(f"stacks_signal={value!r} is not a signal")
    if isinstance(value, int):
        number = int(value)
    else:
        text = value.strip().upper().replace(" ", "")
        if text.lstrip("-").isdigit():
            number = int(text)
        else:
            if not text.startswith("SIG"):
                text = "SIG" + text
            number = _named_signal(text)
    if number in (signal.SIGKILL, signal.SIGSTOP) or not 1 <= number < signal.NSIG:
        raise ValueError(f"stacks_signal={value!r} must be a signal a handler can take (1 to {signal.NSIG - 1}, not SIGKILL or SIGSTOP)")
    return number


def _named_signal(text: str) -> int:
    for base in ("SIGRTMIN", "SIGRTMAX"):
        if text.startswith(base):
            rest = text[len(base) :]
            offset = 0
            if rest:
                if rest[0] not in "+-" or not rest[1:].isdigit():
                    raise ValueError(f"stacks_signal={text!r}: write {base}+N or {base}-N")
                offset = int(rest)
            number = int(getattr(signal, base)) + offset
            if not signal.SIGRTMIN <= number <= signal.SIGRTMAX:
                raise ValueError(f"stacks_signal={text!r} is outside SIGRTMIN..SIGRTMAX")
            return number
    try:
        return int(signal.Signals[text])
    except KeyError:
        raise ValueError(f"stacks_signal={text!r} is not a signal name this system knows") from None


def disposition(signum: int) -> str:
    """How ``signum`` is handled now: ``default``, ``ignored`` or
    ``handled``. Read from the kernel (``sigaction``), so a handler that C
    code installed (``faulthandler`` included) counts, and from Python's own
    table when the kernel cannot be asked."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        # struct sigaction begins with the handler on Linux; the rest
        # (mask, flags, restorer) fits well within 256 bytes.
        old = ctypes.create_string_buffer(256)
        if libc.sigaction(ctypes.c_int(signum), None, old) == 0:
            handler = ctypes.c_void_p.from_buffer(old).value or 0
            return "default" if handler == 0 else "ignored" if handler == 1 else "handled"
    except (OSError, AttributeError, ValueError):
        pass
    python = signal.getsignal(signum)
    if python == signal.SIG_DFL:
        return "default"
    return "ignored" if python == signal.SIG_IGN else "handled"


def arm(capture_stacks: Optional[bool], stacks_signal: Union[int, str, None], env: Mapping[str, str]) -> Optional[Armed]:
    """Arms this process's capture, as :func:`trainstate.init` does: ``None``
    when it is turned off (nothing is touched), else what the watcher needs.
    A signal that already has a handler, or a bad ``stacks_signal``, is not
    taken: one warning, and an :class:`Armed` without a signal. Never raises."""
    if not wants_capture(capture_stacks, env):
        return None
    if _held.fd is not None:
        return Armed(_held.signal, _held.path, _held.directory, None)
    try:
        signum = parse_signal(stacks_signal if stacks_signal is not None else env.get("TRAINSTATE_STACKS_SIGNAL"))
    except ValueError as err:
        logger.warning("trainstate: %s; stacks are captured without a signal (py-spy, if installed)", err)
        return Armed(None, None, None, str(err))
    state = disposition(signum)
    if state != "default":
        reason = f"signal {signum} ({_name(signum)}) is {'ignored' if state == 'ignored' else 'taken by another handler'} in this rank"
        logger.warning(
            "trainstate: %s; trainstate leaves it alone and captures stacks without it (py-spy, if installed). "
            "Choose a free one with TRAINSTATE_STACKS_SIGNAL, or turn capture off with TRAINSTATE_STACKS=off",
            reason,
        )
        return Armed(None, None, None, reason)
    directory: Optional[str] = None
    fd: Optional[int] = None
    try:
        directory = tempfile.mkdtemp(prefix="trainstate-stacks-")  # mode 0700
        path = os.path.join(directory, f"stacks-{os.getpid()}.txt")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
        faulthandler.register(signum, file=fd, all_threads=True, chain=False)
    except (OSError, ValueError, RuntimeError) as err:
        if fd is not None:
            os.close(fd)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)
        logger.warning("trainstate: cannot arm the stack capture (%s); stacks are captured without a signal", err)
        return Armed(None, None, None, f"the capture could not be armed: {err}")
    _held.fd, _held.signal, _held.path, _held.directory = fd, signum, path, directory
    return Armed(signum, path, directory, None)


def disarm() -> None:
    """Unregisters the handler and removes the stacks file and its
    directory (at the rank's exit)."""
    fd, signum, directory = _held.fd, _held.signal, _held.directory
    if fd is None:
        return
    _held.fd = _held.signal = _held.path = _held.directory = None
    try:
        if signum is not None:
            faulthandler.unregister(signum)
    except (OSError, ValueError, RuntimeError):
        pass
    try:
        os.close(fd)
    except OSError:
        pass
    if directory is not None:
        shutil.rmtree(directory, ignore_errors=True)


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        if signal.SIGRTMIN <= signum <= signal.SIGRTMAX:
            return f"SIGRTMIN+{signum - int(signal.SIGRTMIN)}"
        return f"signal {signum}"


# The watcher's side.


def cut(data: bytes, limit: int = MAX_STACK_BYTES) -> "tuple[str, bool]":
    """``data`` as text of at most ``limit`` bytes, cut after its last
    whole line when it is longer; and whether it was cut."""
    if len(data) <= limit:
        text = data.decode("utf-8", "replace")
        if len(text.encode("utf-8")) <= limit:
            return text, False
    head = data[:limit]
    end = head.rfind(b"\n")
    head = head[: end + 1] if end >= 0 else head
    text = head.decode("utf-8", "replace")
    while len(text.encode("utf-8")) > limit:
        text = text[: text.rfind("\n", 0, len(text) - 1) + 1] if "\n" in text[:-1] else text[: len(text) // 2]
    return text, True


def flight_recorder_note(env: Mapping[str, str], rank: int) -> Optional[str]:
    """Where PyTorch's NCCL flight recorder dumps this rank's record, when
    the job enabled it (``TORCH_NCCL_TRACE_BUFFER_SIZE`` > 0 and
    ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` set) and the dump exists."""
    try:
        size = int((env.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or "0").strip())
    except ValueError:
        return None
    prefix = env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE") or ""
    if size <= 0 or not prefix:
        return None
    path = f"{prefix}{rank}"
    try:
        found = os.stat(path).st_size
    except OSError:
        return None
    return f"NCCL flight recorder dump: {path} ({found} bytes)"


def _report(rank: int, source: str, stack: str, truncated: bool, notes: List[Optional[str]]) -> RankStackReport:
    report: RankStackReport = {"rank": rank, "source": source, "stack": stack, "truncated": truncated}
    note = "; ".join(n for n in notes if n)
    if note:
        report["note"] = note[:MAX_STACK_NOTE_LEN]
    return report


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 1 else f"{value * 1000:.0f} ms"


def capture(
    armed: Mapping[str, Any],
    rank: int,
    send_signal: Callable[[int], bool],
    within: float,
    env: Mapping[str, str],
    py_spy_pid: Optional[int] = None,
    limit: int = MAX_STACK_BYTES,
) -> RankStackReport:
    """Captures rank ``rank``'s stacks within ``within`` seconds, as the
    watcher does on a capture order. ``armed`` is the rank's
    :meth:`Armed.config`; ``send_signal(signum)`` signals the rank (False
    when it is gone); ``py_spy_pid`` is the pid ``py-spy`` reads when the
    rank writes nothing; ``env`` is the rank's environment (for the flight
    recorder's note). Never raises, never waits longer than ``within``
    (and ``py-spy``'s own exit)."""
    until = time.monotonic() + max(within, 0.0)
    flight = flight_recorder_note(env, rank)
    signum = armed.get("signal")
    path = armed.get("path")
    why: Optional[str] = armed.get("reason") or ("stacks are not armed in this rank" if signum is None else None)
    if isinstance(signum, int) and isinstance(path, str):
        try:
            stack, truncated = _by_signal(path, signum, send_signal, until, limit)
        except OSError as err:
            stack, truncated = "", False
            why = f"the stacks file could not be read ({err})"
        else:
            if stack:
                return _report(rank, "faulthandler", stack, truncated, [flight])
            if why is None:
                why = f"no answer to signal {signum} within {_seconds(within)}"
    spy = shutil.which("py-spy") if py_spy_pid is not None else None
    if spy is not None and py_spy_pid is not None:
        stack, truncated, failed = _py_spy(spy, py_spy_pid, until, limit)
        if stack:
            return _report(rank, "py-spy", stack, truncated, [why, flight])
        return _report(rank, "py-spy", "", False, [why, failed, flight])
    return _report(rank, "faulthandler" if signum is not None else "watcher", "", False, [why, flight])


def _by_signal(path: str, signum: int, send_signal: Callable[[int], bool], until: float, limit: int) -> "tuple[str, bool]":
    """Empties the stacks file, signals the rank and reads what its
    handler wrote, once the file stopped growing (or time is up)."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        os.ftruncate(fd, 0)  # the rank appends (O_APPEND): it writes from the start again
        if not send_signal(signum):
            return "", False
        size, since = 0, time.monotonic()
        while True:
            now = time.monotonic()
            current = os.fstat(fd).st_size
            if current != size:
                size, since = current, now
            elif size > 0 and now - since >= SETTLE:
                break
            if now >= until:
                break
            time.sleep(min(_POLL, max(until - now, 0.0)))
        data = os.pread(fd, limit + 1, 0) if size > 0 else b""
    finally:
        os.close(fd)
    return cut(data, limit)


def _py_spy(spy: str, pid: int, until: float, limit: int) -> "tuple[str, bool, Optional[str]]":
    """``py-spy dump --pid PID`` within the time left: its stacks, whether
    they were cut, and why there are none."""
    left = until - time.monotonic()
    if left <= 0.05:
        return "", False, "no time was left for py-spy"
    try:
        done = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, timeout=left, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "", False, f"py-spy did not answer within {_seconds(left)}"
    except OSError as err:
        return "", False, f"py-spy could not run ({err})"
    if done.returncode != 0 or not done.stdout.strip():
        said = done.stderr.decode("utf-8", "replace").strip().splitlines()
        return "", False, f"py-spy failed ({said[-1] if said else f'exit status {done.returncode}'})"
    text, truncated = cut(done.stdout, limit)
    return text, truncated, None

