"""One rank's report to the head: join, heartbeats, and how the rank ended.

Nothing here may break training: every request has a short deadline, a
head that is down or slow is logged once and retried in the background,
and no exception leaves this module into the caller's code.
"""

import logging
import os
import signal
import sys
import threading
import time
import traceback
from types import TracebackType
from typing import Any, Callable, Dict, Optional, Type

from . import _http, _launch
from ._wire import JoinRequest, RankEndRequest, RendezvousResponse, TrainWorkerInfo

logger = logging.getLogger("trainstate")

TERMINAL = ("FINISHED", "ERRORED", "ABORTED")
"""The statuses a run ends with."""

_MAX_BACKOFF = 30.0


class Run:
    """This process's rank of a run, as reported to the head.

    Made by :func:`trainstate.init`. The rank joins its group at the head in
    the background, heartbeats while it lives, and reports how it ended:
    at exit (``FINISHED``), at an uncaught exception (``ERRORED`` with the
    traceback) or on SIGTERM/SIGINT (``ABORTED``). :meth:`finish` and
    :meth:`fail` report an end explicitly.
    """

    def __init__(
        self,
        *,
        url: Optional[str],
        token: Optional[str],
        launch: Optional[_launch.Launch],
        worker: Optional[TrainWorkerInfo],
        name: str,
        timeout: float,
        join_timeout: Optional[float],
        reason: Optional[str] = None,
    ) -> None:
        self._url = url
        self._token = token
        self._launch = launch
        self._worker = worker
        self._name = name
        self._timeout = timeout
        self._join_timeout = join_timeout
        self._pid = os.getpid()
        self._enabled = reason is None and url is not None and launch is not None
        self._disabled_reason = reason
        # Re-entrant: a signal handler runs in the main thread, which may hold it.
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._changed = threading.Condition(self._lock)
        self._thread: Optional[threading.Thread] = None
        self._run_id: Optional[str] = None
        self._attempt_id = str(launch.attempt) if launch else "0"
        self._joined = False
        self._run_status: Optional[str] = None
        self._lease_ms = 60_000
        self._end: Optional[RankEndRequest] = None
        self._end_sent = False
        self._given_up = False
        self._heartbeats_stopped = False
        self._warned = False
        self._interrupted: Optional[str] = None
        self._exit_status: Optional[Any] = None

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
    def status(self) -> Optional[str]:
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

    def __repr__(self) -> str:
        if not self._enabled:
            return f"<trainstate.Run disabled: {self._disabled_reason}>"
        return (
            f"<trainstate.Run {self._run_id or '(joining)'} rank {self.rank}/{self.world_size}"
            f" attempt {self._attempt_id} {self._run_status or 'PENDING'}>"
        )

    # Explicit ends.

    def finish(self) -> None:
        """Reports that this rank ended cleanly. The run finishes once every
        rank has."""
        self._guarded(self._report_end, "FINISHED", "", None)

    def fail(self, error: Optional[BaseException] = None, detail: Optional[str] = None) -> None:
        """Reports that this rank failed with ``error`` (its traceback is
        sent) or ``detail``: the run is ERRORED, unless the launcher restarts
        the workers."""

        def report() -> None:
            text = detail
            if text is None and error is not None:
                text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            if isinstance(error, KeyboardInterrupt):
                self._report_end("ABORTED", text or "KeyboardInterrupt", "USER_INTERRUPT")
            else:
                self._report_end("ERRORED", text or "", "USER_ERROR")

        self._guarded(report)

    def interrupt(self, detail: str = "interrupted") -> None:
        """Reports that this rank was interrupted: the run is ABORTED
        (``USER_INTERRUPT``), unless the launcher restarts the workers."""
        self._guarded(self._report_end, "ABORTED", detail, "USER_INTERRUPT")

    def wait_for_group(self, timeout: float) -> bool:
        """Waits up to ``timeout`` seconds until the head has registered the
        run (every rank joined); True if it has. Never raises."""
        if not self._enabled:
            return False
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._run_status is None and not self._given_up:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return self._run_status is not None

    def close(self) -> None:
        """Stops the background thread without reporting an end."""
        self._stop.set()

    # The background thread.

    def _start(self) -> None:
        if not self._enabled:
            return
        self._guarded(self._join)
        self._thread = threading.Thread(target=self._loop, name="trainstate-reporter", daemon=True)
        self._thread.start()

    def _owned(self) -> bool:
        """False in a forked child: only the process that called init reports."""
        return self._enabled and os.getpid() == self._pid

    def _guarded(self, action: Callable[..., None], *args: Any) -> None:
        """Runs ``action``; whatever it raises stays here."""
        if not self._owned():
            return
        try:
            action(*args)
        except BaseException as err:  # noqa: BLE001 - training must go on
            logger.debug("trainstate: %r", err, exc_info=True)

    def _loop(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                wait = self._tick()
                backoff = 0.5
            except _http.Unreachable:
                wait = backoff
                backoff = min(backoff * 2, _MAX_BACKOFF)
            except BaseException as err:  # noqa: BLE001
                logger.debug("trainstate: reporter: %r", err, exc_info=True)
                wait = backoff
                backoff = min(backoff * 2, _MAX_BACKOFF)
            if wait is None:
                return
            self._stop.wait(wait)

    def _interval(self) -> float:
        return max(0.05, min(self._lease_ms / 4000.0, 15.0))

    def _tick(self) -> Optional[float]:
        """One step of the background thread; the seconds until the next,
        or None when there is nothing left to do."""
        if self._given_up or self._end_sent:
            return None
        if not self._joined:
            self._join()
            return self._interval() if self._joined else None if self._given_up else 1.0
        if self._end is not None:
            self._send_end()
            return None if self._end_sent else 1.0
        if self._heartbeats_stopped:
            return 1.0
        self._heartbeat()
        return self._interval()

    # Requests.

    def _call(self, path: str, body: Any, timeout: Optional[float] = None) -> Dict[str, Any]:
        """One request; warns once per process when the head cannot be
        reached, and gives up on a refusal."""
        assert self._url is not None
        try:
            return _http.request(self._url, "POST", path, body, self._token, timeout or self._timeout)
        except _http.Unreachable as err:
            self._warn_once(
                f"trainstate: cannot reach the head ({err}); training goes on, and this rank keeps trying in the background"
            )
            raise
        except _http.HeadError as err:
            if err.retryable:
                self._warn_once(
                    f"trainstate: the head is unavailable ({err}); training goes on, and this rank keeps trying in the background"
                )
                raise _http.Unreachable(str(err)) from None
            raise

    def _warn_once(self, message: str) -> None:
        with self._lock:
            if self._warned:
                logger.debug(message)
                return
            self._warned = True
        logger.warning(message)

    def _accept(self, answer: RendezvousResponse) -> None:
        with self._changed:
            self._run_id = answer.get("run_id", self._run_id)
            self._attempt_id = answer.get("attempt_id", self._attempt_id)
            self._run_status = answer.get("run_status")
            self._lease_ms = int(answer.get("lease_ms") or self._lease_ms)
            self._joined = True
            self._changed.notify_all()

    def _give_up(self, err: _http.HeadError, what: str) -> None:
        self._warn_once(f"trainstate: the head refused {what} ({err}); this rank stops reporting, training goes on")
        with self._changed:
            self._given_up = True
            self._changed.notify_all()
        self._stop.set()

    def _join(self) -> None:
        if self._joined or self._given_up:
            return
        assert self._launch is not None and self._worker is not None
        body: JoinRequest = {
            "world_size": self._launch.world_size,
            "attempt": self._launch.attempt,
            "worker": self._worker,
            "name": self._name,
            "job_id": self._launch.job_id,
        }
        if self._join_timeout is not None:
            body["join_timeout_ms"] = max(1, int(self._join_timeout * 1000))
        if self._run_id is not None:
            body["run_id"] = self._run_id
        try:
            answer = self._call(f"/api/train/rendezvous/{self._launch.key}/join", body)
        except _http.HeadError as err:
            self._give_up(err, f"rank {self._launch.rank}'s join")
            return
        self._accept(answer)  # type: ignore[arg-type]

    def _heartbeat(self) -> None:
        path = f"/api/train/runs/{self._run_id}/ranks/{self.rank}/heartbeat"
        try:
            answer = self._call(path, {"attempt_id": self._attempt_id})
        except _http.HeadError as err:
            if err.status == 404:
                # The head forgot the group (a restart): join again, keeping the run id.
                with self._lock:
                    self._joined = False
                return
            # The attempt was replaced, or the request is refused: no more heartbeats.
            logger.debug("trainstate: heartbeat refused: %s", err)
            self._heartbeats_stopped = True
            return
        self._accept(answer)  # type: ignore[arg-type]
        if self._run_status in TERMINAL:
            self._heartbeats_stopped = True

    def _report_end(self, status: str, detail: str, cause: Optional[str]) -> None:
        """Records this rank's end (the first one counts) and sends it now."""
        assert self._launch is not None
        with self._lock:
            if self._end is not None:
                return
            end: RankEndRequest = {
                "attempt_id": self._attempt_id,
                "status": status,  # type: ignore[typeddict-item]
                "detail": detail[-50_000:],
                "restarts_remaining": self._launch.restarts_remaining,
            }
            if cause is not None:
                end["cause"] = cause  # type: ignore[typeddict-item]
            self._end = end
        self._send_end()

    def _send_end(self) -> None:
        if self._end_sent or self._given_up or self._end is None:
            return
        if not self._joined:
            self._join()
            if not self._joined:
                return
        end = dict(self._end)
        end["attempt_id"] = self._attempt_id
        path = f"/api/train/runs/{self._run_id}/ranks/{self.rank}/end"
        try:
            answer = self._call(path, end)
        except _http.HeadError as err:
            if err.status == 404:
                with self._lock:
                    self._joined = False
                return
            logger.debug("trainstate: end refused: %s", err)
            self._end_sent = True
            self._stop.set()
            return
        self._accept(answer)  # type: ignore[arg-type]
        self._end_sent = True
        self._stop.set()

    # The process's hooks.

    def _uncaught(self, exc_type: Type[BaseException], exc: BaseException, tb: Optional[TracebackType]) -> None:
        if issubclass(exc_type, KeyboardInterrupt):
            self._report_end("ABORTED", f"Rank {self.rank} was interrupted (KeyboardInterrupt).", "USER_INTERRUPT")
        else:
            self._report_end("ERRORED", "".join(traceback.format_exception(exc_type, exc, tb)), "USER_ERROR")

    def _signalled(self, signum: int) -> None:
        name = signal.Signals(signum).name
        self._report_end("ABORTED", f"Rank {self.rank} received {name}.", "USER_INTERRUPT")

    def _at_exit(self) -> None:
        if self._end is None:
            status = self._exit_status
            if self._interrupted is not None:
                self._report_end("ABORTED", f"Rank {self.rank} was interrupted ({self._interrupted}).", "USER_INTERRUPT")
            elif status is not None and status != 0:
                detail = status if isinstance(status, str) else f"exited with status {status}"
                self._report_end("ERRORED", f"Rank {self.rank} {detail}", "USER_ERROR")
            else:
                self._report_end("FINISHED", "", None)
        # One more try within the deadline if the first did not get through.
        deadline = time.monotonic() + self._timeout
        while not self._end_sent and not self._given_up and time.monotonic() < deadline:
            try:
                self._send_end()
            except _http.Unreachable:
                break
        self._stop.set()


# The process-wide hooks, installed once, each calling the current run.

_current: Optional[Run] = None
_installed = False
_previous_excepthook: Callable[..., Any] = sys.excepthook
_previous_handlers: Dict[int, Any] = {}
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
    try:
        _previous_excepthook(exc_type, exc, tb)
    finally:
        run = _current
        if run is not None:
            run._guarded(run._uncaught, exc_type, exc, tb)


def _exit(status: Any = None) -> Any:
    run = _current
    if run is not None and run._owned():
        run._exit_status = status
    return _original_exit(status)


def _at_exit() -> None:
    run = _current
    if run is not None:
        run._guarded(run._at_exit)


def _on_signal(signum: int, frame: Any) -> None:
    run = _current
    if run is not None and run._owned():
        if signum == signal.SIGINT:
            # Python turns it into KeyboardInterrupt, which the script may
            # catch: the end is reported when it ends.
            run._interrupted = "SIGINT"
        else:
            run._guarded(run._signalled, signum)
    previous = _previous_handlers.get(signum, signal.SIG_DFL)
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_DFL:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install_hooks() -> None:
    global _installed, _previous_excepthook, _original_exit
    if _installed:
        return
    _installed = True
    import atexit

    _previous_excepthook = sys.excepthook
    sys.excepthook = _excepthook
    _original_exit = sys.exit
    sys.exit = _exit  # type: ignore[assignment]
    atexit.register(_at_exit)
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            previous = signal.getsignal(signum)
            if previous in (signal.SIG_IGN, None):
                continue  # ignored, or set outside Python: leave it alone
            _previous_handlers[signum] = previous
            signal.signal(signum, _on_signal)
        except (ValueError, OSError):
            pass
