"""Draw the course's diagrams into labs/figures/ (SVG): ``python scripts/draw_figures.py [--check] [OUT]``.

The notebooks show these files; ``--check`` fails when a committed figure differs from
what this script draws (the test suite runs it).
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("svg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

OUT = Path(__file__).resolve().parent.parent / "labs" / "figures"
BLUE, ORANGE, GREEN, GREY, RED = "#4C72B0", "#DD8452", "#55A868", "#8C8C8C", "#C44E52"
plt.rcParams.update({"svg.hashsalt": "labkit", "svg.fonttype": "none", "font.size": 10,
                     "font.family": "DejaVu Sans"})


def _canvas(w: float, h: float, title: str) -> tuple[plt.Figure, plt.Axes]:
    fig, ax = plt.subplots(figsize=(w, h))
    ax.set_xlim(0, w * 10)
    ax.set_ylim(0, h * 10)
    ax.axis("off")
    ax.set_title(title, fontsize=12, fontweight="bold")
    return fig, ax


def _box(ax: plt.Axes, x: float, y: float, w: float, h: float, text: str, color: str = BLUE,
         fill: float = 0.15, size: float = 9) -> None:
    ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.3,rounding_size=1", fc=color, alpha=fill,
                                ec=color, lw=1.5))
    ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)


def _arrow(ax: plt.Axes, a: tuple[float, float], b: tuple[float, float], color: str = GREY, text: str = "",
           bend: float = 0.0, style: str = "-|>", size: float = 8) -> None:
    ax.add_patch(FancyArrowPatch(a, b, arrowstyle=style, mutation_scale=12, color=color, lw=1.4,
                                 connectionstyle=f"arc3,rad={bend}"))
    if text:
        ax.text((a[0] + b[0]) / 2, (a[1] + b[1]) / 2 + 1.5, text, ha="center", fontsize=size, color=color)


def ranks() -> plt.Figure:
    """2 nodes x 2 GPUs: the global rank, and the local rank that picks the GPU."""
    fig, ax = _canvas(8, 3.6, "Ranks and local ranks: 2 nodes x 2 GPUs (mpirun -np 4 -H node1:2,node2:2)")
    for n in range(2):
        x0 = 3 + n * 40
        _box(ax, x0, 4, 34, 26, "", GREY, 0.06)
        ax.text(x0 + 17, 27.5, f"node{n + 1}", ha="center", fontweight="bold")
        for g in range(2):
            rank = 2 * n + g
            _box(ax, x0 + 2 + g * 16, 7, 14, 15,
                 f"process\nrank {rank}\nlocal rank {g}\n\nGPU {g}", [BLUE, ORANGE][g], 0.18)
    ax.text(40, 1, "hvd.rank(): 0..size-1 over all nodes (rank 0 prints and saves).  "
            "hvd.local_rank(): 0..GPUs-1 within a node (it picks the GPU).", ha="center", fontsize=8.5)
    return fig


def ring() -> plt.Figure:
    """Ring all-reduce of 4 workers: reduce-scatter, then all-gather; 2(N-1)/N of the gradients sent each."""
    n = 4
    fig, ax = _canvas(9, 4.2, "Ring all-reduce, N = 4: reduce-scatter (N-1 steps), then all-gather (N-1 steps)")
    colors = [BLUE, ORANGE, GREEN, RED]
    for phase, (x0, title) in enumerate([(2, "before: each worker has its own\ngradient, cut into N chunks"),
                                         (32, "after reduce-scatter: worker i holds\nthe sum of chunk i+1"),
                                         (62, "after all-gather: every worker\nholds every summed chunk")]):
        ax.text(x0 + 12, 36, title, ha="center", fontsize=8.5)
        for w in range(n):
            y = 26 - w * 7
            ax.text(x0 - 1, y + 2, f"w{w}", ha="right", va="center", fontsize=8)
            for c in range(n):
                full = phase == 2 or (phase == 1 and c == (w + 1) % n)
                label = "Σ" if full else ("" if phase else f"g{w}")
                _box(ax, x0 + c * 6.2, y, 5, 4, label, colors[c], 0.55 if full else 0.12, 7)
        if phase < 2:
            _arrow(ax, (x0 + 26, 17), (x0 + 29, 17), GREY)
    ax.text(45, 1.5, "Each step every worker sends one chunk (1/N of the gradients) to its neighbour: "
            "2(N-1) steps send 2(N-1)/N of the gradients per worker, whatever N.", ha="center", fontsize=8.5)
    return fig


def broadcast() -> plt.Figure:
    """Rank 0's initial weights copied to every rank before training."""
    fig, ax = _canvas(7, 3.2, "Broadcast from rank 0 (BroadcastGlobalVariablesCallback(0))")
    _box(ax, 4, 12, 16, 9, "rank 0\nweights W₀", BLUE, 0.3)
    for r in range(1, 4):
        y = 24 - (r - 1) * 10
        _box(ax, 48, y, 16, 6, f"rank {r}: W{'₁₂₃'[r - 1]} → W₀", GREY, 0.12)
        _arrow(ax, (21, 16.5), (47, y + 3), BLUE)
    ax.text(35, 1, "Random initial weights differ per rank; after the broadcast all ranks start from W₀\n"
            "and the averaged updates keep them identical.", ha="center", fontsize=8.5)
    return fig


