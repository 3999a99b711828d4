"""Pictures of what the ranks did, from data the lab already has: the weights a check recorded on
each rank, the epochs around a worker kill, and the run records (training curves, runs side by side)."""

from __future__ import annotations

from typing import Any

from labkit.figures.plot import figure_grid
from labkit.figures.scaling_model import learning_rate
from labkit.records.hvd_evidence import Run
from labkit.records.runrecord import RunRecord

SNAPSHOTS = (("init", "initial\nweights"), ("after_b0", "after\nstep 1"), ("b1_begin", "before\nstep 2"),
             ("b1_end", "after\nstep 2"), ("final", "end of\ntraining"))


def weight_gaps(evidence: Run) -> list[tuple[str, float | None]]:
    """How far rank 1's weights are from rank 0's at each snapshot of a Horovod check's run (relative distance; None
    when missing)."""
    import numpy as np

    w = evidence.weights
    out: list[tuple[str, float | None]] = []
    for key, label in SNAPSHOTS:
        a, b = (w.get(r, {}).get(key) for r in (0, 1))
        if a is None or b is None:
            out.append((label, None))
            continue
        a, b = np.asarray(a), np.asarray(b)
        denom = float(np.linalg.norm(a) + np.linalg.norm(b)) or 1.0
        out.append((label, float(np.linalg.norm(a - b)) / denom))
    return out


def update_gap(evidence: Run) -> float | None:
    """How different the two ranks' updates were in the same training step (0: averaged gradients)."""
    import numpy as np

    w = evidence.weights
    try:
        u0, u1 = (np.asarray(w[r]["b1_end"]) - np.asarray(w[r]["b1_begin"]) for r in (0, 1))
    except KeyError:
        return None
    denom = float(np.linalg.norm(u0) + np.linalg.norm(u1))
    return float(np.linalg.norm(u0 - u1)) / denom if denom else 0.0


def rank_weights(report: Any) -> Any:
    """Rank 0 against rank 1 in a Horovod check's run: the same weights (step 4), the same updates (step 3)."""
    evidence = getattr(report, "evidence", None)
    if not isinstance(evidence, Run) or not evidence.weights:
        raise ValueError("this report has no weight snapshots: run a Horovod check first (check.horovod(N))")
    gaps, update = weight_gaps(evidence), update_gap(evidence)
    fig, (ax, bx) = figure_grid(ncols=2, width=4.2, height=3.2)
    xs = [i for i, (_, g) in enumerate(gaps) if g is not None]
    ax.plot(xs, [gaps[i][1] for i in xs], "o-", color="#C44E52")
    ax.set_xticks(range(len(gaps)), [label for label, _ in gaps], fontsize=7)
    ax.set_ylabel("relative distance")
    ax.set_ylim(-0.03, max(0.1, max((g for _, g in gaps if g is not None), default=0) * 1.2))
    ax.set_title("weights: rank 1 vs rank 0", fontsize=10)
    bx.bar([0], [update or 0.0], color="#4C72B0", width=0.5)
    bx.set_xticks([0], ["update of\nstep 2"], fontsize=7)
    bx.set_xlim(-1, 1)
    bx.set_ylim(0, max(0.1, (update or 0) * 1.2))
    bx.set_title("updates: rank 1 vs rank 0", fontsize=10)
    for a in (ax, bx):
        a.axhline(0, color="#888", lw=0.8)
        a.grid(alpha=0.3)
    return fig


def resume_timeline(report: Any) -> Any:
    """Epochs the chief ran before a worker was killed and after the cluster restarted."""
    fig, (ax,) = figure_grid(width=6.5, height=2.4)
    done, cut = report.completed_before, report.before[-1:] if report.before else []
    for row, epochs, color, label in ((1, done, "#55A868", "completed"), (1, cut, "#C44E52", "cut by the kill"),
                                      (0, report.after, "#4C72B0", "after the restart")):
        for e in epochs:
            ax.barh(row, 0.9, left=e - 0.45, color=color, alpha=0.8, label=label)
            ax.text(e, row, str(e), ha="center", va="center", color="white", fontsize=9)
    if report.before:
        ax.axvline(report.before[-1] + 0.3, color="#C44E52", ls="--")
        ax.text(report.before[-1] + 0.35, 1.45, f"{report.killed} killed", color="#C44E52", fontsize=8)
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_yticks([0, 1], ["second start", "first start"])
    ax.set_xlabel("epoch")
    ax.set_ylim(-0.6, 1.8)
    ax.set_title("Kill and resume: which epochs ran when", fontsize=10)
    return fig


