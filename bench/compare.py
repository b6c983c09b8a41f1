#!/usr/bin/env python3
"""Side by side: Ray's state actor (the anchor) and trainstate, on this machine.

Runs ../shared/bench/ray_state_bench.py (Ray 2.60's TrainStateActor) and
`cargo xtask bench` (trainstate) one after the other, for several rounds, at
(N, W) = (2000, 8) and (200, 64), then writes docs/benchmarks.md from the JSON
lines: medians, ratios (ours / Ray), the goals, the machine, the versions and
the exact commands. Every JSON line is also kept in bench/results.jsonl.

Python standard library only. Ray needs a Python environment with
ray[default]==2.60.0; `--setup-ray` creates one in .venv-ray (git ignores it)
from bench/ray-anchor-requirements.txt. Without Ray, trainstate is measured
alone and the document says so.

Usage:
    python3 bench/compare.py [--rounds 3] [--setup-ray] [--skip-ray]
                             [--configs 2000x8,200x64] [--ready 20000]
                             [--wrk] [--wrk-prefer minimal] [--scale 100000]

--wrk also registers through wrk (apt-get install wrk) in every round and
configuration (`cargo xtask bench --path wrk`), shown as its own column
beside the Rust client's (http) and Ray's, and measures the head's reads and
heartbeats with wrk (`cargo xtask bench --path wrk-reads`): their gets and
listings fill the same column, the rest the table "Reads and heartbeats (wrk)". --scale N also measures the head
with N runs retained (`cargo xtask bench --scale N`): time to ready after a
restart and filtered pages of 100.
    python3 bench/compare.py --from-results   # the document again, from bench/results.jsonl
"""
import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv-ray")
VENV_PY = os.path.join(VENV, "bin", "python")
REQUIREMENTS = os.path.join(ROOT, "bench", "ray-anchor-requirements.txt")
DEFAULT_RAY_SCRIPT = os.path.join(os.path.dirname(ROOT), "shared", "bench", "ray_state_bench.py")
ANALYSIS = os.path.join(ROOT, "bench", "analysis.md")
HEADS = os.path.join(ROOT, "bench", "heads.md")
VERSIONS = os.path.join(ROOT, "bench", "versions.md")
WRITE_PATH = os.path.join(ROOT, "bench", "write-path.md")
RESULTS = os.path.join(ROOT, "bench", "results.jsonl")
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
XTASK = os.path.join(ROOT, "target", "release", "xtask")

COMMANDS = []  # every command run, for the document


