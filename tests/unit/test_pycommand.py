"""What a python command is, said once (labkit.core.pycommand), for the starter, the scale-out check, the plain
Slurm script and the batch script's dry run."""

from __future__ import annotations

import pytest

from labkit.core import pycommand


@pytest.mark.parametrize("program, python", [
    ("python", True), ("python3", True), ("python3.12", True), ("/opt/venv/bin/python3", True),
    ("pythonw", False), ("ipython", False), ("python-config", False), ("bash", False), ("train.py", False),
])
def test_which_programs_are_python(program: str, python: bool) -> None:
    assert pycommand.is_python(program) is python


def test_every_name_the_dry_run_shims_is_python() -> None:
    assert all(pycommand.is_python(name) for name in pycommand.NAMES)


@pytest.mark.parametrize("argv, strict, lenient", [
    (["python", "t.py", "--epochs", "2"], (["python"], ["t.py", "--epochs", "2"]), "t.py"),
    (["python", "-u", "-X", "dev", "-Wignore", "t.py"], (["python", "-u", "-X", "dev", "-Wignore"], ["t.py"]), "t.py"),
    (["python", "-uB", "t.py"], (["python", "-uB"], ["t.py"]), "t.py"),
    (["python", "-m", "pkg"], None, None),
    (["python", "-c", "print(1)"], None, None),
    (["python", "-"], None, None),
    (["python", "-u"], None, None),
    (["python", "--unknown", "t.py"], None, "t.py"),  # the starter leaves it unwrapped; the reader finds the script
    (["python", "-Q", "new", "t.py"], None, "t.py"),  # Python 2's option: read in a batch script, never wrapped
    (["python", "-um", "pkg"], None, None),  # -m joined to a flag still runs a module
    (["python", "-Bc", "print(1)"], None, None),
])
def test_the_script_after_the_interpreters_options(argv: list[str], strict: object, lenient: str | None) -> None:
    assert pycommand.split(argv) == strict
    found = pycommand.split(argv, strict=False)
    assert (found[1][0] if found else None) == lenient
