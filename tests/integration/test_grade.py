"""labkit.grading.grade and labkit.grading.reports:
points, outputs CI systems read, and grading that survives hostile scripts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import judge, paths

from labkit.course import labs
from labkit.course import release as course
from labkit.grading import grade, reports

ROOT = labs.ROOT
XSD = paths.FIXTURES / "junit" / "JUnit.xsd"


def _result() -> grade.Result:
    cases = [grade.Case("horovod", 1, "init", True, "ok", 1.0, 1.0, 2.0),
             grade.Case("horovod", 2, "verbose", False, "rank 1 prints <progress> & \x1b[0mbars\nmore", 0.0, 2.0, 2.0),
             grade.Case("mirrored", 1, "devices", False, "not started: ...", 0.0, 1.0)]
    return grade.Result("labs", cases, 4.0)


def test_junit_is_valid_against_the_schema_ci_systems_read() -> None:
    import xml.etree.ElementTree as ET

    import xmlschema

    text = reports.junit_xml(_result())
    suites = ET.fromstring(text)
    xmlschema.XMLSchema(str(XSD)).validate(text)  # the aggregated form: testsuites, each with package and id
    assert [s.get("name") for s in suites] == ["horovod", "mirrored"]
    failure = suites[0].findall("testcase")[1].find("failure")
    assert failure is not None and failure.get("message").startswith("rank 1 prints <progress>")
    assert "more" in failure.text and "\x1b" not in failure.text
    assert suites[0].get("failures") == "1" and suites[0].get("tests") == "2"


def test_a_broken_document_is_rejected_by_the_schema() -> None:
    import xmlschema

    with pytest.raises(xmlschema.XMLSchemaValidationError):
        xmlschema.XMLSchema(str(XSD)).validate('<testsuite name="x" tests="1"><testcase name="a"/></testsuite>')


def test_summary_is_a_markdown_table() -> None:
    text = reports.summary_markdown(_result())
    assert text.startswith("## labkit grade: 1 / 4 points")
    assert "| horovod | 2: verbose | **fail** | 0/2 | rank 1 prints <progress> & " in text


def test_points_from_the_course_configuration(tmp_path: Path) -> None:
    lab = labs.get("mirrored")
    assert grade.step_points(lab, {}) == [1.0] * 4
    assert grade.step_points(lab, {"points": {"mirrored": 10}}) == [2.5] * 4
    assert grade.step_points(lab, {"points": {"mirrored": [1, 2, 3, 4]}}) == [1, 2, 3, 4]
    with pytest.raises(ValueError, match="a list of 4 numbers"):
        grade.step_points(lab, {"points": {"mirrored": [1, 2]}})
    (tmp_path / "pyproject.toml").write_text('[tool.labkit.grading]\nlabs = ["mirrored"]\n')
    (tmp_path / "labs").mkdir()
    assert grade.load_config(tmp_path / "labs") == {"labs": ["mirrored"]}


def _checkout(tmp_path: Path, scripts: dict[str, str]) -> Path:
    """A learner's labs/ folder: starter name -> source file (``starter`` keeps the handed-out starter)."""
    folder = tmp_path / "course" / "labs"
    folder.mkdir(parents=True)
    for name, source in scripts.items():
        src = ROOT / "labs" / name if source == "starter" else ROOT / "solutions" / source
        shutil.copy2(src, folder / name)
    return folder


def _snapshot(folder: Path) -> dict[str, tuple[bytes, float]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime) for p in folder.rglob("*")
            if p.is_file()}


def test_untouched_starters_score_zero_in_seconds(tmp_path: Path) -> None:
    folder = _checkout(tmp_path, {lab.starter: "starter" for lab in labs.LABS.values()})
    (folder / "fashion_mnist_ps.py").write_text((folder / "fashion_mnist_ps.py").read_text() + "\n# my notes\n")
    before = _snapshot(folder.parent)
    start = time.perf_counter()
    result = grade.grade(folder)
    assert time.perf_counter() - start < 30
    steps = sum(lab.n_steps for lab in labs.LABS.values())
    assert result.score == 0 and result.max_score == steps and len(result.cases) == steps
    assert all(c.message.startswith("not started") for c in result.cases)
    assert _snapshot(folder.parent) == before


def test_a_missing_script_scores_zero_and_says_so(tmp_path: Path) -> None:
    folder = _checkout(tmp_path, {})
    result = grade.grade(folder, ["mirrored"])
    assert result.score == 0 and "missing" in result.cases[0].message


