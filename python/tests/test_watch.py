"""The watcher process each rank starts: what it sees of a rank that dies
without reporting, and that it goes on while the rank holds the GIL.

Each script is run as a child that the test does not reap until the head
has the rank's end, as torchrun (which polls its workers) does not; how a
rank reaped at once by its parent is still known is tested at the end."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from conftest import Head, child_env, script, wait_until

from trainstate import _proc

RANK = """
    import ctypes, os, signal, sys, threading, time
    import trainstate
    run = trainstate.init(timeout=1.0)
    print("watcher", run.watcher_pid, flush=True)
    {body}
    print("done", flush=True)
"""


def start(path: Path, env: Dict[str, str], **popen: Any) -> "subprocess.Popen[str]":
    child = subprocess.Popen(
        [sys.executable, str(path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(path.parent), **popen
    )
    assert child.stdout is not None
    first = child.stdout.readline()
    assert first.startswith("watcher "), (first, child.stderr.read() if child.poll() is not None and child.stderr else "")
    return child


def ended(head, name: str, status: str) -> Dict[str, Any]:
    return head.run_named(name, status, deadline=30)


def test_a_rank_killed_with_sigkill_is_reported_killed(head, name, tmp_path):
    child = start(script(tmp_path, RANK.format(body="time.sleep(60)")), child_env(head.url, name))
    head.run_named(name, "RUNNING")
    child.kill()
    run = ended(head, name, "ERRORED")
    assert child.wait(10) == -signal.SIGKILL
    assert (run["cause"]["kind"], run["cause"]["how"], run["cause"]["failed_world_rank"]) == ("SYSTEM_ERROR", "KILLED", 0)
    assert "died without reporting: killed by SIGKILL" in run["status_detail"]


def test_a_rank_that_calls_os_exit_is_reported_with_its_status(head, name, tmp_path):
    child = start(script(tmp_path, RANK.format(body="os._exit(3)")), child_env(head.url, name))
    run = ended(head, name, "ERRORED")
    assert child.wait(10) == 3
    assert (run["cause"]["kind"], run["cause"]["how"]) == ("USER_ERROR", "EXITED")
    assert "exited with status 3" in run["status_detail"]


def test_a_rank_that_crashes_is_reported_with_its_signal(head, name, tmp_path):
    child = start(script(tmp_path, RANK.format(body="os.kill(os.getpid(), signal.SIGSEGV)")), child_env(head.url, name))
    run = ended(head, name, "ERRORED")
    assert child.wait(10) == -signal.SIGSEGV
    assert (run["cause"]["kind"], run["cause"]["how"]) == ("SYSTEM_ERROR", "KILLED")
    assert "killed by SIGSEGV" in run["status_detail"]


HOLD_GIL = """
    ticks = [0]
    def tick():
        while True:
            ticks[0] += 1
            # Replaced whole, so that a read never finds it half written.
            with open("ticks.new", "w") as f:
                f.write(str(ticks[0]))
            os.replace("ticks.new", "ticks")
            time.sleep(0.05)
    threading.Thread(target=tick, daemon=True).start()
    while ticks[0] < 3:
        time.sleep(0.01)
    print("holding the GIL", flush=True)
    # PyDLL calls keep the GIL (CDLL ones release it): no Python thread runs.
    ctypes.PyDLL(None).sleep({seconds})
