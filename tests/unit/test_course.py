"""labkit.course.release: the learner's release (no solutions/ folder) and resetting a starter with a backup."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.course import labs
from labkit.course import release as course

ROOT = labs.ROOT


def test_release_holds_starters_cleared_notebooks_and_grading_but_no_solutions(tmp_path: Path) -> None:
    out = tmp_path / "course"
    written = course.release(out)
    assert "pyproject.toml" in written and ".github/workflows/grade.yml" in written and ".gitlab-ci.yml" in written
    assert (out / ".gitlab-ci.yml").read_bytes() == (ROOT / "course" / "workflows" / "gitlab-ci.yml").read_bytes()
    assert (out / "course" / "autograder.py").is_file()  # for the instructor's Classroom 50 config repository
    assert not (out / "solutions").exists() and not (out / "tests").exists()
    for lab in labs.LABS.values():
        assert (out / "labs" / lab.starter).read_text() == (ROOT / "labs" / lab.starter).read_text()
        assert (out / course.STARTERS / lab.starter).is_file()
    nb = json.loads((out / "labs" / "02_horovod.ipynb").read_text())
    assert all(c.get("outputs", []) == [] for c in nb["cells"] if c["cell_type"] == "code")
    assert (out / "labs" / "figures" / "ring_allreduce.svg").is_file()  # the pictures the notebooks show
    assert "[tool.labkit.grading]" in (out / "pyproject.toml").read_text()
    assert course.release(out, check=True) == []


def test_release_check_names_what_is_out_of_sync(tmp_path: Path) -> None:
    out = tmp_path / "course"
    course.release(out)
    (out / "labs" / "fashion_mnist.py").write_text("# edited\n")
    (out / "solutions").mkdir()
    done = subprocess.run([sys.executable, "-m", "labkit.cli", "release", "--check", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "labs/fashion_mnist.py" in done.stderr and "solutions/" in done.stderr
    with pytest.raises(ValueError, match="another folder"):
        course.release(ROOT)


def test_not_started_ignores_comments_but_not_code(tmp_path: Path) -> None:
    lab = labs.get("horovod")
    script = tmp_path / lab.starter
    starter = (ROOT / "labs" / lab.starter).read_text()
    script.write_text(starter.replace("# TODO: Step 2", "# my note\n    # TODO: Step 2"))
    assert course.not_started(script, lab)
    script.write_text(starter + "print('started')\n")
    assert not course.not_started(script, lab)


def test_reset_restores_the_starter_and_keeps_every_version(tmp_path: Path) -> None:
    folder = tmp_path / "labs"
    folder.mkdir()
    script = folder / "fashion_mnist_mirrored.py"
    assert course.reset(script) is None and script.read_text() == (ROOT / "labs" / script.name).read_text()
    script.write_text("my first try\n")
    first = course.reset(script)
    script.write_text("my second try\n")
    second = course.reset(script)
    assert first != second and first.read_text() == "my first try\n" and second.read_text() == "my second try\n"
    assert script.read_text() == (ROOT / "labs" / script.name).read_text()
    assert course.reset(script) is None  # already the starter: nothing to back up
    with pytest.raises(ValueError, match="not a lab starter"):
        course.reset(folder / "notes.py")


def test_the_release_holds_no_solution_and_no_notebook_names_one(tmp_path: Path) -> None:
    out = tmp_path / "course"
    course.release(out)
    solutions = {p.read_bytes() for p in (ROOT / "solutions").glob("*.py")}
    shipped = [p for p in out.rglob("*") if p.is_file()]
    assert not (out / "solutions").exists()
    assert not (out / "course" / "INSTRUCTOR.md").exists() and (out / "docs" / "checks.md").is_file()
    assert [str(p.relative_to(out)) for p in shipped if p.read_bytes() in solutions] == []
    mentions = [f"{nb.name} cell {c.get('id')}" for nb in sorted((out / "labs").glob("*.ipynb"))
                for c in json.loads(nb.read_text())["cells"] if "solutions/" in "".join(c["source"])]
    assert mentions == [], "released notebooks name solutions/ (a learner's course has none)"


def test_the_release_ships_the_reference_results_and_the_lab_settings(tmp_path: Path) -> None:
    out = tmp_path / "course"
    course.release(out)
    for name in ("runs.jsonl", "results.json", "README.md"):
        assert (out / "labs" / "reference" / name).is_file(), name
    overrides = json.loads((out / "jupyter" / "lab-settings" / "overrides.json").read_text())
    assert overrides["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"
    done = subprocess.run(["make", "-n", "-o", "setup", "lab"], cwd=out, capture_output=True, text=True, timeout=60)
    assert f"--LabApp.app_settings_dir={out}/jupyter/lab-settings" in done.stdout, done.stdout
