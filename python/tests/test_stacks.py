"""A rank's stacks, captured from outside it: real child processes armed
through the code :func:`trainstate.init` runs (:func:`trainstate._stacks.arm`),
captured through the code the watcher runs (:func:`trainstate._stacks.capture`),
and, against a real head, the whole way: the head's capture order, the
watcher's answer, the faster heartbeats of a stuck rank, and the end of a
rank the head stops.

The tests against a head need its side of stack captures: they skip, saying
why, only when the head answers 404 or 405 for the stacks route, and never
when ``CI=true``."""

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from conftest import Head, child_env, script, wait_until

from trainstate import _progress, _stacks, _watch

# A child armed as init arms a rank, which then says what it armed and
# runs its body.
ARMED = """
    import ctypes, json, os, signal, sys, threading, time
    from trainstate import _stacks
    armed = _stacks.arm(None, None, os.environ)
    print(json.dumps(armed.config() if armed is not None else None), flush=True)
    {body}
"""


def start(path: Path, env: Optional[Dict[str, str]] = None) -> Tuple["subprocess.Popen[str]", Dict[str, Any]]:
    child = subprocess.Popen(
        [sys.executable, str(path)], env=env or child_env(None), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(path.parent)
    )
    assert child.stdout is not None
    first = child.stdout.readline()
    if not first.strip():
        child.wait(10)
        raise AssertionError(f"the child said nothing: {child.stderr.read() if child.stderr else ''}")
    return child, json.loads(first)


def wait_for_line(child: "subprocess.Popen[str]", expected: str) -> None:
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line == expected + "\n", (line, child.stderr.read() if child.poll() is not None and child.stderr else "")


def stop(child: "subprocess.Popen[str]") -> None:
    if child.poll() is None:
        child.kill()
    child.wait(10)


def signal_of(child: "subprocess.Popen[str]") -> Any:
    def send(signum: int) -> bool:
        if child.poll() is not None:
            return False
        os.kill(child.pid, signum)
        return True

    return send


def no_py_spy() -> Optional[int]:
    """The pid py-spy is given: none, so that the signal alone is tested."""
    return None


def test_the_default_signal_is_sigrtmin_plus_7_and_names_and_numbers_are_read() -> None:
    assert _stacks.default_signal() == int(signal.SIGRTMIN) + 7
    assert _stacks.parse_signal(None) == _stacks.default_signal()
    assert _stacks.parse_signal("SIGRTMIN+7") == _stacks.default_signal()
    assert _stacks.parse_signal("usr2") == signal.SIGUSR2
    assert _stacks.parse_signal(" 40 ") == 40
    for bad in ("SIGKILL", "9", "SIGNOPE", "SIGRTMIN*2", "SIGRTMAX+1", 0):
        with pytest.raises(ValueError, match="stacks_signal"):
            _stacks.parse_signal(bad)


def test_a_rank_asleep_in_a_function_of_its_own_gives_that_function(tmp_path: Path) -> None:
    body = """
    def waiting_for_a_peer():
        time.sleep(600)
    threading.Thread(target=lambda: time.sleep(600), name="loader", daemon=True).start()
    print("asleep", flush=True)
    waiting_for_a_peer()
    """
    child, armed = start(script(tmp_path, ARMED.format(body=body)))
    try:
        wait_for_line(child, "asleep")
        assert armed["signal"] == _stacks.default_signal(), armed
        path = Path(armed["path"])
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, oct(path.stat().st_mode)
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700, oct(path.parent.stat().st_mode)

        began = time.monotonic()
        report = _stacks.capture(armed, 3, signal_of(child), 5.0, {}, no_py_spy())
        took = time.monotonic() - began
        assert report["source"] == "faulthandler" and report["rank"] == 3, report
        assert "in waiting_for_a_peer" in report["stack"], report["stack"]
        assert "Current thread" in report["stack"] or "Thread 0x" in report["stack"], report["stack"]
        assert report["stack"].count("(most recent call first)") >= 2, "every thread is dumped"
        assert not report["truncated"] and "note" not in report, report
        assert took < 2.0, f"the capture took {took:.2f} s"

        # Asked again, the file holds the new capture alone (emptied first).
        again = _stacks.capture(armed, 3, signal_of(child), 5.0, {}, no_py_spy())
        assert again["stack"].count("in waiting_for_a_peer") == 1, again["stack"]
        assert child.poll() is None, "the rank lives on after its capture"
    finally:
        stop(child)


HOLD_GIL = """
    ticks = [0]
    def tick():
        while True:
            ticks[0] += 1
            time.sleep(0.01)
    threading.Thread(target=tick, daemon=True).start()
    while ticks[0] < 3:
        time.sleep(0.01)
    def hold_the_gil():
        print("holding the GIL", flush=True)
        # PyDLL calls keep the GIL: no Python thread of this process runs.
        # A signal handler cuts sleep(3) short, so it sleeps again.
        while True:
            ctypes.PyDLL(None).sleep(600)
    hold_the_gil()
"""


