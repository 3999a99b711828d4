"""labkit.figures.plot: the figures have the expected lines and axes; the CLI writes PNG files."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.cli import main as cli
from labkit.figures import plot
from labkit.records import runs, sweep
from labkit.records.runrecord import RunRecord


def records() -> list[RunRecord]:
    out = []
    for strategy, rates in (("horovod", {1: 100.0, 2: 190.0, 4: 340.0}),
                            ("MultiWorkerMirroredStrategy", {1: 90.0, 2: 150.0})):
        for w, ips in rates.items():
            out.append(RunRecord(run_id=f"{strategy}-{w}", strategy=strategy, launcher="mpirun", workers=w,
                                 images_per_sec=ips, time_to_target_s=100.0 / w if w < 4 else None, status="ok"))
    out.append(RunRecord(run_id="bad", strategy="horovod", workers=8, images_per_sec=None, status="failed"))
    return out


def _lines(ax) -> dict[str, list]:
    return {line.get_label(): list(line.get_ydata()) for line in ax.get_lines()}


def test_series_groups_by_framework() -> None:
    groups = plot.series(records())
    assert sorted(groups) == ["Horovod", "tf.distribute MultiWorkerMirroredStrategy"]
    assert [p.workers for p in groups["Horovod"]] == [1, 2, 4]  # the failed 8-worker run is left out


def test_throughput_has_measured_and_ideal_lines() -> None:
    fig = plot.throughput(records())
    (ax,) = fig.axes
    lines = _lines(ax)
    assert lines["Horovod"] == [100.0, 190.0, 340.0]
    assert lines["Horovod: ideal (linear)"] == [100.0, 200.0, 400.0]
    assert lines["tf.distribute MultiWorkerMirroredStrategy: ideal (linear)"] == [90.0, 180.0]
    assert ax.get_xlabel() == "workers" and "images/sec" in ax.get_ylabel()


def test_speedup_and_efficiency() -> None:
    fig = plot.speedup(records())
    sp, eff = fig.axes
    lines = _lines(sp)
    assert lines["Horovod"] == pytest.approx([1.0, 1.9, 3.4]) and lines["ideal"] == [1.0, 2.0, 4.0]
    lines = _lines(eff)
    assert lines["Horovod: of linear"] == pytest.approx([100.0, 95.0, 85.0]) and lines["ideal"] == [100, 100, 100]
    assert "efficiency" in eff.get_ylabel()


def test_time_to_accuracy_bars() -> None:
    fig = plot.time_to_accuracy(records())
    (ax,) = fig.axes
    heights = sorted(round(b.get_height(), 1) for b in ax.patches)
    assert heights == sorted([100.0, 50.0, 0.0, 100.0, 50.0])  # the 4-worker run did not reach the target
    assert any("not reached" in t.get_text() for t in ax.texts)


def test_compare_puts_frameworks_side_by_side() -> None:
    fig = plot.compare(records())
    titles = [ax.get_title() for ax in fig.axes]
    assert "Horovod" in titles and "tf.distribute MultiWorkerMirroredStrategy" in titles
    assert len(fig.axes) == 4


def test_sweep_plot_and_png(tmp_path: Path) -> None:
    points = sweep.points_from_records([r for r in records() if r.strategy == "horovod"])
    result = sweep.Sweep("train.py", points, {})
    fig = plot.scaling(result)
    assert [ax.get_title() for ax in fig.axes] == ["Throughput", "Speedup", "Efficiency = speedup / workers",
                                                   "Time to accuracy"]
    out = plot.save(fig, tmp_path / "sub" / "s.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_writes_pngs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "runs.jsonl"
    for r in records():
        runs.append(r, path)
    assert cli.main(["plot", str(path), "--out", str(tmp_path / "plots")]) == 0
    written = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert written == ["horovod_vs_tf_distribute.png", "speedup_efficiency.png", "throughput.png",
                       "time_to_accuracy.png"]
    assert cli.main(["plot", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "x")]) == 1


def test_sweep_plot_shows_the_ceiling() -> None:
    def ceiling(workers: int, ips: float) -> RunRecord:
        return RunRecord(run_id=f"c{workers}", launcher="independent", status="ok", strategy="horovod",
                         threads_per_worker=1, workers=workers, images_per_sec=ips)

    recs = [r for r in records() if r.strategy == "horovod"]
    recs += [ceiling(2, 200.0), ceiling(4, 400.0)]
    result = sweep.Sweep("train.py", sweep.points_from_records(recs), {})
    throughput, _, efficiency, _ = plot.scaling(result).axes
    (ceil,) = [v for k, v in _lines(throughput).items() if k.endswith(": ceiling (independent copies)")]
    assert ceil == [200.0, 400.0]
    (of_ceiling,) = [v for k, v in _lines(efficiency).items() if k.endswith(": of the ceiling")]
    assert of_ceiling == pytest.approx([95.0, 85.0])
