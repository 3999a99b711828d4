"""The final assessment judges one run of the learner's own script, against this machine's budget.

The judge's unit tests read fixture records (tests/fixtures/assessment/*.json): ``good.json`` is a
real record (two Horovod workers, one thread each, small mode) moved to a course checkout at
``/course/labs``; every other fixture is that record gamed one way (its ``fixture`` field says how).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import paths

from labkit.cli import main as cli
from labkit.course import labs
from labkit.grading import assessment, calibration, grade
from labkit.grading.assessment import Goal
from labkit.records import runrecord, runs
from labkit.records.runrecord import RunRecord

FIXTURES = paths.FIXTURES / "assessment"
MINE = "/course/labs/fashion_mnist.py"  # where good.json's script ran (the file itself is not needed)
GOAL = Goal(np=2, target=0.82, budget_s=400)  # good.json reached 82% after 302 s


def fixture(name: str, **changes: Any) -> RunRecord:
    """The fixture record ``name``, read as a run record, with ``changes`` to its fields."""
    record = runrecord.parse(json.loads((FIXTURES / f"{name}.json").read_text()), f"{name}.json")
    return dataclasses.replace(record, **changes)


def test_a_run_of_the_learners_script_with_the_goals_settings_passes_in_time() -> None:
    v = assessment.judge(fixture("good"), GOAL, MINE)
    assert v.passed, v.message
    assert v.reached_s == pytest.approx(302.375) and "epoch 11" in v.message and "83.2%" in v.message
    slow = assessment.judge(fixture("good"), Goal(budget_s=200), MINE)
    assert not slow.passed and "after 302 s, over the budget of 200 s" in slow.message


GAMED = {  # fixture -> what the verdict must name (the setting and what it should be)
    "tiny_test_set": "test set: 128 images, it should be the full small-mode test set of 1000 images",
    "full_mode": "mode: 'full', it should be 'small'",
    "extra_threads": "threads per worker: 2, it should be 1",
    "extra_threads_unasked": "each worker used 1.93 cores while training",
    "wrong_workers": "workers: 4, it should be 2 (--np 2)",
    "independent_copies": "the 2 processes did not train together",
    "target_lowered": "target accuracy: 0.5, it should be 0.82",
    "bench_shrink": "shrunk by bench --shrink",
    "solution_record": "only a run of the script judged counts",
}


@pytest.mark.parametrize("name", list(GAMED))
def test_a_gamed_run_fails_naming_the_setting(name: str) -> None:
    v = assessment.judge(fixture(name), GOAL, MINE)
    assert not v.passed and GAMED[name] in v.message, v.message
    assert v.details["settings"]


def test_full_mode_also_names_its_test_set() -> None:
    v = assessment.judge(fixture("full_mode"), GOAL, MINE)
    assert "test set: 0 images" in v.message and "mode: 'full'" in v.message


def test_a_record_of_another_script_never_counts() -> None:
    solution = fixture("solution_record")
    theirs = assessment.judge_records([solution], GOAL, "/course/solutions/fashion_mnist_solution.py")
    assert theirs.passed  # the solution's record itself is a passing one ...
    alone = assessment.judge_records([solution], GOAL, MINE)  # ... but never for the learner's script
    assert not alone.passed and "no recorded run of /course/labs/fashion_mnist.py" in alone.message
    assert "1 record(s) of other scripts do not count" in alone.message
    gamed = assessment.judge_records([solution, fixture("tiny_test_set")], GOAL, MINE)
    assert not gamed.passed and gamed.run_id == "tiny-test-set" and gamed.records_judged == 2
    mine = assessment.judge_records([solution, fixture("good"), fixture("full_mode")], GOAL, MINE)
    assert mine.passed and mine.run_id == "mine-ok" and mine.reached_s == pytest.approx(302.375)


def test_a_relative_script_is_read_from_the_folder_the_job_ran_in() -> None:
    record = fixture("good")
    assert assessment.recorded_script(record) == Path(MINE).resolve()
    record = fixture("good", log_dir="/elsewhere/runs/logs/20261125-094922-212b")  # the same name, another folder
    assert not assessment.judge(record, GOAL, MINE).passed
    assert assessment.judge(record, GOAL, "/elsewhere/fashion_mnist.py").passed


def test_a_script_changed_since_its_run_does_not_count(tmp_path: Path) -> None:
    labs_dir = tmp_path / "labs"
    labs_dir.mkdir()
    script = labs_dir / "fashion_mnist.py"
    script.write_text("# the learner's script\n")
    logs = str(labs_dir / "runs" / "logs" / "x")
    later = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() + 60))
    assert assessment.judge(fixture("good", log_dir=logs, start_time=later), GOAL, script).passed  # file older than run
    earlier = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() - 3600))
    v = assessment.judge(fixture("good", log_dir=logs, start_time=earlier), GOAL, script)
    assert not v.passed and "fashion_mnist.py changed after this run started" in v.message


def test_how_a_run_ended_counts() -> None:
    crashed = fixture("good", status="failed", error="ZeroDivisionError: division by zero")
    v = assessment.judge(crashed, GOAL, MINE)
    assert not v.passed and "status 'failed'" in v.message and "ZeroDivisionError" in v.message
    stopped = fixture("good", status="timeout")  # stopped by the assessment after it reached the target
    assert assessment.judge(stopped, GOAL, MINE).passed
    good = fixture("good")
    never = fixture("good", status="timeout", epochs=[e for e in good.epochs if (e.val_accuracy or 0) < 0.82])
    assert "status 'timeout'" in assessment.judge(never, GOAL, MINE).message
    short = fixture("good", epochs=good.epochs[:5])
    assert "at most 77.9% in 5 epochs" in assessment.judge(short, GOAL, MINE).message


# ----------------------------------------------------------------------------- the budget: this machine's


@pytest.fixture
def calibrated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> calibration.Calibration:
    """A cached calibration of this machine's conditions (50 s), so no workload runs."""
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    cal = calibration.Calibration(50.0, [49.0, 50.0, 53.0], "2026-11-25T10:00:00+0000",
                                  "labkit assess --calibrate --np 2", calibration.conditions(2, 1))
    path = calibration.cache_file()
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"workers=2,threads=1": cal.__dict__}))
    return cal


