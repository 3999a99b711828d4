"""The results of a scaling sweep: points per worker count, speedup and efficiency, the table.

:func:`labkit.measure.bench.bench` runs the sweep; :func:`points_from_records` rebuilds the points of any
run records (the plots and the dashboard use it), so a sweep can be read back from its records.
"""

from __future__ import annotations

import html
import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from labkit.records.runrecord import RunRecord


@dataclass
class Point:
    """One worker count of a sweep."""

    workers: int
    threads: int | None
    images_per_sec: float | None = None
    speedup: float | None = None
    efficiency: float | None = None
    time_to_target_s: float | None = None
    final_val_accuracy: float | None = None
    cpu_cores: float | None = None  # cores rank 0 actually got while training (CPU s / wall s)
    # The machine's ceiling for this many workers: as many independent single-worker copies
    # at once (same threads, no communication); None when not measured.
    ceiling_images_per_sec: float | None = None
    ceiling_efficiency: float | None = None  # images/sec / ceiling: what communication and sync cost
    ceiling_repeats: list[float | None] = field(default_factory=list)
    repeats: list[float | None] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.images_per_sec is not None


@dataclass
class Sweep:
    """The result of :func:`bench`: one :class:`Point` per worker count, plus conditions."""

    script: str
    points: list[Point]
    conditions: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    records: list[RunRecord] = field(default_factory=list)  # the runs' records (plots label by them)

    def to_dict(self) -> dict[str, Any]:
        return {"script": self.script, "conditions": self.conditions, "warnings": self.warnings,
                "points": [asdict(p) for p in self.points]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def table(self) -> str:
        return format_table(self.points)

    def __str__(self) -> str:
        lines = [self.table(), "", describe_conditions(self.conditions)]
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return "<pre>" + html.escape(str(self)) + "</pre>"


def _median(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def compute(points: list[Point]) -> list[Point]:
    """Fill speedup and efficiency from images/sec, against the 1-worker point.

    Without a 1-worker point the smallest worker count is the baseline and
    efficiency is speedup / (workers / baseline workers).
    """
    measured = [p for p in points if p.images_per_sec]
    if not measured:
        return points
    base = min(measured, key=lambda p: p.workers)
    for p in points:
        if p.images_per_sec:
            p.speedup = p.images_per_sec / base.images_per_sec
            p.efficiency = p.speedup / (p.workers / base.workers)
            if p.ceiling_images_per_sec:
                p.ceiling_efficiency = p.images_per_sec / p.ceiling_images_per_sec
    return points


def is_ceiling(record: RunRecord) -> bool:
    """A record of independent copies (``--ceiling``), not of a distributed job."""
    return record.launcher == "independent"


def finished(record: RunRecord) -> bool:
    """Whether the run ended well (a record that does not say how it ended counts as one that did)."""
    return record.status in ("ok", None)


def points_from_records(records: list[RunRecord], threads: int | None = None) -> list[Point]:
    """Group run records by worker count into points (median over repeats); speedup and ceiling filled in."""
    by_np: dict[int, list[RunRecord]] = {}
    ceilings: dict[int, list[float | None]] = {}
    for r in records:
        if is_ceiling(r):
            if r.workers:
                ceilings.setdefault(r.workers, []).append(r.images_per_sec if finished(r) else None)
        elif r.workers:
            by_np.setdefault(r.workers, []).append(r)
    points = []
    for np_, recs in sorted(by_np.items()):
        ok = [r for r in recs if finished(r)]
        p = Point(workers=np_, threads=threads if threads is not None else recs[0].threads_per_worker)
        p.repeats = [r.images_per_sec for r in ok]
        p.run_ids = [r.run_id for r in recs]
        p.failures = [f"{r.run_id}: {r.status} ({(r.error or '').splitlines()[-1:]})" for r in recs if not finished(r)]
        p.images_per_sec = _median(p.repeats)
        p.time_to_target_s = _median([r.time_to_target_s for r in ok])
        p.final_val_accuracy = _median([r.final_val_accuracy for r in ok])
        p.cpu_cores = _median([r.cpu_cores for r in ok])
        p.ceiling_repeats = ceilings.get(np_, [])
        p.ceiling_images_per_sec = _median(p.ceiling_repeats)
        points.append(p)
    return compute(points)


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


def format_table(points: list[Point]) -> str:
    """A plain-text table: workers, threads, images/sec, speedup, efficiency (against linear scaling and,
    when measured, against the machine's ceiling), time to the target accuracy."""
    ceiling = any(p.ceiling_images_per_sec for p in points)
    head = f"{'workers':>7}  {'threads':>7}  {'images/sec':>10}  {'speedup':>7}  {'efficiency':>10}  "
    if ceiling:
        head += f"{'ceiling':>8}  {'of ceiling':>10}  "
    head += f"{'time to acc.':>12}  {'val acc.':>8}  {'cores/worker':>12}"
    rows = [head, "-" * len(head)]
    for p in points:
        eff = None if p.efficiency is None else 100 * p.efficiency
        row = (f"{p.workers:>7}  {_fmt(p.threads, 'd') if p.threads else 'auto':>7}  "
               f"{_fmt(p.images_per_sec, '.1f'):>10}  {_fmt(p.speedup, '.2f', 'x'):>7}  {_fmt(eff, '.0f', '%'):>10}  ")
        if ceiling:
            ceff = None if p.ceiling_efficiency is None else 100 * p.ceiling_efficiency
            row += f"{_fmt(p.ceiling_images_per_sec, '.1f'):>8}  {_fmt(ceff, '.0f', '%'):>10}  "
        row += (f"{_fmt(p.time_to_target_s, '.1f', ' s'):>12}  {_fmt(p.final_val_accuracy, '.3f'):>8}  "
                f"{_fmt(p.cpu_cores, '.2f'):>12}")
        rows.append(row)
        for f in p.failures:
            rows.append(f"         failed: {f}")
    return "\n".join(rows)


def check_busy(points: list[Point], cores: int, gpus: int = 0) -> list[str]:
    """Warnings for points whose workers got much less CPU than they were given (a busy machine)."""
    out = []
    for p in points:
        given = p.threads or max(1, cores // p.workers)
        if not gpus and p.cpu_cores is not None and p.cpu_cores < 0.75 * given:
            out.append(f"at {p.workers} worker(s) rank 0 got {p.cpu_cores:.2f} cores of the {given} it was given: "
                       "other processes were using the CPU, so this point is slowed by them, not by scaling.")
    return out


def describe_conditions(c: dict[str, Any]) -> str:
    """Say what was compared and whether the comparison is fair."""
    cores, threads = c.get("cores"), c.get("threads")
    lines = [f"conditions: {c.get('launcher')} launcher, {c.get('device', 'cpu')}, {cores} cores, "
             f"repeat {c.get('repeat')}, script args: {' '.join(c.get('args') or []) or '(none)'}"]
    if threads:
        lines.append(
            f"fair comparison: equal cores per worker ({threads} thread(s) each), so N workers use N x {threads} "
            "cores; efficiency near 100% means adding workers adds throughput, as on a cluster where each worker "
            "brings its own hardware.")
    else:
        lines.append(
            f"comparison: every run uses all {cores} cores (threads per worker = cores // workers), i.e. one worker "
            "with all cores vs. several workers sharing them; this answers 'does distributing help on this "
            "machine?', not 'does it scale?' (use --threads 1 for that).")
    lines.append("images/sec: training steps only (validation excluded), first epoch (graph tracing) left out "
                 "when there are several, median over repeats (interleaved across worker counts).")
    if c.get("ceiling"):
        lines.append("ceiling: N independent single-worker copies of the script running at the same time with the "
                     "same threads each and no communication (their images/sec added up); 'of ceiling' is the "
                     "distributed run's images/sec over it, i.e. what communication and synchronisation cost here.")
    if c.get("target") is not None or c.get("ceiling") is not None:
        lines.append(f"time to acc.: wall time from the job's start (process start-up included) to the end of the "
                     f"first epoch whose validation accuracy reached {c.get('target') or 'the script target'}.")
    if c.get("env"):
        lines.append("worker environment: " + " ".join(f"{k}={v}" for k, v in sorted(c["env"].items())))
    if c.get("optimizer"):
        lines.append(f"Horovod optimizer knobs set from outside (the script is unchanged): {c['optimizer']}.")
    shrink = c.get("shrink")
    if shrink:
        lines.append(f"shrunk from outside (the script is unchanged): first {shrink[0]} training and {shrink[1]} test "
                     f"images of load_data(), Conv2D filters divided by {shrink[2]} (at least 16).")
    return "\n".join(lines)
