"""Lab 9's judges on recorded probe runs (offline), and one real check of the finished script.

The recorded cases (tests/helpers/probe_cases.py) cover each step's solution, the finished lab 8 script (no
--accumulate), wrong scripts failing at the right step (accumulation ignored, the rate scaled twice or not at all,
Keras's SyncBatchNormalization under Horovod, the pure bfloat16 policy, a bfloat16 output, a profile on every rank,
a profiler never stopped, validation batches profiled) and correct scripts written another way (summed gradients at
the workers' rate, the profiler's context manager around fit). Every message of the judges is tested on hand-made
evidence in tests/unit/test_lab_at_scale_units.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.judge import expect_case, judge_case, real_check_matches_recording
from helpers.probe_cases import CASES, find

from labkit.course import labs

HERE = [c for c in CASES if c.lab == "at-scale"]


@pytest.mark.parametrize("case", HERE, ids=lambda c: c.name)
def test_a_recorded_run_is_judged_at_the_right_step(case) -> None:
    expect_case(judge_case(case), case)


@pytest.mark.slow
@pytest.mark.horovod
def test_a_real_check_of_step_4s_script_passes_four_steps_and_matches_its_recording(tmp_path: Path, running) -> None:
    # the elastic run it asks for refuses --elastic within seconds; the finished script's elastic run is heavy
    report = real_check_matches_recording(find("at-scale", "after_step_04"), tmp_path, running,
                                          "labkit.instrument.start horovod")
    assert report.seconds is not None and report.seconds < labs.get("at-scale").timeout


@pytest.mark.heavy
@pytest.mark.horovod
def test_a_real_elastic_check_of_the_finished_script_shrinks_grows_and_passes(tmp_path: Path, running) -> None:
    # about 70 s idle: the probed run, then 24 epochs under horovodrun's elastic mode, a worker leaving and returning
    report = real_check_matches_recording(find("at-scale", "after_step_05"), tmp_path, running,
                                          "labkit.instrument.start horovod")
    assert "a new worker joined" in report.steps[4].message
    assert not running("horovodrun") and not running("fashion_mnist")
