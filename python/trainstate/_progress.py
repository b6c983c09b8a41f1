"""A rank's progress: what :func:`trainstate.report` keeps, checks and hands
to the watcher.

A report only updates the rank's latest state (its step, total steps,
phase and the scalars that changed since the last hand-over), which costs a
few microseconds; about once a second that coalesced state is handed to the
watcher as one JSON line ``{"progress": {...}}``, written without blocking.

A hand-over whose step grew carries the rank's time per step over the
interval (``step_time_ms``), from which the head tells stragglers: the mean
of the ``step_time`` values the caller reported since the last hand-over
(its own work, which in lock-step training differs from rank to rank),
else the wall time per step between the advances the interval saw
(Δtime/Δstep, the same on every rank of lock-step training).
When the socket would block, the line is not written and the state stays
coalesced for the next hand-over: only the latest values matter. A daemon
thread hands over what a rank reported just before it went quiet.

Invalid input (a value that is not a finite number, a bad name, too many
names, a step that goes back) is dropped, with at most one warning line per
kind; nothing here raises into the caller, but for one thing: a checkpoint
mark (``checkpoint``, "progress up to this step is saved") that breaks a
rule raises ``ValueError`` naming ``checkpoint``, and the report it came
with is not taken. A mark decides what a failure counts as lost, so a
wrong one is the caller's mistake to hear about, not a value to drop.

A mark is kept like the step: every hand-over carries the rank's highest
mark, so a later report without one keeps it.

The limits are the head's (``trainstate-schema``'s ``limits.rs``).
"""

import logging
import math
import operator
import re
import threading
import time
from typing import Any, Callable, Dict, Mapping, Optional, Set, Tuple

from .types import RankProgress

logger = logging.getLogger("trainstate")

MAX_METRIC_NAMES_PER_REPORT = 32
"""The most metric names one heartbeat's progress may carry."""
MAX_METRIC_NAMES_PER_RUN = 64
"""The most distinct metric names a run may have."""
MAX_METRIC_NAME_LEN = 128
"""The longest metric name, in characters."""
MAX_PHASE_LEN = 64
"""The longest phase, in characters."""
MAX_EXPECT_NEXT_WITHIN_MS = 604_800_000
"""The longest announced wait for the next advance: 7 days."""
MIN_STALL_AFTER_MS = 1_000
"""The shortest stall window a run may ask for."""
MAX_STALL_AFTER_MS = 604_800_000
"""The longest stall window a run may ask for: 7 days."""
MAX_STEP_TIME_MS = 604_800_000
"""The longest time per step a rank may report: 7 days."""
MAX_STEP = 2**64 - 1
"""Steps are unsigned 64-bit integers on the wire."""

HAND_OVER_INTERVAL = 1.0
"""How often, at most, the coalesced state goes to the watcher, in seconds."""

_METRIC_NAME = re.compile(r"[A-Za-z0-9_.:/-]{1,%d}" % MAX_METRIC_NAME_LEN)


def valid_phase(phase: str) -> bool:
    """1 to 64 characters of printable ASCII."""
    return 1 <= len(phase) <= MAX_PHASE_LEN and all(" " <= c <= "~" for c in phase)


def valid_metric_name(name: str) -> bool:
    """1 to 128 characters of ``[A-Za-z0-9_.:/-]``."""
    return _METRIC_NAME.fullmatch(name) is not None


def stall_after_ms(seconds: Optional[float]) -> Optional[int]:
    """The join's ``stall_after_ms`` for ``init(stall_after=seconds)``, or
    ``None`` (with one warning) when it is out of range."""
    if seconds is None:
        return None
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or not MIN_STALL_AFTER_MS <= value * 1000 <= MAX_STALL_AFTER_MS:
        logger.warning("trainstate: stall_after=%r is not between 1 s and 7 days; the head's stall window applies", seconds)
        return None
    return int(round(value * 1000))


MAX_ABORT_AFTER_MS = 604_800_000
"""The longest grace between a stall and the end of its ranks: 7 days."""