def asleep_in_the_kernel(pid: int) -> bool:
    """True once the process's main thread sleeps in nanosleep (what
    sleep(3) calls); True at once where the kernel does not say."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError:
        return True
    return wchan in ("", "0") or "nanosleep" in wchan


def test_a_rank_holding_the_gil_in_c_still_gives_its_stack(tmp_path: Path) -> None:
    child, armed = start(script(tmp_path, ARMED.format(body=HOLD_GIL)))
    try:
        wait_for_line(child, "holding the GIL")
        wait_until("the rank asleep in sleep(3)", lambda: asleep_in_the_kernel(child.pid), deadline=10, every=0.01)
        report = _stacks.capture(armed, 0, signal_of(child), 5.0, {}, no_py_spy())
        assert report["source"] == "faulthandler", report
        assert "in hold_the_gil" in report["stack"], report["stack"]
        assert "in tick" in report["stack"], "the starved thread is dumped too"
        assert child.poll() is None
    finally:
        stop(child)


def test_a_rank_whose_signal_is_ignored_is_answered_within_the_bound(tmp_path: Path) -> None:
    body = """
    signal.signal(_stacks.default_signal(), signal.SIG_IGN)
    print("ignoring", flush=True)
    time.sleep(600)
    """
    child, armed = start(script(tmp_path, ARMED.format(body=body)))
    try:
        wait_for_line(child, "ignoring")
        began = time.monotonic()
        report = _stacks.capture(armed, 1, signal_of(child), 1.0, {}, no_py_spy())
        took = time.monotonic() - began
        assert report["stack"] == "" and not report["truncated"], report
        assert report.get("note") == f"no answer to signal {_stacks.default_signal()} within 1 s", report
        assert 0.9 <= took < 1.5, f"answered after {took:.2f} s"
        assert child.poll() is None
    finally:
        stop(child)


def test_a_rank_with_no_signal_and_no_py_spy_is_answered_with_why(tmp_path: Path) -> None:
    armed = _stacks.Armed(None, None, None, "signal 41 (SIGRTMIN+7) is taken by another handler in this rank").config()
    report = _stacks.capture(armed, 2, lambda signum: True, 1.0, {}, None)
    assert report == {"rank": 2, "source": "watcher", "stack": "", "truncated": False, "note": armed["reason"]}, report


def test_a_rank_whose_signal_is_taken_is_read_by_py_spy_when_it_is_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # py-spy comes with the environment the tests run in (.ci/run installs it).
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if shutil.which("py-spy") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("py-spy is missing: .ci/run installs it beside the client")
        print("py-spy is not installed: its part of the capture is not tested here")
        pytest.skip("py-spy is not installed")
    # The rank's own handler holds the signal, so the capture may not take it.
    body = """
    signal.signal(_stacks.default_signal(), lambda signum, frame: None)
    def loading_a_shard():
        time.sleep(600)
    print("asleep", flush=True)
    loading_a_shard()
    """
    plain = """
    import json, os, signal, time
    from trainstate import _stacks
    print(json.dumps(None), flush=True)
    {body}
