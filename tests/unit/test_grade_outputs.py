"""labkit grade's outputs for CI, from a saved result (nothing is graded, no check runs): the GitHub annotations at
the failing step's file and line, the job outputs, the retired --classroom, and the Classroom 50 autograder's
result.json."""

from __future__ import annotations

import datetime
import importlib.util
import json
from pathlib import Path

import pytest

from labkit.cli import main as cli
from labkit.course import labs
from labkit.grading import grade, reports

TRACEBACK = ('step 4: the run failed:\nTraceback (most recent call last):\n'
             '  File "/tmp/labkit-grade-x/fashion_mnist.py", line 88, in <module>\n    model.fit(x)\n'
             '  File "/venv/site-packages/keras/x.py", line 3\nValueError: bad')


def _result() -> grade.Result:
    cases = [grade.Case("horovod", 3, "shard", True, "", 2.0, 2.0),
             grade.Case("horovod", 4, "scale", False, TRACEBACK, 0.0, 2.0),
             grade.Case("mirrored", 1, "devices", False, "not started: ...", 0.0, 1.0),
             grade.Case("assessment", 1, "82% on 2 workers", False, "too slow: 100% of the budget, a, b", 0.0, 5.0)]
    for c in cases[1:3]:
        grade._where(c, labs.get(c.lab), Path("labs"))
    return grade.Result("labs", cases, 3.0)


def test_a_failing_case_names_its_file_and_the_line_its_message_shows() -> None:
    result = _result()
    assert (result.cases[1].file, result.cases[1].line) == ("labs/fashion_mnist.py", 88)
    assert (result.cases[2].file, result.cases[2].line) == ("labs/fashion_mnist_mirrored.py", None)
    assert grade.locate("x.py does not parse (SyntaxError at line 5: oops)", ("x.py",)) == ("x.py", 5)
    horovod = labs.get("horovod").files
    assert grade.locate("rank 1 crashed (at fashion_mnist.py:41)", horovod) == ("fashion_mnist.py", 41)
    assert grade.locate('File "/other/module.py", line 3', horovod) == ("", None)


def test_annotations_are_one_escaped_line_per_failing_step() -> None:
    lines = reports.annotations(_result())
    assert len(lines) == 3
    assert lines[0].startswith("::error file=labs/fashion_mnist.py,line=88,title=horovod step 4%3A scale (0/2 points)"
                               "::step 4")
    assert "\n" not in lines[0] and "%0A" in lines[0]
    assert lines[1].startswith("::error file=labs/fashion_mnist_mirrored.py,title=")  # no line: none is known
    assert lines[2].startswith("::error title=assessment step 1%3A 82%25 on 2 workers (0/5 points)::too slow: 100%25")


def test_guarded_text_pauses_the_runner_s_commands() -> None:
    text = reports.guarded("FAIL ...\n::set-output name=score::99")
    first, *_, last = text.splitlines()
    token = first.removeprefix("::stop-commands::")
    assert len(token) == 32 and last == f"::{token}::"


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "grade.json"
    path.write_text(json.dumps(_result().to_dict()))
    return path


