"""Judging the checks' recorded probe runs (``tests/fixtures/probes``) and running the same cases for real."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from labkit import check
from labkit.check import Report, judging
from labkit.course import labs

# What a check's ranks and scratch folders would leave in the temporary folder (AutoGraph writes a module per
# converted function and removes it only at a clean exit; a rank the check stops has none).
TEMPORARY = ("__autograph_generated_file", "labkit-", "ompi.")


def judge_case(case) -> Report:  # a probe_cases.Case
    """Judge a recorded probe run (``tests/fixtures/probes``) as the check would, without running anything."""
    spec = labs.get(case.lab)
    evidence = judging.load(case.fixture, case.lab)  # refused, naming the file, when recorded in another format
    module = judging.lab_module(case.lab)
    upto = min(case.step or spec.n_steps, evidence.covers)
    return Report(case.lab, case.name, judging.judge(module, evidence, upto, spec.steps))


def expect_case(report: Report, case) -> None:
    """Steps 1..case.passes pass; the next one fails, with case.hint in its message."""
    judged = len(report.steps)
    assert [s.passed for s in report.steps] == [s.step <= case.passes for s in report.steps], report.format()
    if case.passes < judged:
        assert report.first_failing_step == case.passes + 1, report.format()
        assert case.hint in report.steps[case.passes].message, report.format()


def real_check_matches_recording(case, tmp_path: Path, running: Callable[[str], bool], probe: str,
                                 step: int | None = None) -> Report:
    """Check ``case`` for real: it is judged as recorded, its evidence has the recorded shape, nothing is left."""
    out = tmp_path / "evidence.json"
    before = set(os.listdir(tempfile.gettempdir()))
    report = check.run_check(case.lab, case.script(tmp_path), step, fresh=True, evidence_out=out)
    left = {n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith(TEMPORARY)}
    assert not left, f"the check left temporary files: {sorted(left)[:5]}"
    expect_case(report, case)
    assert judging.shape(judging.load(out)) == judging.shape(judging.load(case.fixture)), (
        "the probe's evidence changed shape: run `make probe-fixtures`")
    assert not running(probe)
    return report
