"""The framework callbacks. The Hugging Face callback runs inside a real
``transformers.Trainer`` (CI installs transformers from PyPI). Lightning does
not import with Debian's torch 1.13 on Python 3.11 (torch's own
``torch.distributed._shard`` fails there), so its callback is driven the way
Lightning calls it, with Lightning absent."""

import importlib.util
import os

import pytest

from conftest import child_env, run_script, script

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
