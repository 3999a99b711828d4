"""The MultiWorkerMirroredStrategy lab's judges on recorded probe runs (offline); one real check with the
kill-and-resume run proves the wiring."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers.judge import expect_case, judge_case, real_check_matches_recording
from helpers.probe_cases import CASES, find

from labkit.check import judging, lab_multiworker
from labkit.records import typed
from labkit.records.tfdist_evidence import Kill, MultiWorker
from labkit.records.tfdist_probe import Event

HERE = [c for c in CASES if c.lab == "multiworker"]


@pytest.mark.parametrize("case", HERE, ids=lambda c: c.name)
def test_a_recorded_run_is_judged_at_the_right_step(case) -> None:
    expect_case(judge_case(case), case)


def test_step_4_says_why_when_no_worker_could_be_killed() -> None:
    ev = judging.load(find("multiworker", "after_step_04").fixture)
    assert isinstance(ev, MultiWorker)
    ev = dataclasses.replace(ev, kill=Kill(killed=False, why="the second epoch did not begin in time"))
    with pytest.raises(judging.Failed, match="second epoch did not begin"):
        lab_multiworker.step_4(ev)


def test_worker_1_printing_progress_fails_step_3() -> None:
    ev = judging.load(find("multiworker", "after_step_04").fixture)
    assert isinstance(ev, MultiWorker)
    ev = dataclasses.replace(ev, progress_bar={**ev.progress_bar, "worker.1": True})
    with pytest.raises(judging.Failed, match="verbose=0"):
        lab_multiworker.step_3(ev)


@pytest.mark.slow
def test_a_real_check_with_a_killed_worker_passes_and_matches_its_recording(tmp_path: Path,
                                                                            running) -> None:
    real_check_matches_recording(find("multiworker", "after_step_05"), tmp_path, running,
                                 "labkit.instrument.start tfdist", step=5)


def test_step_5_takes_an_epoch_run_again_after_a_restart_from_its_last_run() -> None:
    def end(epoch: int, t: float, rates: list[float]) -> dict:
        return {"kind": "epoch_end", "epoch": epoch, "t": t, "pid": int(t), "lr": rates}

    events = [end(0, 1, [0.02] * 2), end(1, 2, [0.5] * 2),  # epoch 2 of the killed process, then again
              end(1, 3, [0.03] * 2), end(2, 4, [0.04] * 2)]
    assert lab_multiworker._rates([typed.parse(Event, e) for e in events]) == [[0.02] * 2, [0.03] * 2, [0.04] * 2]