def test_the_budget_is_a_multiple_of_this_machines_reference_time(calibrated: calibration.Calibration) -> None:
    assert calibration.cache_file().parent.name == "cache"
    goal = assessment.machine_goal(np=2)
    assert goal.budget_s == pytest.approx(calibration.MULTIPLE * 50.0)
    assert f"{calibration.MULTIPLE:g} x this machine's reference time 50.0 s (2026-11-25" in str(goal)
    assert calibrated.spread == pytest.approx(0.08)
    assert assessment.machine_goal(np=2, multiple=2).budget_s == 100.0


def test_a_calibration_taken_under_other_conditions_is_not_reused(calibrated: calibration.Calibration) -> None:
    assert calibration.load(2, 1) is not None
    assert calibration.load(4, 1) is None  # another worker count: measured again
    data = json.loads(calibration.cache_file().read_text())
    data["workers=2,threads=1"]["conditions"]["cores"] += 1  # another machine (or a resized one)
    calibration.cache_file().write_text(json.dumps(data))
    assert calibration.load(2, 1) is None
    calibration.cache_file().write_text("{damaged")
    assert calibration.load(2, 1) is None


def test_the_cli_judges_the_scripts_runs_in_a_records_file(tmp_path: Path, calibrated: calibration.Calibration,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture) -> None:
    course = tmp_path / "course" / "labs"
    course.mkdir(parents=True)
    (course / "fashion_mnist.py").write_text("# mine\n")
    os.utime(course / "fashion_mnist.py", (time.time() - 10 ** 6,) * 2)  # older than the runs
    logs = str(course / "runs" / "logs" / "x")
    path = course / "runs" / "runs.jsonl"
    runs.append(fixture("solution_record", log_dir=logs), path)
    monkeypatch.chdir(course)
    assert cli.main(["assess", "fashion_mnist.py", "--records", str(path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert not out["passed"] and "other scripts do not count" in out["message"]
    runs.append(fixture("good", log_dir=logs), path)
    assert cli.main(["assess", "--records", str(path), "fashion_mnist.py", "--multiple", "8"]) == 0  # 400 s
    assert "PASSED" in capsys.readouterr().out
    assert cli.main(["assess", "fashion_mnist.py", "--records", str(path)]) == (
        0 if calibration.MULTIPLE * 50 >= 302.375 else 1)


@pytest.mark.parametrize(("argv", "error"), [
    (["assess"], "give the SCRIPT to judge"),
    (["assess", "nosuch.py"], "labkit assess: nosuch.py not found"),
    (["assess", "tests/integration/test_assessment.py", "--records", "missing.jsonl"], "missing.jsonl not found"),
    (["assess", "tests/integration/test_assessment.py", "--records", "x.jsonl", "--", "--epochs", "2"],
     "nothing goes after --"),
    (["assess", "tests/integration/test_assessment.py", "--calibrate"], "--calibrate measures this machine"),
    (["assess", "--target", "82"], "between 0 and 1"),
    (["assess", "--multiple", "0"], "must be more than 0"),
])
def test_bad_invocations_are_one_line_usage_errors(argv: list[str], error: str, capsys: pytest.CaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(labs.ROOT)
    try:
        code = cli.main(argv)
    except SystemExit as e:
        code = e.code
    err = capsys.readouterr().err
    assert code == 2 and error in err and err.startswith("labkit assess: "), err


def test_a_course_configures_the_assessment_and_bad_settings_are_named() -> None:
    spec, run = assessment.from_config({"np": 4, "target": 0.85, "multiple": 5, "points": 5,
                                        "args": ["--epochs", "30"]})
    assert spec == {"np": 4, "target": 0.85, "multiple": 5.0}
    assert run["points"] == 5.0 and run["script"] == "fashion_mnist.py"
    with pytest.raises(ValueError, match="budget is relative to the machine"):
        assessment.from_config({"budget": 180})
    with pytest.raises(ValueError, match="unknown key"):
        assessment.from_config({"worker": 2})
    with pytest.raises(ValueError, match="write np = 3"):  # the worker count has one name, as in `labkit run --np`
        assessment.from_config({"workers": 3})
    with pytest.raises(ValueError, match="0 < target <= 1"):
        assessment.from_config({"target": 82})
    with pytest.raises(ValueError, match="list of strings"):
        assessment.from_config({"args": "--epochs 20"})


def test_grading_runs_the_learners_own_script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "labs"
    folder.mkdir()
    (folder / "fashion_mnist.py").write_text("print('mine')\n")
    seen = {}

    def fake_assess(script, goal, args, launcher, job, **kw):
        seen.update(script=Path(script), cwd=Path(job.cwd), args=args, goal=goal, text=Path(script).read_text())
        return assessment.Verdict(True, "reached 83.0% after 70 s", goal)

    monkeypatch.setattr(assessment, "assess", fake_assess)
    monkeypatch.setattr(assessment, "machine_goal", lambda **spec: Goal(spec["multiple"] * 50, spec["np"],
                                                                         spec["target"]))
    config = {"labs": ["mirrored"], "assessment": {"points": 5, "multiple": 4, "args": ["--epochs", "20"]}}
    result = grade.grade(folder, config=config)
    case = result.cases[-1]
    assert (case.lab, case.passed, case.points, case.max_points) == ("assessment", True, 5.0, 5.0)
    assert seen["script"].name == "fashion_mnist.py" and seen["script"].parent != folder  # a scratch copy
    assert seen["text"] == "print('mine')\n"  # the learner's, never a solution
    assert seen["cwd"].parent == seen["script"].parent and seen["args"] == ["--epochs", "20"]
    assert seen["goal"].budget_s == 200
    assert result.max_score == 4 + 5  # the mirrored lab (missing here: 0 of 4) and the assessment
    assert sorted(p.name for p in folder.iterdir()) == ["fashion_mnist.py"]  # nothing written in the checkout


@pytest.mark.slow
@pytest.mark.horovod
def test_a_real_run_is_judged_from_its_record(tmp_path: Path, calibrated: calibration.Calibration,
                                              capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """`labkit assess` runs a finished script (copied in as the learner's) and its real record is judged:
    only the reduced test set given here differs from the goal, and the run is stopped as soon as training
    begins, not after its 20 epochs."""
    mine = tmp_path / "fashion_mnist.py"
    shutil.copy2(labs.get("horovod").solution(), mine)
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    code = cli.main(["assess", "--np", "2", str(mine), "--json", "--", "--epochs", "20",
                     "--test-size", "128", "--log-dir", str(tmp_path / "csv")])
    took = time.monotonic() - started
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["details"]["settings"] == [
        "test set: 128 images, it should be the full small-mode test set of 1000 images (drop --test-size)"], out
    assert "stopped as soon as it began training" in out["message"], out
    assert took < 45, took  # 20 epochs of 6,000 images would take minutes
    assert out["goal"]["budget_s"] == pytest.approx(calibration.MULTIPLE * 50.0)


def test_a_script_without_the_settings_does_not_count() -> None:
    bare = fixture("good", config={}, mode=None, test_size=None)
    v = assessment.judge(bare, GOAL, MINE)
    assert not v.passed and "mode: not shown (the script has no such argument), it should be 'small'" in v.message
    assert "target accuracy: not shown" in v.message and "test set: not shown" in v.message


@pytest.mark.slow
@pytest.mark.horovod
def test_calibration_times_the_shipped_workload_and_caches_it(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The workload ships in the package (a released course has no solutions) and runs on this machine."""
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    said = []
    cal = calibration.measure(2, repeats=1, say=said.append)
    assert cal.seconds > 5 and len(cal.runs_s) == 1 and cal.command == "labkit assess --calibrate --np 2"
    assert cal.conditions["workers"] == 2 and cal.conditions["threads"] == 1 and cal.date[:4] == time.strftime("%Y")
    assert calibration.load(2, 1) == cal  # cached, with its date, command and conditions
    assert any("calibrating this machine" in s for s in said)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # nothing left in the current folder
