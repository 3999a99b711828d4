"""The MirroredStrategy lab's judges on recorded probe runs (offline); one real check proves the wiring."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers.judge import expect_case, judge_case, real_check_matches_recording
from helpers.probe_cases import CASES, find

from labkit.check import judging, lab_mirrored
from labkit.records.tfdist_evidence import Mirrored

HERE = [c for c in CASES if c.lab == "mirrored"]


@pytest.mark.parametrize("case", HERE, ids=lambda c: c.name)
def test_a_recorded_run_is_judged_at_the_right_step(case) -> None:
    expect_case(judge_case(case), case)


def test_a_model_never_saved_fails_step_4() -> None:
    ev = judging.load(find("mirrored", "after_step_04").fixture)
    assert isinstance(ev, Mirrored)
    ev = dataclasses.replace(ev, files=[f for f in ev.files if f != ev.model_path])
    with pytest.raises(judging.Failed, match="model.save"):
        lab_mirrored.step_4(ev)


@pytest.mark.slow
def test_a_real_check_of_the_solution_passes_and_matches_its_recording(tmp_path: Path, running) -> None:
    real_check_matches_recording(find("mirrored", "after_step_04"), tmp_path, running,
                                          "labkit.instrument.start tfdist")
