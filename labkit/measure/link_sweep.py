"""A training script's throughput as the link between its workers slows, against the ring-allreduce model.

    result = sweep("solutions/fashion_mnist_solution.py", rates=("unlimited", "1gbit", "100mbit"),
                   args=["--epochs", "2"])
    print(result)

First one worker alone on this machine (one thread) gives the step's compute time ``t1 = B / I1`` (its batch
``B`` over its images/sec ``I1``). Then, for each rate, ``np`` fresh virtual nodes of one slot each, linked at
that rate (:class:`labkit.nodes.virtual.VirtualNodes`, root), run the script with one worker per node. Each
step all-reduces the gradient (``G`` bytes, from the run's record) over the ring:
``c = 2 (N - 1) / N * G / rate`` seconds. A step that overlaps none of it takes ``t1 + c``; one that hides it
all behind backprop takes ``max(t1, c)``. The model's two throughputs, ``N B / (t1 + c)`` and
``N B / max(t1, c)``, bound what a run can reach on that link; the measured figure shows where the script
sits between them. There is no delay emulation on these links (no ``netem``): only their rate is limited.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from labkit.launching.jobspec import JobSpec
from labkit.measure import allreduce, bench
from labkit.nodes import net
from labkit.nodes import virtual as nodes

RATES = ("unlimited", "1gbit", "100mbit")
UNLIMITED = "unlimited"


JOB = JobSpec(timeout=1800, quiet=True)  # each run's default: its time limit, and no output of its own


def parse_rates(text: str) -> list[str]:
    """``"unlimited,1gbit,100mbit"`` to a list of rates, each checked (``tc`` units: kbit, mbit, gbit)."""
    out = [r.strip() for r in text.split(",") if r.strip()]
    if not out:
        raise ValueError(f"bad rates {text!r}: use e.g. unlimited,1gbit,100mbit")
    for r in out:
        if r != UNLIMITED:
            net.rate_bits(r)  # ValueError with the accepted forms
    return out


@dataclass
class LinkPoint:
    """One link rate: what the workers reached, and what the model allows."""

    rate: str
    images_per_sec: float | None
    allreduce_s: float | None = None  # the model's all-reduce time per step at this rate
    model_serial: float | None = None  # images/sec if no communication overlaps compute
    model_overlap: float | None = None  # images/sec if all of it overlaps compute
    run_id: str | None = None
    failure: str | None = None


@dataclass
class LinkSweep:
    """The result of :func:`sweep`."""

    script: str
    np: int
    alone_images_per_sec: float | None  # one worker alone, one thread
    batch_per_worker: int | None
    gradient_bytes: int | None
    points: list[LinkPoint] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def __str__(self) -> str:
        head = (f"{self.script} on {self.np} virtual nodes x 1 slot (1 thread each); one worker alone: "
                f"{_f(self.alone_images_per_sec)} images/sec at a batch of {self.batch_per_worker}; "
                f"gradient {allreduce.human_bytes(self.gradient_bytes or 0)} per step")
        rows = [f"{'link':>10}  {'images/sec':>10}  {'model: no overlap':>17}  {'full overlap':>12}  "
                f"{'all-reduce (model)':>18}"]
        for p in self.points:
            rows.append(f"{p.rate:>10}  {_f(p.images_per_sec):>10}  {_f(p.model_serial):>17}  "
                        f"{_f(p.model_overlap):>12}  {_f(p.allreduce_s and p.allreduce_s * 1000, 'ms'):>18}"
                        + (f"  failed: {p.failure}" if p.failure else ""))
        return "\n".join([head, *rows])


def _f(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.1f}" + (f" {unit}" if unit else "")


def model(rate: str, np: int, alone_images_per_sec: float, batch: int,
          gradient_bytes: int) -> tuple[float, float, float]:
    """The ring all-reduce's seconds per step at ``rate`` and the throughputs without and with full overlap."""
    compute = batch / alone_images_per_sec
    comm = 0.0 if rate == UNLIMITED else allreduce.ring_seconds(gradient_bytes, np, net.rate_bits(rate))
    return comm, np * batch / (compute + comm), np * batch / max(compute, comm)


def sweep(script: str | Path, rates: Sequence[str] = RATES, args: Sequence[str] = (), np: int = 2,
          launcher: str = "mpirun", runs_file: str | Path | None = None, say: Callable[[str], Any] = print,
          job: JobSpec = JOB) -> LinkSweep:
    """Run ``script ARGS`` alone, then on ``np`` nodes at each rate (fresh nodes each time); compare with the model.
    Every run gets ``job`` with one thread per worker."""
    rates = parse_rates(",".join(rates))
    plan = bench.SweepPlan([1], args=list(args), launcher=launcher, runs_file=runs_file, echo=False)
    job = job.but(threads=1)
    say(f"one worker alone on this machine: {script} {' '.join(args)}")
    alone = bench.bench(script, plan, job)
    record = alone.records[-1] if alone.records else None
    out = LinkSweep(str(script), np, alone.points[0].images_per_sec, record.batch_per_worker if record else None,
                    record.gradient_bytes if record else None)
    for rate in rates:
        say(f"{np} virtual nodes, link {rate}: {script} with {np} workers")
        with nodes.VirtualNodes(count=np, slots=1, rate=None if rate == UNLIMITED else rate) as cluster:
            run = bench.bench(script, dataclasses.replace(plan, nps=[np], hostfile=cluster.hostfile), job)
        point = run.points[0]
        p = LinkPoint(rate, point.images_per_sec, run_id=(point.run_ids or [None])[-1],
                      failure="; ".join(point.failures) or None)
        if out.alone_images_per_sec and out.batch_per_worker and out.gradient_bytes:
            p.allreduce_s, p.model_serial, p.model_overlap = model(rate, np, out.alone_images_per_sec,
                                                                   out.batch_per_worker, out.gradient_bytes)
        out.points.append(p)
        say(f"  {_f(p.images_per_sec)} images/sec (model: {_f(p.model_serial)} to {_f(p.model_overlap)})")
    return out
