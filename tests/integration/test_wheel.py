"""labkit as a wheel: built from this checkout, installed in a fresh environment outside it, run from a scratch folder.

Nothing is downloaded. The wheel is built with this environment's setuptools (``pip wheel --no-deps
--no-build-isolation --no-index``) from a copy of the package and its project file, and installed
with ``--no-deps`` into a new virtual environment made from the same base Python
(:mod:`bare_venv`). Its dependencies (TensorFlow, Horovod, jsonschema...) come from this
environment's ``site-packages``, which the new one sees through a ``.pth`` file holding that
folder's path; the editable install's finder that maps ``labkit`` to this checkout is not run
there, so ``import labkit`` can only find the wheel's copy, which the first test asserts.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml
from helpers import bare_venv, paths

from labkit.deploy import k8s_validate

ROOT = paths.ROOT
pytestmark = pytest.mark.slow


class Installed:
    """The fresh environment with the wheel in it, and a scratch folder outside the checkout to run in."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.wheel = self._build(work / "dist")
        self.venv = work / "venv"
        self.scratch = work / "scratch"
        self.scratch.mkdir()
        self._install()

    def _build(self, dist: Path) -> Path:
        src = self.work / "src"  # a copy: building in the checkout would leave build/ there
        shutil.copytree(ROOT / "labkit", src / "labkit", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(ROOT / name, src / name)
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
              "--wheel-dir", str(dist), str(src)], timeout=600)
        (wheel,) = dist.glob("labkit-*.whl")
        return wheel

    def _install(self) -> None:
        bare_venv.create(self.venv)
        _run([sys.executable, "-m", "pip", "--python", str(self.python), "install", "--no-deps", "--no-index",
              str(self.wheel)], timeout=300)

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def env(self) -> dict[str, str]:
        return bare_venv.environ(self.venv)

    def labkit(self, *args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
        """The wheel's ``labkit`` command, run in the scratch folder (or ``cwd``)."""
        return subprocess.run([str(self.venv / "bin" / "labkit"), *args], cwd=cwd or self.scratch, env=self.env(),
                              capture_output=True, text=True, timeout=timeout)


def _run(argv: Sequence[str], timeout: float = 120) -> subprocess.CompletedProcess:
    out = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{' '.join(argv)} failed:\n{out.stdout}\n{out.stderr}"
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("wheel")
    assert not work.resolve().is_relative_to(ROOT)
    return Installed(work)


def test_the_wheel_carries_the_package_and_its_data_but_no_course(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    schemas = sorted(p.name for p in k8s_validate.SCHEMA_DIR.iterdir() if p.is_file())
    assert [s for s in schemas if f"labkit/deploy/k8s_schemas/{s}" not in names] == []
    assert "labkit/check/__init__.py" in names and "labkit/cli/main.py" in names
    assert not [n for n in names if n.startswith(("solutions/", "labs/", "tests/", "k8s/"))]
    metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
    requires = [line for line in zipfile.ZipFile(installed.wheel).read(metadata).decode().splitlines()
                if line.startswith("Requires-Dist: tomli")]
    assert requires and 'python_version < "3.11"' in requires[0]
    where = subprocess.run([str(installed.python), "-c", "import labkit; print(labkit.__file__)"],
                           cwd=installed.scratch, env=installed.env(), capture_output=True, text=True, timeout=120)
    assert Path(where.stdout.strip()).is_relative_to(installed.venv), where.stdout + where.stderr


def test_doctor_reports_as_json(installed: Installed) -> None:
    out = installed.labkit("doctor", "--json")
    report = json.loads(out.stdout)
    assert report["executable"] == str(installed.python)
    assert report["tensorflow"] and report["keras"].startswith("tf-keras")
    assert isinstance(report["problems"], list) and report["ready"] == (out.returncode == 0)


def test_k8s_manifests_are_validated_against_the_schemas_in_the_wheel(installed: Installed) -> None:
    out = installed.labkit("k8s", "mpijob", "--workers", "3", "-o", "-")
    assert out.returncode == 0, out.stderr
    job = yaml.safe_load(out.stdout)
    assert job["kind"] == "MPIJob" and job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 3
    code = ("from labkit.deploy import k8s; job = k8s.mpijob(); job['spec']['bogus'] = 1\n"
            "try:\n    k8s.validate(job)\nexcept ValueError as e:\n    print(e)")
    bad = subprocess.run([str(installed.python), "-c", code], cwd=installed.scratch, env=installed.env(),
                         capture_output=True, text=True, timeout=120)
    assert "spec.bogus: unknown field" in bad.stdout, bad.stdout + bad.stderr  # the stored schema was read


def test_check_help(installed: Installed) -> None:
    out = installed.labkit("check", "--help")
    assert out.returncode == 0 and "horovod" in out.stdout and "parameter-server" in out.stdout


def test_release_needs_the_course_source_and_says_so(installed: Installed) -> None:
    out = installed.labkit("release", "OUT")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "no course source" in out.stderr and "checkout of the course source" in out.stderr
    assert not (installed.scratch / "OUT").exists()
    gen = installed.labkit("gen", "--check")  # the templates are the course's too
    assert gen.returncode != 0 and "no course source" in gen.stderr


def test_release_from_a_checkout_of_the_course_source(installed: Installed) -> None:
    course = installed.work / "course"
    out = installed.labkit("release", str(course), cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert (course / "labs" / "fashion_mnist.py").is_file() and (course / ".labkit" / "starters").is_dir()
    assert (course / "labkit" / "deploy" / "k8s_schemas" / "SOURCES.md").is_file()
    assert not (course / "solutions").exists()
    again = installed.labkit("release", "--check", str(course), cwd=ROOT / "labs")  # found from a folder inside
    assert again.returncode == 0, again.stdout + again.stderr