"""
    child, _ = start(script(tmp_path, plain.format(body=body)))
    try:
        wait_for_line(child, "asleep")
        armed = _stacks.Armed(None, None, None, "signal 41 (SIGRTMIN+7) is taken by another handler in this rank").config()
        report = _stacks.capture(armed, 1, signal_of(child), 15.0, {}, child.pid)
        assert report["source"] == "py-spy", report
        assert "loading_a_shard" in report["stack"], report["stack"]
        assert child.poll() is None, "py-spy reads the rank and leaves it running"
    finally:
        stop(child)


def test_the_flight_recorders_dump_is_named_in_the_note(tmp_path: Path) -> None:
    prefix = str(tmp_path / "nccl_trace_rank_")
    (tmp_path / "nccl_trace_rank_2").write_bytes(b"x" * 1234)
    env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix}
    armed = _stacks.Armed(None, None, None, "stacks are not armed in this rank").config()
    report = _stacks.capture(armed, 2, lambda signum: True, 0.1, env, None)
    assert report.get("note") == f"stacks are not armed in this rank; NCCL flight recorder dump: {prefix}2 (1234 bytes)", report
    assert _stacks.flight_recorder_note({**env, "TORCH_NCCL_TRACE_BUFFER_SIZE": "0"}, 2) is None
    assert _stacks.flight_recorder_note(env, 3) is None, "no dump of rank 3 exists"


def test_stacks_over_the_byte_bound_are_cut_at_a_line(tmp_path: Path) -> None:
    # Long file and function names make each frame's line long: a few
    # threads a hundred frames deep write well over 64 KiB.
    body = """
    def a_function_with_a_long_name_so_that_each_frame_line_is_long_enough_to_fill_the_bound(depth):
        if depth == 0:
            time.sleep(600)
        a_function_with_a_long_name_so_that_each_frame_line_is_long_enough_to_fill_the_bound(depth - 1)
    for _ in range(4):
        threading.Thread(target=a_function_with_a_long_name_so_that_each_frame_line_is_long_enough_to_fill_the_bound, args=(120,), daemon=True).start()
    time.sleep(0.5)
    print("deep", flush=True)
    time.sleep(600)
    """
    path = script(tmp_path, ARMED.format(body=body), filename="a_training_script_with_a_very_long_name_" + "x" * 150 + ".py")
    child, armed = start(path)
    try:
        wait_for_line(child, "deep")
        report = _stacks.capture(armed, 0, signal_of(child), 5.0, {}, no_py_spy())
        size = len(report["stack"].encode("utf-8"))
        assert report["truncated"], f"{size} bytes, not cut"
        assert _stacks.MAX_STACK_BYTES - 1024 < size <= _stacks.MAX_STACK_BYTES, size
        assert report["stack"].endswith("\n"), report["stack"][-200:]
        last = report["stack"].splitlines()[-1]
        assert last.startswith("  File ") and last.endswith("_bound"), last
    finally:
        stop(child)
    assert _stacks.cut(b"one\ntwo\nthree\n", 9) == ("one\ntwo\n", True)
    assert _stacks.cut(b"one\ntwo\n", 9) == ("one\ntwo\n", False)


# Through init: what it arms, and what it leaves alone.

INIT = """
    import json, os, signal, sys, time
    import trainstate
    from trainstate import _stacks
    sig = _stacks.default_signal()
    {before}
    run = trainstate.init(timeout=1.0)
    print(json.dumps({{"enabled": run.enabled, "armed": run._stacks.config() if run._stacks else None,
                       "disposition": _stacks.disposition(sig), "python": str(signal.getsignal(sig))}}), flush=True)
    {after}
"""


def test_init_arms_the_signal_and_removes_its_file_at_exit(head: Head, name: str, tmp_path: Path) -> None:
    child, said = start(script(tmp_path, INIT.format(before="", after="")), child_env(head.url, name))
    assert child.wait(30) == 0, child.stderr.read() if child.stderr else ""
    assert said["enabled"] and said["disposition"] == "handled", said
    armed = said["armed"]
    assert armed["signal"] == _stacks.default_signal(), said
    assert not os.path.exists(armed["directory"]), "the stacks file and its directory went with the rank"


def test_turned_off_the_signals_disposition_is_untouched(head: Head, name: str, tmp_path: Path) -> None:
    child, said = start(script(tmp_path, INIT.format(before="", after="")), child_env(head.url, name, TRAINSTATE_STACKS="off"))
    assert child.wait(30) == 0, child.stderr.read() if child.stderr else ""
    assert said["enabled"] and said["armed"] is None, said
    assert said["disposition"] == "default" and said["python"] == str(signal.SIG_DFL), said

    child, said = start(
        script(tmp_path, INIT.format(before="", after="").replace("trainstate.init(timeout=1.0)", "trainstate.init(timeout=1.0, capture_stacks=False)")),
        child_env(head.url, name + "-arg"),
    )
    assert child.wait(30) == 0, child.stderr.read() if child.stderr else ""
    assert said["armed"] is None and said["disposition"] == "default", said


def test_a_signal_with_a_handler_is_not_taken(head: Head, name: str, tmp_path: Path) -> None:
    before = """
    def mine(signum, frame):
        print("mine", flush=True)
    signal.signal(sig, mine)
    """
    after = """
    os.kill(os.getpid(), sig)
    time.sleep(0.5)
    """
    child, said = start(script(tmp_path, INIT.format(before=before, after=after)), child_env(head.url, name))
    wait_for_line(child, "mine")
    assert child.wait(30) == 0
    assert said["disposition"] == "handled" and "mine" in said["python"], said
    armed = said["armed"]
    assert armed["signal"] is None and "taken by another handler" in armed["reason"], said
    stderr = child.stderr.read() if child.stderr else ""
    assert stderr.count("taken by another handler") == 1, stderr


# The watcher's pace and the join's words.


def test_a_stuck_rank_is_beaten_for_every_2_s_and_a_moving_one_every_quarter_lease() -> None:
    assert _watch.beat_interval(60_000, None) == 15.0
    assert _watch.beat_interval(60_000, 1.0) == 15.0
    assert _watch.beat_interval(60_000, 5.0) == 2.0
    assert _watch.beat_interval(2_000, 30.0) == 0.5, "never slower than the lease asks"


def test_on_stall_is_sent_only_for_abort() -> None:
    assert _progress.stall_action("detect", 10) == (None, None)
    assert _progress.stall_action("abort", None) == ("ABORT", None)
    assert _progress.stall_action("ABORT", 2.5) == ("ABORT", 2500)
    assert _progress.stall_action("abort", -1) == ("ABORT", None)
    assert _progress.stall_action("explode", 1) == (None, None)


# Against a real head.


def stacks_route_or_skip(head: Head, run_id: str) -> Dict[str, Any]:
    """Asks the head for a capture of the run: its answer. Skips when the
    head has no stacks route (404 or 405 for a run it has), never on CI."""
    request = urllib.request.Request(
        f"{head.url}/api/train/runs/{run_id}/stacks", data=b"{}", method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return dict(json.loads(response.read() or b"{}"))
    except urllib.error.HTTPError as err:
        if err.code in (404, 405) and os.environ.get("CI") != "true":
            reason = f"the head at {head.url} answers {err.code} for POST /api/train/runs/{{id}}/stacks: its side of stack captures is not there yet"
            print(reason)
            pytest.skip(reason)
        raise


@pytest.fixture
def slow_head() -> Iterator[Head]:
    """A head with a 60 s lease: a rank heartbeats every 15 s unless it is stuck."""
    started = Head(["--lease", "60s"])
    yield started
    started.stop()


STUCK = """
    import time
    import trainstate
    run = trainstate.init(timeout=1.0{options})
    for step in range(1, 4):
        trainstate.report(step=step, total_steps=100)
        time.sleep(0.1)
    print(run.run_id, flush=True)
    def rank_zero_is_stuck():
        time.sleep(600)
    rank_zero_is_stuck()
