"""The large-batch experiment's results (lab 9) as typed records, a table and a picture.

One :class:`Point` is one training run: a global batch, the rule that set its learning rate, the validation
accuracy after each epoch. :mod:`labkit.measure.large_batch` makes them; the notebook and the instructor guide read
them from ``labs/reference/large_batch.json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from labkit.figures import plot

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")


@dataclass(frozen=True)
class Point:
    """One run of the experiment."""

    rule: str  # how the learning rate was set, e.g. "linear rule, warm-up"
    batch_per_worker: int
    global_batch: int
    lr: float  # the rate trained with after the warm-up
    warmup_epochs: int
    updates_per_epoch: int
    val_accuracy: list[float | None] = field(default_factory=list)  # after each epoch
    seconds: float | None = None
    status: str = "ok"

    @property
    def final(self) -> float | None:
        """The validation accuracy after the last epoch (``None`` for a run that ended without one)."""
        return self.val_accuracy[-1] if self.val_accuracy else None


def rules(points: Sequence[Point]) -> list[str]:
    """The rules, in the order they first appear."""
    return list(dict.fromkeys(p.rule for p in points))


def batches(points: Sequence[Point]) -> list[int]:
    """The global batches, smallest first."""
    return sorted({p.global_batch for p in points})


def at(points: Sequence[Point], rule: str, global_batch: int) -> Point | None:
    """The run of ``rule`` at ``global_batch``, if there is one."""
    return next((p for p in points if p.rule == rule and p.global_batch == global_batch), None)


def breaks(points: Sequence[Point], rule: str, drop: float = 0.05) -> int | None:
    """The smallest global batch at which ``rule`` ends more than ``drop`` below its best final accuracy
    (``None``: it never falls that far)."""
    mine = sorted((p for p in points if p.rule == rule), key=lambda p: p.global_batch)
    finals = [p.final for p in mine if p.final is not None]
    if not finals:
        return None
    best = max(finals)
    return next((p.global_batch for p in mine if p.final is None or p.final < best - drop), None)


def _percent(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def table(points: Sequence[Point]) -> str:
    """Final validation accuracy (%) per global batch (rows) and rule (columns), with each rule's rate."""
    names = rules(points)
    width = max(12, *(len(n) + 2 for n in names))
    head = f"  {'global batch':>12}{'updates':>9}" + "".join(f"{n:>{width}}" for n in names)
    rows = [head]
    for g in batches(points):
        cells = []
        updates = next((p.updates_per_epoch for p in points if p.global_batch == g), 0)
        for n in names:
            p = at(points, n, g)
            cells.append("-" if p is None else f"{_percent(p.final)} (lr {p.lr:g})")
        rows.append(f"  {g:>12}{updates:>9}" + "".join(f"{c:>{width}}" for c in cells))
    return "\n".join(rows)


def figure(points: Sequence[Point], curves_at: int | None = None) -> Any:
    """Left: the final validation accuracy against the global batch, one line per rule; right: the accuracy
    after each epoch of every rule at ``curves_at`` (default: the second largest global batch)."""
    fig, (left, right) = plot.figure_grid(2, width=5.5, height=3.6)
    sizes = batches(points)
    for colour, name in zip(COLOURS, rules(points), strict=False):
        mine = [p for p in sorted(points, key=lambda p: p.global_batch) if p.rule == name and p.final is not None]
        left.plot([p.global_batch for p in mine], [100 * (p.final or 0) for p in mine], "o-", color=colour,
                  label=name)
    left.set_xscale("log", base=2)
    left.set_xticks(sizes, [str(g) for g in sizes])
    left.set_xlabel("global batch (images per update)")
    left.set_ylabel("validation accuracy at the end (%)")
    left.legend(fontsize=8)
    left.set_title("the same epochs, ever larger batches", fontsize=10)
    g = curves_at if curves_at is not None else (sizes[-2] if len(sizes) > 1 else sizes[0] if sizes else 0)
    for colour, name in zip(COLOURS, rules(points), strict=False):
        p = at(points, name, g)
        if p is None:
            continue
        epochs = range(1, len(p.val_accuracy) + 1)
        right.plot(list(epochs), [None if a is None else 100 * a for a in p.val_accuracy], "o-", color=colour,
                   label=f"{name} (lr {p.lr:g})")
    right.set_xlabel("epoch")
    right.set_ylabel("validation accuracy (%)")
    right.legend(fontsize=8)
    right.set_title(f"epoch by epoch at a global batch of {g}", fontsize=10)
    return fig
