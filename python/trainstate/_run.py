"""One rank's report to the head, from the rank's side.

The rank does no HTTP at all: a watcher process (:mod:`trainstate._watch`)
joins, heartbeats and reports the rank's end, and sees the rank die. The
rank only tells it, without ever blocking, how it ended when it knows
(an uncaught exception, ``sys.exit`` with a status, an explicit
:meth:`Run.finish` or :meth:`Run.fail`, or reaching its exit), and a
daemon thread reads the head's answers the watcher passes back.

Nothing here may break training: no exception leaves this module into the
caller's code, no Python signal handler is installed (only
``faulthandler``'s C handler on the stacks signal, :mod:`trainstate._stacks`,
which runs only when the watcher captures the rank's stacks), and the
rank's exit status and output are what they would be without trainstate.
"""

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Type, Union

from . import _launch, _proc, _stacks
from ._progress import CheckpointError, Progress, checked_checkpoint, stall_action, stall_after_ms
from ._contract import MAX_TRACE_LEN, TERMINAL_RUN_STATUSES
from .types import CauseKind, FailureMode, RunStatus, TrainWorkerInfo

logger = logging.getLogger("trainstate")

TERMINAL: Tuple[RunStatus, ...] = TERMINAL_RUN_STATUSES
"""The statuses a run ends with."""

_WRITE_BOUND = 0.2
"""How long finishing a line already partly written may take, in seconds."""

# Variables that would make the watcher's interpreter print or linger.
_WATCHER_ENV_DROP = (
    "PYTHONINSPECT",
    "PYTHONVERBOSE",
    "PYTHONPROFILEIMPORTTIME",
    "PYTHONTRACEMALLOC",
    "PYTHONDEVMODE",
    "PYTHONWARNINGS",
    "PYTHONSTARTUP",
    "PYTHONBREAKPOINT",
    "PYTHONFAULTHANDLER",
)