def ps_vs_allreduce() -> plt.Figure:
    """A central parameter server (asynchronous) against all-reduce among peers (synchronous)."""
    fig, ax = _canvas(9, 3.8, "Parameter server (centralised) vs all-reduce (decentralised)")
    _box(ax, 14, 25, 16, 7, "parameter server\nholds the variables", ORANGE, 0.3)
    for i in range(3):
        x = 2 + i * 14
        _box(ax, x, 5, 11, 6, f"worker {i}", BLUE, 0.15)
        _arrow(ax, (x + 4, 11.5), (19 + i * 3, 24.5), BLUE, bend=0.15)
        _arrow(ax, (21 + i * 3, 24.5), (x + 7, 11.5), ORANGE, bend=0.15)
    ax.text(22, 0, "each worker pushes gradients and pulls\nvariables when it is ready: asynchronous,\n"
            "a slow worker does not stop the others", ha="center", fontsize=8)
    cx, cy, r = 70, 19, 9
    import math

    pts = [(cx + r * math.cos(a), cy + r * math.sin(a)) for a in (math.pi / 2, 0, -math.pi / 2, math.pi)]
    for i, (x, y) in enumerate(pts):
        _box(ax, x - 5, y - 2.5, 10, 5, f"worker {i}", BLUE, 0.15)
    for i in range(4):
        (x1, y1), (x2, y2) = pts[i], pts[(i + 1) % 4]
        _arrow(ax, (x1 + (x2 - x1) * 0.35, y1 + (y2 - y1) * 0.35), (x1 + (x2 - x1) * 0.65, y1 + (y2 - y1) * 0.65),
               GREEN)
    ax.text(70, 0, "every worker holds a copy; each step all\naverage their gradients together: synchronous,\n"
            "the step waits for the slowest", ha="center", fontsize=8)
    return fig


def tf_config() -> plt.Figure:
    """Lab 4's TF_CONFIG cluster: two workers, no chief task and no ps; worker 0 acts as the chief."""
    fig, ax = _canvas(9, 3.8, "TF_CONFIG in lab 4: two workers, worker 0 acts as the chief")
    tasks = [(0, "node1:2222", GREEN, "also the chief: prints, writes\nthe logs and the final model"),
             (1, "node2:2222", BLUE, "trains; saves to a temporary\nfolder it deletes")]
    for i, (idx, addr, color, role) in enumerate(tasks):
        x = 2 + i * 52
        _box(ax, x, 17, 34, 14, f"worker {idx}  ({addr})\nTF_CONFIG task: {{type: worker, index: {idx}}}\n\n{role}",
             color, 0.18, 8)
    _arrow(ax, (37.5, 24), (52.5, 24), GREY, style="<|-|>")
    ax.text(45, 26, "all-reduce of the\ngradients, every step", ha="center", fontsize=8, color=GREY)
    ax.text(45, 10, 'TF_CONFIG = {"cluster": {"worker": ["node1:2222", "node2:2222"]},\n'
            '             "task": {"type": "worker", "index": 1}}     <- what worker 1 is given',
            ha="center", fontsize=8, family="DejaVu Sans Mono")
    ax.text(45, 1.5, "The cluster part is identical on every worker; the task part says which entry this process is.\n"
            "No \"chief\" and no \"ps\" entries: lab 5's parameter-server cluster adds them.",
            ha="center", fontsize=8.5)
    return fig


def coordinator() -> plt.Figure:
    """ParameterServerStrategy: the chief's ClusterCoordinator queues steps; idle workers take them."""
    fig, ax = _canvas(9, 4.0, "ClusterCoordinator: the chief schedules steps, workers run them")
    _box(ax, 2, 14, 22, 14, "chief\nClusterCoordinator\n\nschedule(step) x N\njoin()", GREEN, 0.18)
    for k in range(4):
        _box(ax, 27 + k * 5, 19, 4, 4, f"s{k + 1}", GREY, 0.2, 7)
    ax.text(37, 25, "queue of steps", ha="center", fontsize=8)
    for i in range(2):
        y = 26 - i * 12
        _box(ax, 52, y - 3, 14, 8, f"worker {i}\nruns a step on\nits own data", BLUE, 0.15, 8)
        _arrow(ax, (47.5, 21), (51.5, y + 1), GREY)
        _arrow(ax, (66.5, y + 1), (73.5, 17), ORANGE, bend=-0.1)
    _box(ax, 74, 12, 14, 10, "ps 0\nvariables", ORANGE, 0.25)
    ax.text(45, 2, "Steps go to whichever worker is free; each reads and updates the variables on the parameter\n"
            "server. fit(..., steps_per_epoch=K) schedules K steps per epoch this way.", ha="center", fontsize=8.5)
    return fig


FIGURES: dict[str, Callable[[], plt.Figure]] = {
    "ranks.svg": ranks, "ring_allreduce.svg": ring, "broadcast.svg": broadcast,
    "ps_vs_allreduce.svg": ps_vs_allreduce, "tf_config.svg": tf_config, "coordinator.svg": coordinator,
}


def render(make: Callable[[], plt.Figure]) -> bytes:
    fig = make()
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    plt.close(fig)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", type=Path, default=OUT, help=f"folder (default: {OUT})")
    p.add_argument("--check", action="store_true", help="fail when a figure differs from the committed one")
    a = p.parse_args(argv)
    stale = []
    for name, make in FIGURES.items():
        data, path = render(make), a.out / name
        if a.check:
            if not path.exists() or path.read_bytes() != data:
                stale.append(name)
        else:
            a.out.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    if stale:
        print(f"out of date (run `python scripts/draw_figures.py`): {', '.join(stale)}", file=sys.stderr)
        return 1
    print("figures are up to date" if a.check else f"wrote {len(FIGURES)} figures to {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
