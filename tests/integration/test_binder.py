"""Binder: binder/postBuild run from a clean clone into a fresh Python environment, as repo2docker runs it.

repo2docker builds an image: the Python that ``binder/runtime.txt`` names, the Debian packages of
``binder/apt.txt`` (installed by the image build; here the machine's own), then ``binder/postBuild``
from the repository's root with that Python first on PATH, and ``binder/start`` before every command.
No Docker engine is needed to run those steps the same way.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import paths

ROOT = paths.ROOT
BINDER = ROOT / "binder"


def _runtime_python() -> str:
    """The interpreter binder/runtime.txt asks for (``python-3.11`` -> ``python3.11``)."""
    version = (BINDER / "runtime.txt").read_text().strip().removeprefix("python-")
    found = shutil.which(f"python{version}")
    if found is None:
        pytest.skip(f"binder/runtime.txt asks for Python {version}, which this machine lacks")
    return found


def test_runtime_and_apt_files_match_what_setup_needs() -> None:
    version = (BINDER / "runtime.txt").read_text().strip()
    assert version.startswith("python-3.") and 10 <= int(version.split(".")[1]) <= 13  # TensorFlow 2.21's range
    apt = set((BINDER / "apt.txt").read_text().split())
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert {"openmpi-bin", "libopenmpi-dev", "dataset-fashion-mnist"} <= apt
    assert all(pkg in setup for pkg in apt), "apt.txt names a package the setup does not know"
    assert os.access(BINDER / "postBuild", os.X_OK) and os.access(BINDER / "start", os.X_OK)


@pytest.mark.slow
@pytest.mark.heavy  # a fresh environment from PyPI's wheels: make test-heavy
@pytest.mark.horovod
def test_postbuild_installs_a_working_lab_into_a_fresh_environment(tmp_path: Path) -> None:
    repo, env_dir = tmp_path / "repo", tmp_path / "env"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True, timeout=120)
    subprocess.run([_runtime_python(), "-m", "venv", str(env_dir)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LABKIT_", "VIRTUAL_ENV", "PYTHON"))}
    env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env['PATH']}"
    env["PIP_NO_COMPILE"] = "1"  # no byte-compiling of TensorFlow's thousands of files: a minute less, same install
    build = subprocess.run(["bash", str(repo / "binder" / "postBuild")], cwd=repo, env=env, capture_output=True,
                           text=True, timeout=1500)
    assert build.returncode == 0, (build.stdout + build.stderr)[-3000:]
    python = env_dir / "bin" / "python"
    assert not (repo / ".venv").exists(), "postBuild must install into Binder's environment, not a .venv"
    doctor = subprocess.run([str(repo / "binder" / "start"), str(env_dir / "bin" / "labkit"), "doctor", "--json"],
                            cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    report = json.loads(doctor.stdout)
    assert report["ready"] is True, doctor.stdout[-3000:]
    assert report["horovod"]["mpi"] is True and report["horovod"]["version"] == "0.28.1"
    where = subprocess.run([str(python), "-c", "import labkit, tensorflow as tf; print(labkit.__file__)"],
                           env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)  # not this checkout
    assert where.stdout.strip().startswith(str(repo)), where.stdout + where.stderr
    assert sys.prefix != str(env_dir)