"""


def started_run(head: Head, name: str, tmp_path: Path, options: str = "") -> Tuple["subprocess.Popen[str]", str]:
    path = script(tmp_path, STUCK.format(options=options))
    child = subprocess.Popen(
        [sys.executable, str(path)], env=child_env(head.url, name), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path)
    )
    assert child.stdout is not None
    run_id = child.stdout.readline().strip()
    assert run_id, child.stderr.read() if child.poll() is not None and child.stderr else "no run id"
    return child, run_id


def test_a_stuck_rank_heartbeats_faster_and_answers_the_heads_capture(slow_head: Head, name: str, tmp_path: Path) -> None:
    head = slow_head
    child, run_id = started_run(head, name, tmp_path)
    try:
        def beats() -> List[int]:
            return [b for b in (head.get(f"/api/train/runs/{run_id}").get("rank_last_heartbeat_ms") or []) if b]

        # Stuck for 5 s, the rank's watcher beats every 2 s, not every 15 s:
        # after its last progress, the next beats come 2 s apart.
        seen = [wait_until("a first heartbeat", lambda: beats() or None, deadline=15)[0]]
        for _ in range(3):
            seen.append(wait_until("the next heartbeat", lambda: [b for b in beats() if b > seen[-1]] or None, deadline=12)[0])
        assert seen[-1] - seen[-2] <= 3_000, seen

        opened = stacks_route_or_skip(head, run_id)
        print("capture opened:", opened)

        def complete() -> Optional[Dict[str, Any]]:
            captures = head.get(f"/api/train/runs/{run_id}/stacks").get("captures") or []
            return captures[0] if captures and captures[0].get("state") == "COMPLETE" else None

        capture = wait_until("the capture complete", complete, deadline=30)
        rank = capture["ranks"][0]
        assert rank["answered"] and rank["source"] == "faulthandler", rank
        assert "in rank_zero_is_stuck" in rank["stack"], rank["stack"]
        assert child.poll() is None, "the rank lives on"
    finally:
        stop(child)


def test_a_rank_the_head_ends_is_errored_with_no_progress_in_the_heads_words(head: Head, name: str, tmp_path: Path) -> None:
    child, run_id = started_run(head, name, tmp_path, options=", stall_after=1, on_stall='abort', abort_after=0")
    try:
        stacks_route_or_skip(head, run_id)
        run = head.run_named(name, "ERRORED", deadline=60)
        assert child.wait(30) in (-signal.SIGTERM, -signal.SIGKILL)
    finally:
        stop(child)
    cause = run["cause"]
    assert (cause["kind"], cause["how"], cause["failed_world_rank"]) == ("NO_PROGRESS", "KILLED", 0), cause
    assert "killed by SIGTERM" not in run["status_detail"], run["status_detail"]
    assert run["status_detail"].strip(), run

