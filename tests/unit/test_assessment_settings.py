"""labkit.grading.assessment.SettingsWatch: an assessment run is stopped as soon as its settings show."""

from __future__ import annotations

import json
from pathlib import Path

from labkit.grading import assessment
from labkit.records import runrecord

GOAL = assessment.Goal(budget_s=600.0)
RIGHT = {"mode": "small", "test_size": 1000, "target_accuracy": 0.82, "epochs": 20}


def observe(folder: Path, config: dict, begun: bool = True, pid: int = 101) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    obs = {"pid": pid, "started": 1.0, "config": config, "world": {"is_chief": True, "rank": 0, "workers": 2},
           "fits": [{}] if begun else [], "epochs": []}
    if begun:
        obs["train_begin"] = 2.0
    (folder / f"observed.{pid}.json").write_text(json.dumps(obs))


def test_nothing_is_said_before_training_begins_nor_for_the_goals_settings(tmp_path: Path) -> None:
    watch = assessment.SettingsWatch(GOAL, every=0)
    assert watch(tmp_path / "none") is None
    observe(tmp_path, {**RIGHT, "test_size": 200}, begun=False)
    assert watch(tmp_path) is None  # parsed, but the mode's defaults may still be filled in
    observe(tmp_path, RIGHT)
    assert watch(tmp_path) is None


def test_a_wrong_setting_is_named_once_training_begins(tmp_path: Path) -> None:
    observe(tmp_path, {**RIGHT, "test_size": 200, "target_accuracy": 0.5})
    why = assessment.SettingsWatch(GOAL, every=0)(tmp_path)
    assert why and "test set: 200 images, it should be the full small-mode test set of 1000" in why, why
    assert "target accuracy: 0.5, it should be 0.82" in why, why
    assert "mode:" not in why, why


def test_a_stopped_record_is_judged_by_the_settings_it_showed() -> None:
    record = runrecord.parse({
        "run_id": "r1", "status": "stopped", "error": "its settings cannot count: test set: 200 images",
        "script": "/x/fashion_mnist.py", "config": {**RIGHT, "test_size": 200}, "workers": 2, "strategy": "horovod",
        "threads_per_worker": 1, "epochs": []})
    verdict = assessment.judge(record, GOAL, "/x/fashion_mnist.py")
    assert not verdict.passed and "stopped as soon as it began training" in verdict.message, verdict.message
    assert "test set: 200 images" in verdict.message
