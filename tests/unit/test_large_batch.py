"""The large-batch experiment (lab 9): the arguments each rule passes, the table and picture of its results, where
each rule breaks, and the reference file read bounded and typed."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from pathlib import Path

import pytest

from labkit.figures import large_batch as drawn
from labkit.figures.large_batch import Point
from labkit.measure import large_batch as lb
from labkit.measure.precision import Made
from labkit.records import typed


def _value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.mark.parametrize("batch", [16, 64, 256, 1024])
def test_each_rule_trains_at_its_rate_once_the_script_scales_by_the_workers(batch: int) -> None:
    plan = lb.Plan()
    for rule in lb.RULES:
        args = lb.arguments(rule, batch, plan)
        # the lab's script multiplies --base-lr by the number of workers (lab 2, step 8)
        trained = float(_value(args, "--base-lr")) * plan.workers
        want = lb.BASE_LR * batch * plan.workers / lb.BASE_BATCH if rule.scaled else lb.BASE_LR
        assert trained == pytest.approx(want) == pytest.approx(rule.lr(batch * plan.workers))
        assert int(_value(args, "--batch-size")) == batch and int(_value(args, "--epochs")) == plan.epochs
        assert int(_value(args, "--warmup-epochs")) == rule.warmup_epochs
        assert float(_value(args, "--target-accuracy")) > 1  # no run stops early


def test_the_rules_differ_in_scaling_and_warm_up_only() -> None:
    warm, cold, flat = lb.RULES
    assert warm.scaled and cold.scaled and not flat.scaled
    assert warm.warmup_epochs > 0 and cold.warmup_epochs == flat.warmup_epochs == 0
    assert flat.lr(2048) == flat.lr(32) == lb.BASE_LR and warm.lr(2048) == 64 * lb.BASE_LR


def test_updates_per_epoch_count_as_the_script_does() -> None:
    for batch in (16, 64, 256, 1024, 6000, 10000):
        assert lb.updates_per_epoch(batch, 2) == max(1, math.ceil(6000 / batch) // 2)
    assert lb.updates_per_epoch(1024, 2) == 3 and lb.updates_per_epoch(16, 2) == 187


def _points() -> list[Point]:
    out = []
    for g, finals in ((32, (0.80, 0.79, 0.81)), (128, (0.82, 0.78, 0.74)), (512, (0.78, 0.55, 0.60)),
                      (2048, (0.30, 0.10, 0.40))):
        for rule, final in zip(lb.RULES, finals, strict=True):
            out.append(Point(rule.name, g // 2, g, rule.lr(g), rule.warmup_epochs, lb.updates_per_epoch(g // 2, 2),
                             [final / 2, final], 30.0))
    return out


def test_where_each_rule_breaks_is_the_first_batch_more_than_the_drop_below_its_best() -> None:
    pts = _points()
    assert drawn.breaks(pts, "linear rule, warm-up") == 2048  # best 0.82; 0.78 is within 0.05
    assert drawn.breaks(pts, "linear rule, no warm-up") == 512
    assert drawn.breaks(pts, "not scaled") == 128  # best 0.81; 0.74 is 0.07 below
    assert drawn.breaks(pts, "linear rule, warm-up", drop=0.9) is None
    assert drawn.breaks(pts, "no such rule") is None
    crashed = [*pts[:3], Point("not scaled", 64, 128, 0.05, 0, 47, [], 3.0, "failed (1)")]
    assert drawn.breaks(crashed, "not scaled") == 128  # a run without an epoch broke


def test_the_table_has_a_row_per_batch_and_a_column_per_rule() -> None:
    text = drawn.table(_points())
    lines = text.splitlines()
    assert len(lines) == 5 and all(r.name in lines[0] for r in lb.RULES)
    assert lines[1].split()[:2] == ["32", "187"] and "80.0 (lr 0.05)" in lines[1]
    assert "30.0 (lr 3.2)" in lines[4] and "10.0 (lr 3.2)" in lines[4] and "40.0 (lr 0.05)" in lines[4]


def test_the_figure_draws_a_line_per_rule_on_each_side() -> None:
    fig = drawn.figure(_points())
    left, right = fig.axes
    assert len(left.get_lines()) == 3 and len(right.get_lines()) == 3
    assert "512" in right.get_title()
    assert [list(line.get_xdata()) for line in left.get_lines()][0] == [32, 128, 512, 2048]


def _reference(path: Path) -> None:
    ref = lb.Reference(Made("2026-11-28", "2 CPU cores", "python -m labkit.measure.large_batch --out x", 0.01, 0.02),
                       "fashion_mnist_at_scale_after_step_05.py", 2, 2, _points())
    path.write_text(json.dumps(asdict(ref)))


def test_the_reference_file_reads_back_typed(tmp_path: Path) -> None:
    _reference(tmp_path / lb.FILE)
    ref = lb.read(tmp_path)
    assert ref is not None and ref.points == _points() and ref.made.other_work == 0.02
    assert lb.read(tmp_path / "nowhere") is None


def test_a_bad_reference_file_is_named_never_a_key_error(tmp_path: Path) -> None:
    _reference(tmp_path / lb.FILE)
    data = json.loads((tmp_path / lb.FILE).read_text())
    data["points"][0]["val_accuracy"] = "high"
    (tmp_path / lb.FILE).write_text(json.dumps(data))
    with pytest.raises(typed.RecordError, match="val_accuracy"):
        lb.read(tmp_path)
    (tmp_path / lb.FILE).write_text("[" * 100_000)
    with pytest.raises(ValueError, match="large_batch.json"):
        lb.read(tmp_path)


def test_the_shipped_reference_reads_and_its_runs_all_trained(tmp_path: Path) -> None:
    ref = lb.read()
    assert ref is not None, "labs/reference/large_batch.json is missing: python -m labkit.measure.large_batch"
    assert {p.rule for p in ref.points} == {r.name for r in lb.RULES}
    for p in ref.points:
        assert p.status == "ok" and len(p.val_accuracy) == ref.epochs, p
        assert p.updates_per_epoch == lb.updates_per_epoch(p.batch_per_worker, ref.workers), p  # as measured


def test_the_sweep_runs_every_rule_at_every_batch_and_tells_each(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[tuple[str, int]] = []

    def fake(script: Path, rule: lb.Rule, batch: int, plan: lb.Plan, extra: tuple[str, ...] = ()) -> Point:
        ran.append((rule.name, batch))
        return Point(rule.name, batch, batch * plan.workers, rule.lr(batch * plan.workers), rule.warmup_epochs, 1,
                     [0.5], 2.0)

    monkeypatch.setattr(lb, "run_point", fake)
    told: list[str] = []
    points = lb.sweep(Path("x.py"), lb.Plan(batches=(16, 1024), epochs=1), told=told.append)
    assert ran == [(r.name, b) for b in (16, 1024) for r in lb.RULES] and len(points) == 6
    assert told[-1] == ("[6/6] global batch 2048, not scaled (lr 0.05): validation accuracy 50.0% after 1 epoch(s), "
                        "2 s, ok")


def test_a_script_named_from_the_lab_folder_runs_in_the_runs_own_folder(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # the notebook passes "fashion_mnist.py"; each run has a temporary folder of its own
    from labkit.launching import launch

    seen: list[str] = []

    def fake_run(command: list[str], **kw: object) -> object:
        seen.append(command[1])
        return launch.JobResult(1, command, tmp_path, 2, 1.0)

    monkeypatch.setattr(lb.launch, "run", fake_run)
    monkeypatch.chdir(tmp_path)
    p = lb.run_point(Path("fashion_mnist.py"), lb.RULES[2], 64, lb.Plan(epochs=1))
    assert seen == [str(tmp_path / "fashion_mnist.py")] and p.status == "failed (1)" and p.val_accuracy == []
