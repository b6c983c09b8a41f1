"""The watcher: a small process beside each rank that does all of the rank's
talking to the head, and sees the rank die.

The rank starts it at :func:`trainstate.init` (``python -m
trainstate._watch``) as its child, connected by a pipe both ways (a Unix
socket pair, the watcher's stdin and stdout): the rank sends JSON lines
(first the configuration, then the rank's own end, or a note that it
reached exit with the status it knew), and the watcher sends the head's
answers back, one JSON line per change. A socket rather than a plain pipe
because a write to it can refuse ``SIGPIPE`` (``MSG_NOSIGNAL``): a rank
whose watcher is gone must not die of writing to it. The watcher
joins the group (retrying with backoff), heartbeats every quarter lease,
and reports the rank's end. The rank's progress (:mod:`trainstate._progress`)
rides on its heartbeats: the head keeps each rank's latest report as it
is, so every heartbeat carries the whole latest state (step, total, phase,
the time per step that came with the latest step, the 32 most recently
changed metrics, and what is left of an announced wait; the head counts a
step time only with a step new to it, so sending it again is harmless; and
the highest checkpoint mark, which the same mark again leaves as it is).
While there is new progress the watcher heartbeats every second;
progress the head refuses (a step that went back, a bad value) is logged
once and dropped, and heartbeats go on without it.

The head's answers may carry two orders. ``capture``: the watcher captures
its rank's Python stacks from outside the rank (:mod:`trainstate._stacks`:
the signal ``faulthandler`` is armed on, else ``py-spy``, else a note) in
a thread of its own, within the order's bound, and posts them once per
capture. ``end_rank`` (a run stalled under ``on_stall: ABORT``): it ends its
rank, once (SIGTERM, then SIGKILL after 5 s), and reports the rank's end as
ERRORED with cause NO_PROGRESS and the head's words. Once the rank has
reported progress and has not advanced for 5 s, the watcher heartbeats
every 2 s at most, so that an order reaches it within seconds of a stall.

Why a process and not a thread of the rank: a rank blocked in C++ while
holding the GIL (``init_process_group`` waiting for a peer) starves every
Python thread of its process, and a dead rank runs no code at all. The
watcher sees end of file on its stdin the moment the rank's process is
gone, whatever killed it; once the kernel has re-parented the watcher, the
rank is a zombie until its parent reaps it, and ``/proc/<pid>/stat`` tells
how it ended (a signal, or an exit status). A rank reaped before that read
is known only to have died without reporting.

The watcher never changes the job but on the head's orders (the signal of
a capture, which the rank's ``faulthandler`` answers; the end of a stalled
rank under ``on_stall: ABORT``): it ignores SIGINT, SIGTERM and SIGHUP
(so a Ctrl-C or torchrun's SIGTERM to the process group ends the rank, not
its report; the watcher ends by itself once the rank is gone), stays in the
rank's process group (so killing the whole group kills it too, and the
head's lease ends the run), writes nothing to the rank's stdout, and
writes at most one warning line to the rank's stderr. It exits within a
bounded time after the rank is gone.
"""

import json
import os
import select
import shutil
import signal
import socket
import sys
import threading
import time
from typing import Any, Dict, List, Optional, Tuple, cast

from . import _causes, _http, _proc, _stacks
from ._contract import END_RANK, HEARTBEAT_RANK, JOIN_RENDEZVOUS, MAX_TRACE_LEN, POST_RUN_STACKS, TERMINAL_RUN_STATUSES, Route
from ._progress import MAX_METRIC_NAMES_PER_REPORT
from .types import JoinRequest, RankEndRequest, RankHeartbeatRequest, RankProgress, RankStackReport, RendezvousResponse, RunStatus, StacksRequest

_MAX_BACKOFF = 30.0
_POLL = 0.2
"""How often the parent is checked, in seconds: the fallback for a rank
whose pipe end outlives it, or that closed it and lives on."""
_REPARENT_WAIT = 0.5
"""How long end of file waits for the rank's exit to re-parent the watcher."""
_FINAL_TRIES = 3
"""How many requests' deadlines the end of a dead rank may take."""
_PROGRESS_INTERVAL = 1.0
"""How often, at most, a heartbeat carries new progress, in seconds."""
STUCK_AFTER = 5.0
"""How long a rank that reported progress may go without advancing before
its watcher heartbeats faster, in seconds."""
STUCK_INTERVAL = 2.0
"""How often, at most, the watcher of a stuck rank heartbeats, in seconds:
a capture order reaches it within seconds of a stall."""
END_GRACE = 5.0
"""How long a rank the head ends has after SIGTERM before SIGKILL, in seconds."""
_DEFAULT_ANSWER_WITHIN_MS = 5_000
_MAX_ANSWER_WITHIN_MS = 20_000
_MAX_ANSWERED = 64
"""How many capture ids the watcher remembers having answered."""