def _record(run: Any) -> RunRecord:
    rec = run if isinstance(run, RunRecord) else getattr(run, "record", None)
    if not isinstance(rec, RunRecord):
        raise ValueError("this run has no record: launch it through labkit (notebook.python, notebook.run, launch.run)")
    return rec


def curves(*runs: Any, labels: list[str] | None = None) -> Any:
    """Training curves from run records: validation (and training) accuracy against the wall clock, and
    images/sec per epoch. Each run is a launch result, a ``notebook.python`` result or a record."""
    fig, (ax, bx) = figure_grid(ncols=2, width=4.6, height=3.2)
    for i, run in enumerate(runs):
        rec = _record(run)
        name = labels[i] if labels else f"{rec.workers or 1} worker(s), batch {rec.batch_per_worker}"
        eps = [e for e in rec.epochs if e.elapsed_s is not None]
        line, = ax.plot([e.elapsed_s for e in eps], [e.val_accuracy for e in eps], "o-", label=name)
        ax.plot([e.elapsed_s for e in eps], [e.accuracy for e in eps], ":", color=line.get_color())
        bx.plot([e.epoch for e in eps], [e.images_per_sec for e in eps], "o-", label=name)
        if rec.target_accuracy:
            ax.axhline(rec.target_accuracy, color="#888", ls="--", lw=0.8)
    ax.set_xlabel("seconds since the start")
    ax.set_ylabel("accuracy (solid: validation, dotted: training)")
    bx.set_xlabel("epoch")
    bx.set_ylabel("training images/sec")
    bx.set_ylim(bottom=0)
    for a in (ax, bx):
        a.grid(alpha=0.3)
        a.legend(fontsize=7)
    return fig


def compare_runs(named: dict[str, Any]) -> Any:
    """Bars side by side: training images/sec and wall time of each named run (e.g. one big worker
    against N small ones)."""
    fig, (ax, bx) = figure_grid(ncols=2, width=3.8, height=2.8)
    names = list(named)
    recs = [_record(named[n]) for n in names]
    rates = [r.images_per_sec or 0.0 for r in recs]
    walls = [r.duration_s or 0.0 for r in recs]
    panels = ((ax, rates, "training images/sec", "{:.0f}"), (bx, walls, "wall time (s)", "{:.0f} s"))
    for a, values, title, unit in panels:
        bars = a.bar(names, values, color=["#4C72B0", "#55A868", "#C44E52", "#8172B2"][: len(names)])
        a.bar_label(bars, [unit.format(v) for v in values], fontsize=8)
        a.set_title(title, fontsize=10)
        a.tick_params(axis="x", labelsize=8)
    return fig


def worker_steps(run: Any, slowed: str | None = None) -> Any:
    """ParameterServerStrategy: the steps each worker finished over time, from the run record. With one
    worker slowed down, the coordinator gives the other more steps: training is asynchronous."""
    rec = _record(run)
    times = rec.worker_step_times or {}
    if not times:
        raise ValueError("this record has no per-worker steps: it is not a ParameterServerStrategy run")
    fig, (ax, bx) = figure_grid(ncols=2, width=4.4, height=3.0)
    names = [f"worker {k}" + (" (slowed)" if slowed == f"worker.{k}" else "") for k in times]
    for name, ts in zip(names, times.values(), strict=True):
        ax.step(sorted(ts), range(1, len(ts) + 1), where="post", label=name)
    ax.set_xlabel("seconds since the start")
    ax.set_ylabel("steps finished")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    bars = bx.bar(names, [len(ts) for ts in times.values()], color=["#4C72B0", "#C44E52", "#55A868", "#8172B2"])
    bx.bar_label(bars, fontsize=8)
    bx.set_title("steps per worker", fontsize=10)
    return fig


def learning_rates(workers: tuple[int, ...] = (1, 2, 4, 8), base_lr: float = 0.01, warmup_epochs: int = 3,
                   epochs: int = 40) -> Any:
    """The lab's learning rate against the epoch for each worker count (scaled, warmed up, decayed)."""
    fig, (ax,) = figure_grid(width=7, height=3.5)
    xs = [e / 20 for e in range(epochs * 20)]
    for n in workers:
        ax.plot(xs, [learning_rate(e, n, base_lr, warmup_epochs) for e in xs], label=f"{n} worker(s)")
    ax.set(xlabel="epoch", ylabel="learning rate", yscale="log", title="Scaled learning rate with warm-up")
    ax.legend()
    return fig
