"""The framework callbacks. The Hugging Face callback runs inside a real
``transformers.Trainer`` (CI installs transformers from PyPI). Lightning does
not import with Debian's torch 1.13 on Python 3.11 (torch's own
``torch.distributed._shard`` fails there), so its callback is driven the way
Lightning calls it, with Lightning absent."""

import importlib.util
import os
import textwrap
from typing import TYPE_CHECKING

import pytest

from conftest import child_env, run_script, script

if TYPE_CHECKING:
    from pathlib import Path

    from conftest import Head

HF = """
    import torch
    from transformers import Trainer, TrainingArguments
    from trainstate.integrations.huggingface import TrainstateCallback

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, x, labels=None):
            out = self.linear(x).squeeze(-1)
            return {"loss": (out - labels).pow(2).mean(), "logits": out}

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            return {"x": torch.randn(4), "labels": torch.tensor(float(i % 2))}

    args = TrainingArguments(
        output_dir="out", max_steps=3, per_device_train_batch_size=4, report_to=[],
        save_strategy="no", logging_strategy="no", disable_tqdm=True, use_cpu=True,
    )
    callback = TrainstateCallback(timeout=1.0)
    Trainer(model=Model(), args=args, train_dataset=Data(), callbacks=[callback]).train()
    print("trained", callback.run.run_id, callback.run.status)
"""


def test_the_hugging_face_callback_reports_a_real_trainer_run(head, name, tmp_path):
    if importlib.util.find_spec("transformers") is None:
        if os.environ.get("CI"):
            raise RuntimeError("transformers is required on CI: .ci/run installs it")
        pytest.skip("transformers is not installed")
    result = run_script(script(tmp_path, HF), child_env(head.url, name), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    run = head.run_named(name, "FINISHED")
    assert f"trained {run['id']}" in result.stdout
    assert len(run["workers"]) == 1


CALLBACKS = """
    import sys
    from trainstate.integrations.{module} import TrainstateCallback

    # The framework's base class has the end hooks; without the framework, nothing calls them.
    END = lambda callback, hook: getattr(callback, hook, lambda *args: None)
    callback = TrainstateCallback(timeout=1.0)
    {calls}
    print("enabled", callback.run.enabled)
"""


@pytest.mark.parametrize(
    "module, calls, status, cause",
    [
        ("huggingface", "callback.on_train_begin(None, None, None); END(callback, 'on_train_end')(None, None, None)", "FINISHED", None),
        ("lightning", "callback.on_fit_start(None, None); END(callback, 'on_fit_end')(None, None)", "FINISHED", None),
        # Lightning catches KeyboardInterrupt, calls on_exception, and the script goes on to exit cleanly.
        ("lightning", "callback.on_fit_start(None, None); callback.on_exception(None, None, KeyboardInterrupt())", "ABORTED", "USER_INTERRUPT"),
        ("lightning", "callback.on_fit_start(None, None); callback.on_exception(None, None, ValueError('nan loss'))", "ERRORED", "USER_ERROR"),
    ],
)
def test_callbacks_join_and_end_the_rank_as_their_framework_calls_them(head, name, tmp_path, module, calls, status, cause):
    path = script(tmp_path, CALLBACKS.format(module=module, calls=calls))
    result = run_script(path, child_env(head.url, name))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "enabled True"
    run = head.run_named(name, status)
    assert (run.get("cause") or {}).get("kind") == cause
    if status == "ERRORED":
        assert "ValueError: nan loss" in run["status_detail"]


@pytest.mark.parametrize(
    "module, calls",
    [
        ("huggingface", "callback.on_train_begin(None, None, None); END(callback, 'on_train_end')(None, None, None)"),
        ("lightning", "callback.on_fit_start(None, None); END(callback, 'on_fit_end')(None, None)"),
    ],
)
def test_the_end_of_training_is_not_the_end_of_the_rank(head, name, tmp_path, module, calls):
    # Training ended cleanly, then the script failed: the run is what the
    # process did, as torchrun's exit status says.
    path = script(tmp_path, CALLBACKS.format(module=module, calls=calls) + "    raise RuntimeError('export failed')\n")
    result = run_script(path, child_env(head.url, name))
    assert result.returncode == 1
    run = head.run_named(name, "ERRORED")
    assert run["cause"]["kind"] == "USER_ERROR"
    assert "RuntimeError: export failed" in run["status_detail"]


def test_callbacks_import_without_their_frameworks():
    from trainstate.integrations import huggingface, lightning

    for module, framework in [(huggingface, "transformers"), (lightning, "pytorch_lightning")]:
        base = module.TrainstateCallback.__mro__[1]
        try:
            importlib.import_module(framework)
        except Exception:  # absent, or broken as Lightning is with Debian's torch
            assert base is object


PROGRESS_CALLBACKS = """
    import os, time
    from types import SimpleNamespace
    from trainstate.integrations.{module} import TrainstateCallback

    callback = TrainstateCallback(timeout=1.0)
    {calls}
    print("reported", callback.run.run_id, flush=True)
    until = time.monotonic() + 60
    while not os.path.exists("done") and time.monotonic() < until:
        time.sleep(0.05)
"""

HF_CALLS = """
    state = SimpleNamespace(global_step=0, max_steps=40)
    callback.on_train_begin(None, state, None)
    for step in range(1, 8):
        state.global_step = step
        callback.on_step_end(None, state, None)
    callback.on_log(None, state, None, logs={"loss": 0.25, "learning_rate": 1e-4, "epoch": 0.5, "note": "text"})
"""

LIGHTNING_CALLS = """
    class Tensor:
        def __init__(self, value):
            self.value = value
        def numel(self):
            return 1
        def __float__(self):
            return self.value
    trainer = SimpleNamespace(global_step=0, max_steps=40, logged_metrics={"train_loss": Tensor(0.25), "lr": 1e-4})
    callback.on_fit_start(trainer, None)
    for step in range(1, 8):
        trainer.global_step = step
        callback.on_train_batch_end(trainer, None, None, None, step)
"""


@pytest.mark.parametrize(
    "module, calls, metrics",
    [
        ("huggingface", HF_CALLS, {"loss": 0.25, "learning_rate": 1e-4, "epoch": 0.5}),
        ("lightning", LIGHTNING_CALLS, {"train_loss": 0.25, "lr": 1e-4}),
    ],
)
def test_callbacks_report_step_max_steps_and_logged_scalars(head, name, tmp_path, module, calls, metrics):
    import subprocess
    import sys

    from conftest import health_of, wait_until

    path = script(tmp_path, PROGRESS_CALLBACKS.format(module=module, calls=textwrap.indent(textwrap.dedent(calls), "    ")))
    child = subprocess.Popen([sys.executable, str(path)], env=child_env(head.url, name), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))
    try:
        first = child.stdout.readline()
        assert first.startswith("reported "), (first, child.stderr.read() if child.poll() is not None else "")
        run_id = first.split()[1]

        def at_step_7():
            served = (head.get(f"/api/train/runs/{run_id}").get("rank_progress") or [None])[0]
            return served if served and served.get("step") == 7 and served.get("metrics") else None

        try:
            progress = wait_until("the callback's progress", at_step_7, deadline=15)
        except AssertionError:
            health_of(head, run_id, "PROGRESSING", deadline=0)  # says whether the head serves progress at all
            raise
        assert progress["total_steps"] == 40
        assert progress["metrics"] == metrics
        (tmp_path / "done").touch()
        assert child.wait(30) == 0, child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


