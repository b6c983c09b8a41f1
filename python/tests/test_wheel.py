"""The Python client as a wheel, as a training job gets it: the wheel is
built offline (`pip wheel --no-deps --no-build-isolation`), installed with
no index into a fresh virtual environment, and a real 2-rank torchrun job
run by that environment's Python reports to the real head through the
installed package (never the source tree), ending FINISHED with both ranks.

With ``TRAINSTATE_WHEEL`` set (`.ci/run` sets it to the wheel it built),
that file is the one installed; otherwise the test builds its own from a
copy of ``python/`` (so no ``build/`` directory of the source tree, with
files since removed, can leak into it)."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from conftest import ROOT, Head
from test_version import workspace_version

if importlib.util.find_spec("torch") is None:
    if os.environ.get("CI"):
        raise RuntimeError("torch is required on CI: .ci/run installs python3-torch")
    pytest.skip("torch is not installed (apt-get install --no-install-recommends python3-torch)", allow_module_level=True)

TRAIN = """
    import os, sys
    import trainstate
    # The package is the wheel installed in this environment, not the source tree.
    assert trainstate.__file__.startswith(sys.prefix + os.sep), (trainstate.__file__, sys.prefix)
    run = trainstate.init()
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    model = torch.nn.Linear(4, 1)
    for step in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        model.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        trainstate.report({"loss": float(loss)}, step=step, total_steps=3)
    dist.barrier()
    print(f"rank {dist.get_rank()} done with trainstate {trainstate.__version__}", flush=True)
    dist.destroy_process_group()
"""

# Offline: nothing here may reach an index.
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


def clean_env(**extra: str) -> Dict[str, str]:
    """The environment without anything that would point Python at the
    source tree, a launcher or a head of the caller's."""
    prefixes = ("TRAINSTATE_", "RANK", "WORLD_SIZE", "LOCAL_", "TORCHELASTIC", "SLURM_", "MASTER_", "GROUP_", "PIP_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes) and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(OFFLINE)
    env.update(extra)
    return env


def builder() -> Optional[str]:
    """A Python that can build the wheel with no network: setuptools 61+
    (pyproject.toml metadata) and wheel, installed beside it."""
    probe = "import setuptools, wheel, sys; sys.exit(int(setuptools.__version__.split('.')[0]) < 61)"
    for candidate in (sys.executable, "/usr/bin/python3"):
        if candidate and Path(candidate).exists():
            if subprocess.run([candidate, "-c", probe], env=clean_env(), capture_output=True).returncode == 0:
                return candidate
    return None


def run(command: List[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert result.returncode == 0, f"{command} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def build_wheel(tmp_path: Path) -> Path:
    python = builder()
    if python is None:
        if os.environ.get("CI"):
            raise RuntimeError("no Python with setuptools>=61 and wheel: .ci/run installs python3-setuptools python3-wheel")
        pytest.skip("no Python with setuptools>=61 and wheel to build the wheel offline")
    source = tmp_path / "src"
    # A copy of what the wheel is built from, symbolic links (the licence
    # texts) followed, without build leftovers or the tests.
    shutil.copytree(
        ROOT / "python",
        source,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".mypy_cache", "tests", "resumed-*"),
    )
    dist = tmp_path / "dist"
    run([python, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(dist), str(source)], 120, env=clean_env())
    built = list(dist.iterdir())
    assert len(built) == 1, built
    return built[0]


def test_the_wheel_installs_offline_and_a_torchrun_job_reports_through_it(head: Head, name: str, tmp_path: Path):
    version = workspace_version()
    given = os.environ.get("TRAINSTATE_WHEEL")
    wheel = Path(given) if given else build_wheel(tmp_path)
    # One version for the workspace, the wheel and the head.
    assert wheel.name == f"trainstate-{version}-py3-none-any.whl", wheel.name
    assert head.get("/api/version")["version"] == version
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(f"trainstate-{version}.dist-info/METADATA").decode()
    assert "trainstate/py.typed" in names, names
    assert f"\nVersion: {version}\n" in metadata
    assert "\nAuthor: The trainstate developers\n" in metadata
    assert "\nClassifier: Typing :: Typed\n" in metadata
    assert {f"trainstate-{version}.dist-info/LICENSE-MIT", f"trainstate-{version}.dist-info/LICENSE-APACHE"} <= set(names)

    # A fresh environment. Its system site packages give it Debian's torch
    # (torchrun), never the package under test: the checks below say where
    # `trainstate` comes from.
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], 120, env=clean_env())
    python = str(venv / "bin" / "python")
    run([python, "-m", "pip", "install", "--no-index", "--no-deps", str(wheel)], 120, env=clean_env(), cwd=str(tmp_path))

    where = tmp_path / "elsewhere"  # not python/, so the source tree is not on sys.path
    where.mkdir()
    probe = (
        "import json, sys, importlib.metadata as m, trainstate\n"
        "files = [str(f) for f in m.files('trainstate') or []]\n"
        "typed = [str(f.locate()) for f in m.files('trainstate') or [] if str(f).endswith('py.typed')]\n"
        "print(json.dumps({'file': trainstate.__file__, 'prefix': sys.prefix, 'version': trainstate.__version__,\n"
        "  'dist_version': m.version('trainstate'), 'files': files, 'typed': typed}))\n"
    )
    seen = json.loads(run([python, "-c", probe], 60, env=clean_env(), cwd=str(where)).stdout)
    assert Path(seen["file"]).resolve().is_relative_to(Path(seen["prefix"]).resolve() / "lib"), seen["file"]
    assert not Path(seen["file"]).resolve().is_relative_to(ROOT), seen["file"]
    assert seen["version"] == seen["dist_version"] == version
    assert "trainstate/py.typed" in seen["files"], seen["files"]
    assert len(seen["typed"]) == 1 and Path(seen["typed"][0]).is_file(), seen["typed"]

    # A real 2-rank torchrun job, launched by the fresh environment's Python.
    train = where / "train.py"
    train.write_text(textwrap.dedent(TRAIN))
    command = [
        python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        # --redirects 2 --tee 2: torch 1.13 on Python 3.11 crashes with the default.
        "--redirects", "2", "--tee", "2", "--monitor_interval", "0.2", str(train),
    ]
    env = clean_env(TRAINSTATE_URL=head.url, TRAINSTATE_RUN_NAME=name, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    result = subprocess.run(command, env=env, cwd=str(where), capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count(f"done with trainstate {version}") == 2, result.stdout[-3000:]

    finished = head.run_named(name, "FINISHED")
    assert [w["world_rank"] for w in finished["workers"]] == [0, 1], finished["workers"]
    assert len({w["pid"] for w in finished["workers"]}) == 2
    assert [a["attempt_id"] for a in finished["attempts"]] == ["0"]