def test_report_prints_annotations_in_github_actions_and_writes_the_outputs(
        saved: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    outputs, summary, junit = tmp_path / "out", tmp_path / "summary.md", tmp_path / "grade.xml"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_OUTPUT", str(outputs))
    assert cli.main(["grade", "--report", str(saved), "--summary", str(summary), "--junit", str(junit)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("::stop-commands::") and any(line.startswith("FAIL") for line in out)
    stop = out.index(f"::{out[0].removeprefix('::stop-commands::')}::")
    assert [line.split("::")[1].split(",")[0] for line in out[stop + 1:]] == [
        "error file=labs/fashion_mnist.py", "error file=labs/fashion_mnist_mirrored.py",
        "error title=assessment step 1%3A 82%25 on 2 workers (0/5 points)"]
    assert outputs.read_text() == "score=2\nmax_score=10\n"
    assert summary.read_text().startswith("## labkit grade: 2 / 10 points") and "<testsuites>" in junit.read_text()


def test_annotations_on_request_and_not_by_default(saved: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    monkeypatch.delenv("GITHUB_OUTPUT", raising=False)
    assert cli.main(["grade", "--report", str(saved)]) == 0
    assert "::error" not in capsys.readouterr().out
    assert cli.main(["grade", "--report", str(saved), "--annotations", "--json"]) == 0
    got = capsys.readouterr()
    assert grade.Result.from_dict(json.loads(got.out)) == _result() and got.err.count("::error ") == 3


def test_classroom_is_refused_with_what_to_use_instead(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main(["grade", str(tmp_path), "--classroom", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert "GitHub Classroom was discontinued on 2026-08-28" in err
    assert all(word in err for word in ("--junit", "--summary", "max_score="))
    assert not (tmp_path / "c.json").exists() and not hasattr(reports, "classroom")


def test_a_saved_result_that_is_not_one_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"path": "labs", "cases": [{"lab": "horovod", "step": "1"}]}))
    assert cli.main(["grade", "--report", str(bad)]) == 2
    assert "a case's 'step' is '1'" in capsys.readouterr().err


# ----------------------------------------------------------------------------- Classroom 50


@pytest.fixture(scope="module")
def autograder():  # noqa: ANN201
    spec = importlib.util.spec_from_file_location("course_autograder", labs.ROOT / "course" / "autograder.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_whole_points_keep_each_lab_s_total(autograder) -> None:  # noqa: ANN001
    assert autograder.whole_points([0.75] * 4) == [1, 1, 1, 0]
    assert autograder.whole_points([1.0, 2.0, 0.0]) == [1, 2, 0]
    assert autograder.whole_points([1 / 3] * 3) == [1, 0, 0]
    assert sum(autograder.whole_points([1.6] * 5)) == 8


def test_result_json_follows_the_classroom50_contract(autograder) -> None:  # noqa: ANN001
    """The fields and types of classroom50/result/v1 (Classroom 50's schemas/result-v1.schema.json)."""
    env = {"CLASSROOM": "dl", "ASSIGNMENT": "labs", "SUBMISSION_TAG": "submit/2026-09-01T10-00-00Z-abc1234",
           "COMMIT_URL": "https://example.org/c", "RELEASE_URL": "https://example.org/r", "OWNER": "alice",
           "ASSIGNMENT_TYPE": "individual"}
    result = _result()
    result.cases.append(grade.Case("parameter-server", 1, "x", True, "", 0.75, 0.75))
    result.cases += [grade.Case("parameter-server", k, "x", False, "m" * 5000, 0.0, 0.75) for k in (2, 3, 4)]
    data = autograder.result_json(result.to_dict(), env, datetime.datetime(2026, 9, 1, 10, 0, 5))
    required = {"schema", "classroom", "assignment", "assignment_type", "owner", "submission", "commit", "release",
                "review", "datetime", "score", "max-score", "tests"}
    assert required <= set(data) and data["schema"] == "classroom50/result/v1"
    assert data["datetime"] == "2026-09-01T10:00:05Z" and data["review"] == env["COMMIT_URL"]
    for t in data["tests"]:
        assert {"test-name", "passed", "score", "max-score"} <= set(t)
        assert all(type(t[k]) is int and 0 <= t[k] for k in ("score", "max-score")) and t["score"] <= t["max-score"]
        assert len(t["output"]) <= autograder.OUTPUT_LIMIT
    assert data["score"] == sum(t["score"] for t in data["tests"]) == 3  # 2 + the 0.75-step rounded up to 1
    assert data["max-score"] == 2 + 2 + 1 + 5 + 3
    assert data["tests"][1]["test-name"] == "horovod step 4: scale" and not data["tests"][1]["passed"]