HOSTILE = {
    "syntax error": ("def main(:\n    pass\n", "SyntaxError"),
    "exit at import": ("import sys\nprint('bye')\nsys.exit(3)\n", "code 3"),
    "endless loop": ("while True:\n    pass\n", "timed out"),
    "kills its parent": ("import os, signal, time\nos.kill(os.getppid(), signal.SIGKILL)\ntime.sleep(300)\n",
                         "the check was stopped"),
    "leaves children": ("import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', "
                        "'import time; time.sleep(303)'], start_new_session=True)\nsys.exit(1)\n", "code 1"),
    "floods its output": ("import sys\nfor i in range(60000):\n    print('x' * 100)\nsys.exit(1)\n", "code 1"),
}


def _left_behind(mark: str) -> list[str]:
    """Live processes started with ``GRADE_TEST_MARK=mark`` in their environment (this test's only: other
    work on the machine may run checks at the same time)."""
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and p.environ().get("GRADE_TEST_MARK") == mark:
                out.append(" ".join(p.info["cmdline"] or []))
        except (psutil.Error, OSError):
            continue
    return out


@pytest.mark.slow
# The endless loop waits out the check's timeout (22 s on a clean clone): make test-heavy; test_hostile_checks.py
# stops an endless loop at its line in make test.
@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.heavy) if k == "endless loop" else k
                                  for k in HOSTILE])
def test_hostile_scripts_fail_step_one_with_nothing_left_running(tmp_path: Path, kind: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    mark = f"{kind}-{time.time()}"
    monkeypatch.setenv("GRADE_TEST_MARK", mark)  # inherited by every process the grading starts
    temporary = Path(tempfile.gettempdir())
    before = set(os.listdir(temporary))
    source, expect = HOSTILE[kind]
    folder = tmp_path / "labs"
    folder.mkdir()
    (folder / "fashion_mnist_mirrored.py").write_text(source)
    start = time.perf_counter()
    result = grade.grade(folder, ["mirrored"], timeout=20)
    assert time.perf_counter() - start < 20 + 60
    first = result.cases[0]
    assert not first.passed and expect in first.message, first.message[-1500:]
    assert len(first.message) < 20000
    assert result.score == 0
    assert _left_behind(mark) == []
    left = {n for n in set(os.listdir(temporary)) - before if n.startswith(judge.TEMPORARY)}
    assert not left, f"the grading left temporary files: {sorted(left)[:5]}"  # a check it killed too


def _workspace(tmp_path: Path) -> Path:
    """A GitHub runner's workspace after the workflow's checkouts and setup: the course repository made by
    `labkit release` as the grader and as the learner's submission, the grader's .venv this one."""
    workspace = tmp_path / "workspace"
    for name in ("grader", "submission"):
        course.release(workspace / name)
    (workspace / "grader" / ".venv").symlink_to(Path(sys.executable).parent.parent)  # what `make setup` creates
    return workspace


def _run_workflow(workspace: Path) -> tuple[int, dict[str, str], dict, str]:
    """The workflow's shell steps after its setup (read from its YAML), in order, as the runner runs them: the
    grade step's exit code, the job's outputs, the saved result and what the report step printed."""
    import yaml

    steps = yaml.safe_load((workspace / "grader" / ".github" / "workflows" / "grade.yml").read_text())["jobs"]["grade"]
    steps = steps["steps"]
    assert any(s.get("run") == "make setup" and s.get("working-directory") == "grader" for s in steps)  # not run here
    temp = workspace.parent / "runner-temp"
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir()
    out, summary = workspace.parent / "github_output", workspace.parent / "summary.md"
    out.write_text("")
    env = {**_clean_env(), "GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(workspace), "RUNNER_TEMP": str(temp),
           "GITHUB_OUTPUT": str(out), "GITHUB_STEP_SUMMARY": str(summary)}
    codes, printed = {}, ""
    for step in (s for s in steps if s.get("id") in ("grade", "report")):
        done = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=workspace, env=env, capture_output=True,
                              text=True, timeout=900)
        codes[step["id"]], printed = done.returncode, printed + done.stdout
    assert codes["report"] == 0, printed
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    saved = json.loads((temp / "labkit-graded" / "grade.json").read_text())
    assert (temp / "labkit-graded" / "grade.xml").is_file()
    return codes["grade"], outputs, saved, printed


@pytest.mark.slow  # 2 s or more: make test, not the 90 s of make test-fast
def test_the_workflow_steps_grade_a_released_course_with_untouched_starters(tmp_path: Path) -> None:
    workspace = _workspace(tmp_path)
    code, outputs, saved, printed = _run_workflow(workspace)
    config = grade.load_config(workspace / "grader" / "labs")
    top = sum(sum(grade.step_points(labs.get(name), config)) for name in config["labs"])
    assert code == 1 and outputs == {"score": "0", "max_score": f"{top:g}"}
    assert all(c["message"].startswith("not started") for c in saved["cases"])
    assert "::error file=labs/fashion_mnist.py,title=horovod step 1" in printed
    assert "labkit grade: 0 /" in (tmp_path / "summary.md").read_text()