def log(*a):
    print(f"[compare {time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def rel(path):
    return os.path.relpath(path, ROOT)


def run(cmd, env=None, record=True, capture=True, timeout=1800):
    def show(c):
        if c == sys.executable:
            return "python3"
        if c.startswith(ROOT):
            return rel(c)
        if c.startswith(os.path.dirname(ROOT) + os.sep):
            return os.path.join("..", os.path.relpath(c, os.path.dirname(ROOT)))
        return c
    shown = " ".join(shlex.quote(show(c)) for c in cmd)
    if record and shown not in COMMANDS:
        COMMANDS.append(shown)
    log("$", shown)
    out = subprocess.run(cmd, cwd=ROOT, env=env, timeout=timeout, text=True,
                         stdout=subprocess.PIPE if capture else None)
    return out.returncode, (out.stdout or "")


def json_lines(text):
    lines = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return lines


def criterion_lines(text):
    """`name  time: [low estimate high]` from criterion's output (the name may
    stand on the line before)."""
    rows, previous = [], ""
    for line in text.splitlines():
        m = re.search(r"time:\s+\[(\S+ \S+) (\S+ \S+) (\S+ \S+)\]", line)
        if m:
            name = line[:line.index("time:")].strip() or previous.strip()
            rows.append({"bench": "criterion", "name": name, "low": m.group(1),
                         "estimate": m.group(2), "high": m.group(3)})
        elif line.strip():
            previous = line
    return rows


def ray_python():
    """The Python that has ray, or None."""
    for py in (os.environ.get("RAY_ANCHOR_PYTHON"), VENV_PY):
        if py and os.path.exists(py):
            ok = subprocess.run([py, "-c", "import ray"], capture_output=True).returncode == 0
            if ok:
                return py
    return None


def setup_ray():
    if not os.path.exists(VENV_PY):
        run([sys.executable, "-m", "venv", VENV], capture=False)
    run([VENV_PY, "-m", "pip", "install", "-q", "-r", REQUIREMENTS], capture=False, timeout=3600)


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


# ------------------------------------------------------------------ figures
def get(d, path):
    for key in path.split("."):
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def ray_ready(r):
    a, b = r.get("ray_init_s"), r.get("actor_create_s")
    return None if a is None or b is None else a + b


def mem_growth_mib(r):
    """VmRSS growth from start to after the writes (N runs stored)."""
    m = r.get("actor_mem_kib", {})
    a = get(m, "after_create.VmRSS")
    b = get(m, "after_pipelined.VmRSS")
    return None if a is None or b is None else (b - a) / 1024


def per_run_kib(r):
    g = mem_growth_mib(r)
    return None if g is None else g * 1024 / r["N"]


# (label, getter, unit, higher_is_better, digits)
METRICS = [
    ("sequential register, runs/s", lambda r: get(r, "seq.runs_per_s"), "", True, 0),
    ("sequential latency p50, ms", lambda r: get(r, "seq.lat_ms_p50"), "", False, 3),
    ("sequential latency p99, ms", lambda r: get(r, "seq.lat_ms_p99"), "", False, 3),
    ("pipelined register, runs/s", lambda r: get(r, "pipelined.runs_per_s"), "", True, 0),
    ("pipelined: CPU per run of the process holding the state, µs",
     lambda r: get(r, "pipelined.cpu_us_per_run_state"), "", False, 0),
    ("pipelined: CPU of the load generator per run, µs (HTTP)",
     lambda r: get(r, "pipelined.cpu_us_per_run_driver"), "", None, 0),
    ("list all runs, unpaged, median ms", lambda r: get(r, "get_all.lat_ms_median"), "", False, 3),
    ("list all runs, pages of 1000 summed, median ms",
     lambda r: get(r, "get_all_paged.lat_ms_median"), "", False, 3),
    ("JSON bytes of the listing", lambda r: get(r, "get_all.json_bytes"), "", None, 0),
    ("get one run, median ms", lambda r: get(r, "get_one.lat_ms_median"), "", False, 3),
    ("JSON bytes of one run", lambda r: get(r, "get_one.json_bytes"), "", None, 0),
    ("RSS after start (base), MiB",
     lambda r: (get(r, "actor_mem_kib.after_create.VmRSS") or 0) / 1024 or None, "", False, 1),
    ("RSS growth for the N runs, MiB", mem_growth_mib, "", False, 1),
    ("RSS per retained run, KiB", per_run_kib, "", False, 2),
    ("peak RSS, MiB", lambda r: r.get("actor_peak_rss_mib"), "", False, 1),
    ("time to ready (empty), s",
     lambda r: ray_ready(r) if r.get("bench") != "trainstate" else r.get("actor_create_s"), "", False, 4),
    ("time to ready with the N runs stored, s", lambda r: r.get("ready_with_runs_s"), "", False, 4),
]

OURS = [("http", "durable"), ("http", "memory"), ("inproc", "durable"), ("inproc", "memory"),
        ("store", "durable"), ("store", "memory")]
# Columns shown only when measured (they need wrk). A column's rows are the
# lines of `--path wrk` (registrations) and `--path wrk-reads` (gets and
# listings) of its store: each line fills the rows it has keys for.
WRK = [("wrk", "durable"), ("wrk", "memory")]
WRK_PATHS = ("wrk", "wrk-reads")

# The table "Reads and heartbeats (wrk)": (label, getter, digits), from the
# lines of `--path wrk-reads`.
# On one connection "timed" is each request as the script timed it; the other
# latencies are wrk's, corrected for coordinated omission.
READS = [
    ("get one run (1 connection), p50 ms", lambda r: get(r, "get_one.lat_ms_p50"), 3),
    ("get one run (1 connection), p99 ms", lambda r: get(r, "get_one.lat_ms_p99"), 3),
    ("get one run (1 connection), timed, p50 ms", lambda r: get(r, "get_one.service_lat_ms_p50"), 3),
    ("get one run (1 connection), timed, p99 ms", lambda r: get(r, "get_one.service_lat_ms_p99"), 3),
    ("get one run (1 connection), req/s", lambda r: get(r, "get_one.req_per_s"), 0),
    ("list every run, unpaged (1 connection), p50 ms", lambda r: get(r, "get_all.lat_ms_p50"), 3),
    ("list every run, unpaged (1 connection), p99 ms", lambda r: get(r, "get_all.lat_ms_p99"), 3),
    ("list every run, unpaged (1 connection), timed, p99 ms",
     lambda r: get(r, "get_all.service_lat_ms_p99"), 3),
    ("list every run, unpaged (1 connection), req/s", lambda r: get(r, "get_all.req_per_s"), 1),
    ("get one run during a registration burst, p50 ms",
     lambda r: get(r, "get_during_burst.get.lat_ms_p50"), 3),
    ("get one run during a registration burst, p99 ms",
     lambda r: get(r, "get_during_burst.get.lat_ms_p99"), 3),
    ("get one run during a registration burst, timed, p50 ms",
     lambda r: get(r, "get_during_burst.get.service_lat_ms_p50"), 3),
    ("get one run during a registration burst, timed, p99 ms",
     lambda r: get(r, "get_during_burst.get.service_lat_ms_p99"), 3),
    ("the registration burst meanwhile, runs/s",
     lambda r: get(r, "get_during_burst.register.runs_per_s"), 0),
    ("run heartbeats, req/s", lambda r: get(r, "run_heartbeats.req_per_s"), 0),
    ("run heartbeats, p50 ms", lambda r: get(r, "run_heartbeats.lat_ms_p50"), 3),
    ("run heartbeats, p99 ms", lambda r: get(r, "run_heartbeats.lat_ms_p99"), 3),
    ("run heartbeats: CPU of the head, cores", lambda r: get(r, "run_heartbeats.head_cpu_cores"), 2),
    ("rank heartbeats, req/s", lambda r: get(r, "rank_heartbeats.req_per_s"), 0),
    ("rank heartbeats, p50 ms", lambda r: get(r, "rank_heartbeats.lat_ms_p50"), 3),
    ("rank heartbeats, p99 ms", lambda r: get(r, "rank_heartbeats.lat_ms_p99"), 3),
    ("rank heartbeats: CPU of the head, cores", lambda r: get(r, "rank_heartbeats.head_cpu_cores"), 2),
]


def med(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(values) if values else None


def fmt(x, digits):
    if x is None:
        return "–"
    if digits == 0:
        return f"{x:,.0f}"
    return f"{x:,.{digits}f}"


def cell(values, digits):
    values = [v for v in values if isinstance(v, (int, float))]
    if not values:
        return "–"
    m = statistics.median(values)
    if len(values) > 1 and min(values) != max(values):
        return f"{fmt(m, digits)} <sub>({fmt(min(values), digits)}–{fmt(max(values), digits)})</sub>"
    return fmt(m, digits)


def ratio(ours, ray):
    if ours is None or ray in (None, 0):
        return "–"
    r = ours / ray
    return f"{r:,.1f}×" if r >= 0.095 else f"{r:.4f}×"


# ------------------------------------------------------------------ document
def write_doc(results, ray_ok, args, machine, started, finished, load_before, load_after):
    configs = [tuple(map(int, c.split("x"))) for c in args.configs.split(",")]
    ours = [r for r in results if r.get("bench") == "trainstate" and "config" not in r and "error" not in r]
    rays = [r for r in results if r.get("bench") == "ray_train_state_actor" and "error" not in r]
    ready = [r for r in results if r.get("config") == "ready" and "error" not in r]
    scale = [r for r in results if r.get("config") == "scale" and "error" not in r]
    columns = OURS + [c for c in WRK
                      if any(r["path"] in WRK_PATHS and r["store"] == c[1] for r in ours)]
    errors = [r for r in results if "error" in r]

    def pick(n, w, path=None, store=None):
        if path is None:
            return [r for r in rays if r["N"] == n and r["W"] == w]
        paths = WRK_PATHS if path == "wrk" else (path,)
        return [r for r in ours if r["N"] == n and r["W"] == w and r["path"] in paths and r["store"] == store]

    def median_of(rows, getter):
        return med([getter(r) for r in rows])

    L = []
    L.append("# Benchmarks: trainstate beside Ray's state actor")
    L.append("")
    L.append("<!-- Generated by bench/compare.py from the JSON lines in bench/results.jsonl. "
             "Do not edit by hand: run the script again. -->")
    L.append("")
    L.append(f"Measured {started} – {finished} on the machine described below, "
             f"{args.rounds} round(s), Ray and trainstate alternating within each round. "
             "Each cell is the median over the rounds, with the range (min–max) in small print.")
    note = getattr(args, "note", None)
    if note:
        L.append("")
        L.append(f"**Conditions of this sitting:** {note} Load average (1, 5, 15 min) before: {load_before}; "
                 f"after: {load_after}.")
    if not ray_ok:
        L.append("")
        L.append("**Ray was not measured in this run** (no Python environment with ray 2.60 was available): "
                 "the tables show trainstate alone; ratios are left empty.")
    L.append("")
    L.append("Paths: **http** = `trainstate serve` (release build, a child process) over loopback, "
             "sequential on one connection, pipelined over "
             f"{next((get(r, 'pipelined.in_flight') for r in ours if r['path'] == 'http'), 64)} concurrent connections, load generator in the "
             "same 2 cores; **inproc** = `StateHandle` to the actor in a process of its own, "
             "trainstate-actor's `inproc` example "
             "(pipelined: all N registrations in flight); **store** = the store writer and its committed view "
             "without the actor (no validation, no transition checks). **durable** = SQLite in WAL mode, "
             "`synchronous=FULL` (the default); **memory** = `--in-memory`. Ray keeps nothing on disk.")
    wrk_rows = [r for r in ours if r["path"] == "wrk"]
    if wrk_rows:
        w0 = wrk_rows[0]
        L.append("")
        L.append("**wrk** = the same `trainstate serve` loaded by `wrk` "
                 f"({get(w0, 'wrk.version') or 'wrk'}) with `bench/wrk/register.lua`, a fresh run id in every "
                 "request: sequential = 1 thread, 1 connection; pipelined = "
                 f"{get(w0, 'pipelined.threads')} threads over {get(w0, 'pipelined.in_flight')} connections; "
                 f"{get(w0, 'wrk.mode')} (so more runs are stored than N); `Prefer: return=minimal` "
                 f"{'sent' if get(w0, 'wrk.prefer') else 'not sent'}. Latencies are wrk's; afterwards the "
                 "listing's total must hold every acknowledged (201) run, no more than the requests in flight "
                 "when wrk stopped, and no answer may be other than 201. wrk is written in C and uses far less "
                 "CPU per request than the Rust client, so it leaves more of the 2 cores to the server.")
    reads_rows = [r for r in ours if r["path"] == "wrk-reads"]
    if reads_rows:
        r0 = reads_rows[0]
        L.append("")
        L.append("In the wrk column, **get one run** and **list all runs** are wrk's median (p50) with "
                 f"`bench/wrk/cycle.lua` ({get(r0, 'wrk.mode')}), one connection, N runs stored: "
                 "`GET /api/train/runs/{id}` cycling through the N runs, and `GET /api/train/v2/runs`; "
                 "the table \"Reads and heartbeats (wrk)\" has the rest.")
    L.append("")

    for (n, w) in configs:
        ray_rows = pick(n, w)
        L.append(f"## N = {n:,} runs × W = {w} workers × 1 dataset")
        L.append("")
        head = ["metric", "Ray 2.60"] + [f"{p} {s}" for p, s in columns]
        L.append("| " + " | ".join(head) + " |")
        L.append("|" + "---|" * len(head))
        for label, getter, _, _, digits in METRICS:
            row = [label, cell([getter(r) for r in ray_rows], digits)]
            for p, s in columns:
                row.append(cell([getter(r) for r in pick(n, w, p, s)], digits))
            L.append("| " + " | ".join(row) + " |")
        L.append("")
        L.append(f"Ratios, ours / Ray (medians; for times and memory, below 1× is better):")
        L.append("")
        head = ["metric"] + [f"{p} {s}" for p, s in columns]
        L.append("| " + " | ".join(head) + " |")
        L.append("|" + "---|" * len(head))
        for label, getter, _, better, _ in METRICS:
            ray_m = median_of(ray_rows, getter)
            if better is None or ray_m is None:
                continue
            row = [label]
            for p, s in columns:
                row.append(ratio(median_of(pick(n, w, p, s), getter), ray_m))
            L.append("| " + " | ".join(row) + " |")
        L.append("")
        http = pick(n, w, "http", "durable") + pick(n, w, "http", "memory")
        if http:
            L.append("The load generator's own ceiling over HTTP (the same client, same connections, "
                     "against trivial routes; `/healthz` also makes one read of the actor):")
            L.append("")
            L.append("| route | sequential req/s | pipelined req/s |")
            L.append("|---|---|---|")
            for route in ("/api/version", "/healthz"):
                L.append(f"| `{route}` | "
                         f"{cell([get(r, 'client_ceiling') and r['client_ceiling'].get(route, {}).get('seq_req_per_s') for r in http], 0)} | "
                         f"{cell([get(r, 'client_ceiling') and r['client_ceiling'].get(route, {}).get('pipelined_req_per_s') for r in http], 0)} |")
            L.append("")

    L.append("## Reads and heartbeats (wrk)")
    L.append("")
    reads = [r for r in ours if r["path"] == "wrk-reads"]
    if reads:
        r0 = reads[0]
        L.append("`cargo xtask bench --path wrk-reads`: the head loaded by wrk with `bench/wrk/cycle.lua`, "
                 f"{get(r0, 'wrk.mode')}, each phase against a fresh `trainstate serve` (durable unless the "
                 "column says otherwise). Gets and listings: 1 thread, 1 connection, N runs stored; during "
                 "the burst the same get runs beside `bench/wrk/register.lua` (2 threads, 64 connections). "
                 f"Heartbeats: 2 threads over 64 connections, {get(r0, 'run_heartbeats.runs') or 1000:,} live "
                 "runs (`POST /api/train/runs/{id}/heartbeat`), or every rank of groups of W assembled "
                 "through the rendezvous (`POST /api/train/runs/{id}/ranks/{rank}/heartbeat`); the head's CPU "
                 "is its utime + stime over the phase's wall time. Every answer must be 200 (201 for the "
                 "burst's registrations, each of them stored). Latencies are wrk's, which wrk 4 corrects for "
                 "coordinated omission (it adds samples for the requests a slow answer held back, at the "
                 "mean rate); on one connection the script also times each request as it happens "
                 "(\"timed\"), which the goals read.")
    else:
        L.append("Not measured in this sitting (`python3 bench/compare.py --wrk` measures it).")
    L.append("")
    read_columns = [(n, w, s) for (n, w) in configs for s in ("durable", "memory")
                    if s == "durable" or pick(n, w, "wrk-reads", s)]
    head = ["metric"] + [f"N = {n:,}, W = {w}" + ("" if s == "durable" else f", {s}")
                         for n, w, s in read_columns]
    L.append("| " + " | ".join(head) + " |")
    L.append("|" + "---|" * len(head))
    for label, getter, digits in READS:
        row = [label] + [cell([getter(r) for r in pick(n, w, "wrk-reads", s)], digits)
                         for n, w, s in read_columns]
        L.append("| " + " | ".join(row) + " |")
    L.append("")

    if ready:
        L.append("## Time to ready with many runs stored")
        L.append("")
        L.append("The store is filled through the store alone, then `trainstate serve` is started on it "
                 "several times. Ready = `/healthz` says `\"loaded\": true` (the head answers `/healthz` "
                 "within milliseconds of its start and holds other requests until then); "
                 "RSS per run = (RSS when ready − RSS of the same server on an empty store) / N. "
                 "The \"time to ready\" rows of the tables above are the same moment.")
        L.append("")
        L.append("| N × W | store file | ready (median of starts) | starts | RSS when ready | RSS empty | RSS per run |")
        L.append("|---|---|---|---|---|---|---|")
        for r in ready:
            L.append(f"| {r['N']:,} × {r['W']} | {r.get('db_bytes', 0) / 2**20:.1f} MiB | "
                     f"{r['ready_with_runs_s_median'] * 1000:.1f} ms | "
                     f"{', '.join(f'{x * 1000:.1f}' for x in r['ready_with_runs_s'])} ms | "
                     f"{med(r.get('rss_when_ready_mib', [])) or 0:.1f} MiB | {r.get('rss_empty_mib', 0):.1f} MiB | "
                     f"{r.get('rss_per_run_kib', 0):.2f} KiB |")
        L.append("")

    for r in scale:
        L.append(f"## {r['N']:,} runs retained: restart and filtered pages")
        L.append("")
        L.append(f"`cargo xtask bench --scale {r['N']}`: a durable store filled with {r['N']:,} runs of "
                 f"{r['W']} workers through the store alone ({r.get('fill_s', 0):.1f} s, store file "
                 f"{r.get('db_bytes', 0) / 2**20:.0f} MiB), then `trainstate serve` started on it "
                 f"{len(r.get('starts', []))} times. Times from spawning the process: its \"listening\" line, "
                 "the first 2xx `/healthz`, and the moment `/healthz` says the runs are fully loaded "
                 + ("(its `loaded`/`ready` field)." if r.get("healthz_says_loaded") else
                    "(this head's `/healthz` does not say so: the same as the first 2xx answer).")
                 + " After each start the listing's total must be N.")
        L.append("")
        L.append("| start | listening | `/healthz` 2xx | fully loaded |")
        L.append("|---|---|---|---|")
        for i, st in enumerate(r.get("starts", []), 1):
            L.append(f"| {i} | {st['listening_s'] * 1000:.1f} ms | {st['healthz_s'] * 1000:.1f} ms | "
                     f"{st['loaded_s'] * 1000:.1f} ms |")
        L.append(f"| median | {r['listening_s_median'] * 1000:.1f} ms | {r['healthz_s_median'] * 1000:.1f} ms | "
                 f"**{r['loaded_s_median'] * 1000:.1f} ms** |")
        L.append("")
        L.append(f"RSS when ready: {', '.join(f'{x:.1f}' for x in r.get('rss_when_ready_mib', []))} MiB; "
                 f"after the pages: {r.get('rss_after_pages_mib', 0):.1f} MiB.")
        L.append("")
        L.append(f"A page of {r.get('page_limit', 100)} over HTTP on the last start, "
                 f"median of {r.get('repeats')} requests (one connection, one at a time):")
        L.append("")
        L.append("| filter | query | runs on the page | median ms | min–max ms |")
        L.append("|---|---|---|---|---|")
        for pg in r.get("pages", []):
            L.append(f"| {pg['filter']} | `{pg['query']}` | {pg['runs']} | **{pg['lat_ms_median']:.3f}** | "
                     f"{pg['lat_ms_min']:.3f}–{pg['lat_ms_max']:.3f} |")
        L.append("")

    # ------------------------------------------------------------ goals
    L.append("## Goals")
    L.append("")
    L.append("Durable store unless said otherwise; W = 8 unless said otherwise.")
    L.append("")
    L.append("| goal | target | measured | met |")
    L.append("|---|---|---|---|")

    def m(n, w, path, store, getter):
        return median_of(pick(n, w, path, store), getter)

    def goal(text, target, measured, ok):
        mark = "–" if ok is None else ("yes" if ok else "**no**")
        L.append(f"| {text} | {target} | {measured} | {mark} |")

    def vs_ray(text, n, w, path, getter, factor, higher=True):
        ours_m = m(n, w, path, "durable", getter)
        ray_m = median_of(pick(n, w), getter)
        if ours_m is None:
            return
        if ray_m in (None, 0):
            goal(text, f"{factor}× Ray", fmt(ours_m, 1), None)
            return
        r = ours_m / ray_m if higher else ray_m / ours_m
        goal(text, f"≥ {factor}× Ray", f"{r:,.1f}× ({fmt(ours_m, 1)} vs {fmt(ray_m, 1)})", r >= factor)

    seq_g = lambda r: get(r, "seq.runs_per_s")
    pip_g = lambda r: get(r, "pipelined.runs_per_s")
    list_g = lambda r: get(r, "get_all.lat_ms_median")
    vs_ray("pipelined register over HTTP", 2000, 8, "http", pip_g, 10)
    vs_ray("pipelined register in process", 2000, 8, "inproc", pip_g, 12)
    vs_ray("sequential register over HTTP", 2000, 8, "http", seq_g, 3)
    vs_ray("sequential register in process", 2000, 8, "inproc", seq_g, 3)
    vs_ray("pipelined register over HTTP, W = 64", 200, 64, "http", pip_g, 4)
    vs_ray("list 2,000 runs over HTTP (unpaged), faster by", 2000, 8, "http", list_g, 100, higher=False)
    g1 = m(2000, 8, "http", "durable", lambda r: get(r, "get_one.lat_ms_median"))
    if g1 is not None:
        goal("get one run over loopback", "well under 1 ms", f"{g1:.3f} ms", g1 < 0.5)
    pr = m(2000, 8, "http", "durable", per_run_kib)
    if pr is not None:
        goal("memory per retained 8-worker run, (RSS after writes − after start) / N, N = 2,000", "< 4 KiB", f"{pr:.2f} KiB", pr < 4)
    for r in ready:
        goal(f"memory per retained 8-worker run, after a start with {r['N']:,} runs stored", "< 4 KiB",
             f"{r.get('rss_per_run_kib', 0):.2f} KiB", r.get("rss_per_run_kib", 99) < 4)
    base = m(2000, 8, "http", "durable", lambda r: (get(r, "actor_mem_kib.after_create.VmRSS") or 0) / 1024)
    if base is not None:
        goal("base RSS of the server after start", "< 20 MiB", f"{base:.1f} MiB", base < 20)
    rd = m(2000, 8, "http", "durable", lambda r: r.get("ready_with_runs_s"))
    if rd is not None:
        goal("ready with 2,000 runs stored", "< 100 ms", f"{rd * 1000:.1f} ms", rd < 0.1)
    for r in ready:
        x = r["ready_with_runs_s_median"]
        goal(f"ready with {r['N']:,} runs stored", "< 1 s" if r["N"] >= 20000 else "–",
             f"{x * 1000:.1f} ms", x < 1.0 if r["N"] >= 20000 else None)
    for p, s in columns:
        if p != "wrk" or s != "durable":
            continue
        vs_ray("pipelined register through wrk", 2000, 8, "wrk", pip_g, 9)
        x = m(2000, 8, "wrk", "durable", pip_g)
        if x is not None:
            goal("pipelined register through wrk, W = 8", "≥ 10,000 runs/s", fmt(x, 0), x >= 10000)
        x = m(200, 64, "wrk", "durable", pip_g)
        if x is not None:
            goal("pipelined register through wrk, W = 64", "≥ 2,500 runs/s", fmt(x, 0), x >= 2500)
        x = m(2000, 8, "wrk", "durable", seq_g)
        if x is not None:
            goal("one at a time through wrk, W = 8", "≥ 1,500 runs/s", fmt(x, 0), x >= 1500)
    def read_goal(text, target, getter, ok):
        x = m(2000, 8, "wrk-reads", "durable", getter)
        goal(text, target, "–" if x is None else f"{x:.3f} ms", None if x is None else ok(x))

    read_goal("get one run through wrk (1 connection, 2,000 stored), median, timed", "≤ 0.2 ms",
              lambda r: get(r, "get_one.service_lat_ms_p50"), lambda x: x <= 0.2)
    read_goal("list 2,000 runs through wrk (unpaged, 1 connection), median, timed", "≤ 8 ms",
              lambda r: get(r, "get_all.service_lat_ms_p50"), lambda x: x <= 8)
    read_goal("get one run during a pipelined registration burst, p99, timed", "≤ 2 ms",
              lambda r: get(r, "get_during_burst.get.service_lat_ms_p99"), lambda x: x <= 2)
    for kind in ("run", "rank"):
        rate = m(2000, 8, "wrk-reads", "durable", lambda r: get(r, f"{kind}_heartbeats.req_per_s"))
        cores = m(2000, 8, "wrk-reads", "durable", lambda r: get(r, f"{kind}_heartbeats.head_cpu_cores"))
        if rate is None or cores is None:
            goal(f"{kind} heartbeats through wrk (2 threads, 64 connections)",
                 "≥ 30,000/s, head under 1.5 cores", "–", None)
        else:
            goal(f"{kind} heartbeats through wrk (2 threads, 64 connections)",
                 "≥ 30,000/s, head under 1.5 cores", f"{fmt(rate, 0)}/s, {cores:.2f} cores",
                 rate >= 30000 and cores < 1.5)
    for r in scale:
        x = r["loaded_s_median"]
        goal(f"ready (fully loaded) after a restart with {r['N']:,} runs", "≤ 1 s", f"{x * 1000:.0f} ms", x <= 1.0)
        worst = max(r.get("pages", []), key=lambda pg: pg["lat_ms_median"], default=None)
        if worst:
            goal(f"any filtered page of 100 with {r['N']:,} runs, matching or not (slowest median)", "≤ 5 ms",
                 f"{worst['lat_ms_median']:.3f} ms ({worst['filter']})", worst["lat_ms_median"] <= 5)
    for (n, w) in configs:
        for path in ("http", "inproc"):
            for label, getter in (("pipelined", pip_g), ("sequential", seq_g)):
                d = m(n, w, path, "durable", getter)
                mem = m(n, w, path, "memory", getter)
                if d is not None and mem:
                    goal(f"durable within 80% of in-memory, {label} {path}, W = {w}", "≥ 80%",
                         f"{d / mem * 100:.0f}%", d / mem >= 0.8)
    L.append("")

    micro = [r for r in results if r.get("bench") == "criterion"]
    if micro:
        L.append("## Micro-benchmarks (criterion)")
        L.append("")
        L.append("`cargo bench -p trainstate-schema --bench wire` and `cargo bench -p trainstate-actor "
                 "--bench store`: the estimate with criterion's confidence interval.")
        carried = {r["carried_from"] for r in micro if r.get("carried_from")}
        if carried:
            L.append(f"Not measured in this sitting (`--no-micro`): carried over from the sitting of "
                     f"{', '.join(sorted(carried))}.")
        L.append("")
        L.append("| benchmark | time | interval |")
        L.append("|---|---|---|")
        for r in micro:
            L.append(f"| {r['name']} | {r['estimate']} | {r['low']} – {r['high']} |")
        L.append("")

    if os.path.exists(ANALYSIS):
        with open(ANALYSIS) as f:
            L.append(f.read().rstrip())
        L.append("")

    # Two versions beside each other, measured apart and written by hand:
    # kept as it is.
    if os.path.exists(VERSIONS):
        with open(VERSIONS) as f:
            L.append(f.read().rstrip())
        L.append("")

    # The stores beside each other (`cargo xtask bench --postgres`), measured
    # apart and written by hand: kept as it is.
    if os.path.exists(HEADS):
        with open(HEADS) as f:
            L.append(f.read().rstrip())
        L.append("")

    # The registration write path under wrk, with its profile, measured
    # apart and written by hand: kept as it is.
    if os.path.exists(WRITE_PATH):
        with open(WRITE_PATH) as f:
            L.append(f.read().rstrip())
        L.append("")

    # ------------------------------------------------------------ setting
    L.append("## Machine, versions, noise")
    L.append("")
    for k, v in machine.items():
        L.append(f"- {k}: {v}")
    if rays:
        r = rays[0]
        L.append(f"- Ray {r.get('ray')}, pydantic {r.get('pydantic')}, Python {r.get('python')} "
                 f"(`ray_state_bench.py --api v1`, `--num-cpus 2`)")
    if ours:
        r = ours[0]
        L.append(f"- trainstate {r.get('trainstate')}, {r.get('rustc')}, release profile")
    L.append(f"- load average (1, 5, 15 min) before: {load_before}; after: {load_after}")
    L.append("")
    L.append("The machine has 2 cores shared by the state, the load generator and, during the run, "
             "other work on the same machine (builds and tests). Figures move by tens of percent "
             "between rounds: compare medians, read the ranges, and do not read small differences.")
    if errors:
        L.append("")
        L.append(f"{len(errors)} measurement(s) failed and are left out:")
        for e in errors:
            L.append(f"- {e.get('bench')} {e.get('path', '')} {e.get('store', '')} N={e.get('N')} W={e.get('W')}: "
                     f"`{' '.join(str(e.get('error')).split())[:300]}`")
    L.append("")
    L.append("## Commands")
    L.append("")
    L.append("This document was written by:")
    L.append("")
    L.append("```sh")
    L.append("python3 bench/compare.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    L.append("```")
    L.append("")
    if getattr(args, "from_results", False):
        L.append("and then written again from the same `bench/results.jsonl`, after the prose in "
                 "`bench/analysis.md` was edited, by `python3 bench/compare.py --from-results`. The measurement")
    else:
        L.append("The measurement")
    L.append("ran, in this order (each round repeats the measurement commands):")
    L.append("")
    L.append("```sh")
    L.extend(COMMANDS)
    L.append("```")
    L.append("")
    L.append("Every JSON line of the run is in `bench/results.jsonl`; the key names are those of "
             "`ray_state_bench.py` (`seq`, `pipelined`, `get_all`, `get_one`, `actor_mem_kib`, "
             "`actor_peak_rss_mib`, `actor_rss_growth_mib`, `ray_init_s`, `actor_create_s`), plus ours "
             "(`get_all_paged`, `ready_with_runs_s`, `client_ceiling`, `mem_per_run_kib`, `checks`).")
    L.append("")
    os.makedirs(os.path.dirname(DOC), exist_ok=True)
    with open(DOC, "w") as f:
        f.write("\n".join(L))
    log("wrote", rel(DOC))


def machine_info():
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            models = [l.split(":", 1)[1].strip() for l in f if l.startswith("model name")]
        info["CPU"] = f"{models[0] if models else '?'} ({len(models)} logical CPUs in /proc/cpuinfo)"
    except OSError:
        pass
    info["nproc"] = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    free = subprocess.run(["free", "-m"], capture_output=True, text=True).stdout.splitlines()
    if len(free) > 1:
        info["memory (free -m)"] = "`" + " ".join(free[1].split()) + "` (total used free shared buff/cache available)"
    info["kernel"] = platform.release()
    df = subprocess.run(["df", "-T", "/tmp"], capture_output=True, text=True).stdout.splitlines()
    if len(df) > 1:
        info["store directory file system (/tmp)"] = df[1].split()[1]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    info["trainstate commit"] = commit or "?"
    return info


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", default="2000x8,200x64", help="NxW,... (default 2000x8,200x64)")
    ap.add_argument("--ready", type=int, default=20000, help="also time a start with this many runs stored (0: no)")
    ap.add_argument("--note", default=None,
                    help="a sentence on the conditions of the sitting, printed under its date")
    ap.add_argument("--no-build", dest="build", action="store_false",
                    help="use the release binaries already in target/release")
    ap.add_argument("--wrk", action="store_true",
                    help="also register through wrk, and load reads and heartbeats with it "
                         "(cargo xtask bench --path wrk, --path wrk-reads) in every round")
    ap.add_argument("--wrk-prefer", choices=["minimal"], default=None,
                    help="wrk sends `Prefer: return=minimal`")
    ap.add_argument("--scale", type=int, default=0,
                    help="also measure the head with this many runs retained (0: no)")
    ap.add_argument("--setup-ray", action="store_true", help="create .venv-ray with ray 2.60 if it is missing")
    ap.add_argument("--skip-ray", action="store_true", help="measure trainstate alone")
    ap.add_argument("--ray-script", default=DEFAULT_RAY_SCRIPT)
    ap.add_argument("--no-micro", dest="micro", action="store_false",
                    help="skip the criterion micro-benchmarks")
    ap.add_argument("--from-results", action="store_true",
                    help="measure nothing: write docs/benchmarks.md again from bench/results.jsonl "
                         "(after editing bench/analysis.md)")
    args = ap.parse_args()

    if args.from_results:
        with open(RESULTS) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        meta = rows[0]["meta"]
        COMMANDS.extend(meta["commands"])
        args.configs, args.rounds = meta["configs"], meta["rounds"]
        args.note = args.note or meta.get("note")
        sys.argv[1:] = meta["argv"]
        write_doc(rows[1:], meta["ray_ok"], args, meta["machine"], meta["started"], meta["finished"],
                  meta["load_before"], meta["load_after"])
        return

    if args.setup_ray and not args.skip_ray and ray_python() is None:
        setup_ray()
    py = None if args.skip_ray else ray_python()
    ray_ok = py is not None and os.path.exists(args.ray_script)
    if not ray_ok and not args.skip_ray:
        log("Ray is not available (use --setup-ray); measuring trainstate alone")

    if args.build:
        code, _ = run(["cargo", "build", "--release", "--quiet", "-p", "xtask", "-p", "trainstate-actor",
                       "--bin", "xtask", "--bin", "trainstate"], capture=False)
        # Apart: an example turns on the actor's dev-dependency features,
        # which the measured binary must not have.
        if code == 0:
            code, _ = run(["cargo", "build", "--release", "--quiet", "-p", "trainstate-actor",
                           "--example", "inproc"], capture=False)
        if code != 0:
            sys.exit("release build failed")

    started = time.strftime("%Y-%m-%d %H:%M %Z")
    load_before = loadavg()
    machine = machine_info()
    results = []
    configs = [tuple(map(int, c.split("x"))) for c in args.configs.split(",")]
    env = dict(os.environ)
    if py:
        env["RAY_ANCHOR_PYTHON"] = py
    for rnd in range(1, args.rounds + 1):
        for (n, w) in configs:
            if ray_ok:
                code, out = run([sys.executable, args.ray_script, "-N", str(n), "-W", str(w)], env=env)
                lines = json_lines(out)
                if lines:
                    lines[-1]["round"] = rnd
                    results.extend(lines[-1:])
                else:
                    results.append({"bench": "ray_train_state_actor", "N": n, "W": w,
                                    "error": f"no result (exit {code})"})
            code, out = run([XTASK, "bench", "--no-build", "--n", str(n), "--w", str(w),
                             "--path", "all", "--store", "all"])
            for line in json_lines(out):
                line["round"] = rnd
                results.append(line)
            if args.wrk:
                cmd = [XTASK, "bench", "--no-build", "--n", str(n), "--w", str(w),
                       "--path", "wrk", "--store", "durable"]
                if args.wrk_prefer:
                    cmd += ["--wrk-prefer", args.wrk_prefer]
                code, out = run(cmd)
                lines = json_lines(out)
                for line in lines:
                    line["round"] = rnd
                results.extend(lines or [{"bench": "trainstate", "path": "wrk", "store": "durable",
                                          "N": n, "W": w, "error": f"no result (exit {code})"}])
                cmd = [XTASK, "bench", "--no-build", "--n", str(n), "--w", str(w),
                       "--path", "wrk-reads", "--store", "durable"]
                code, out = run(cmd)
                lines = json_lines(out)
                for line in lines:
                    line["round"] = rnd
                results.extend(lines or [{"bench": "trainstate", "path": "wrk-reads", "store": "durable",
                                          "N": n, "W": w, "error": f"no result (exit {code})"}])
    if args.ready:
        code, out = run([XTASK, "bench", "--no-build", "--path", "none", "--w", "8",
                         "--ready", str(args.ready)])
        results.extend(json_lines(out))
    if args.scale:
        code, out = run([XTASK, "bench", "--no-build", "--path", "none", "--w", "8",
                         "--scale", str(args.scale)])
        results.extend(json_lines(out) or [{"bench": "trainstate", "config": "scale", "N": args.scale,
                                            "error": f"no result (exit {code})"}])
    if args.micro:
        for package, bench in (("trainstate-schema", "wire"), ("trainstate-actor", "store")):
            code, out = run(["cargo", "bench", "--quiet", "-p", package, "--bench", bench], timeout=3600)
            results.extend(criterion_lines(out))
    elif os.path.exists(RESULTS):
        # Keep the last measured micro-benchmarks, marked as such.
        with open(RESULTS) as f:
            rows = [json.loads(line) for line in f if line.strip()]
        when = rows[0].get("meta", {}).get("started", "?") if rows else "?"
        for r in rows[1:]:
            if r.get("bench") == "criterion":
                r.setdefault("carried_from", when)
                results.append(r)
    finished = time.strftime("%Y-%m-%d %H:%M %Z")
    load_after = loadavg()

    meta = {"commands": COMMANDS, "configs": args.configs, "rounds": args.rounds, "argv": sys.argv[1:],
            "ray_ok": ray_ok, "machine": machine, "started": started, "finished": finished,
            "load_before": load_before, "load_after": load_after, "note": args.note}
    with open(RESULTS, "w") as f:
        f.write(json.dumps({"meta": meta}) + "\n")
        for r in results:
            f.write(json.dumps(r) + "\n")
    log("wrote", rel(RESULTS))
    write_doc(results, ray_ok, args, machine, started, finished, load_before, load_after)


if __name__ == "__main__":
    main()
