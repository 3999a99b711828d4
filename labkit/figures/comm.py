"""What communication costs, drawn: the all-reduce against the ring model, and one Horovod knob's variants."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from labkit.figures.plot import figure_grid


def link(labels: Sequence[str], measured: Sequence[float], model: Sequence[float | None], title: str) -> Any:
    """Measured all-reduce seconds per tensor size beside the ring model's (bars, log scale)."""
    fig, (ax,) = figure_grid(width=5.5, height=3.2)
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], measured, width=0.4, label="measured (median)")
    if any(m is not None for m in model):
        ax.bar([x + 0.2 for x in xs], [m or 0 for m in model], width=0.4, label="ring model", alpha=0.6)
    ax.set_xticks(list(xs), list(labels))
    ax.set_yscale("log")
    ax.set_ylabel("seconds per all-reduce")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return fig


def knob(labels: Sequence[str], comm_s: Sequence[float], title: str) -> Any:
    """Each variant's all-reduce time per step, the default first."""
    fig, (ax,) = figure_grid(width=5.5, height=2.6)
    ys = range(len(labels))
    ax.barh(list(ys), [c * 1000 for c in comm_s], color=["tab:blue"] + ["tab:orange"] * (len(labels) - 1))
    ax.set_yticks(list(ys), list(labels))
    ax.invert_yaxis()
    ax.set_xlabel("all-reduce per step (ms, median)")
    ax.set_title(title, fontsize=10)
    for y, c in zip(ys, comm_s, strict=True):
        ax.annotate(f"{c * 1000:.0f} ms", (c * 1000, y), xytext=(3, 0), textcoords="offset points", va="center",
                    fontsize=8)
    return fig


def workers_per_epoch(epochs: Sequence[int], sizes: Sequence[int], title: str) -> Any:
    """How many workers finished each epoch of an elastic job (the order they ended in)."""
    fig, (ax,) = figure_grid(width=5.5, height=2.4)
    ax.step(range(len(sizes)), list(sizes), where="mid")
    ax.plot(range(len(sizes)), list(sizes), "o", markersize=4)
    ax.set_xticks(list(range(len(epochs))), [str(e) for e in epochs], fontsize=7)
    ax.set_yticks(sorted(set(sizes)))
    ax.set_xlabel("epoch (in the order they ended)")
    ax.set_ylabel("workers")
    ax.set_title(title, fontsize=10)
    return fig


def link_sweep(rates: Sequence[str], measured: Sequence[float | None], serial: Sequence[float | None],
               overlap: Sequence[float | None], title: str) -> Any:
    """A script's images/sec at each link rate, between the ring model's bounds (no overlap, full overlap)."""
    fig, (ax,) = figure_grid(width=5.5, height=3.2)
    xs = list(range(len(rates)))
    low = [s if s is not None else float("nan") for s in serial]
    high = [o if o is not None else float("nan") for o in overlap]
    ax.fill_between(xs, low, high, alpha=0.2, label="ring model: no overlap to full overlap")
    ax.plot(xs, [m if m is not None else float("nan") for m in measured], "o-", label="measured")
    ax.set_xticks(xs, list(rates))
    ax.set_xlabel("link rate")
    ax.set_ylabel("images/sec")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return fig


def accuracy_curves(curves: dict[str, Sequence[float | None]], title: str) -> Any:
    """Validation accuracy per epoch, one line per variant (e.g. float32 and float16 gradients)."""
    fig, (ax,) = figure_grid(width=5.5, height=3.0)
    for label, accs in curves.items():
        ax.plot(range(1, len(accs) + 1), [a if a is not None else float("nan") for a in accs], "o-", label=label)
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation accuracy")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return fig
