"""The layers' import contract (``.importlinter``): kept by the package, and broken by an injected upward import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import paths

ROOT = paths.ROOT
LINT = Path(sys.executable).parent / "lint-imports"
pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (make setup installs it)")


def _lint(tree: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run([str(LINT), "--config", str(tree / ".importlinter")], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=300)


def _copy(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "labkit", tree / "labkit", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", tree / ".importlinter")
    return tree


def test_the_package_keeps_its_layers(tmp_path: Path) -> None:
    done = _lint(_copy(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


@pytest.mark.parametrize(("module", "line", "named"), [
    ("core/proc.py", "from labkit.records import runs", "labkit.core is not allowed to import labkit.records"),
    ("records/runs.py", "def _later():\n    from labkit.launching import launch", "labkit.records is not allowed"),
    ("check/judging.py", "from labkit.deploy import k8s", "labkit.check is not allowed to import labkit.deploy"),
])
def test_an_upward_import_breaks_the_contract(tmp_path: Path, module: str, line: str, named: str) -> None:
    """Also inside a function: a function-level import cannot dodge a layer."""
    tree = _copy(tmp_path)
    path = tree / "labkit" / module
    path.write_text(path.read_text() + "\n\n" + line + "\n")
    done = _lint(tree)
    assert done.returncode != 0 and named in done.stdout, done.stdout + done.stderr
