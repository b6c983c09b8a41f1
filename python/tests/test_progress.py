"""A rank's progress on its side: what a report keeps, what it drops, how it
is coalesced and handed to the watcher over a real socket pair (written by
the rank's own non-blocking writer, read back as the watcher reads it), and
what a report costs."""

import json
import logging
import math
import socket
import timeit
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from conftest import wait_until

import trainstate
from trainstate import _progress
from trainstate._progress import Progress
from trainstate._run import Run


class Pipe:
    """The rank's end of a socket pair, written by :meth:`Run._send`, and
    the watcher's end, read line by line."""

    def __init__(self) -> None:
        self.rank, self.watcher = socket.socketpair()
        self.watcher.setblocking(False)
        self.run = Run(url=None, token=None, launch=None, worker=None, name="", timeout=1.0, join_timeout=None, reason="a test's pipe")
        self.run._socket = self.rank
        self.buffer = b""

    def progress(self, interval: float = 3600.0, clock: Optional[Callable[[], float]] = None) -> Progress:
        return Progress(self.run._send, interval) if clock is None else Progress(self.run._send, interval, clock)

    def lines(self) -> List[Dict[str, Any]]:
        """Every whole line written so far, as the watcher parses them."""
        while True:
            try:
                chunk = self.watcher.recv(1 << 20)
            except BlockingIOError:
                break
            if not chunk:
                break
            self.buffer += chunk
        found = []
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            try:
                found.append(json.loads(line))
            except ValueError:
                pass  # a line cut short, as the watcher skips it
        return found

    def fill(self) -> None:
        """Fills the socket until a write would block."""
        self.rank.setblocking(False)
        try:
            while True:
                self.rank.send(b"x" * 4096)
        except BlockingIOError:
            pass

    def close(self) -> None:
        self.rank.close()
        self.watcher.close()


