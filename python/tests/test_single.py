"""A single-process script reports to a real head: how it ends, and what
changes when the head is down or slow (nothing but one warning)."""

import signal
import socket
import subprocess
import sys
import threading
import time

from conftest import child_env, run_script, script

from trainstate import _probe

WORK = """
    import os, sys, time
    import trainstate
    if not os.environ.get("NO_TRAINSTATE"):
        run = trainstate.init(timeout=1.0)
    print("training", flush=True)
    {body}
    print("done", flush=True)
"""


def test_a_clean_script_finishes_with_its_worker(head, name, tmp_path):
    path = script(tmp_path, WORK.format(body="print(os.getpid())"))
    result = run_script(path, child_env(head.url, name))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    run = head.run_named(name, "FINISHED")
    [worker] = run["workers"]
    assert worker["pid"] == int(result.stdout.split()[1])
    assert worker["node_id"] == _probe.node_id()
    # The workers of an ended run are DEAD.
    assert (worker["world_rank"], worker["node_ip"], worker["status"]) == (0, "127.0.0.1", "DEAD")
    assert worker["resources"]["CPU"] >= 1
    assert run["controller_actor_id"].startswith("rendezvous:local:")
    assert run["end_time_ms"] >= run["start_time_ms"]


def test_an_uncaught_exception_errors_the_run_with_its_traceback(head, name, tmp_path):
    path = script(tmp_path, WORK.format(body="raise ValueError('bad batch')"))
    result = run_script(path, child_env(head.url, name))
    assert result.returncode == 1
    assert "ValueError: bad batch" in result.stderr, "the traceback is printed as usual"
    run = head.run_named(name, "ERRORED")
    cause = run["cause"]
    assert (cause["kind"], cause["failed_world_rank"], cause["how"]) == ("USER_ERROR", 0, "RAISED")
    assert run["start_time_ms"] <= cause["failed_at_ms"] <= run["end_time_ms"]
    assert run["status_detail"].startswith("Rank 0 worker raised an error.")
    assert 'in <module>\n    raise ValueError(\'bad batch\')\nValueError: bad batch' in run["status_detail"]


def test_a_non_zero_exit_errors_the_run(head, name, tmp_path):
    path = script(tmp_path, WORK.format(body="sys.exit(3)"))
    result = run_script(path, child_env(head.url, name))
    assert result.returncode == 3
    run = head.run_named(name, "ERRORED")
    assert "exited with status 3" in run["status_detail"]
    assert (run["cause"]["kind"], run["cause"]["how"]) == ("USER_ERROR", "EXITED")


def test_sigterm_aborts_the_run_as_a_user_interrupt(head, name, tmp_path):
    path = script(tmp_path, WORK.format(body="time.sleep(60)"))
    child = subprocess.Popen([sys.executable, str(path)], env=child_env(head.url, name), stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "training\n"
    head.run_named(name, "RUNNING")
    child.send_signal(signal.SIGTERM)
    assert child.wait(30) == -signal.SIGTERM, "the process still dies of SIGTERM"
    run = head.run_named(name, "ABORTED")
    assert (run["cause"]["kind"], run["cause"]["how"]) == ("USER_INTERRUPT", "KILLED")
    assert "terminated by SIGTERM" in run["status_detail"]


def test_sigint_aborts_the_run_as_a_user_interrupt(head, name, tmp_path):
    path = script(tmp_path, WORK.format(body="time.sleep(60)"))
    # A child of a shell's background job starts with SIGINT ignored: give it Python's default.
    child = subprocess.Popen(
        [sys.executable, str(path)], env=child_env(head.url, name), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert child.stdout is not None and child.stdout.readline() == "training\n"
    head.run_named(name, "RUNNING")
    child.send_signal(signal.SIGINT)
    child.wait(30)
    assert child.stderr is not None and "KeyboardInterrupt" in child.stderr.read()
    run = head.run_named(name, "ABORTED")
    assert run["cause"]["kind"] == "USER_INTERRUPT"


def test_forked_and_spawned_children_do_not_report_for_their_rank(head, name, tmp_path):
    source = """
        import multiprocessing as mp
        import os
        import trainstate

        def child():
            assert not trainstate.init().enabled, "a spawned child reports nothing"
            raise RuntimeError("a failing child is not a failing rank")

        if __name__ == "__main__":
            trainstate.init()
            pid = os.fork()
            if pid == 0:
                raise RuntimeError("a forked child's failure is not the rank's")
            os.waitpid(pid, 0)
            p = mp.get_context("spawn").Process(target=child)
            p.start()
            p.join()
            print("children exited", p.exitcode)
    """
    path = script(tmp_path, source)
    result = run_script(path, child_env(head.url, name))
    assert result.returncode == 0, result.stderr
    assert "children exited 1" in result.stdout
    run = head.run_named(name, "FINISHED")
    assert len(run["workers"]) == 1


def _without_trainstate(path, body_env):
    baseline = run_script(path, child_env(None, None, NO_TRAINSTATE="1", **body_env))
    return baseline


def test_a_head_that_is_down_changes_nothing_but_one_warning(name, tmp_path):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again: nothing listens there
    down = f"http://127.0.0.1:{port}"
    for body in ["print('steps')", "raise ValueError('diverged')", "sys.exit(4)"]:
        path = script(tmp_path, WORK.format(body=body))
        baseline = _without_trainstate(path, {})
        result = run_script(path, child_env(down, name))
        assert result.returncode == baseline.returncode, body
        assert result.stdout == baseline.stdout, body
        extra = [line for line in result.stderr.splitlines() if line not in baseline.stderr.splitlines()]
        assert len(extra) == 1 and "trainstate: cannot reach the head" in extra[0], result.stderr


def test_a_head_that_never_answers_costs_each_call_its_deadline_only(name, tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])  # read nothing, answer nothing
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        path = script(tmp_path, WORK.format(body="print('steps')"))
        started = time.monotonic()
        result = run_script(path, child_env(f"http://127.0.0.1:{listener.getsockname()[1]}", name))
        elapsed = time.monotonic() - started
        assert result.returncode == 0 and result.stdout == "training\nsteps\ndone\n"
        assert result.stderr.count("trainstate:") == 1, result.stderr
        # The join at init and the end at exit each wait one 1 s deadline.
        assert elapsed < 10, elapsed
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()


def test_without_a_url_nothing_is_reported_and_one_warning_says_so(tmp_path):
    path = script(tmp_path, WORK.format(body="print(run.enabled)"))
    result = run_script(path, child_env(None))
    assert result.returncode == 0
    assert result.stdout == "training\nFalse\ndone\n"
    assert result.stderr.strip().splitlines() == ["trainstate: TRAINSTATE_URL is not set; this run is not reported"]
