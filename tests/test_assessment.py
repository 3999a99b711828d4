"""The final assessment judges run records: target accuracy within a time budget on N workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit import assessment, cli
from labkit.assessment import Goal

GOAL = Goal(workers=2, target=0.82, budget_s=120)


def record(workers: int = 2, accs: tuple[float, ...] = (0.7, 0.8, 0.83), every: float = 30.0, status: str = "ok",
           run_id: str = "r1") -> dict:
    return {"run_id": run_id, "workers": workers, "status": status, "images_per_sec": 900.0,
            "epochs": [{"epoch": i + 1, "elapsed_s": every * (i + 1), "val_accuracy": a} for i, a in enumerate(accs)]}


def test_a_run_that_reaches_the_target_in_time_passes() -> None:
    v = assessment.judge(record(), GOAL)
    assert v.passed and v.reached_s == 90.0 and "83.0%" in v.message and "epoch 3" in v.message


@pytest.mark.parametrize(("rec", "why"), [
    (record(every=50.0), "over the budget of 120 s"),
    (record(accs=(0.7, 0.79)), "at most 79.0%"),
    (record(workers=1), "used 1 worker(s)"),
    (record(status="failed"), "status 'failed'"),
    (record(accs=()), "no validation accuracy"),
])
def test_a_run_that_misses_says_why(rec: dict, why: str) -> None:
    v = assessment.judge(rec, GOAL)
    assert not v.passed and why in v.message, v.message


def test_the_best_of_many_runs_counts() -> None:
    runs = [record(accs=(0.7, 0.75), run_id="short"), record(every=20.0, run_id="fast"), record(run_id="slow")]
    v = assessment.judge_records(runs, GOAL)
    assert v.passed and v.run_id == "fast" and v.records_judged == 3
    closest = assessment.judge_records([record(accs=(0.6,), run_id="a"), record(accs=(0.79,), run_id="b")], GOAL)
    assert not closest.passed and closest.run_id == "b"
    assert not assessment.judge_records([], GOAL).passed
    few = assessment.judge_records([record(workers=1, run_id="alone"), record(workers=2, accs=(0.5,), run_id="two")],
                                   GOAL)
    assert few.run_id == "two" and "at most 50.0%" in few.message  # a run on too few workers is not the closest
    assert "none of the 1 recorded runs used 2 workers" in assessment.judge_records([record(workers=1)], GOAL).message


def test_the_cli_judges_a_records_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(record()) + "\n")
    assert cli.main(["assess", "--records", str(path), "--budget", "120", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["passed"] and out["goal"] == {"workers": 2, "target": 0.82, "budget_s": 120.0}
    assert cli.main(["assess", "--records", str(path), "--budget", "60"]) == 1
    assert "FAILED" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "error"), [
    (["assess"], "give a SCRIPT"),
    (["assess", "--records", "missing.jsonl"], "no such records file"),
    (["assess", "--target", "82"], "between 0 and 1"),
])
def test_bad_invocations_are_one_line_errors(argv: list[str], error: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code != 0
    assert error in str(e.value.code) + capsys.readouterr().err


def test_a_course_configures_the_assessment_and_bad_settings_are_named() -> None:
    goal, run = assessment.from_config({"workers": 4, "target": 0.85, "budget": 600, "points": 5,
                                        "args": ["--epochs", "30"]})
    assert goal == Goal(4, 0.85, 600.0) and run["points"] == 5.0 and run["script"] == "fashion_mnist.py"
    with pytest.raises(ValueError, match="unknown key"):
        assessment.from_config({"worker": 2})
    with pytest.raises(ValueError, match="0 < target <= 1"):
        assessment.from_config({"target": 82})
    with pytest.raises(ValueError, match="list of strings"):
        assessment.from_config({"args": "--epochs 20"})


def test_grading_adds_the_assessment_as_one_case(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from labkit import grade

    folder = tmp_path / "labs"
    folder.mkdir()
    (folder / "fashion_mnist.py").write_text("print('mine')\n")
    seen = {}

    def fake_assess(script, goal, args, launcher, cwd=None, **kw):  # noqa: ANN001, ANN003, ANN202
        seen.update(script=Path(script), cwd=Path(cwd), args=args, goal=goal)
        return assessment.Verdict(True, "reached 83.0% after 70 s", goal)

    monkeypatch.setattr(assessment, "assess", fake_assess)
    config = {"labs": ["mirrored"], "assessment": {"points": 5, "args": ["--epochs", "20"]}}
    result = grade.grade(folder, config=config)
    case = result.cases[-1]
    assert (case.lab, case.passed, case.points, case.max_points) == ("assessment", True, 5.0, 5.0)
    assert seen["script"].name == "fashion_mnist.py" and seen["script"].parent != folder  # a scratch copy
    assert seen["cwd"].parent == seen["script"].parent and seen["args"] == ["--epochs", "20"]
    assert result.max_score == 4 + 5  # the mirrored lab (missing here: 0 of 4) and the assessment
    assert sorted(p.name for p in folder.iterdir()) == ["fashion_mnist.py"]  # nothing written in the checkout
