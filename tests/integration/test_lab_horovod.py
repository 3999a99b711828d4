"""The Horovod lab's judges on recorded probe runs (offline); real checks prove the wiring and the timeouts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.judge import expect_case, judge_case, real_check_matches_recording
from helpers.probe_cases import CASES, find

from labkit import check
from labkit.check import judging, lab_horovod
from labkit.course import labs

HERE = [c for c in CASES if c.lab == "horovod"]


@pytest.mark.parametrize("case", HERE, ids=lambda c: c.name)
def test_a_recorded_run_is_judged_at_the_right_step(case) -> None:
    expect_case(judge_case(case), case)


def test_a_rank_that_left_no_record_fails_step_1_with_its_error() -> None:
    ev = {"np": 2, "batch": 16, "timed_out": False, "start_error": None, "weights": {},
          "states": {"0": {"milestones": ["start", "fit_start"], "error": None}},
          "ranks": {"0": {"exit": None}, "1": {"exit": 1, "error": "ImportError: nope", "log_tail": ""}}}
    results = judging.judge(lab_horovod, lab_horovod.evidence(ev), 3, labs.get("horovod").steps)
    assert [r.passed for r in results] == [False, False, False]
    assert "rank 1" in results[0].message and "ImportError" in results[0].message
    assert "fix step 1" in results[2].message


def test_a_hang_is_called_a_deadlock() -> None:
    ev = {"np": 2, "timed_out": True, "start_error": None,
          "states": {str(r): {"milestones": ["start"], "error": None} for r in range(2)},
          "ranks": {str(r): {"exit": None, "stalled": False} for r in range(2)}}
    with pytest.raises(judging.Failed, match="deadlock"):
        lab_horovod.step_1(lab_horovod.evidence(ev))


@pytest.mark.slow
@pytest.mark.horovod
def test_a_real_check_of_the_solution_passes_and_matches_its_recording(tmp_path: Path, running) -> None:
    report = real_check_matches_recording(find("horovod", "after_step_08"), tmp_path, running,
                                          "labkit.instrument.start horovod")
    assert report.seconds is not None and report.seconds < labs.get("horovod").timeout


@pytest.mark.slow
@pytest.mark.horovod
def test_a_deadlock_is_reported_within_the_timeout(tmp_path: Path, running) -> None:
    text = (find("horovod", "after_step_06").script(tmp_path)).read_text().replace(
        "    args = parse_args(argv)\n",
        "    args = parse_args(argv)\n    if hvd.rank() == 0:\n"
        "        hvd.allreduce(tf.constant(1.0), name='only_rank_0')\n")
    script = tmp_path / "deadlock.py"
    script.write_text(text)
    report = check.run_check("horovod", script, fresh=True)  # the hang starts before the model: the fit bound
    assert not report.passed
    assert "deadlock" in report.format() or "stuck" in report.format(), report.format()
    assert "rank 0" in report.format() and "a correct script calls model.fit within" in report.format(), report.format()
    assert report.seconds is not None and report.seconds < 150  # the bound grows with the machine's load
    assert not running("labkit.instrument.start horovod")


def test_step_8_reads_the_rates_of_every_rank_and_every_epoch() -> None:
    assert "0.04" in lab_horovod.step_8(judging.load(find("horovod", "after_step_08").fixture))
    ev = json.loads(find("horovod", "after_step_08").fixture.read_text())  # the recording, changed by hand
    run = ev["lr_run"]
    for ep in run["states"]["1"]["epochs"][3:]:
        ep["lr"] = [2 * r for r in ep["lr"]]  # rank 1 scaled twice after the warm-up
    with pytest.raises(judging.Failed, match="rank 1 trained with"):
        lab_horovod.step_8(lab_horovod.evidence(ev))
    for r in ("0", "1"):
        del run["states"][r]["epochs"][3:]
    with pytest.raises(judging.Failed, match="training stopped after 3"):
        lab_horovod.step_8(lab_horovod.evidence(ev))
    del ev["lr_run"]
    with pytest.raises(judging.Failed, match="steps 1-7 must pass"):
        lab_horovod.step_8(lab_horovod.evidence(ev))


@pytest.mark.slow
@pytest.mark.horovod
def test_a_queued_check_waits_for_its_slot_and_its_budget_starts_then(tmp_path: Path, running,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """With LABKIT_CHECK_SLOTS=1 and the slot held by another process for 12 s, a step-1 check given a 20 s budget
    waits, is told its place, and still passes: its budget counts from the slot, not from the press."""
    monkeypatch.setenv("LABKIT_CHECK_SLOTS", "1")
    monkeypatch.setenv("LABKIT_CHECK_QUEUE", str(tmp_path / "queue"))
    holder = subprocess.Popen([sys.executable, "-c", "import time\nfrom labkit.core import slots\n"
                               f"with slots.SlotQueue({str(tmp_path / 'queue')!r}, 1).slot('other'):\n"
                               "    print('holding', flush=True)\n    time.sleep(12)\n"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        script = find("horovod", "after_step_01").script(tmp_path)
        report = check.run_check("horovod", script, 1, timeout=20, fresh=True)
    finally:
        holder.kill()
        holder.wait()
    assert report.passed, report.format()
    assert any("waited" in n and "for a check slot" in n for n in report.notes), report.notes
    assert report.seconds is not None and report.seconds > 12
    assert not list((tmp_path / "queue").glob("*.ticket")) and not running("labkit.instrument.start horovod")
