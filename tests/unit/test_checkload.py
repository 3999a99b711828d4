"""labkit.measure.checkload: the load test's figures and each learner's environment."""

from __future__ import annotations

from pathlib import Path

from labkit.core import slots
from labkit.measure import checkload


def test_the_figures_of_a_load() -> None:
    run = checkload.LoadRun(4, 1, 10.0, [10.0, 20.0, 30.0, 40.0], 1, 0.02, ["step 1 FAIL ..."])
    assert run.quantile(0.5) in (20.0, 30.0) and run.quantile(0.95) == 40.0
    text = str(run)
    assert "4 learners, queue of 1 slot(s)" in text and "p50   25.0 s" in text and "max   40.0 s" in text
    assert "failed 1" in text and "other programs 2% of the cores" in text
    assert "no queue" in str(checkload.LoadRun(4, 0, 10.0, [1.0], 0, None, []))


def test_a_learner_gets_the_queue_only_when_asked(monkeypatch) -> None:
    monkeypatch.setenv(slots.SLOTS_VAR, "7")
    assert slots.SLOTS_VAR not in checkload.learner_env(0, Path("/q"))
    env = checkload.learner_env(2, Path("/q"))
    assert env[slots.SLOTS_VAR] == "2" and env[slots.QUEUE_VAR] == "/q"