def stall_action(on_stall: Optional[str], abort_after: Optional[float]) -> Tuple[Optional[str], Optional[int]]:
    """The join's ``on_stall`` and ``abort_after_ms`` for
    ``init(on_stall=..., abort_after=seconds)``: nothing for ``"detect"``
    (the head's default), ``"ABORT"`` and the grace in ms (the head's
    default when ``abort_after`` is ``None``) for ``"abort"``. A word that
    is neither, or a grace out of 0 s to 7 days, is dropped with one
    warning: the run then only detects."""
    word = (on_stall or "detect").strip().lower() if isinstance(on_stall, str) else on_stall
    if word == "detect":
        return None, None
    if word != "abort":
        logger.warning("trainstate: on_stall=%r is neither 'detect' nor 'abort'; a stall is only detected", on_stall)
        return None, None
    if abort_after is None:
        return "ABORT", None
    try:
        value = float(abort_after)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or not 0 <= value * 1000 <= MAX_ABORT_AFTER_MS:
        logger.warning("trainstate: abort_after=%r is not between 0 s and 7 days; the head's default grace applies", abort_after)
        return "ABORT", None
    return "ABORT", int(round(value * 1000))


class CheckpointError(ValueError):
    """A checkpoint mark that breaks a rule; the message names ``checkpoint``."""


def checked_checkpoint(checkpoint: Any) -> int:
    """``checkpoint`` as a step, or ``ValueError`` naming it: a whole
    number (an ``int``, not a ``bool``) from 0 to 2**64-1."""
    if isinstance(checkpoint, bool) or not isinstance(checkpoint, int):
        raise CheckpointError(f"checkpoint must be a step, a whole number (int) from 0 to 2**64-1, not {checkpoint!r}")
    if not 0 <= checkpoint <= MAX_STEP:
        raise CheckpointError(f"checkpoint must be a step from 0 to 2**64-1, not {checkpoint}")
    return int(checkpoint)


