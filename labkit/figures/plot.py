"""Scaling plots from run records or a benchmark sweep, as matplotlib figures.

Every function takes run records (``labkit.records.runs.read()``), a
:class:`labkit.records.sweep.Sweep`, or a ``{label: [Point, ...]}`` mapping, and returns a
``matplotlib.figure.Figure`` (shown by Jupyter when it is a cell's value; saved
with :func:`save`). Records are grouped by framework (Horovod, or the
tf.distribute strategy) so that they can be compared side by side.

From a shell: ``labkit plot runs/runs.jsonl --out plots/`` writes PNG files.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from labkit.records import sweep
from labkit.records.runrecord import RunRecord

IDEAL_STYLE = {"linestyle": "--", "color": "grey", "linewidth": 1}


def framework(record: RunRecord) -> str:
    """``horovod``, the tf.distribute strategy's name, or the launcher, for grouping records."""
    strategy = record.strategy
    if strategy:
        return "Horovod" if strategy == "horovod" else f"tf.distribute {strategy}"
    return str(record.launcher or "single process")


def series(data: Any, by: Callable[[RunRecord], str] = framework) -> dict[str, list[Any]]:
    """Normalise records, a Sweep, or a mapping into ``{label: [Point sorted by workers]}``."""
    if isinstance(data, sweep.Sweep):  # labelled like its records: Horovod, the strategy ...
        first = next((r for r in data.records if not sweep.is_ceiling(r)), None)
        return {by(first) if first else Path(data.script).stem: data.points}
    if isinstance(data, dict):
        return {k: sorted(v, key=lambda p: p.workers) for k, v in data.items()}
    data = list(data)
    if data and isinstance(data[0], sweep.Point):
        return {"run": sorted(data, key=lambda p: p.workers)}
    groups: dict[str, list[RunRecord]] = {}
    for r in data:
        if sweep.finished(r) and r.images_per_sec:
            groups.setdefault(by(r), []).append(r)
    return {label: sweep.points_from_records(recs) for label, recs in sorted(groups.items())}


def merged(*data: Any) -> dict[str, list[Any]]:
    """The series of several sweeps or record lists side by side (e.g. a Horovod and a tf.distribute sweep)."""
    groups: dict[str, list[Any]] = {}
    for d in data:
        for label, pts in series(d).items():
            groups[label if label not in groups else f"{label} ({len(groups) + 1})"] = pts
    return groups


def _notebook_png() -> None:
    """In a Jupyter kernel, show a Figure returned by a cell as a PNG (without importing pyplot)."""
    try:
        from IPython import get_ipython
        from IPython.core.pylabtools import select_figure_formats
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None and hasattr(shell, "kernel"):
        try:
            select_figure_formats(shell, {"png"})
        except Exception:  # noqa: BLE001 - display is a convenience
            pass


def figure_grid(ncols: int = 1, width: float = 5.0, height: float = 3.6) -> Any:
    """A figure of ``ncols`` axes side by side (shown as a PNG in a notebook) and its axes."""
    from matplotlib.figure import Figure

    _notebook_png()
    fig = Figure(figsize=(width * ncols, height), layout="constrained")
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    return fig, axes


def _workers_axis(ax: Any, workers: list[int]) -> None:
    ax.set_xlabel("workers")
    if workers:
        ax.set_xticks(sorted(set(workers)))
    ax.grid(True, alpha=0.3)


def _all_workers(groups: dict[str, list[Any]]) -> list[int]:
    return sorted({p.workers for pts in groups.values() for p in pts})


def draw_throughput(ax: Any, groups: dict[str, list[Any]]) -> None:
    """Images/sec against workers, each series with its ideal (linear) line."""
    for label, pts in groups.items():
        pts = [p for p in pts if p.images_per_sec]
        if not pts:
            continue
        xs = [p.workers for p in pts]
        line = ax.plot(xs, [p.images_per_sec for p in pts], marker="o", label=label)[0]
        base = pts[0]
        ax.plot(xs, [base.images_per_sec * x / base.workers for x in xs], **{**IDEAL_STYLE, "color": line.get_color()},
                label=f"{label}: ideal (linear)")
        ceil = [p for p in pts if getattr(p, "ceiling_images_per_sec", None)]
        if ceil:
            ax.plot([p.workers for p in ceil], [p.ceiling_images_per_sec for p in ceil], marker="^", linestyle=":",
                    color=line.get_color(), label=f"{label}: ceiling (independent copies)")
    ax.set_ylabel("training images/sec")
    ax.set_title("Throughput")
    ax.set_ylim(bottom=0)
    _workers_axis(ax, _all_workers(groups))
    ax.legend(fontsize="small")


def draw_speedup(ax: Any, groups: dict[str, list[Any]]) -> None:
    workers = _all_workers(groups)
    for label, pts in groups.items():
        pts = [p for p in pts if p.speedup]
        ax.plot([p.workers for p in pts], [p.speedup for p in pts], marker="o", label=label)
    if workers:
        base = workers[0]
        ax.plot(workers, [w / base for w in workers], **IDEAL_STYLE, label="ideal")
    ax.set_ylabel("speedup over the fewest workers")
    ax.set_title("Speedup")
    ax.set_ylim(bottom=0)
    _workers_axis(ax, workers)
    ax.legend(fontsize="small")


