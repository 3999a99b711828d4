"""labkit.check.Report: asserted from other graders (otter-grader tests, nbgrader hidden cells)."""

from __future__ import annotations

import pytest

from labkit.check import Report, StepResult


def _report() -> Report:
    steps = [StepResult(1, True, "ok"), StepResult(2, True, "ok"),
             StepResult(3, False, "wrap the optimizer in hvd.DistributedOptimizer")]
    return Report("horovod", "fashion_mnist.py", steps)


def test_assert_passed_up_to_a_step() -> None:
    report = _report()
    report.assert_passed(2)
    with pytest.raises(AssertionError, match="horovod step 3: wrap the optimizer"):
        report.assert_passed(3)
    with pytest.raises(AssertionError, match="step 3"):
        report.assert_passed()
    with pytest.raises(AssertionError, match="step 5 of the horovod lab was not checked"):
        report.assert_passed(5)
    assert report.step(3).message.startswith("wrap") and report.step(9) is None