class Progress:
    """The rank's latest progress, and its hand-over to the watcher.

    ``send`` writes one message to the watcher without blocking and answers
    whether it was written; ``wait=False`` asks it not to wait for a line
    half written either. ``clock`` is the monotonic clock, in seconds.
    """

    def __init__(
        self, send: Callable[[Dict[str, Any], bool], bool], interval: float = HAND_OVER_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._send = send
        self._interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._step: Optional[int] = None
        self._total_steps: Optional[int] = None
        self._phase: Optional[str] = None
        self._expect_ms: Optional[int] = None
        # The rank's highest checkpoint mark: progress up to it is saved.
        self._checkpoint: Optional[int] = None
        self._metrics: Dict[str, float] = {}
        self._names: Set[str] = set()
        # The step times the caller reported since the last hand-over (their
        # sum in ms, and how many), when the step last grew (monotonic), and
        # the step and time the next hand-over's wall time per step is
        # counted from.
        self._step_time_sum = 0.0
        self._step_time_count = 0
        self._advanced_at: Optional[float] = None
        self._counted_from: Optional[Tuple[int, float]] = None
        self._dirty = False
        self._due = 0.0
        self._warned: Set[str] = set()
        self._flusher: Optional[threading.Thread] = None
        self.handed_over = 0
        """How many hand-overs were written (for tests and curiosity)."""

    def report(
        self,
        metrics: Optional[Mapping[str, Any]],
        step: Optional[Any],
        total_steps: Optional[Any],
        phase: Optional[str],
        expect_next_within: Optional[float],
        step_time: Optional[float] = None,
        checkpoint: Optional[int] = None,
    ) -> None:
        """Takes one report; hands the state over when it is due. A
        ``checkpoint`` that breaks a rule raises ``ValueError`` (see
        :meth:`_check_checkpoint`) and nothing of the report is taken."""
        with self._lock:
            if checkpoint is not None:
                checkpoint = self._check_checkpoint(checkpoint, step)
            if step is not None:
                self._take_step(step)
            if step_time is not None:
                self._take_step_time(step_time)
            if total_steps is not None:
                total = self._count("total_steps", total_steps)
                if total is not None:
                    self._total_steps = total
            if phase is not None and phase != self._phase:
                if isinstance(phase, str) and valid_phase(phase):
                    self._phase = phase
                else:
                    self._warn("phase", f"phase {phase!r} is not 1 to {MAX_PHASE_LEN} printable ASCII characters")
            if metrics:
                self._take_metrics(metrics)
            if checkpoint is not None:
                self._checkpoint = checkpoint if self._checkpoint is None else max(self._checkpoint, checkpoint)
            urgent = False
            if expect_next_within is not None:
                urgent = self._take_expect(expect_next_within)
            self._dirty = True
            due = urgent or self._clock() >= self._due
        if due:
            self.flush()
        if self._flusher is None:
            self._start_flusher()

    def _check_checkpoint(self, checkpoint: Any, step: Any) -> int:
        """The mark ``checkpoint``, checked against the rank's own step
        (``step`` when this report's is valid, else the latest reported)
        and its previous mark; ``ValueError`` naming ``checkpoint`` when it
        is not a step, is ahead of the rank's step (or the rank has none
        yet) or is lower than its previous mark. Changes nothing."""
        mark = checked_checkpoint(checkpoint)
        own = self._step
        if step is not None and not isinstance(step, bool):
            try:
                value: Optional[int] = operator.index(step)
            except TypeError:
                value = None
            if value is not None and 0 <= value <= MAX_STEP and (own is None or value >= own):
                own = value
        if own is None:
            raise CheckpointError(f"checkpoint={mark} needs the rank's step: report the step with the mark, or before it")
        if mark > own:
            raise CheckpointError(f"checkpoint={mark} is ahead of the rank's step {own}: a mark says progress up to a step it reached is saved")
        if self._checkpoint is not None and mark < self._checkpoint:
            raise CheckpointError(f"checkpoint={mark} is lower than the rank's previous mark {self._checkpoint} (marks never go back)")
        return mark

    def _take_step(self, step: Any) -> None:
        value = self._count("step", step)
        if value is None:
            return
        if self._step is not None and value < self._step:
            self._warn("step_back", f"step {value} is lower than the step {self._step} reported before (steps never go back)")
            return
        if self._step is None or value > self._step:
            self._advanced_at = self._clock()
            if self._counted_from is None:
                self._counted_from = (value, self._advanced_at)
        self._step = value

    def _take_step_time(self, seconds: Any) -> None:
        try:
            value = float(seconds) * 1000.0
        except (TypeError, ValueError, OverflowError):
            value = math.nan
        if not (math.isfinite(value) and 0 < value <= MAX_STEP_TIME_MS):
            self._warn("step_time", f"step_time={seconds!r} is not a number of seconds greater than 0 and at most 7 days")
            return
        self._step_time_sum += value
        self._step_time_count += 1

    def _step_time_ms(self) -> Optional[float]:
        """The time per step of the interval since the last hand-over (ms):
        the mean of the caller's step times, else the wall time per step
        between the advances it saw; ``None`` when the step did not grow."""
        if self._counted_from is None or self._step is None or self._advanced_at is None:
            return None
        first_step, first_at = self._counted_from
        if self._step <= first_step:
            return None
        if self._step_time_count:
            return round(self._step_time_sum / self._step_time_count, 3)
        wall = (self._advanced_at - first_at) * 1000.0 / (self._step - first_step)
        return round(wall, 3) if 0 < wall <= MAX_STEP_TIME_MS else None
    def _count(self, kind: str, value: Any) -> Optional[int]:
        if type(value) is not int:
            try:
                value = None if isinstance(value, bool) else operator.index(value)
            except TypeError:
                value = None
        if value is None or not 0 <= value <= MAX_STEP:
            self._warn(kind, f"{kind} must be a whole number from 0 to 2**64-1")
            return None
        return int(value)

    def _take_metrics(self, metrics: Mapping[str, Any]) -> None:
        names = self._names
        taken = 0
        for name, value in metrics.items():
            if taken >= MAX_METRIC_NAMES_PER_REPORT:
                self._warn("metric_names_per_report", f"more than {MAX_METRIC_NAMES_PER_REPORT} metrics in one report; {name!r} and later ones are dropped")
                break
            new = name not in names
            if new:
                if not isinstance(name, str) or not valid_metric_name(name):
                    self._warn("metric_name", f"metric name {name!r} is not 1 to {MAX_METRIC_NAME_LEN} characters of [A-Za-z0-9_.:/-]")
                    continue
                if len(names) >= MAX_METRIC_NAMES_PER_RUN:
                    self._warn("metric_names_per_run", f"metric {name!r} would make more than {MAX_METRIC_NAMES_PER_RUN} names in the run")
                    continue
            if type(value) is not float:
                try:
                    value = float(value)
                except (TypeError, ValueError, OverflowError):
                    value = math.nan
            if value - value != 0.0:  # NaN or an infinity
                self._warn("metric_value", f"metric {name!r} is not a finite number ({value!r})")
                continue
            if new:
                names.add(name)
            self._metrics[name] = value
            taken += 1

    def _take_expect(self, seconds: Any) -> bool:
        try:
            value = float(seconds)
        except (TypeError, ValueError, OverflowError):
            value = math.nan
        if not math.isfinite(value) or not 0 <= value * 1000 <= MAX_EXPECT_NEXT_WITHIN_MS:
            self._warn("expect_next_within", f"expect_next_within={seconds!r} is not between 0 s and 7 days")
            return False
        self._expect_ms = int(round(value * 1000))
        return True

    def _warn(self, kind: str, message: str) -> None:
        if kind in self._warned:
            return
        self._warned.add(kind)
        logger.warning("trainstate: %s; dropped (training goes on)", message)

    def flush(self) -> bool:
        """Hands the coalesced state to the watcher now, without blocking;
        True when it went (or there was nothing new)."""
        with self._lock:
            if not self._dirty:
                return True
            progress: RankProgress = {}
            if self._step is not None:
                progress["step"] = self._step
            if self._total_steps is not None:
                progress["total_steps"] = self._total_steps
            if self._phase is not None:
                progress["phase"] = self._phase
            if self._expect_ms is not None:
                progress["expect_next_within_ms"] = self._expect_ms
            if self._checkpoint is not None:
                progress["checkpoint"] = self._checkpoint
            metrics, self._metrics = self._metrics, {}
            if metrics:
                progress["metrics"] = metrics
            step_time_ms = self._step_time_ms()
            if step_time_ms is not None:
                progress["step_time_ms"] = step_time_ms
            step_times = (self._step_time_sum, self._step_time_count)
            counted_from = self._counted_from
            if step_time_ms is not None and self._step is not None and self._advanced_at is not None:
                self._step_time_sum, self._step_time_count = 0.0, 0
                self._counted_from = (self._step, self._advanced_at)
            expect, self._expect_ms = self._expect_ms, None
            self._dirty = False
            self._due = self._clock() + self._interval
        if self._send({"progress": progress}, False):
            self.handed_over += 1
            return True
        # The socket would block: keep the latest for the next hand-over.
        with self._lock:
            for name, value in metrics.items():
                self._metrics.setdefault(name, value)
            if step_time_ms is not None:
                self._step_time_sum += step_times[0]
                self._step_time_count += step_times[1]
                self._counted_from = counted_from
            if self._expect_ms is None:
                self._expect_ms = expect
            self._dirty = True
        return False

    def _start_flusher(self) -> None:
        with self._lock:
            if self._flusher is not None:
                return
            self._flusher = threading.Thread(target=self._flush_when_due, name="trainstate-progress", daemon=True)
        self._flusher.start()

    def _flush_when_due(self) -> None:
        """Hands over what a report left pending once it is due, so a rank
        that went quiet right after reporting is still heard."""
        while True:
            with self._lock:
                wait = self._due - self._clock() if self._dirty else self._interval
            time.sleep(min(max(wait, 0.05), self._interval))
            with self._lock:
                due = self._dirty and self._clock() >= self._due
            if due:
                try:
                    self.flush()
                except Exception:  # noqa: BLE001 - training must go on
                    pass