def draw_efficiency(ax: Any, groups: dict[str, list[Any]]) -> None:
    workers = _all_workers(groups)
    for label, pts in groups.items():
        eff = [p for p in pts if p.efficiency]
        line = ax.plot([p.workers for p in eff], [100 * p.efficiency for p in eff], marker="o",
                       label=f"{label}: of linear")[0]
        ceil = [p for p in pts if getattr(p, "ceiling_efficiency", None)]
        if ceil:
            ax.plot([p.workers for p in ceil], [100 * p.ceiling_efficiency for p in ceil], marker="^",
                    linestyle=":", color=line.get_color(), label=f"{label}: of the ceiling")
    if workers:
        ax.plot(workers, [100] * len(workers), **IDEAL_STYLE, label="ideal")
    ax.set_ylabel("scaling efficiency (%)")
    ax.set_title("Efficiency = speedup / workers")
    ax.set_ylim(0, 120)
    _workers_axis(ax, workers)
    ax.legend(fontsize="small")


def draw_time_to_accuracy(ax: Any, groups: dict[str, list[Any]]) -> None:
    workers = _all_workers(groups)
    n = max(1, len(groups))
    width = 0.8 / n
    for i, (label, pts) in enumerate(groups.items()):
        xs = [workers.index(p.workers) + (i - (n - 1) / 2) * width for p in pts]
        ys = [p.time_to_target_s if p.time_to_target_s is not None else 0 for p in pts]
        bars = ax.bar(xs, ys, width=width, label=label)
        for bar, p in zip(bars, pts, strict=True):
            if p.time_to_target_s is None:
                ax.annotate("not reached", (bar.get_x() + bar.get_width() / 2, 0), ha="center", va="bottom",
                            rotation=90, fontsize="x-small")
    ax.set_xticks(range(len(workers)), [str(w) for w in workers])
    ax.set_xlabel("workers")
    ax.set_ylabel("seconds to the target validation accuracy")
    ax.set_ylim(bottom=0)
    ax.set_title("Time to accuracy")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize="small")


def throughput(*data: Any) -> Any:
    """Images/sec against workers with the ideal linear line."""
    fig, (ax,) = figure_grid(1)
    draw_throughput(ax, merged(*data))
    return fig


def speedup(*data: Any) -> Any:
    """Speedup and efficiency against workers, with the ideal lines."""
    fig, (a, b) = figure_grid(2)
    groups = merged(*data)
    draw_speedup(a, groups)
    draw_efficiency(b, groups)
    return fig


def time_to_accuracy(*data: Any) -> Any:
    """Seconds to the target validation accuracy, per worker count (of each sweep or record list given)."""
    fig, (ax,) = figure_grid(1)
    draw_time_to_accuracy(ax, merged(*data))
    return fig


def scaling(*data: Any) -> Any:
    """Throughput (with the ceiling when measured), speedup, efficiency and time to accuracy in one
    figure (what ``labkit bench --plot`` saves)."""
    fig, (a, b, c, d) = figure_grid(4, width=4.4)
    groups = merged(*data)
    draw_throughput(a, groups)
    draw_speedup(b, groups)
    draw_efficiency(c, groups)
    draw_time_to_accuracy(d, groups)
    return fig


def compare(*data: Any) -> Any:
    """Horovod and tf.distribute side by side: one column per framework (sweeps or run records),
    throughput above efficiency."""
    from matplotlib.figure import Figure

    groups = merged(*data)
    n = max(1, len(groups))
    _notebook_png()
    fig = Figure(figsize=(4.4 * n, 6.4), layout="constrained")
    items = list(groups.items()) or [("no records", [])]
    top = None
    for i, (label, pts) in enumerate(items):
        ax = fig.add_subplot(2, n, i + 1, sharey=top)
        top = top or ax
        draw_throughput(ax, {label: pts})
        ax.set_title(label)
        ax2 = fig.add_subplot(2, n, n + i + 1)
        draw_efficiency(ax2, {label: pts})
        ax2.set_title("")
    fig.suptitle("Horovod vs tf.distribute (same y scale for throughput)")
    return fig


def save(fig: Any, path: str | Path, dpi: int = 110) -> Path:
    """Write ``fig`` as a PNG (folders created); return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png")
    return path


def save_all(records: list[RunRecord], out_dir: str | Path) -> list[Path]:
    """Every plot of ``records`` as PNG files in ``out_dir``."""
    out = Path(out_dir)
    return [
        save(throughput(records), out / "throughput.png"),
        save(speedup(records), out / "speedup_efficiency.png"),
        save(time_to_accuracy(records), out / "time_to_accuracy.png"),
        save(compare(records), out / "horovod_vs_tf_distribute.png"),
    ]