def untimed(lines: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """``lines`` without the wall times per step that hand-overs whose step
    grew carry (their own tests pin them down with a clock of their own)."""
    return [{"progress": {k: v for k, v in line["progress"].items() if k != "step_time_ms"}} for line in lines]


@pytest.fixture
def pipe() -> Iterator[Pipe]:
    opened = Pipe()
    yield opened
    opened.close()


def test_the_first_report_goes_at_once_and_later_ones_are_coalesced(pipe: Pipe) -> None:
    progress = pipe.progress()
    progress.report({"loss": 2.0, "lr": 0.1}, 1, 100, "train", None)
    assert pipe.lines() == [{"progress": {"step": 1, "total_steps": 100, "phase": "train", "metrics": {"loss": 2.0, "lr": 0.1}}}]
    for step in range(2, 50):
        progress.report({"loss": 1.0 / step}, step, None, None, None)
    assert pipe.lines() == [], "reports within the interval are kept, not handed over"
    assert progress.flush()
    # The latest step, the sticky total and phase, only the metrics that
    # changed, and the wall time per step since the first.
    lines = pipe.lines()
    assert untimed(lines) == [{"progress": {"step": 49, "total_steps": 100, "phase": "train", "metrics": {"loss": 1.0 / 49}}}]
    assert lines[0]["progress"]["step_time_ms"] > 0
    assert progress.flush() and pipe.lines() == [], "nothing new: nothing handed over"


def test_what_a_rank_reported_before_going_quiet_is_handed_over_by_itself(pipe: Pipe) -> None:
    progress = pipe.progress(interval=0.2)
    progress.report(None, 1, None, None, None)
    progress.report({"loss": 0.5}, 2, None, None, None)
    seen: List[Dict[str, Any]] = []

    def step_2_arrived() -> bool:
        seen.extend(pipe.lines())
        return any(line["progress"].get("step") == 2 for line in seen)

    wait_until("the pending report to be handed over", step_2_arrived, deadline=10)
    assert untimed(seen[-1:]) == [{"progress": {"step": 2, "metrics": {"loss": 0.5}}}]


def test_an_announced_wait_is_handed_over_at_once_and_only_once(pipe: Pipe) -> None:
    progress = pipe.progress()
    progress.report(None, 10, None, "train", None)
    progress.report(None, 10, None, "checkpoint", 30.0)
    assert pipe.lines() == [
        {"progress": {"step": 10, "phase": "train"}},
        {"progress": {"step": 10, "phase": "checkpoint", "expect_next_within_ms": 30_000}},
    ]
    progress.report(None, 11, None, "train", None)
    assert progress.flush()
    assert untimed(pipe.lines()) == [{"progress": {"step": 11, "phase": "train"}}]


def test_a_full_socket_drops_the_hand_over_and_keeps_the_latest(pipe: Pipe) -> None:
    progress = pipe.progress()
    pipe.fill()
    progress.report({"loss": 3.0, "acc": 0.1}, 5, None, None, 60.0)
    progress.report({"loss": 2.5}, 6, None, None, None)
    assert not progress.flush(), "the socket is full: nothing is written, nothing waits"
    assert progress.handed_over == 0
    pipe.lines()  # the watcher reads what filled the socket
    pipe.buffer = b""
    assert progress.flush()
    assert untimed(pipe.lines()) == [{"progress": {"step": 6, "expect_next_within_ms": 60_000, "metrics": {"loss": 2.5, "acc": 0.1}}}]


def test_invalid_input_is_dropped_with_one_warning_per_kind(pipe: Pipe, caplog: pytest.LogCaptureFixture) -> None:
    progress = pipe.progress()
    caplog.set_level(logging.WARNING, logger="trainstate")
    for _ in range(3):
        progress.report({"nan": math.nan, "inf": math.inf, "bad name": 1.0, "": 1.0, "x" * 129: 1.0, "ok": 1.0, "text": "high"}, 7, None, "eval\n", None)
    progress.report(None, 3, None, None, None)  # steps never go back
    progress.report(None, -1, -5, None, None)
    progress.report(None, True, None, None, 8 * 24 * 3600.0)
    progress.report({f"m{i}": float(i) for i in range(40)}, None, None, None, None)
    progress.report({f"n{i}": float(i) for i in range(32)}, None, None, None, None)
    assert progress.flush()
    sent = [line["progress"] for line in pipe.lines()]
    last = sent[-1]
    assert last["step"] == 7 and "phase" not in last and "total_steps" not in last and "expect_next_within_ms" not in last
    names = set().union(*(line.get("metrics", {}) for line in sent))
    assert {"nan", "inf", "bad name", "", "x" * 129, "text"}.isdisjoint(names)
    # "ok", 32 of the 40 (the limit of a report), 31 of the next 32 (the limit of a run, 64).
    assert "ok" in names and len(names) == 64, sorted(names)
    assert all(math.isfinite(v) for line in sent for v in line.get("metrics", {}).values())
    warnings = [r.getMessage() for r in caplog.records if r.name == "trainstate"]
    kinds = ["not a finite number", "metric name", "is not 1 to 64 printable", "steps never go back", "step must be", "total_steps must be", "expect_next_within=", "in one report", "names in the run"]
    for kind in kinds:
        assert sum(kind in w for w in warnings) == 1, (kind, warnings)
    assert len(warnings) == len(kinds), warnings


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_step_time_handed_over_is_the_mean_of_the_callers_since_the_last_one(pipe: Pipe) -> None:
    clock = Clock()
    progress = pipe.progress(clock=clock)
    progress.report(None, 1, None, None, None, 0.1)
    assert pipe.lines() == [{"progress": {"step": 1}}], "a first step has no interval to time"
    for step, seconds in [(2, 0.1), (3, 0.2), (4, 0.3), (5, 0.2)]:
        clock.now += 5.0  # the wall time is not what is sent when the caller measured its own
        progress.report(None, step, None, None, None, seconds)
    assert progress.flush()
    # Every step time since the last hand-over that carried one, the first step's included.
    assert pipe.lines() == [{"progress": {"step": 5, "step_time_ms": 180.0}}]
    progress.report({"loss": 1.0}, None, None, None, None, 0.5)
    progress.report(None, 6, None, None, None, 0.3)
    assert progress.flush()
    assert pipe.lines() == [{"progress": {"step": 6, "step_time_ms": 400.0, "metrics": {"loss": 1.0}}}]


def test_without_the_callers_step_times_the_wall_time_per_step_is_handed_over(pipe: Pipe) -> None:
    clock = Clock()
    progress = pipe.progress(clock=clock)
    progress.report(None, 10, None, None, None)
    assert pipe.lines() == [{"progress": {"step": 10}}]
    clock.now += 1.0
    progress.report(None, 15, None, None, None)
    clock.now += 1.0
    progress.report(None, 20, None, None, None)
    clock.now += 0.7  # reported again without an advance: the interval ends at the advance
    progress.report({"loss": 0.5}, 20, None, None, None)
    assert progress.flush()
    assert pipe.lines() == [{"progress": {"step": 20, "step_time_ms": 200.0, "metrics": {"loss": 0.5}}}]
    clock.now += 0.3
    progress.report({"loss": 0.4}, 20, None, None, None)
    assert progress.flush()
    assert pipe.lines() == [{"progress": {"step": 20, "metrics": {"loss": 0.4}}}], "no advance, no step time"
    clock.now += 1.5
    progress.report(None, 30, None, None, None)
    assert progress.flush()
    assert pipe.lines() == [{"progress": {"step": 30, "step_time_ms": 250.0}}], "from the advance the last one counted to"


def test_a_step_time_whose_hand_over_was_not_written_goes_with_the_next(pipe: Pipe) -> None:
    clock = Clock()
    progress = pipe.progress(clock=clock)
    progress.report(None, 1, None, None, None)
    pipe.lines()
    pipe.fill()
    progress.report(None, 2, None, None, None, 0.25)
    assert not progress.flush(), "the socket is full"
    pipe.lines()
    pipe.buffer = b""
    progress.report(None, 3, None, None, None, 0.75)
    assert progress.flush()
    assert pipe.lines() == [{"progress": {"step": 3, "step_time_ms": 500.0}}]


def test_a_bad_step_time_is_dropped_with_one_warning(pipe: Pipe, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="trainstate")
    progress = pipe.progress(clock=Clock())
    progress.report(None, 1, None, None, None)
    pipe.lines()
    for bad in [math.nan, math.inf, -1.0, 0, "fast", 8 * 24 * 3600.0, None]:
        progress.report(None, 2, None, None, None, bad)  # type: ignore[arg-type]
    progress.report(None, 2, None, None, None, 0.05)
    assert progress.flush()
    assert pipe.lines() == [{"progress": {"step": 2, "step_time_ms": 50.0}}]
    warnings = [r.getMessage() for r in caplog.records if r.name == "trainstate"]
    assert len(warnings) == 1 and "step_time=" in warnings[0], warnings


def test_the_watcher_sends_a_step_time_only_with_the_step_it_came_with(pipe: Pipe) -> None:
    import os

    from trainstate._watch import Watcher

    watcher = Watcher({"url": "http://127.0.0.1:9", "rank": 0, "pid": os.getpid(), "warn": False}, os.dup(pipe.watcher.fileno()))
    try:
        with watcher.lock:
            watcher.take_progress({"step": 10, "step_time_ms": 120.0})
        sent = watcher.take_progress_to_send()
        assert sent is not None and sent.get("step_time_ms") == 120.0
        with watcher.lock:
            watcher.take_progress({"metrics": {"loss": 1.0}})
        sent = watcher.take_progress_to_send()
        assert sent is not None and sent.get("step_time_ms") == 120.0, "the whole latest state, whose step is still 10"
        with watcher.lock:
            watcher.take_progress({"step": 11})
        sent = watcher.take_progress_to_send()
        assert sent is not None and sent["step"] == 11 and "step_time_ms" not in sent, sent
    finally:
        watcher.out.close()


def test_numbers_of_other_types_are_taken_as_floats_and_whole_numbers(pipe: Pipe) -> None:
    class Scalar:
        def __float__(self) -> float:
            return 0.25

        def __index__(self) -> int:
            return 12

    progress = pipe.progress()
    progress.report({"int": 3, "scalar": Scalar()}, Scalar(), None, None, None)  # type: ignore[dict-item, arg-type]
    assert pipe.lines() == [{"progress": {"step": 12, "metrics": {"int": 3.0, "scalar": 0.25}}}]


def test_report_never_raises_and_does_nothing_without_a_head() -> None:
    trainstate.report({"loss": 1.0}, step=1)  # before init, or without a head: nothing
    run = Run(url=None, token=None, launch=None, worker=None, name="", timeout=1.0, join_timeout=None, reason="no head")
    run.report({"loss": math.nan}, step=-1, phase="\x00", expect_next_within=-1, step_time=-1)
    run.report(object(), step=object())  # type: ignore[arg-type]


def test_stall_after_is_sent_in_milliseconds_within_its_range(caplog: pytest.LogCaptureFixture) -> None:
    assert _progress.stall_after_ms(None) is None
    assert _progress.stall_after_ms(10) == 10_000
    assert _progress.stall_after_ms(2.5) == 2_500
    caplog.set_level(logging.WARNING, logger="trainstate")
    assert _progress.stall_after_ms(0.5) is None
    assert _progress.stall_after_ms(8 * 24 * 3600) is None
    assert _progress.stall_after_ms(math.nan) is None
    assert sum("stall_after" in r.getMessage() for r in caplog.records) == 3


def test_the_cost_of_a_report(pipe: Pipe) -> None:
    progress = pipe.progress()
    progress.report({"loss": 1.0, "lr": 0.1}, 0, 1_000_000, "train", None)
    counter: Tuple[int] = (0,)

    def one_step() -> None:
        progress.report({"loss": 0.5, "lr": 0.1}, counter[0], None, None, None)

    def one_step_with_phase() -> None:
        progress.report({"loss": 0.5, "lr": 0.1, "grad_norm": 2.0}, counter[0], 1_000_000, "train", None)

    for what, call in [("2 metrics and a step", one_step), ("3 metrics, step, total and phase", one_step_with_phase)]:
        number = 200_000
        best = min(timeit.repeat(call, number=number, repeat=5)) / number
        print(f"report() with {what}: {best * 1e6:.2f} µs per call (best of 5 x {number})")
        assert math.isfinite(best)
    print(f"hand-overs to the watcher meanwhile: {progress.handed_over}")


def test_the_watcher_sends_the_whole_latest_state_with_what_is_left_of_a_wait(pipe: Pipe) -> None:
    import os

    from trainstate._watch import Watcher

    watcher = Watcher({"url": "http://127.0.0.1:9", "rank": 0, "pid": os.getpid(), "warn": False}, os.dup(pipe.watcher.fileno()))
    try:
        assert watcher.take_progress_to_send() is None, "nothing reported: no progress in the heartbeat"
        with watcher.lock:
            watcher.take_progress({"step": 10, "total_steps": 100, "phase": "train", "metrics": {f"m{i}": float(i) for i in range(30)}})
            watcher.take_progress({"step": 10, "phase": "checkpoint", "expect_next_within_ms": 30_000, "metrics": {f"n{i}": float(i) for i in range(5)}})
        assert watcher.progress_new
        first = watcher.take_progress_to_send()
        assert first is not None and not watcher.progress_new
        assert (first["step"], first["total_steps"], first["phase"]) == (10, 100, "checkpoint")
        # The 32 most recently changed metrics: the 5 new ones, and the last 27 of the 30 before.
        assert set(first["metrics"]) == {f"n{i}" for i in range(5)} | {f"m{i}" for i in range(3, 30)}
        assert 29_000 < (first.get("expect_next_within_ms") or 0) <= 30_000
        again = watcher.take_progress_to_send()
        assert again is not None
        assert again["metrics"] == first["metrics"], "every heartbeat carries the whole state: the head keeps the latest report"
        assert (again.get("expect_next_within_ms") or 0) <= (first.get("expect_next_within_ms") or 0), "the same end of the wait, not a new one"
        with watcher.lock:
            watcher.take_progress({"step": 11, "phase": "train"})
        advanced = watcher.take_progress_to_send()
        assert advanced is not None and "expect_next_within_ms" not in advanced, "it advanced: the wait is over"
        assert advanced["step"] == 11
    finally:
        watcher.out.close()