@pytest.mark.heavy  # 74-76 s on a clean clone: make test's budget; the workflow's steps run on the starters there
@pytest.mark.horovod
def test_the_workflow_grades_a_course_repository(tmp_path: Path) -> None:
    """The workflow's own shell steps (read from its YAML), on a course repository made by `labkit release`: the
    grader's points, the learner's scripts."""
    workspace = _workspace(tmp_path)
    submission, grader = workspace / "submission", workspace / "grader"
    # A learner half-way: Horovod up to step 3, the MirroredStrategy lab done, two labs not started, and lab 8's
    # option not added to the Horovod script (its check fails in seconds: the script refuses the option).
    shutil.copy2(labs.get("horovod").solution(3), submission / "labs" / "fashion_mnist.py")
    shutil.copy2(labs.get("mirrored").solution(), submission / "labs" / "fashion_mnist_mirrored.py")
    pyproject = submission / "pyproject.toml"  # the learner's own points count for nothing: the grader's do
    pyproject.write_text(pyproject.read_text().replace("communication = 1", "communication = 100"))
    code, outputs, saved, _ = _run_workflow(workspace)
    failing = [f"{c['lab']} step {c['step']}" for c in saved["cases"] if not c["passed"]]
    assert code == 1 and outputs["score"] == "7"
    assert failing == [*[f"horovod step {k}" for k in range(4, labs.get("horovod").n_steps + 1)],
                       *[f"multiworker step {k}" for k in range(1, labs.get("multiworker").n_steps + 1)],
                       *[f"parameter-server step {k}" for k in range(1, labs.get("parameter-server").n_steps + 1)],
                       "communication step 1"]
    # A course that grades that one lab only (the grader's pyproject.toml says which): everything passes, exit 0.
    # (Each lab's final solution passing every step is its own lab test's real check.)
    text = (grader / "pyproject.toml").read_text()
    labs_line = next(line for line in text.splitlines() if line.startswith("labs = ["))
    (grader / "pyproject.toml").write_text(text.replace(labs_line, 'labs = ["mirrored"]'))
    code, outputs, saved, _ = _run_workflow(workspace)
    assert code == 0 and outputs["score"] == "4", [c["message"] for c in saved["cases"] if not c["passed"]]
    assert "labkit grade: 4 / 4" in (tmp_path / "summary.md").read_text()


def _clean_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("LABKIT_", "GITHUB_"))}


def test_only_a_well_formed_report_of_a_finished_check_counts() -> None:
    lab = labs.get("mirrored")
    good = json.dumps({"lab": "mirrored", "steps": [{"step": 1, "passed": True, "message": "ok"}]})
    assert grade._report_of("noise\n" + good + "\n", 1, lab) is not None
    assert grade._report_of(good, -9, lab) is None  # the check was killed: its output proves nothing
    assert grade._report_of(good + "\nmore output\n", 0, lab) is None  # not its last line
    assert grade._report_of(good.replace('"mirrored"', '"horovod"'), 0, lab) is None
    assert grade._report_of(good.replace('"step": 1', '"step": 9'), 0, lab) is None
    assert grade._report_of(good.replace('"message": "ok"', '"msg": "ok"'), 0, lab) is None


def test_a_wrong_assessment_table_fails_before_any_lab_is_graded(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from labkit.cli import main as cli

    (tmp_path / "pyproject.toml").write_text('[tool.labkit.grading]\nlabs = ["horovod"]\n\n'
                                             '[tool.labkit.grading.assessment]\nbudget = 180\n')
    (tmp_path / "labs").mkdir()
    start = time.perf_counter()
    assert cli.main(["grade", str(tmp_path / "labs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("labkit grade: [tool.labkit.grading.assessment]: budget is relative to the machine")
    assert "multiple = M" in err and time.perf_counter() - start < 5


@pytest.mark.slow  # 2 s or more: make test, not the 90 s of make test-fast
def test_a_lab_of_other_files_than_scripts_is_graded_from_them(tmp_path: Path) -> None:
    """The scale-out lab's hostfile and batch script reach the grading's scratch copy; a linked file does not."""
    lab = labs.get("scale-out")
    folder = tmp_path / "labs"
    folder.mkdir()
    for step in range(1, lab.n_steps + 1):
        shutil.copy2(lab.solution(step), folder / lab.step_file(step))
    result = grade.grade(folder, ["scale-out"])
    assert result.score == lab.n_steps, [c.message for c in result.cases]
    (folder / "cluster_hostfile").unlink()
    (folder / "cluster_hostfile").symlink_to(lab.solution(1))
    again = grade.grade(folder, ["scale-out"])
    assert again.score < lab.n_steps, [c.message for c in again.cases]
