"""Ray's own V2 pydantic models accept every document trainstate serves on
Ray's V2 route, for runs written the V2 way and runs registered the V1 way.

Runs against the real `trainstate` binary (TRAINSTATE_BIN). Needs Ray 2.60
(`fixtures/ray-v2/ray-requirements.txt`): skipped with a reason when it is
missing, except under CI=true, where a missing Ray is a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "fixtures"

try:
    from ray.train.v2._internal.state.schema import TrainRunsResponse
except ImportError as missing:  # pragma: no cover - depends on the machine
    if os.environ.get("CI") == "true":
        raise
    pytest.skip(f"Ray 2.60 is not installed ({missing})", allow_module_level=True)


def request(method: str, url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("content-type", "application/json")
    with urllib.request.urlopen(req, timeout=10) as answer:
        return json.load(answer)


@pytest.fixture()
def head() -> Iterator[str]:
    binary = os.environ.get("TRAINSTATE_BIN", str(ROOT / "target" / "debug" / "trainstate"))
    with tempfile.TemporaryDirectory() as data_dir:
        process = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0", "--data-dir", data_dir],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdout is not None
            first = process.stdout.readline().strip()
            assert first.startswith("listening on "), first
            yield first.removeprefix("listening on ")
        finally:
            process.terminate()
            process.wait(timeout=30)


def test_rays_v2_models_accept_what_trainstate_serves(head: str) -> None:
    dashboard = json.loads((FIXTURES / "ray-v2" / "dashboard-v2-runs.json").read_text())
    # Ray's three real runs, written the V2 way, as their final whole documents.
    for run in reversed(dashboard["train_runs"]):
        own = {k: run[k] for k in run if k not in ("attempts", "job_details")}
        request("PUT", f"{head}/api/train/v2/runs/{run['id']}", own)
        for attempt in run["attempts"]:
            workers = [
                {k: v for k, v in w.items() if k not in ("processStats", "gpus")}
                for w in attempt["workers"]
            ]
            doc = dict(attempt, workers=workers)
            request("PUT", f"{head}/api/train/v2/runs/{run['id']}/attempts/{attempt['attempt_id']}", doc)
    # And Ray's V1 documents, registered the V1 way.
    for v1 in json.loads((FIXTURES / "ray-v1-runs.json").read_text()):
        request("POST", f"{head}/api/train/runs", v1)

    answer = request("GET", f"{head}/api/train/v2/runs/v1")
    assert len(answer["train_runs"]) == len(dashboard["train_runs"]) + 2
    validated = TrainRunsResponse.model_validate(answer)
    assert {r.name for r in validated.train_runs} >= {"v2-ok", "v2-flaky", "v2-bad"}
    statuses = {r.name: r.status.value for r in validated.train_runs}
    assert statuses["v2-bad"] == "ERRORED" and statuses["v2-flaky"] == "FINISHED"
    flaky = next(r for r in validated.train_runs if r.name == "v2-flaky")
    assert [a.status.value for a in flaky.attempts] == ["ERRORED", "FINISHED"]
