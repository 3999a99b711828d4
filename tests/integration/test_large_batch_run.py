"""Lab 9's large-batch experiment on the real finished script: one run, tiny data, one epoch; what it records."""

from __future__ import annotations

import pytest

from labkit.course import labs
from labkit.measure import large_batch as lb

TINY = ("--train-size", "512", "--test-size", "128")


@pytest.mark.slow
@pytest.mark.horovod
def test_a_run_records_its_accuracy_updates_and_rate(running) -> None:
    plan = lb.Plan(batches=(64,), epochs=1, timeout=300)
    p = lb.run_point(labs.get("at-scale").solution(), lb.RULES[0], 64, plan, extra=TINY)
    assert p.status == "ok" and len(p.val_accuracy) == 1 and p.val_accuracy[0] is not None, p
    assert (p.global_batch, p.lr, p.warmup_epochs) == (128, 0.2, 3)
    assert p.updates_per_epoch == 4  # as the run counted them: ceil(512 / 64) // 2
    assert not running("fashion_mnist_at_scale")