HF_SAVE_CALLS = """
    state = SimpleNamespace(global_step=0, max_steps=40)
    callback.on_train_begin(None, state, None)
    for step in range(1, 8):
        state.global_step = step
        callback.on_step_end(None, state, None)
        if step == 5:
            callback.on_save(None, state, None)
"""

LIGHTNING_SAVE_CALLS = """
    trainer = SimpleNamespace(global_step=0, max_steps=40, logged_metrics={})
    callback.on_fit_start(trainer, None)
    for step in range(1, 8):
        trainer.global_step = step
        callback.on_train_batch_end(trainer, None, None, None, step)
        if step == 5:
            callback.on_save_checkpoint(trainer, None, {"global_step": step})
"""


@pytest.mark.parametrize("module, calls", [("huggingface", HF_SAVE_CALLS), ("lightning", LIGHTNING_SAVE_CALLS)])
def test_callbacks_mark_the_global_step_saved_when_their_framework_saves(head: "Head", name: str, tmp_path: "Path", module: str, calls: str) -> None:
    import subprocess
    import sys

    from typing import Any, Dict, Optional

    from conftest import wait_until

    path = script(tmp_path, PROGRESS_CALLBACKS.format(module=module, calls=textwrap.indent(textwrap.dedent(calls), "    ")))
    child = subprocess.Popen([sys.executable, str(path)], env=child_env(head.url, name), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))
    try:
        assert child.stdout is not None and child.stderr is not None
        first = child.stdout.readline()
        assert first.startswith("reported "), (first, child.stderr.read() if child.poll() is not None else "")
        run_id = first.split()[1]

        def at_step_7() -> Optional[Dict[str, Any]]:
            served: Optional[Dict[str, Any]] = (head.get(f"/api/train/runs/{run_id}").get("rank_progress") or [None])[0]
            return served if served and served.get("step") == 7 else None

        progress = wait_until("the callback's progress at step 7", at_step_7, deadline=15)
        assert progress.get("checkpoint") == 5, f"the save at step 5 is the rank's mark: {progress}"
        (tmp_path / "done").touch()
        assert child.wait(30) == 0, child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