def beat_interval(lease_ms: int, stuck_for: Optional[float]) -> float:
    """The time between heartbeats: a quarter of the lease (at most 15 s),
    and at most :data:`STUCK_INTERVAL` while the rank has not advanced for
    :data:`STUCK_AFTER` (``stuck_for``: seconds since its last advance, or
    ``None`` before it reported any progress)."""
    normal = max(0.05, min(lease_ms / 4000.0, 15.0))
    if stuck_for is not None and stuck_for >= STUCK_AFTER:
        return min(normal, STUCK_INTERVAL)
    return normal


class Watcher:
    """One rank's reporter, in its own process."""

    def __init__(self, config: Dict[str, Any], out_fd: int) -> None:
        self.config = config
        self.out_fd = out_fd
        self.out = socket.socket(fileno=out_fd)
        self.url: str = config["url"]
        self.token: Optional[str] = config.get("token")
        self.ca_cert: Optional[str] = config.get("ca_cert")
        self.timeout = float(config.get("timeout") or 2.0)
        self.rank = int(config["rank"])
        self.rank_pid = int(config["pid"])
        self.rank_started: Optional[int] = config.get("start_ticks")
        # Opened while the rank lives (it is our parent, so the pid is its).
        self.pidfd = _proc.open_pidfd(self.rank_pid) if os.getppid() == self.rank_pid else None
        self.warn_enabled = bool(config.get("warn", True))
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.observe_lock = threading.Lock()
        self.run_id: Optional[str] = config.get("run_id")
        self.attempt_id = str(config.get("attempt", 0))
        self.run_status: Optional[RunStatus] = None
        self.lease_ms = 60_000
        self.joined = False
        self.tried = False
        self.given_up = False
        self.heartbeats_stopped = False
        self.warned = False
        self.closed = False
        self.own_end: Optional[Dict[str, Any]] = None
        self.exit_note: Optional[Dict[str, Any]] = None
        self.final: Optional[Dict[str, Any]] = None
        self.gone = False
        self.pipe_lost = False
        self.last_sent: Optional[str] = None
        # The rank's latest progress: step, total and phase; its metrics,
        # the most recently changed last; when an announced wait ends
        # (monotonic); and whether any of it is new since the last heartbeat.
        self.progress: RankProgress = {}
        self.progress_metrics: Dict[str, float] = {}
        self.progress_wait_until: Optional[float] = None
        self.progress_new = False
        self.progress_warned = False
        self.last_beat = 0.0
        # When the rank's socket reached end of file, as dated by death_time.
        self.eof_ms: Optional[int] = None
        # The rank's launcher (torchrun's agent), watched through a pidfd
        # of it: whether it had exited before the rank ended is said with
        # the rank's end.
        launcher = config.get("launcher")
        self.launcher: Optional[Dict[str, Any]] = launcher if isinstance(launcher, dict) else None
        self.launcher_fd: Optional[int] = None
        if self.launcher is not None and _proc.start_ticks(_int(self.launcher.get("pid"))) == self.launcher.get("start_ticks"):
            self.launcher_fd = _proc.open_pidfd(_int(self.launcher.get("pid")))
        self.launcher_gone_ms: Optional[int] = None
        self.own_end_checked = False
        # What the machine says of the rank (its memory cgroup's counters,
        # the kernel log, Slurm), read now as a baseline and again at its end.
        self.causes: Optional[_causes.Observer] = None
        try:
            self.causes = _causes.Observer(self.rank_pid, os.environ)
        except Exception:  # noqa: BLE001 - the rank is reported without it
            self.causes = None
        # The head's warning about this rank's node, passed on to the rank.
        self.warning: Optional[str] = None
        # When the rank's step last grew (monotonic), once it reported one.
        self.last_advance: Optional[float] = None
        # The stack capture the rank armed (its signal and file), the
        # captures answered, and the one under way.
        stacks = config.get("stacks")
        self.stacks: Optional[Dict[str, Any]] = stacks if isinstance(stacks, dict) else None
        recorder = config.get("flight_recorder")
        self.rank_env: Dict[str, str] = {k: v for k, v in recorder.items() if isinstance(v, str)} if isinstance(recorder, dict) else {}
        self.answered: List[int] = []
        self.capturing: Optional[threading.Thread] = None
        # The head's words when it ends the rank (a stall under on_stall: ABORT).
        self.ending: Optional[str] = None

    # What the rank says.

    def read_rank(self, in_fd: int) -> None:
        """Reads the rank's lines until end of file, which means the rank
        is gone (or, rarely, that it closed its end and lives on)."""
        buffer = b""
        seen_ms = 0
        delay_before: Optional[int] = None
        delay_after: Optional[int] = None
        while True:
            delay_before = _proc.run_delay_ns()
            try:
                chunk = os.read(in_fd, 65536)
            except InterruptedError:
                continue
            except OSError:
                chunk = b""
            if not chunk:
                # The clock first, before anything else is waited for.
                seen_ms = _proc.now_ms()
                delay_after = _proc.run_delay_ns()
                break
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                self.take(line)
        self.rank_gone(self.death_time(seen_ms, delay_before, delay_after), wait_for_reparent=True)

    def death_time(self, seen_ms: int, delay_before: Optional[int], delay_after: Optional[int]) -> int:
        """When the rank died, from when this watcher saw end of file
        (``seen_ms``): less the time the reading thread then waited for a
        CPU (the kernel's count of it, before and after the read, in ns),
        and never before the last time the rank itself gave (its exit
        note). Kept for the parent poll, which may see the death first."""
        at_ms = seen_ms
        if delay_before is not None and delay_after is not None and delay_after >= delay_before:
            at_ms = seen_ms - (delay_after - delay_before) // 1_000_000
        with self.changed:
            note = self.exit_note
            floor = _int(note.get("at_ms")) if note is not None else 0
            at_ms = max(at_ms, floor) if floor <= seen_ms else at_ms
            self.eof_ms = at_ms
            self.changed.notify_all()
        return at_ms

    def take(self, line: bytes) -> None:
        try:
            message = json.loads(line.decode("utf-8"))
        except ValueError:
            return  # a line cut short by a full pipe
        if not isinstance(message, dict):
            return
        with self.changed:
            if isinstance(message.get("end"), dict) and self.own_end is None:
                self.own_end = message["end"]
            elif isinstance(message.get("exit"), dict) and self.exit_note is None:
                self.exit_note = message["exit"]
            elif message.get("close"):
                self.closed = True
            elif isinstance(message.get("progress"), dict):
                self.take_progress(message["progress"])
            self.changed.notify_all()

    def take_progress(self, progress: Dict[str, Any]) -> None:
        """Keeps the latest progress the rank handed over (under the lock)."""
        step, previous = progress.get("step"), self.progress.get("step")
        if isinstance(step, int) and (previous is None or step > previous):
            self.progress_wait_until = None  # it advanced: an announced wait is over
            self.last_advance = time.monotonic()
        for field in ("step", "total_steps", "phase"):
            if progress.get(field) is not None:
                self.progress[field] = progress[field]
        # A checkpoint mark is never lost to merging: a report without one
        # keeps the mark, and of two marks the higher is kept.
        mark, kept = progress.get("checkpoint"), self.progress.get("checkpoint")
        if isinstance(mark, int) and not isinstance(mark, bool) and (kept is None or mark > kept):
            self.progress["checkpoint"] = mark
        if progress.get("step") is not None:
            # The time per step of the steps up to this one, if the rank
            # measured them: the head counts it with a new step only.
            if isinstance(progress.get("step_time_ms"), (int, float)):
                self.progress["step_time_ms"] = progress["step_time_ms"]
            else:
                self.progress.pop("step_time_ms", None)
        metrics = progress.get("metrics")
        if isinstance(metrics, dict):
            for name, value in metrics.items():
                self.progress_metrics.pop(name, None)
                self.progress_metrics[name] = value
        wait_ms = progress.get("expect_next_within_ms")
        if isinstance(wait_ms, int):
            self.progress_wait_until = time.monotonic() + wait_ms / 1000.0
        self.progress_new = True

    def rank_gone(self, seen_ms: int, wait_for_reparent: bool) -> None:
        """The rank's end of the pipe closed (or its parent changed): once the kernel
        has re-parented the watcher, read how the rank ended and decide
        the rank's end."""
        with self.observe_lock:
            if self.gone:
                return
            if wait_for_reparent:
                # Usually a matter of microseconds, and the rank's parent
                # may reap it at once: look without sleeping at first.
                until = time.monotonic() + _REPARENT_WAIT
                spins = 0
                while os.getppid() == self.rank_pid and time.monotonic() < until:
                    spins += 1
                    if spins > 2000:
                        time.sleep(0.001)
                    elif spins % 50 == 0:
                        os.sched_yield()
                if os.getppid() == self.rank_pid:
                    # The rank closed its end and lives on: keep watching
                    # its pid instead.
                    with self.changed:
                        self.pipe_lost = True
                        self.changed.notify_all()
                    return
            code = self.read_exit_code()
            with self.changed:
                if self.eof_ms is not None:
                    seen_ms = min(seen_ms, self.eof_ms)
            launcher_gone = self.launcher_exited(seen_ms)
            self.remove_stacks_file()
            # Outside the lock: asking the machine why may take a moment.
            final = self.decide(code, seen_ms, launcher_gone)
            with self.changed:
                self.gone = True
                self.final = final
                self.changed.notify_all()

    def launcher_exited(self, now_ms: int) -> bool:
        """True when the rank's launcher has exited (a pidfd of an exited
        process reads ready); notes when it was first seen so."""
        if self.launcher_gone_ms is not None:
            return True
        fd = self.launcher_fd
        if fd is None:
            return False
        try:
            ready, _, _ = select.select([fd], [], [], 0)
        except (OSError, ValueError):
            return False
        if ready:
            self.launcher_gone_ms = now_ms
        return bool(ready)

    def launcher_note(self) -> str:
        """The words that say the launcher had exited before the rank."""
        launcher = self.launcher or {}
        name = launcher.get("name") or "launcher"
        return f"the launcher ({name}, pid {_int(launcher.get('pid'))}) had exited before this rank"

    def read_exit_code(self) -> Optional[int]:
        """How the dead rank ended: from ``/proc`` while it is a zombie, else
        from its pidfd once reaped (Linux 6.15+); ``None`` if neither says."""
        code = _proc.exit_code(self.rank_pid, self.rank_started)
        if code is not None or self.pidfd is None:
            return code
        # Reaped, or being reaped: the kernel records the exit as it reaps.
        until = time.monotonic() + 0.05
        while True:
            code = _proc.pidfd_exit_code(self.pidfd)
            if code is not None or time.monotonic() > until:
                return code
            time.sleep(0.002)

    def decide(self, code: Optional[int], seen_ms: int, launcher_gone: bool = False) -> Optional[Dict[str, Any]]:
        """The rank's end: its own report when it made one, else what its
        death shows; when the launcher had exited before, a failure says so."""
        if self.closed:
            return None
        if self.ending is not None:
            # The head ended the rank: its words, whatever the rank said or
            # the signal that ended it.
            return {"status": "ERRORED", "cause": "NO_PROGRESS", "how": "KILLED", "detail": self.ending, "ended_at_ms": seen_ms, "judged": True}
        if self.own_end is not None:
            own = dict(self.own_end)
            if not own.get("judged"):
                own["judged"] = True
                own["cause"], own["detail"] = self.judge(own.get("status"), own.get("cause"), own.get("how"), own.get("detail") or "", None, seen_ms)
            if launcher_gone and own.get("status") != "FINISHED":
                own["detail"] = f"{own.get('detail') or ''}\n({self.launcher_note()})".lstrip("\n")
            return own
        note = self.exit_note
        if code is None and note is not None:
            # Reaped before it could be read, but it reached its exit: the
            # status it was exiting with, as far as it knew.
            code = (_int(note.get("status")) & 0xFF) << 8
        status, cause, how, detail = _proc.describe(code)
        signum = code & 0x7F if code is not None else None
        cause, detail = self.judge(status, cause, how, detail, signum, seen_ms)
        at_ms = seen_ms
        if note is not None and how in (None, "EXITED"):
            at_ms = _int(note.get("at_ms")) or seen_ms
            message = note.get("message")
            if how == "EXITED" and isinstance(message, str) and message and code is not None and (code >> 8) & 0xFF == _int(note.get("status")):
                detail = f"{detail}: {message}"
        if launcher_gone and status != "FINISHED":
            detail = f"{detail}; {self.launcher_note()}" if detail else self.launcher_note()
        end: Dict[str, Any] = {"status": status, "detail": detail, "ended_at_ms": at_ms}
        if cause is not None:
            end["cause"] = cause
        if how is not None:
            end["how"] = how
        return end

    def judge(self, status: Any, cause: Any, how: Any, detail: str, signum: Optional[int], at_ms: int) -> Tuple[Any, str]:
        """The cause and detail of the rank's end with what the machine
        says of it (:mod:`trainstate._causes`); as they were when it says
        nothing, or cannot be read."""
        if self.causes is None or not isinstance(status, str):
            return cause, detail
        try:
            return self.causes.judge(status, cause, how, detail, signum, at_ms)
        except Exception:  # noqa: BLE001 - the end is reported without it
            return cause, detail

    # What the rank is told.

    def tell_rank(self) -> None:
        """Writes the head's last answer to the rank when it changed; never
        blocks (the rank may be stuck holding its GIL, or gone)."""
        with self.lock:
            state = {
                "run_id": self.run_id,
                "attempt_id": self.attempt_id,
                "run_status": self.run_status,
                "lease_ms": self.lease_ms,
                "joined": self.joined,
                "tried": self.tried,
                "given_up": self.given_up,
            }
            if self.warning is not None:
                state["warning"] = self.warning
        line = json.dumps(state, separators=(",", ":"))
        if line == self.last_sent or self.out_fd < 0:
            return
        try:
            self.out.send(line.encode("utf-8") + b"\n", socket.MSG_DONTWAIT | getattr(socket, "MSG_NOSIGNAL", 0))
            self.last_sent = line
        except BlockingIOError:
            pass
        except OSError:
            self.out_fd = -1

    def warn_once(self, message: str) -> None:
        with self.lock:
            if self.warned:
                return
            self.warned = True
        if self.warn_enabled:
            try:
                os.write(2, (message + "\n").encode("utf-8", "replace"))
            except OSError:
                pass
        self.release_stderr()

    def release_stderr(self) -> None:
        """Once the rank is gone and nothing is left to say, lets go of its
        stderr, so a reader of the rank's output sees it end."""
        with self.lock:
            done = self.gone and (self.warned or not self.warn_enabled)
        if done:
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 2)
                os.close(devnull)
            except OSError:
                pass

    # Requests.

    def call(self, route: Route, path: str, body: Any) -> RendezvousResponse:
        """Sends one request of the rendezvous; every one answers a
        ``RendezvousResponse``."""
        try:
            answer = _http.request(self.url, route, path, body, self.token, self.timeout, self.ca_cert)
            # The wire boundary: the head answers this route with this document.
            return cast(RendezvousResponse, answer)
        except _http.Unreachable as err:
            self.warn_once(
                f"trainstate: cannot reach the head ({err}); training goes on, and this rank keeps trying in the background"
            )
            raise
        except _http.HeadError as err:
            if err.retryable:
                self.warn_once(
                    f"trainstate: the head is unavailable ({err}); training goes on, and this rank keeps trying in the background"
                )
                raise _http.Unreachable(str(err)) from None
            raise

    def accept(self, answer: RendezvousResponse) -> None:
        with self.changed:
            self.run_id = answer.get("run_id", self.run_id)
            self.attempt_id = str(answer.get("attempt_id", self.attempt_id))
            self.run_status = answer.get("run_status")
            try:
                self.lease_ms = int(answer.get("lease_ms") or self.lease_ms)
            except (TypeError, ValueError):
                pass
            self.joined = True
            # A warning of the head's about this rank (its node is a
            # suspect), passed on for the rank to log.
            warning = cast(Dict[str, Any], answer).get("warning")
            if isinstance(warning, str) and warning.strip():
                self.warning = warning.strip()
            self.changed.notify_all()
        self.tell_rank()
        order = answer.get("capture")
        if isinstance(order, dict):
            self.start_capture(cast(Dict[str, Any], order))
        end_rank = answer.get("end_rank")
        if isinstance(end_rank, str):
            self.end_rank(end_rank)

    def give_up(self, err: _http.HeadError, what: str) -> None:
        self.warn_once(f"trainstate: the head refused {what} ({err}); this rank stops reporting, training goes on")
        with self.changed:
            self.given_up = True
            self.tried = True
            self.changed.notify_all()
        self.tell_rank()

    def join(self) -> None:
        config = self.config
        body: JoinRequest = {
            "world_size": config["world_size"],
            "attempt": config.get("attempt", 0),
            "worker": config["worker"],
            "name": config["name"],
            "job_id": config["job_id"],
        }
        if config.get("join_timeout_ms") is not None:
            body["join_timeout_ms"] = config["join_timeout_ms"]
        if config.get("process_start_ms") is not None:
            body["process_start_ms"] = config["process_start_ms"]
        if config.get("stall_after_ms") is not None:
            body["stall_after_ms"] = config["stall_after_ms"]
        if config.get("on_stall") is not None:
            body["on_stall"] = config["on_stall"]
            if config.get("abort_after_ms") is not None:
                body["abort_after_ms"] = config["abort_after_ms"]
        if self.run_id is not None:
            body["run_id"] = self.run_id
        try:
            answer = self.call(JOIN_RENDEZVOUS, _http.url_path(JOIN_RENDEZVOUS, key=config["key"]), body)
        except _http.HeadError as err:
            self.give_up(err, f"rank {self.rank}'s join")
            return
        except _http.Unreachable:
            with self.lock:
                self.tried = True
            self.tell_rank()
            raise
        with self.lock:
            self.tried = True
        self.accept(answer)

    def take_progress_to_send(self) -> Optional[RankProgress]:
        """The progress the next heartbeat carries, whole: the latest step,
        total and phase, the 32 most recently changed metrics, and what is
        left of an announced wait (the same end, however often it is sent).
        ``None`` before the rank reported any."""
        with self.lock:
            progress: RankProgress = dict(self.progress)  # type: ignore[assignment]
            if self.progress_metrics:
                names = list(self.progress_metrics)[-MAX_METRIC_NAMES_PER_REPORT:]
                progress["metrics"] = {name: self.progress_metrics[name] for name in names}
            if self.progress_wait_until is not None:
                left = self.progress_wait_until - time.monotonic()
                if left > 0:
                    progress["expect_next_within_ms"] = int(left * 1000)
                else:
                    self.progress_wait_until = None
            self.progress_new = False
        return progress or None

    def keep_unsent(self) -> None:
        """A heartbeat carried progress but got no answer: the next one
        carries it again, as soon as it may."""
        with self.lock:
            self.progress_new = True

    def drop_progress(self, err: _http.HeadError) -> None:
        """The head refused the progress itself: forget it, and say so once."""
        with self.lock:
            self.progress = {}
            self.progress_metrics = {}
            self.progress_wait_until = None
            warn = not self.progress_warned and self.warn_enabled
            self.progress_warned = True
        if warn:
            try:
                os.write(2, f"trainstate: the head refused rank {self.rank}'s progress ({err}); it is dropped, training goes on\n".encode("utf-8", "replace"))
            except OSError:
                pass

    def progress_due(self) -> Optional[float]:
        """When new progress makes a heartbeat due (monotonic), if it does."""
        with self.lock:
            new = self.progress_new
        return self.last_beat + _PROGRESS_INTERVAL if new else None

    def heartbeat(self) -> None:
        path = _http.url_path(HEARTBEAT_RANK, id=str(self.run_id), rank=self.rank)
        body: RankHeartbeatRequest = {"attempt_id": self.attempt_id}
        progress = self.take_progress_to_send()
        if progress is not None:
            body["progress"] = progress
        self.last_beat = time.monotonic()
        try:
            try:
                answer = self.call(HEARTBEAT_RANK, path, body)
            except _http.HeadError as err:
                if progress is None or err.status not in (409, 422):
                    raise
                # A step that went back, or progress the head finds invalid:
                # if the same heartbeat without it is taken, the progress was
                # what it refused.
                answer = self.call(HEARTBEAT_RANK, path, {"attempt_id": self.attempt_id})
                self.drop_progress(err)
        except _http.Unreachable:
            if progress is not None:
                self.keep_unsent()
            raise
        except _http.HeadError as err:
            if progress is not None:
                self.keep_unsent()
            with self.lock:
                if err.status == 404:
                    # The head forgot the group (a restart): join again, keeping the run id.
                    self.joined = False
                else:
                    # The attempt was replaced, or refused: no more heartbeats.
                    self.heartbeats_stopped = True
            return
        self.accept(answer)
        if self.run_status in TERMINAL_RUN_STATUSES:
            with self.lock:
                self.heartbeats_stopped = True

    def send_pending_progress(self) -> None:
        """Sends the progress the rank handed over since the last heartbeat,
        before its end: the last second of progress (the last step, its
        metrics) is not lost at exit."""
        with self.lock:
            pending = self.progress_new and self.joined and not self.heartbeats_stopped
        if pending:
            self.heartbeat()

    def send_end(self, end: Dict[str, Any]) -> bool:
        """Sends the rank's end; True when it is settled (sent, or refused).
        Progress not sent yet goes first, on a heartbeat of its own."""
        self.send_pending_progress()
        detail = end.get("detail")
        body: RankEndRequest = {
            "attempt_id": self.attempt_id,
            "status": end["status"],
            "detail": detail[-MAX_TRACE_LEN:] if isinstance(detail, str) else "",
            "restarts_remaining": int(self.config.get("restarts_remaining", 0)),
        }
        if end.get("cause") is not None:
            body["cause"] = end["cause"]
        if end.get("how") is not None:
            body["how"] = end["how"]
        if end.get("ended_at_ms") is not None:
            body["ended_at_ms"] = end["ended_at_ms"]
        path = _http.url_path(END_RANK, id=str(self.run_id), rank=self.rank)
        try:
            answer = self.call(END_RANK, path, body)
        except _http.HeadError as err:
            if err.status == 404:
                with self.lock:
                    self.joined = False
                return False
            return True
        self.accept(answer)
        return True

    # What the head orders: a capture of the rank's stacks, the rank's end.

    def rank_alive(self) -> bool:
        """False once the rank has exited (its pidfd reads ready, or this
        watcher was re-parented)."""
        with self.lock:
            if self.gone:
                return False
        if self.pidfd is not None:
            try:
                ready, _, _ = select.select([self.pidfd], [], [], 0)
                return not ready
            except (OSError, ValueError):
                pass
        return os.getppid() == self.rank_pid

    def signal_rank(self, signum: int) -> bool:
        """Sends ``signum`` to the rank, never to another process (through
        its pidfd, else only while the rank is this watcher's parent); True
        when it was sent."""
        if not self.rank_alive():
            return False
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, signum)
                return True
            except ProcessLookupError:
                return False
            except (OSError, AttributeError):
                pass
        if os.getppid() != self.rank_pid:
            return False
        try:
            os.kill(self.rank_pid, signum)
            return True
        except OSError:
            return False

    def start_capture(self, order: Dict[str, Any]) -> None:
        """Answers a capture order once, in a thread of its own, so that
        heartbeats go on meanwhile; an order that comes again while its
        capture is under way, or after it was answered, changes nothing."""
        capture_id = order.get("capture_id")
        within_ms = order.get("answer_within_ms")
        if not isinstance(capture_id, int) or isinstance(capture_id, bool):
            return
        if not isinstance(within_ms, int) or isinstance(within_ms, bool) or within_ms < 0:
            within_ms = _DEFAULT_ANSWER_WITHIN_MS
        with self.lock:
            busy = self.capturing is not None and self.capturing.is_alive()
            if capture_id in self.answered or busy or self.ending is not None or self.gone or self.run_id is None:
                return
            self.answered = (self.answered + [capture_id])[-_MAX_ANSWERED:]
            run_id, attempt_id = self.run_id, self.attempt_id
            thread = threading.Thread(
                target=self.capture_and_post,
                args=(capture_id, min(within_ms, _MAX_ANSWER_WITHIN_MS) / 1000.0, run_id, attempt_id),
                name="trainstate-watch-stacks",
                daemon=True,
            )
            self.capturing = thread
        thread.start()

    def capture(self, within: float) -> RankStackReport:
        """The rank's stacks, within ``within`` seconds
        (:func:`trainstate._stacks.capture`); a rank that turned the
        capture off is answered as such, and is not read by ``py-spy``."""
        if self.stacks is None:
            return {"rank": self.rank, "source": "watcher", "stack": "", "truncated": False,
                    "note": "stack capture is turned off in this rank (TRAINSTATE_STACKS=off or init(capture_stacks=False))"}
        return _stacks.capture(self.stacks, self.rank, self.signal_rank, within, self.rank_env, py_spy_pid=self.rank_pid)

    def capture_and_post(self, capture_id: int, within: float, run_id: str, attempt_id: str) -> None:
        """Captures the rank's stacks and posts them as its answer to
        ``capture_id``, retrying an unreachable head until the capture's
        deadline; a refusal (an old head without the route, a capture
        already complete) is not retried."""
        try:
            report = self.capture(within)
        except Exception:  # noqa: BLE001 - a capture never breaks the watcher
            return
        body: StacksRequest = {"capture_id": capture_id, "attempt_id": attempt_id, "ranks": [report]}
        path = _http.url_path(POST_RUN_STACKS, id=run_id)
        until = time.monotonic() + _MAX_ANSWER_WITHIN_MS / 1000.0
        pause = 0.25
        while True:
            try:
                _http.request(self.url, POST_RUN_STACKS, path, body, self.token, self.timeout, self.ca_cert)
                return
            except _http.HeadError as err:
                if not err.retryable:
                    return
            except _http.Unreachable:
                pass
            except Exception:  # noqa: BLE001
                return
            if time.monotonic() + pause > until:
                return
            time.sleep(pause)
            pause = min(pause * 2, 2.0)

    def end_rank(self, words: str) -> None:
        """Ends the rank as the head asks (once): SIGTERM, then SIGKILL
        after :data:`END_GRACE` if it lives. Its end is then reported with
        the head's words, ERRORED with cause NO_PROGRESS."""
        with self.changed:
            if self.ending is not None or self.gone or self.closed:
                return
            self.ending = words.strip() or "The head ended this rank: the run made no progress."
            self.changed.notify_all()
        threading.Thread(target=self.stop_rank, name="trainstate-watch-end", daemon=True).start()

    def stop_rank(self) -> None:
        if not self.signal_rank(signal.SIGTERM):
            return
        until = time.monotonic() + END_GRACE
        while self.rank_alive() and time.monotonic() < until:
            with self.changed:
                self.changed.wait(0.05)
        if self.rank_alive():
            self.signal_rank(signal.SIGKILL)

    def remove_stacks_file(self) -> None:
        """Removes the rank's stacks file and its private directory, once
        the rank is gone (a rank that reaches its exit removes them itself)."""
        directory = (self.stacks or {}).get("directory")
        if isinstance(directory, str) and os.path.basename(directory).startswith("trainstate-stacks-"):
            shutil.rmtree(directory, ignore_errors=True)

    # The loop.

    def interval(self) -> float:
        """The time between heartbeats now (see :func:`beat_interval`)."""
        with self.lock:
            last_advance = self.last_advance
        stuck_for = time.monotonic() - last_advance if last_advance is not None else None
        return beat_interval(self.lease_ms, stuck_for)

    def beat_due(self, next_beat: float) -> float:
        """When the next heartbeat is due (monotonic): the one planned, or
        sooner once the rank is stuck and the faster beat comes first."""
        return min(next_beat, self.last_beat + self.interval())

    def run(self) -> None:
        """Joins, heartbeats and watches until the rank's end is settled."""
        backoff = 0.5
        next_beat = 0.0
        retry_at = 0.0
        while True:
            with self.changed:
                closed, given_up, gone, final, own_end = self.closed, self.given_up, self.gone, self.final, self.own_end
            if closed or given_up:
                return
            if gone:
                self.release_stderr()
                if final is not None:
                    self.finish(final)
                return
            if own_end is not None and not self.own_end_checked:
                # The rank's own end, as it reports it: judged once with
                # what the machine says, and said whether its launcher had
                # exited before.
                self.own_end_checked = True
                launcher_gone = self.launcher_exited(_proc.now_ms())
                with self.changed:
                    own_end = self.decide(None, _proc.now_ms(), launcher_gone) or own_end
                    self.own_end = own_end
            if own_end is not None and self.settle(own_end):
                # The rank reported its own end: nothing is left to watch.
                return
            now = time.monotonic()
            if os.getppid() != self.rank_pid:
                seen_ms = _proc.now_ms()
                # The reader may be about to date the end of file, which is
                # nearer the death than this poll: give it a moment.
                with self.changed:
                    if self.eof_ms is None:
                        self.changed.wait(0.05)
                self.rank_gone(seen_ms, wait_for_reparent=False)
                continue
            self.launcher_exited(_proc.now_ms())
            if now >= retry_at:
                try:
                    if not self.joined:
                        self.join()
                        next_beat = time.monotonic() + self.interval()
                    elif not self.heartbeats_stopped and (now >= self.beat_due(next_beat) or now >= (self.progress_due() or next_beat)):
                        self.heartbeat()
                        next_beat = time.monotonic() + self.interval()
                    backoff = 0.5
                except _http.Unreachable:
                    retry_at = time.monotonic() + backoff
                    backoff = min(backoff * 2, _MAX_BACKOFF)
                except Exception:  # noqa: BLE001 - keep watching
                    retry_at = time.monotonic() + backoff
                    backoff = min(backoff * 2, _MAX_BACKOFF)
            if time.monotonic() < retry_at:
                due = retry_at
            elif self.joined and not self.heartbeats_stopped:
                due = min(self.beat_due(next_beat), self.progress_due() or next_beat)
            else:
                due = time.monotonic() + _POLL
            wake = min(max(due - time.monotonic(), 0.01), _POLL)
            with self.changed:
                if not (self.gone or self.closed or self.given_up or self.own_end is not None):
                    self.changed.wait(max(wake, 0.0))

    def settle(self, end: Dict[str, Any]) -> bool:
        """Sends the live rank's own end (once joined); True when settled."""
        try:
            if not self.joined:
                self.join()
                if not self.joined:
                    return self.given_up
            return self.send_end(end)
        except _http.Unreachable:
            # Retried at the next turn; the rank's death settles it at the latest.
            with self.changed:
                if not self.gone:
                    self.changed.wait(1.0)
            return False

    def finish(self, end: Dict[str, Any]) -> None:
        """Sends the dead rank's end: a few deadlines at most, then gives up."""
        until = time.monotonic() + _FINAL_TRIES * self.timeout + 1.0
        pause = 0.25
        while time.monotonic() < until:
            try:
                if not self.joined:
                    self.join()
                    if not self.joined:
                        return
                if self.send_end(end):
                    return
            except _http.Unreachable:
                pass
            except Exception:  # noqa: BLE001
                return
            time.sleep(min(pause, max(until - time.monotonic(), 0.0)))
            pause = min(pause * 2, 1.0)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def main() -> None:
    """``python -m trainstate._watch``: the configuration is the first line
    of stdin."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(signum, signal.SIG_IGN)
        except (OSError, ValueError):
            pass
    # Our stdout is the pipe to the rank and nothing else: anything that
    # prints goes nowhere.
    out_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.close(devnull)
    sys.stdout = open(os.devnull, "w")
    config = _read_config(0)
    try:
        watcher = Watcher(config, out_fd) if config is not None else None
    except Exception:  # noqa: BLE001 - a configuration we cannot use
        watcher = None
    if watcher is None:
        os._exit(0)
    reader = threading.Thread(target=watcher.read_rank, args=(0,), name="trainstate-watch-rank", daemon=True)
    reader.start()
    try:
        watcher.run()
    except BaseException:  # noqa: BLE001 - never print a traceback into the rank's stderr
        pass
    watcher.release_stderr()
    os._exit(0)


def _read_config(fd: int) -> Optional[Dict[str, Any]]:
    line = b""
    while not line.endswith(b"\n"):
        try:
            byte = os.read(fd, 1)
        except InterruptedError:
            continue
        except OSError:
            return None
        if not byte:
            return None
        line += byte
    try:
        config = json.loads(line.decode("utf-8"))
    except ValueError:
        return None
    return config if isinstance(config, dict) else None


if __name__ == "__main__":
    main()
