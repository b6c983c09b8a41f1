"""How long a hang takes to be seen, and its stacks to be kept.

Starts a release head in memory (its default `--stall-after`, so the run's
own pace sets its window), then a real 4-rank `torchrun` job (gloo, CPU)
whose steps take STEP seconds and in which rank 2 stops inside a function
of its own at step HANG_AT while the others wait in `all_reduce`. It
waits until the head has called the run STALLED and the stall's capture
is complete, and prints, from the head's own record:

- `detect_s`: from the last advance to STALLED (`health.since_ms -
  health.last_advance_ms`), the window plus the sweep's period;
- `capture_s`: from STALLED to the last rank's stacks kept (the newest
  `at_ms` of the capture's ranks less `health.since_ms`);
- the suspects the capture names.

    python3 bench/stacks/hang.py target/release/trainstate STEP [HANG_AT]

PYTHON (default /usr/bin/python3) is the interpreter with torch; the
client comes from ./python.
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Dict, Tuple

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/trainstate"
STEP = float(sys.argv[2]) if len(sys.argv) > 2 else 0.2
HANG_AT = int(sys.argv[3]) if len(sys.argv) > 3 else 30
PYTHON = os.environ.get("PYTHON", "/usr/bin/python3")
ROOT = Path(__file__).resolve().parents[2]

TRAIN = r"""
import os, sys, time, torch, torch.distributed as dist, trainstate
step_s, hang_at = float(sys.argv[1]), int(sys.argv[2])
trainstate.init(name="hang-bench")
dist.init_process_group("gloo")
rank = dist.get_rank()

def rank_two_is_stuck() -> None:
    time.sleep(3600)

for step in range(1, 100_000):
    if rank == 2 and step == hang_at:
        rank_two_is_stuck()
    time.sleep(step_s)
    t = torch.ones(4)
    dist.all_reduce(t)
    trainstate.report(step=step)
"""


def start_head() -> Tuple["subprocess.Popen[str]", str]:
    head = subprocess.Popen(
        [BIN, "serve", "--in-memory", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert head.stdout is not None
    for line in head.stdout:
        if line.startswith("listening on "):
            return head, line[len("listening on "):].strip()
    raise SystemExit("the head did not start")


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.loads(answer.read())


def main() -> None:
    head, url = start_head()
    job = None
    try:
        script = Path(tempfile.mkdtemp()) / "train.py"
        script.write_text(TRAIN)
        env = {**os.environ, "TRAINSTATE_URL": url, "PYTHONPATH": str(ROOT / "python"), "OMP_NUM_THREADS": "1"}
        job = subprocess.Popen(
            [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
             "--redirects", "2", "--tee", "2", "--monitor_interval", "0.2", str(script), str(STEP), str(HANG_AT)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        started = time.monotonic()
        run: Dict[str, Any] = {}
        while time.monotonic() - started < 900:
            runs = get(url + "/api/train/runs")["train_runs"]
            if runs:
                run = get(url + f"/api/train/runs/{runs[0]['id']}")
                capture = (run.get("health") or {}).get("capture") or {}
                if capture.get("state") == "COMPLETE":
                    break
            time.sleep(0.5)
        else:
            raise SystemExit("no complete capture within 15 minutes")
        health = run["health"]
        stacks = get(url + f"/api/train/runs/{run['id']}/stacks")["captures"][0]
        kept = max(r["at_ms"] for r in stacks["ranks"] if r.get("at_ms"))
        print(json.dumps({
            "step_s": STEP,
            "detect_s": round((health["since_ms"] - health["last_advance_ms"]) / 1000, 2),
            "capture_s": round((kept - health["since_ms"]) / 1000, 2),
            "ranks": len(stacks["ranks"]),
            "suspects": [(s["rank"], s["innermost"]) for s in stacks["suspects"]],
            "detail": health["detail"],
        }))
    finally:
        if job is not None:
            os.killpg(job.pid, signal.SIGTERM)
            job.wait()
        head.terminate()
        head.wait()


if __name__ == "__main__":
    main()
