"""The cost per training step of an armed stack capture, against none.

Starts a release head in memory, then runs one-rank training processes
(a plain process: `trainstate.init()` joins as a world of one) by turns:
one armed (`init(capture_stacks=True)`: faulthandler registered on the
capture's signal, the watcher beside it) and one not
(`capture_stacks=False`), ROUNDS times each, the first of a round
swapped each round. Each process runs STEPS
steps of a fixed piece of work (a 128x128 float matmul in torch, about a
millisecond here) with `trainstate.report(step=i)` after each, and prints
its time per step. Nothing is captured while they run: this measures the
armed capture's idle cost, which should be nothing.

    python3 bench/stacks/step_cost.py target/release/trainstate [ROUNDS] [STEPS]

The child runs with the interpreter given as PYTHON (default
/usr/bin/python3, which has torch) and the client from ./python on its
path.
"""
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Tuple

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/trainstate"
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 5
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 3_000
PYTHON = os.environ.get("PYTHON", "/usr/bin/python3")
ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import sys, time, torch, trainstate
torch.set_num_threads(1)
armed = sys.argv[1] == "armed"
steps = int(sys.argv[2])
trainstate.init(name="step-cost", capture_stacks=armed)
a = torch.rand(128, 128)
for i in range(200):  # warm up
    a = (a @ a).clamp_(0, 1)
start, cpu = time.perf_counter(), time.process_time()
for i in range(steps):
    a = (a @ a).clamp_(0, 1)
    trainstate.report(step=i + 1, total_steps=steps)
elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
print(f"per_step_us={elapsed / steps * 1e6:.3f} cpu_us={cpu / steps * 1e6:.3f}")
"""


def start_head() -> Tuple[subprocess.Popen[str], str]:
    head = subprocess.Popen(
        [BIN, "serve", "--in-memory", "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert head.stdout is not None
    for line in head.stdout:
        if line.startswith("listening on "):
            return head, line[len("listening on "):].strip()
    raise SystemExit("the head did not start")


def one(url: str, mode: str) -> Tuple[float, float]:
    env = {**os.environ, "TRAINSTATE_URL": url, "PYTHONPATH": str(ROOT / "python"), "OMP_NUM_THREADS": "1"}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        env.pop(name, None)
    out = subprocess.run([PYTHON, "-c", CHILD, mode, str(STEPS)], env=env, capture_output=True, text=True, check=True)
    found = re.search(r"per_step_us=([0-9.]+) cpu_us=([0-9.]+)", out.stdout)
    if not found:
        raise SystemExit(f"no figure from the child: {out.stdout!r} {out.stderr!r}")
    return float(found.group(1)), float(found.group(2))


def main() -> None:
    head, url = start_head()
    try:
        wall: Dict[str, List[float]] = {"armed": [], "off": []}
        cpu: Dict[str, List[float]] = {"armed": [], "off": []}
        for round_number in range(ROUNDS):
            # Each round swaps which goes first, so neither gains from its place.
            order = ("armed", "off") if round_number % 2 == 0 else ("off", "armed")
            for mode in order:
                w, c = one(url, mode)
                wall[mode].append(w)
                cpu[mode].append(c)
        print(f"rounds={ROUNDS} steps={STEPS}")
        for label, figures in (("wall", wall), ("cpu", cpu)):
            for mode in ("armed", "off"):
                print(f"{label} {mode}: per step µs {[round(t, 1) for t in figures[mode]]}, median {statistics.median(figures[mode]):.1f}")
            pairs = [a / o for a, o in zip(figures["armed"], figures["off"])]
            spread = max(figures["off"]) / min(figures["off"]) - 1
            print(
                f"{label}: armed/off median {statistics.median(figures['armed']) / statistics.median(figures['off']):.4f}, "
                f"median of the rounds' ratios {statistics.median(pairs):.4f}; spread of the off rounds {spread * 100:.1f}%"
            )
    finally:
        head.terminate()
        head.wait()


if __name__ == "__main__":
    main()
