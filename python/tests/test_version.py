"""One version for the workspace and the wheel: the root Cargo.toml's
``[workspace.package] version`` is the one place, and the Python client's
``trainstate.__version__`` (which pyproject.toml reads for the wheel) must
say the same, or this fails."""

import ast
import re
from pathlib import Path

import trainstate

from conftest import ROOT


def workspace_version() -> str:
    """``[workspace.package] version`` of the root Cargo.toml."""
    text = (ROOT / "Cargo.toml").read_text()
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # the oldest Pythons: the one key, read by hand
        section = re.search(r"^\[workspace\.package\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
        assert section, "the root Cargo.toml has no [workspace.package]"
        found = re.search(r'^version\s*=\s*"([^"]+)"', section.group(1), re.M)
        assert found, "[workspace.package] has no version"
        return found.group(1)
    return str(tomllib.loads(text)["workspace"]["package"]["version"])


def source_version() -> str:
    """``__version__`` as written in the source, read as setuptools reads it."""
    tree = ast.parse((ROOT / "python" / "trainstate" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets):
            assert isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            return node.value.value
    raise AssertionError("trainstate/__init__.py assigns no literal __version__")


def test_the_client_has_the_workspace_version():
    assert source_version() == workspace_version(), (
        "python/trainstate/__init__.py's __version__ and the root Cargo.toml's "
        "[workspace.package] version differ: change both (docs/install.md)"
    )


def test_the_imported_package_says_its_version():
    assert trainstate.__version__ == source_version()


def test_the_wheel_reads_its_version_from_the_package():
    pyproject = (ROOT / "python" / "pyproject.toml").read_text()
    assert re.search(r'^dynamic\s*=\s*\["version"\]', pyproject, re.M), "pyproject.toml must not write a version of its own"
    assert not re.search(r'^version\s*=', pyproject.split("[project.optional-dependencies]")[0], re.M)
    assert re.search(r'^version\s*=\s*\{\s*attr\s*=\s*"trainstate.__version__"\s*\}', pyproject, re.M)


def test_every_crate_takes_the_workspace_version():
    for manifest in sorted(ROOT.glob("*/Cargo.toml")):
        text = manifest.read_text()
        if re.search(r"^\[package\]", text, re.M):
            assert re.search(r"^version\.workspace\s*=\s*true", text, re.M), f"{manifest} sets a version of its own"
