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


@pytest.mark.heavy  # three real runs (about a minute): the notebook path a learner takes with their own script
@pytest.mark.horovod
def test_the_learners_own_sweep_from_the_notebook_cell(tmp_path, monkeypatch, capsys, running) -> None:
    from labkit.core import contract
    from labkit.ui import notebook, scale_lab

    monkeypatch.setenv(contract.NB_QUICK, "1")  # one small run per rule, as the test suite runs notebooks
    monkeypatch.setattr(notebook, "ready", lambda script, lab, steps: (lab, steps) == ("horovod", 8))
    shown: list[object] = []
    monkeypatch.setattr(notebook, "show", shown.append)
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "fashion_mnist.py"  # the learner's own copy, named relative to the lab folder
    mine.write_text(labs.get("at-scale").solution().read_text())
    points = scale_lab.large_batch("fashion_mnist.py")
    out = capsys.readouterr().out
    assert [p.rule for p in points] == [r.name for r in lb.RULES] and all(p.status == "ok" for p in points), out
    assert all(p.val_accuracy and p.val_accuracy[-1] is not None for p in points), out
    assert "after the last epoch, fashion_mnist.py on this machine:" in out and len(shown) == 1
    assert not running("fashion_mnist.py")