"""


def test_a_rank_holding_the_gil_in_a_c_call_keeps_heartbeating(head, name, tmp_path):
    # Held longer than the two waits below may take on a loaded machine (5 s
    # each), so that the ticks are read again while it still holds it.
    path = script(tmp_path, RANK.format(body=HOLD_GIL.format(seconds=12)))
    child = start(path, child_env(head.url, name))
    try:
        assert child.stdout is not None and child.stdout.readline() == "holding the GIL\n"
        run = head.run_named(name, "RUNNING")
        ticks = (tmp_path / "ticks").read_text()

        def heartbeat() -> Optional[int]:
            beats = head.get(f"/api/train/runs/{run['id']}").get("rank_last_heartbeat_ms") or [None]
            return beats[0]

        first = wait_until("a heartbeat", heartbeat, deadline=5)
        # The lease is 2 s, so a heartbeat every 0.5 s: two more within the 12 s the rank holds the GIL.
        wait_until("two more heartbeats", lambda: (heartbeat() or 0) > first + 600, deadline=5)
        assert (tmp_path / "ticks").read_text() == ticks, "the rank's own threads were starved all along"
        assert head.run_named(name)["run_status"] == "RUNNING"
        assert child.wait(30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    ended(head, name, "FINISHED")


def test_sigterm_ends_a_rank_holding_the_gil_at_once_with_its_exit_status(head, name, tmp_path):
    # No Python signal handler: the default action ends the rank, whatever it is doing.
    path = script(tmp_path, RANK.format(body=HOLD_GIL.format(seconds=60)))
    child = start(path, child_env(head.url, name))
    try:
        assert child.stdout is not None and child.stdout.readline() == "holding the GIL\n"
        head.run_named(name, "RUNNING")
        child.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        assert child.wait(30) == -signal.SIGTERM
        assert time.monotonic() - sent < 5
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    run = ended(head, name, "ABORTED")
    assert (run["cause"]["kind"], run["cause"]["how"]) == ("USER_INTERRUPT", "KILLED")
    assert "terminated by SIGTERM" in run["status_detail"]


def test_the_watcher_outlives_a_sigterm_to_the_process_group_and_reports(head, name, tmp_path):
    # Ctrl-C, or a launcher that signals the group, ends the rank, not its report.
    child = start(script(tmp_path, RANK.format(body="time.sleep(60)")), child_env(head.url, name), start_new_session=True)
    head.run_named(name, "RUNNING")
    os.killpg(child.pid, signal.SIGTERM)
    run = ended(head, name, "ABORTED")
    assert child.wait(10) == -signal.SIGTERM
    assert run["cause"]["how"] == "KILLED"


def test_a_forked_child_does_not_hide_the_ranks_death(head, name, tmp_path):
    body = """
    if os.fork() == 0:
        time.sleep(30)  # outlives the rank, holding whatever it inherited
        os._exit(0)
    time.sleep(60)
    """
    child = start(script(tmp_path, RANK.format(body=body)), child_env(head.url, name), start_new_session=True)
    try:
        head.run_named(name, "RUNNING")
        child.kill()
        killed = time.monotonic()
        run = ended(head, name, "ERRORED")
        assert time.monotonic() - killed < 10
        assert "killed by SIGKILL" in run["status_detail"]
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def test_the_watcher_writes_nothing_to_the_ranks_output_and_exits_after_it(name, tmp_path):
    # A head of its own: on the shared one, the failures of earlier tests on
    # this machine may make it a suspect node, which the rank would be
    # warned of on its stderr (as it should be).
    head = Head([])
    try:
        path = script(tmp_path, RANK.format(body="print(os.getpid())"))
        # run() reads the rank's stderr to its end: the watcher lets it go once it is done.
        result = subprocess.run([sys.executable, str(path)], env=child_env(head.url, name), capture_output=True, text=True, timeout=60)
        assert result.returncode == 0
        lines = result.stdout.splitlines()
        assert (len(lines), lines[0].startswith("watcher "), lines[2], result.stderr) == (3, True, "done", "")
        ended(head, name, "FINISHED")
    finally:
        head.stop()


def test_the_watcher_exits_once_the_rank_is_gone(head, name, tmp_path):
    path = script(tmp_path, RANK.format(body="time.sleep(60)"))
    child = subprocess.Popen([sys.executable, str(path)], env=child_env(head.url, name), stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    watcher = int(child.stdout.readline().split()[1])
    assert "trainstate._watch" in Path(f"/proc/{watcher}/cmdline").read_text()
    child.kill()
    ended(head, name, "ERRORED")
    child.wait()

    def gone() -> bool:
        fields = _proc.stat(watcher)
        return fields is None or fields[3] in ("Z", "X")

    wait_until("the watcher to exit", gone, deadline=10)


def test_a_rank_reaped_at_once_by_its_parent_is_still_known(head, name, tmp_path):
    # A shell waits for its child at once; the rank is gone before its
    # watcher can read /proc. Linux 6.15+ still tells through a pidfd.
    path = script(tmp_path, RANK.format(body="os.kill(os.getpid(), signal.SIGKILL)"))
    result = subprocess.run(["sh", "-c", f'"{sys.executable}" "{path}"; echo "status $?"'], env=child_env(head.url, name), capture_output=True, text=True, timeout=60)
    assert "status 137" in result.stdout
    run = ended(head, name, "ERRORED")
    if _proc.pidfd_exit_code(None) is None and not _kernel_tells_reaped_exits():
        assert run["cause"]["how"] in ("KILLED", "VANISHED")
    else:
        assert run["cause"]["how"] == "KILLED" and "killed by SIGKILL" in run["status_detail"]


def _kernel_tells_reaped_exits() -> bool:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    pidfd = _proc.open_pidfd(child.pid)
    child.wait()
    try:
        return _proc.pidfd_exit_code(pidfd) == 0
    finally:
        if pidfd is not None:
            os.close(pidfd)


def test_exit_statuses_are_described_as_the_head_takes_them():
    assert _proc.describe(0) == ("FINISHED", None, None, "")
    assert _proc.describe(3 << 8) == ("ERRORED", "USER_ERROR", "EXITED", "exited with status 3")
    assert _proc.describe(signal.SIGKILL) == ("ERRORED", "SYSTEM_ERROR", "KILLED", "killed by SIGKILL")
    assert _proc.describe(signal.SIGSEGV | 0x80) == ("ERRORED", "SYSTEM_ERROR", "KILLED", "killed by SIGSEGV (core dumped)")
    for interrupt in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        status, cause, how, detail = _proc.describe(interrupt)
        assert (status, cause, how, detail) == ("ABORTED", "USER_INTERRUPT", "KILLED", f"terminated by {interrupt.name}")
    assert _proc.describe(None) == ("ERRORED", "SYSTEM_ERROR", "VANISHED", "")


def test_a_zombies_exit_status_is_read_from_proc(tmp_path):
    fields: List[str] = ["Z", "1"] + ["0"] * 17 + ["777"] + ["0"] * 29 + [str(9)]
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "stat").write_text("42 (a (b) c) " + " ".join(fields) + "\n")
    assert _proc.exit_code(42, 777, str(tmp_path)) == 9
    assert _proc.exit_code(42, 778, str(tmp_path)) is None, "another process with a reused pid"
    assert _proc.exit_code(43, None, str(tmp_path)) is None, "reaped"
