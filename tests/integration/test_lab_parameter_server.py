"""The ParameterServerStrategy lab's judges on recorded probe runs (offline); real checks prove the wiring and
that servers which return end the run at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers.judge import expect_case, judge_case, real_check_matches_recording
from helpers.probe_cases import CASES, find

from labkit import check

HERE = [c for c in CASES if c.lab == "parameter-server"]


@pytest.mark.parametrize("case", HERE, ids=lambda c: c.name)
def test_a_recorded_run_is_judged_at_the_right_step(case) -> None:
    expect_case(judge_case(case), case)


@pytest.mark.slow
def test_a_real_check_of_the_solution_passes_and_matches_its_recording(tmp_path: Path, running) -> None:
    real_check_matches_recording(find("parameter-server", "after_step_03"), tmp_path, running,
                                          "labkit.instrument.start tfdist")


@pytest.mark.slow
def test_servers_that_return_fail_step_1_at_once(tmp_path: Path, running) -> None:
    case = find("parameter-server", "servers_return")
    t = time.perf_counter()
    report = check.run_check("parameter-server", case.script(tmp_path), timeout=180, fresh=True)
    assert time.perf_counter() - t < 90
    expect_case(report, case)
    assert "server.join()" in report.steps[0].message
    assert not running("labkit.instrument.start tfdist")
