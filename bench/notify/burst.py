"""A burst of ended runs with a notification target that is down.

Starts release heads on fresh data directories, in turn without a target
and with a webhook whose receiver is down (a closed port), and registers
RUNS runs that ended ERRORED (8 workers each, as their controller reports
them last) from THREADS keep-alive connections. Prints the registration
rate of each round and, with the target, what `/metrics` says of its
backlog (`trainstate_notify_pending` never above `--notify-backlog`) and of
the events it dropped and failed to send.

    python3 bench/notify/burst.py target/release/trainstate [RUNS] [ROUNDS] [BACKLOG]
"""
import http.client
import json
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Tuple

BIN = sys.argv[1]
RUNS = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
ROUNDS = int(sys.argv[3]) if len(sys.argv) > 3 else 2
BACKLOG = int(sys.argv[4]) if len(sys.argv) > 4 else 1_000
THREADS = 8
T0 = 1_760_000_000_000


def closed_port() -> int:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port: int = probe.getsockname()[1]
    probe.close()
    return port


def start(data_dir: str, target: Optional[str]) -> Tuple["subprocess.Popen[str]", int]:
    args = [BIN, "serve", "--listen", "127.0.0.1:0", "--data-dir", data_dir, "--max-runs", "1000000",
            "--max-connections-per-client", "512"]
    if target:
        args += ["--notify-webhook", target, "--notify-backlog", str(BACKLOG),
                 "--public-url", "http://trainstate.test"]
    head = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert head.stdout is not None
    for line in head.stdout:
        found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
        if found:
            threading.Thread(target=head.stdout.read, daemon=True).start()
            return head, int(found.group(1))
    raise SystemExit("the head did not start")


def ended_run(i: int) -> Dict[str, Any]:
    start_ms, end_ms = T0 + i, T0 + i + 500
    workers = [{"actor_id": f"{i:016x}{r:016x}", "world_rank": r, "local_rank": r % 4, "node_rank": r // 4,
                "node_id": f"{i:028x}{r // 4:028x}", "node_ip": f"10.{i // 60000}.{(i // 250) % 240}.{r // 4 + 1}",
                "pid": 1000 + r, "gpu_ids": [r % 4], "status": "DEAD", "resources": {"CPU": 1.0, "GPU": 1.0}}
               for r in range(8)]
    return {"id": uuid.uuid4().hex, "name": f"burst-{i}", "job_id": str(i // 10), "controller_actor_id": "controller",
            "workers": workers, "datasets": [], "run_status": "ERRORED", "status_detail": "rank 3 raised",
            "start_time_ms": start_ms, "end_time_ms": end_ms,
            "attempts": [{"attempt_id": "0", "start_time_ms": start_ms, "end_time_ms": end_ms}]}


def register(port: int, runs: List[Dict[str, Any]]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    for run in runs:
        conn.request("POST", "/api/train/runs", body=json.dumps(run).encode(),
                     headers={"Content-Type": "application/json", "Prefer": "return=minimal"})
        answer = conn.getresponse()
        text = answer.read()
        if answer.status >= 300:
            raise SystemExit(f"register: {answer.status} {text!r}")
    conn.close()


def metrics(port: int) -> Dict[str, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    found: Dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("trainstate_notify_"):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


def round_(target: Optional[str]) -> Dict[str, Any]:
    runs = [ended_run(i) for i in range(RUNS)]
    with tempfile.TemporaryDirectory() as data_dir:
        head, port = start(data_dir, target)
        try:
            highest_pending = 0.0
            done = threading.Event()

            def watch() -> None:
                nonlocal highest_pending
                while not done.is_set():
                    pending = [v for k, v in metrics(port).items() if k.startswith("trainstate_notify_pending")]
                    highest_pending = max([highest_pending] + pending)
                    done.wait(0.2)

            watcher = threading.Thread(target=watch)
            if target:
                watcher.start()
            began = time.monotonic()
            with ThreadPoolExecutor(THREADS) as pool:
                list(pool.map(lambda k: register(port, runs[k::THREADS]), range(THREADS)))
            took = time.monotonic() - began
            time.sleep(3 if target else 0)
            done.set()
            if target:
                watcher.join()
            seen = metrics(port) if target else {}
            return {"target": "down" if target else "none", "runs_per_s": round(RUNS / took),
                    "seconds": round(took, 2), "highest_pending": highest_pending, "metrics": seen}
        finally:
            head.terminate()
            head.wait()


results = []
for _ in range(ROUNDS):
    results.append(round_(None))
    results.append(round_(f"http://127.0.0.1:{closed_port()}/hook#events=errored,aborted,finished&target=down"))
print(json.dumps(results, indent=1))
for r in results:
    dropped = r["metrics"].get('trainstate_notify_dropped_total{target="down"}')
    print(f"{r['target']:>5}: {r['runs_per_s']:>6} runs/s ({RUNS} ended runs in {r['seconds']} s)"
          + (f"; pending at most {r['highest_pending']:.0f} (bound {BACKLOG}), dropped {dropped}" if r["target"] == "down" else ""))
