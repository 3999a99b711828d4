"""The learner's check record and the cells that read it: a script runs in a cell only once that exact script
has passed the steps the cell needs; otherwise the cell names the first failing or unchecked step."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
from helpers import paths

from labkit import check
from labkit.check import judging
from labkit.check.report import Report, StepResult
from labkit.course import labs
from labkit.records import checklog
from labkit.ui import notebook

FIXTURE = paths.FIXTURES / "checklog" / "checks.jsonl"  # two records among lines that are not records
TITLES = labs.get("horovod").steps


def _report(script: Path, passed: int, failed: str | None = None, upto: int = 8) -> Report:
    """A horovod check of ``script``: steps 1..``passed`` pass, the next fails with ``failed``, the rest unjudged."""
    steps = [StepResult(k, True, f"{TITLES[k - 1]}: fine") for k in range(1, passed + 1)]
    if failed is not None:
        steps.append(StepResult(passed + 1, False, f"{TITLES[passed]}: {failed}"))
    last = len(steps)
    steps += [StepResult(k, False, f"not checked: fix step {passed + 1} first.") for k in range(last + 1, upto + 1)]
    return Report("horovod", str(script.resolve()), steps)


def _checked(script: Path, report: Report) -> None:
    """What ``labkit check`` records after judging ``report`` (the run is not made)."""
    assert checklog.record_check(report, script.read_bytes()) is None


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "labs" / "fashion_mnist.py"
    path.parent.mkdir()
    shutil.copy(paths.ROOT / "solutions" / "fashion_mnist_after_step_08.py", path)
    return path


def test_a_check_report_writes_one_record_per_judged_step(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(judging, "check", lambda lab, path, step, timeout, **kw: _report(path, 2, "no broadcast", 4))
    report = check.run_check("horovod", script, 4)
    assert report.notes == []
    path = script.parent / "runs" / "checks.jsonl"
    assert checklog.checks_file(script) == path
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["lab"], r["step"], r["passed"]) for r in rows] == [("horovod", 1, True), ("horovod", 2, True),
                                                                    ("horovod", 3, False)]  # step 4 was not judged
    assert {r["sha256"] for r in rows} == {checklog.digest(script.read_bytes())}
    assert rows[2]["message"].endswith("no broadcast") and rows[0]["script"] == "fashion_mnist.py"
    assert set(rows[0]) == {"lab", "step", "passed", "message", "sha256", "script", "time"}


def test_a_script_edited_during_its_check_is_not_recorded(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def edited(lab: str, path: Path, step: int, timeout: float, **kw: object) -> Report:
        path.write_text(path.read_text() + "\n# edited\n")
        return _report(path, 1, upto=1)

    monkeypatch.setattr(judging, "check", edited)
    report = check.run_check("horovod", script, 1)
    assert "changed while it was checked" in report.notes[0] and not checklog.checks_file(script).exists()


def test_a_record_that_cannot_be_written_is_a_note_not_a_failure(script: Path) -> None:
    (script.parent / "runs").write_text("a file where the folder would go")
    assert "not written" in checklog.record_check(_report(script, 8), script.read_bytes())


def test_a_fully_passed_script_is_ready(script: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _checked(script, _report(script, 8))
    assert notebook.ready(script, "horovod", 8) and notebook.ready(script, "horovod", 3)
    assert capsys.readouterr().out == ""


def test_a_script_changed_after_its_check_is_not_ready(script: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _checked(script, _report(script, 8))
    script.write_text(script.read_text().replace("def main(", "def main_again(", 1))
    assert not notebook.ready(script, "horovod", 8)
    out = capsys.readouterr().out
    assert out.count("\n") == 2  # what to do, then when and how the reference results below were made
    assert "the reference results were made on 20" in out and "python -m labkit.measure.reference" in out
    assert "fashion_mnist.py: step 1 of lab 2 (initialise Horovod" in out and "never checked for this version" in out
    assert "labkit check horovod fashion_mnist.py --step 8" in out and "reference results" in out


def test_the_first_failing_or_unchecked_step_is_named(script: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _checked(script, _report(script, 4, "validation_steps is 40 on each of 2 workers. " + "x" * 300))
    assert not notebook.ready(script, "horovod", 8)
    out = capsys.readouterr().out
    assert "step 5 of lab 2 failed its last check of this version (divide steps_per_epoch" in out
    assert "validation_steps is 40" in out and "x" * 300 not in out and "...)" in out
    assert notebook.ready(script, "horovod", 4)  # a cell that needs steps 1-4 only runs it
    _checked(script, _report(script, 5, upto=5))  # the latest result of a step counts
    assert not notebook.ready(script, "horovod", 8)
    assert "step 6 of lab 2 (average metrics" in capsys.readouterr().out
    assert not notebook.ready(script, "mirrored", 1)  # another lab's steps: not checked


def test_an_untouched_starter_says_it_is_the_starter(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "labs" / "fashion_mnist_mirrored.py"
    script.parent.mkdir()
    shutil.copy(paths.LABS / script.name, script)
    assert not notebook.ready(script, "mirrored", 4)
    out = capsys.readouterr().out
    assert out.startswith("fashion_mnist_mirrored.py is still the starter: finish steps 1-4 of lab 3")
    assert "the course's reference results" in out


def test_lines_that_are_not_records_are_skipped(tmp_path: Path) -> None:
    rows = checklog.read(FIXTURE)
    assert [(r.step, r.passed, r.message) for r in rows] == [(1, True, "step 1: fine"), (2, True, "step 2: fine")]
    script = tmp_path / "fashion_mnist.py"
    script.write_text("print('finished')\n")  # the content the fixture's records are of
    assert checklog.standing(script, "horovod", 2, rows).ready
    assert checklog.standing(script, "horovod", 3, rows).step == 3
    assert checklog.read(tmp_path / "missing.jsonl") == []


def _lab_6_calls() -> list[tuple[str, str, int]]:
    """The ``notebook.ready(NAME, LAB, STEPS)`` calls of lab 6's cells, as written."""
    nb = json.loads((paths.LABS / "06_scaling.ipynb").read_text())
    found = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        for node in ast.walk(ast.parse("".join(cell["source"]))):
            if isinstance(node, ast.Call) and ast.unparse(node.func) == "notebook.ready":
                name, lab, steps = node.args
                found.append((name.id, lab.value, steps.value))
    return found


def test_lab_6_does_not_sweep_a_half_finished_horovod_script(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The script after step 4, its steps 1-4 passed and step 5 failed, as its check leaves them: every cell of
    lab 6 that runs the Horovod script (one passes --warmup-epochs, which exists from step 8) shows the reference."""
    calls = [c for c in _lab_6_calls() if c[0] == "HOROVOD"]
    assert len(calls) == 3 and all(c[1:] == ("horovod", 8) for c in calls)
    script = tmp_path / "labs" / "fashion_mnist.py"
    script.parent.mkdir()
    shutil.copy(paths.ROOT / "solutions" / "fashion_mnist_after_step_04.py", script)
    _checked(script, _report(script, 4, "validation_steps is not divided by the number of workers"))
    assert [notebook.ready(script, lab, steps) for _, lab, steps in calls] == [False] * 3
    out = capsys.readouterr().out
    assert out.count("step 5 of lab 2 failed its last check of this version") == 3
    shutil.copy(paths.ROOT / "solutions" / "fashion_mnist_after_step_08.py", script)
    _checked(script, _report(script, 8))
    assert [notebook.ready(script, lab, steps) for _, lab, steps in calls] == [True] * 3
