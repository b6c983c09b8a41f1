"""Memory per retained run with full metric histories.

Starts two release heads on fresh data directories. On each it runs RUNS
one-rank rendezvous runs through STEPS progress reports and ends them
(FINISHED): on the first without metrics, on the second with METRICS
metric names a run (a report carries at most 32: halves by turns), so
that every series fills (1,000 points, decimated as it grows). Then it reads each head's RSS once the runs are retained and
the histories flushed, and prints the difference per run, the points one
run serves and the store's size.

    python3 bench/health/histories.py target/release/trainstate [RUNS] [METRICS] [STEPS]
"""
import http.client
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

BIN = sys.argv[1]
RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 50
METRICS = int(sys.argv[3]) if len(sys.argv) > 3 else 64
STEPS = int(sys.argv[4]) if len(sys.argv) > 4 else 2_200


def start(data_dir: str) -> Tuple[subprocess.Popen[str], int]:
    head = subprocess.Popen(
        [BIN, "serve", "--listen", "127.0.0.1:0", "--data-dir", data_dir, "--max-runs", "1000000"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert head.stdout is not None
    for line in head.stdout:
        found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if found:
            return head, int(found.group(1))
    raise SystemExit("the head did not start")


def call(conn: http.client.HTTPConnection, method: str, path: str, body: Optional[Dict[str, Any]] = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    text = answer.read()
    if answer.status >= 300:
        raise SystemExit(f"{method} {path}: {answer.status} {text!r}")
    return json.loads(text) if text else None


def drive(port: int, run: int, metrics: int) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    worker = {"actor_id": f"{run:032x}", "world_rank": 0, "local_rank": 0, "node_rank": 0,
              "node_id": f"{run:056x}", "node_ip": "10.0.0.1", "pid": 1000, "gpu_ids": [],
              "status": "ALIVE", "resources": {"CPU": 1.0}}
    joined = call(conn, "POST", f"/api/train/rendezvous/h{run}/join",
                  {"world_size": 1, "worker": worker, "name": f"hist-{run}", "job_id": str(run)})
    run_id = joined["run_id"]
    for step in range(1, STEPS + 1):
        progress: Dict[str, Any] = {"step": step, "total_steps": STEPS}
        if metrics:
            # A report carries at most 32 names: halves of the run's names by turns.
            half = min(metrics, 32)
            first = (step % 2) * half if metrics > half else 0
            progress["metrics"] = {f"m{i}": 1.0 / step + i for i in range(first, min(first + half, metrics))}
        call(conn, "POST", f"/api/train/runs/{run_id}/ranks/0/heartbeat",
             {"attempt_id": "0", "progress": progress})
    call(conn, "POST", f"/api/train/runs/{run_id}/ranks/0/end", {"attempt_id": "0", "status": "FINISHED"})
    conn.close()
    return str(run_id)


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise SystemExit("no VmRSS")


def measure(metrics: int) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory() as data_dir:
        return measure_in(data_dir, metrics)


def measure_in(data_dir: str, metrics: int) -> Dict[str, Any]:
    head, port = start(data_dir)
    try:
        began = time.monotonic()
        with ThreadPoolExecutor(4) as pool:
            ids: List[str] = list(pool.map(lambda r: drive(port, r, metrics), range(RUNS)))
        took = time.monotonic() - began
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        deadline = time.monotonic() + 30
        while True:
            runs = call(conn, "GET", "/api/train/runs?limit=1&status=FINISHED")
            if runs["total"] == RUNS or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        # Every run has ended; its points are flushed with the next second.
        time.sleep(2.5)
        served = call(conn, "GET", f"/api/train/runs/{ids[0]}/metrics")
        points = sum(len(s["points"]) for s in served["series"])
        rss = rss_kib(head.pid)
        db = sum(os.path.getsize(os.path.join(data_dir, f)) for f in os.listdir(data_dir))
    finally:
        head.terminate()
        head.wait()
    # The same store after a restart: what the retained runs cost, without
    # what the allocator kept of the traffic that made them.
    head, port = start(data_dir)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        while call(conn, "GET", "/api/train/runs?limit=1")["total"] != RUNS:
            time.sleep(0.1)
        restarted = rss_kib(head.pid)
        again = call(conn, "GET", f"/api/train/runs/{ids[0]}/metrics")
        assert again == served, "the histories survive the restart"
        read = rss_kib(head.pid)
    finally:
        head.terminate()
        head.wait()
    return {"metrics": metrics, "rss_kib": rss, "seconds": took, "points_one_run": points,
            "series_one_run": len(served["series"]), "store_bytes": db,
            "reports": RUNS * STEPS, "rss_restarted_kib": restarted,
            "rss_after_one_read_kib": read}


plain = measure(0)
full = measure(METRICS)
per_run = (full["rss_kib"] - plain["rss_kib"]) / RUNS
restarted = (full["rss_restarted_kib"] - plain["rss_restarted_kib"]) / RUNS
print(json.dumps({"runs": RUNS, "steps": STEPS, "without": plain, "with": full,
                  "rss_difference_kib_per_run": round(per_run, 1),
                  "rss_difference_after_restart_kib_per_run": round(restarted, 1)}, indent=1))
print(f"{RUNS} retained runs of {STEPS} steps, {METRICS} metric names a run "
      f"({full['series_one_run']} series, {full['points_one_run']} points served for one run); "
      f"RSS without / with histories: {plain['rss_kib'] / 1024:.1f} / {full['rss_kib'] / 1024:.1f} MiB "
      f"once the runs ended ({per_run:+.1f} KiB a run), "
      f"{plain['rss_restarted_kib'] / 1024:.1f} / {full['rss_restarted_kib'] / 1024:.1f} MiB "
      f"after a restart ({restarted:+.1f} KiB a run), "
      f"{plain['rss_after_one_read_kib'] / 1024:.1f} / {full['rss_after_one_read_kib'] / 1024:.1f} MiB "
      f"after reading one run's histories; "
      f"store {plain['store_bytes'] / 2**20:.1f} / {full['store_bytes'] / 2**20:.1f} MiB")