class Run:
    """This process's rank of a run, as reported to the head.

    Made by :func:`trainstate.init`. The rank's watcher joins its group at
    the head, heartbeats while the rank lives, and reports how it ended:
    its own report when it made one (an uncaught exception, ``sys.exit``
    with a status, :meth:`finish`, :meth:`fail`), else what its death
    shows (its exit status, or the signal that killed it).
    """

    def __init__(
        self,
        *,
        url: Optional[str],
        token: Optional[str],
        launch: Optional[_launch.Launch],
        ca_cert: Optional[str] = None,
        worker: Optional[TrainWorkerInfo],
        name: str,
        timeout: float,
        join_timeout: Optional[float],
        reason: Optional[str] = None,
        process_start_ms: Optional[int] = None,
        stall_after: Optional[float] = None,
    ) -> None:
        self._url = url
        self._token = token
        self._ca_cert = ca_cert
        self._launch = launch
        self._worker = worker
        self._name = name
        self._timeout = timeout
        self._join_timeout = join_timeout
        self._process_start_ms = process_start_ms
        self._stall_after_ms = stall_after_ms(stall_after)
        self._pid = os.getpid()
        self._enabled = reason is None and url is not None and launch is not None
        self._disabled_reason = reason
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._run_id: Optional[str] = None
        self._attempt_id = str(launch.attempt) if launch else "0"
        self._run_status: Optional[RunStatus] = None
        self._lease_ms = 60_000
        self._tried = False
        self._given_up = False
        self._watcher_gone = False
        self._ended = False
        self._line_broken = False
        self._exit_status: Optional[Any] = None
        self._warned = False
        self._socket: Optional[socket.socket] = None
        self._watcher: Optional["subprocess.Popen[bytes]"] = None
        self._progress = Progress(self._send)
        self._on_stall: Optional[str] = None
        self._abort_after_ms: Optional[int] = None
        self._capture_stacks: Optional[bool] = None
        self._stacks_signal: Union[int, str, None] = None
        self._env: Mapping[str, str] = os.environ
        self._stacks: Optional[_stacks.Armed] = None

    def _configure_stalls(
        self,
        on_stall: Optional[str],
        abort_after: Optional[float],
        capture_stacks: Optional[bool],
        stacks_signal: Union[int, str, None],
        env: Mapping[str, str],
    ) -> None:
        """What the head does when the run stalls, and how this rank's
        stacks are captured; read before the watcher starts."""
        self._on_stall, self._abort_after_ms = stall_action(on_stall, abort_after)
        self._capture_stacks = capture_stacks
        self._stacks_signal = stacks_signal
        self._env = env

    # What the rank is.

    @property
    def enabled(self) -> bool:
        """True when this rank reports to a head."""
        return self._enabled

    @property
    def run_id(self) -> Optional[str]:
        """The run's id, once the head has answered a join."""
        return self._run_id

    @property
    def attempt_id(self) -> str:
        """The attempt of the run this rank belongs to."""
        return self._attempt_id

    @property
    def status(self) -> Optional[RunStatus]:
        """The run's status as the head last answered it; ``None`` while the
        group waits for ranks or before the head answered."""
        return self._run_status

    @property
    def rank(self) -> int:
        """This process's world rank."""
        return self._launch.rank if self._launch else 0

    @property
    def world_size(self) -> int:
        """How many ranks the group has."""
        return self._launch.world_size if self._launch else 1

    @property
    def key(self) -> Optional[str]:
        """The rendezvous key this launch's ranks share."""
        return self._launch.key if self._launch else None

    @property
    def launcher(self) -> str:
        """``torchrun``, ``slurm``, ``env`` or ``single``."""
        return self._launch.launcher if self._launch else "single"

    @property
    def worker(self) -> Optional[TrainWorkerInfo]:
        """This rank's worker info, as sent to the head."""
        return self._worker

    @property
    def url(self) -> Optional[str]:
        """The head's URL."""
        return self._url

    @property
    def watcher_pid(self) -> Optional[int]:
        """The pid of the process that reports for this rank."""
        return self._watcher.pid if self._watcher is not None else None

    def __repr__(self) -> str:
        if not self._enabled:
            return f"<trainstate.Run disabled: {self._disabled_reason}>"
        return (
            f"<trainstate.Run {self._run_id or '(joining)'} rank {self.rank}/{self.world_size}"
            f" attempt {self._attempt_id} {self._run_status or 'PENDING'}>"
        )

    # Progress.

    def report(
        self,
        metrics: Optional[Mapping[str, float]] = None,
        *,
        step: Optional[int] = None,
        total_steps: Optional[int] = None,
        phase: Optional[str] = None,
        expect_next_within: Optional[float] = None,
        step_time: Optional[float] = None,
        checkpoint: Optional[int] = None,
    ) -> None:
        """Reports this rank's progress: its ``step`` (the global step, as
        the training loop counts it), ``total_steps`` when known, its
        ``phase`` (``"train"``, ``"eval"``, ``"checkpoint"``...), the latest
        value of some scalar ``metrics``, and, before something long (a
        checkpoint, an evaluation), that its next step may take up to
        ``expect_next_within`` seconds: the head does not call the run
        stalled meanwhile.

        ``step_time`` is the seconds this rank's own work took for one
        step (its compute, without the time it waited for its peers in
        collectives): the head compares ranks by it and names the ones
        persistently slower than their peers (stragglers). Without it the
        wall time between steps is sent, which in lock-step training is
        the same on every rank.

        ``checkpoint`` says progress up to that step is saved (a checkpoint
        was written): when an attempt fails, the head counts the work done
        since the run's latest mark as lost. It is a step: a whole number
        (``int``, not ``bool``), not ahead of the rank's own step (this
        call's ``step``, else the latest it reported) and never lower than
        the rank's previous mark. A mark stays until a higher one replaces
        it.

        Costs a few microseconds and never blocks: the latest state is kept
        and handed to the watcher about once a second, which sends it with
        the rank's heartbeat. Invalid input is dropped with one warning line
        per kind. Never raises, but for a ``checkpoint`` that breaks a rule:
        ``ValueError`` naming ``checkpoint``, and nothing of the call is
        taken."""
        if checkpoint is not None:
            checked_checkpoint(checkpoint)
        if not self._enabled or os.getpid() != self._pid:
            return
        try:
            self._progress.report(metrics, step, total_steps, phase, expect_next_within, step_time, checkpoint)
        except CheckpointError:
            raise  # the mark broke a rule: the caller's to hear
        except Exception as err:  # noqa: BLE001 - training must go on
            logger.debug("trainstate: %r", err, exc_info=True)

    # Explicit ends.

    def finish(self) -> None:
        """Reports that this rank ended cleanly. The run finishes once every
        rank has."""
        self._guarded(self._report_end, "FINISHED", "", None, None, _proc.now_ms())

    def fail(self, error: Optional[BaseException] = None, detail: Optional[str] = None) -> None:
        """Reports that this rank failed with ``error`` (its traceback is
        sent) or ``detail``: the run is ERRORED, unless the launcher restarts
        the workers."""
        at_ms = _proc.now_ms()

        def report() -> None:
            text = detail
            if text is None and error is not None:
                text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            if isinstance(error, KeyboardInterrupt):
                self._report_end("ABORTED", text or "KeyboardInterrupt", "USER_INTERRUPT", None, at_ms)
            else:
                self._report_end("ERRORED", text or "", "USER_ERROR", "RAISED", at_ms)

        self._guarded(report)

    def interrupt(self, detail: str = "interrupted") -> None:
        """Reports that this rank was interrupted: the run is ABORTED
        (``USER_INTERRUPT``), unless the launcher restarts the workers."""
        self._guarded(self._report_end, "ABORTED", detail, "USER_INTERRUPT", None, _proc.now_ms())

    def wait_for_group(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds until the head has registered the
        run (every rank joined); True if it has. Never raises."""
        if not self._enabled:
            return False
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._run_status is None and not self._given_up and not self._watcher_gone:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return self._run_status is not None

    def close(self) -> None:
        """Stops reporting, without reporting an end."""
        self._guarded(self._send, {"close": True})

    # The watcher.

    def _start(self) -> None:
        if not self._enabled:
            return
        try:
            self._stacks = _stacks.arm(self._capture_stacks, self._stacks_signal, self._env)
            self._spawn()
        except Exception as err:  # noqa: BLE001 - training must go on
            _stacks.disarm()
            self._stacks = None
            self._enabled = False
            self._disabled_reason = f"the watcher did not start: {err}"
            logger.warning("trainstate: cannot start this rank's watcher (%s); this rank is not reported, training goes on", err)
            return
        # The first join's answer, within the deadline: run_id is then known
        # at once in the usual case. The watcher goes on trying after that.
        deadline = time.monotonic() + self._timeout
        with self._changed:
            while not self._tried and not self._watcher_gone:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(left)

    def _spawn(self) -> None:
        assert self._launch is not None and self._worker is not None and self._url is not None
        executable = sys.executable
        if not executable:
            raise RuntimeError("sys.executable is unknown")
        package_parent = str(Path(__file__).resolve().parents[1])
        env = {k: v for k, v in os.environ.items() if k not in _WATCHER_ENV_DROP}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent, env.get("PYTHONPATH", "")) if p)
        ours, theirs = socket.socketpair()
        try:
            # The watcher's cwd is the package's parent, so `-m` imports the
            # very package this rank imported, whatever the rank's cwd holds.
            self._watcher = subprocess.Popen(
                [executable, "-W", "ignore", "-m", "trainstate._watch"],
                stdin=theirs.fileno(),
                stdout=theirs.fileno(),
                stderr=None,
                cwd=package_parent,
                env=env,
                close_fds=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._socket = ours
        config: Dict[str, Any] = {
            "url": self._url,
            "token": self._token,
            "ca_cert": self._ca_cert,
            "timeout": self._timeout,
            "key": self._launch.key,
            "rank": self._launch.rank,
            "world_size": self._launch.world_size,
            "attempt": self._launch.attempt,
            "restarts_remaining": self._launch.restarts_remaining,
            "worker": self._worker,
            "name": self._name,
            "job_id": self._launch.job_id,
            "join_timeout_ms": None if self._join_timeout is None else max(1, int(self._join_timeout * 1000)),
            "process_start_ms": self._process_start_ms,
            "stall_after_ms": self._stall_after_ms,
            "on_stall": self._on_stall,
            "abort_after_ms": self._abort_after_ms,
            "stacks": self._stacks.config() if self._stacks is not None else None,
            "flight_recorder": {
                name: self._env[name] for name in ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE") if name in self._env
            },
            "pid": self._pid,
            "start_ticks": _proc.start_ticks(self._pid),
            "warn": logger.isEnabledFor(logging.WARNING),
            "launcher": self._launcher_of(),
        }
        if not self._send(config):
            raise RuntimeError("the watcher did not take its configuration")
        threading.Thread(target=self._read_watcher, name="trainstate-watcher-answers", daemon=True).start()

    def _launcher_of(self) -> Optional[Dict[str, Any]]:
        """The process that launched this rank, for the watcher to say
        whether it had exited before the rank: torchrun's agent (the rank's
        parent, wrappers skipped); ``None`` for other launchers."""
        if self._launch is None or self._launch.launcher != "torchrun":
            return None
        agent = _launch.launching_agent()
        if agent is None:
            return None
        return {"name": "torchrun", "pid": agent[0], "start_ticks": agent[1]}

    def _read_watcher(self) -> None:
        """Takes the head's answers the watcher passes on, until it exits."""
        sock = self._socket
        buffer = b""
        try:
            while sock is not None:
                try:
                    chunk = sock.recv(65536)
                except InterruptedError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    self._take(line)
        finally:
            with self._changed:
                self._watcher_gone = True
                self._changed.notify_all()
            watcher = self._watcher
            if watcher is not None and os.getpid() == self._pid:
                try:
                    watcher.wait(30)  # reaped: it exits once it has nothing left to do
                except Exception:  # noqa: BLE001
                    pass

    def _take(self, line: bytes) -> None:
        try:
            state = json.loads(line.decode("utf-8"))
        except ValueError:
            return
        if not isinstance(state, dict):
            return
        with self._changed:
            self._run_id = state.get("run_id") or self._run_id
            self._attempt_id = str(state.get("attempt_id") or self._attempt_id)
            self._run_status = state.get("run_status")
            try:
                self._lease_ms = int(state.get("lease_ms") or self._lease_ms)
            except (TypeError, ValueError):
                pass
            self._tried = self._tried or bool(state.get("tried"))
            self._given_up = bool(state.get("given_up"))
            warning = state.get("warning")
            new_warning = isinstance(warning, str) and bool(warning.strip()) and not self._warned
            self._warned = self._warned or new_warning
            self._changed.notify_all()
        if new_warning:
            # Once: the head's word about this rank (its node keeps failing runs).
            logger.warning("trainstate: %s", str(warning).strip())

    def _send(self, message: Dict[str, Any], wait: bool = True) -> bool:
        """Writes one line to the watcher without blocking: a full pipe, or
        a watcher that is gone, drops it. True when it was written. With
        ``wait`` False it does not wait for another thread's write, nor to
        finish a line the pipe took only part of (progress: the next
        hand-over carries the latest anyway)."""
        sock = self._socket
        if sock is None or os.getpid() != self._pid:
            return False
        data = json.dumps(message, separators=(",", ":")).encode("utf-8") + b"\n"
        flags = socket.MSG_DONTWAIT | getattr(socket, "MSG_NOSIGNAL", 0)
        if not self._write_lock.acquire(blocking=wait):
            return False
        try:
            if self._line_broken:
                data = b"\n" + data  # ends the line a dropped message left unfinished
            written = 0
            until: Optional[float] = None
            while written < len(data):
                try:
                    written += sock.send(data[written:], flags)
                except (BlockingIOError, InterruptedError):
                    if written == 0:
                        return False
                    if not wait:
                        self._line_broken = True
                        return False
                    until = until or time.monotonic() + _WRITE_BOUND
                    if time.monotonic() > until:
                        self._line_broken = True
                        return False
                    time.sleep(0.005)
                except OSError:
                    return False
            self._line_broken = False
            return True
        finally:
            self._write_lock.release()

    def _owned(self) -> bool:
        """False in a forked child: only the process that called init reports."""
        return self._enabled and os.getpid() == self._pid

    def _guarded(self, action: Callable[..., Any], *args: Any) -> None:
        """Runs ``action``; whatever it raises stays here."""
        if not self._owned():
            return
        try:
            action(*args)
        except BaseException as err:  # noqa: BLE001 - training must go on
            logger.debug("trainstate: %r", err, exc_info=True)

    def _report_end(
        self, status: RunStatus, detail: str, cause: Optional[CauseKind], how: Optional[FailureMode], at_ms: int
    ) -> None:
        """Tells the watcher how this rank ended (the first end counts)."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
        self._progress.flush()
        end: Dict[str, Any] = {"status": status, "detail": detail[-MAX_TRACE_LEN:], "ended_at_ms": at_ms}
        if cause is not None:
            end["cause"] = cause
        if how is not None:
            end["how"] = how
        self._send({"end": end})

    # The process's hooks.

    def _uncaught(self, exc_type: Type[BaseException], exc: BaseException, tb: Optional[TracebackType], at_ms: int) -> None:
        if issubclass(exc_type, KeyboardInterrupt):
            self._report_end("ABORTED", f"Rank {self.rank} was interrupted (KeyboardInterrupt).", "USER_INTERRUPT", None, at_ms)
        else:
            text = "".join(traceback.format_exception(exc_type, exc, tb))
            self._report_end("ERRORED", text, "USER_ERROR", "RAISED", at_ms)

    def _at_exit(self) -> None:
        """The rank reached its exit: tells the watcher so, with the status
        ``sys.exit`` was given, and returns at once. The watcher reads the
        real exit status once the process is gone (a caught ``SystemExit``,
        or a later ``os._exit``, makes it another), and takes this one only
        when the process was reaped before it could read it."""
        with self._lock:
            if self._ended:
                return
        self._progress.flush()
        status, message = _exit_status(self._exit_status)
        self._send({"exit": {"at_ms": _proc.now_ms(), "status": status, "message": message}})

    def _after_fork_in_child(self) -> None:
        """A forked child does not hold the rank's end of the pipe: the
        watcher must see it close when the rank dies, not when the last
        child does."""
        sock, self._socket = self._socket, None
        self._watcher = None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


def _exit_status(value: Any) -> Tuple[int, Optional[str]]:
    """The exit status Python gives ``sys.exit(value)``, and its message."""
    if value is None:
        return 0, None
    if isinstance(value, int):
        return value & 0xFF, None
    return 1, str(value)[:1000]


# The process-wide hooks, installed once, each calling the current run.

_current: Optional[Run] = None
_installed = False
_previous_excepthook: Callable[..., Any] = sys.excepthook
_original_exit: Callable[..., Any] = sys.exit


def current() -> Optional[Run]:
    """The run :func:`trainstate.init` made in this process, if any."""
    return _current


def _set_current(run: Run) -> None:
    global _current
    _current = run
    if run.enabled:
        _install_hooks()


def _excepthook(exc_type: Type[BaseException], exc: BaseException, tb: Optional[TracebackType]) -> None:
    at_ms = _proc.now_ms()
    try:
        _previous_excepthook(exc_type, exc, tb)
    finally:
        run = _current
        if run is not None:
            run._guarded(run._uncaught, exc_type, exc, tb, at_ms)


def _exit(status: Any = None) -> Any:
    run = _current
    if run is not None and run._owned():
        run._exit_status = status
    return _original_exit(status)


def _at_exit() -> None:
    run = _current
    if run is not None:
        run._guarded(run._at_exit)
        if run._owned():
            # The stacks file goes with the rank (the watcher removes it too,
            # for a rank that dies without reaching its exit).
            _stacks.disarm()


def _after_fork_in_child() -> None:
    run = _current
    if run is not None:
        try:
            run._after_fork_in_child()
        except BaseException:  # noqa: BLE001
            pass


def _install_hooks() -> None:
    global _installed, _previous_excepthook, _original_exit
    if _installed:
        return
    _installed = True
    import atexit

    _previous_excepthook = sys.excepthook
    sys.excepthook = _excepthook
    _original_exit = sys.exit
    sys.exit = _exit
    atexit.register(_at_exit)
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
