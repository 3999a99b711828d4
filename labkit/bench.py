"""Scaling benchmark: run a training script at 1..N workers and compare throughput.

From a shell::

    labkit bench solutions/fashion_mnist_solution.py --np 1,2 --threads 1 -- --epochs 3

From a cell: ``labkit.bench.bench("fashion_mnist.py", nps=[1, 2], args=["--epochs", "3"])``.

Every run goes through :func:`labkit.launch.run` (or :mod:`labkit.cluster`), which
observes the script from outside and writes its run record (:mod:`labkit.jobrecord`);
the benchmark finds each run's record by the run id it gave the job. Any Keras
script works, unchanged. ``--ceiling`` adds, per worker count N, N independent
copies at once: what this machine gives N workers without communication.
Throughput is the record's steady-state images/sec (training steps only, first
epoch left out when there are several); over repeats the median is kept.
Speedup is throughput over the 1-worker run's, efficiency is speedup / workers.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from labkit import contract, runs


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
        import html

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


def is_ceiling(record: dict[str, Any]) -> bool:
    """A record of independent copies (``--ceiling``), not of a distributed job."""
    return record.get("launcher") == "independent"


def points_from_records(records: list[dict[str, Any]], threads: int | None = None) -> list[Point]:
    """Group run records by worker count into points (median over repeats); speedup and ceiling filled in."""
    by_np: dict[int, list[dict[str, Any]]] = {}
    ceilings: dict[int, list[float | None]] = {}
    for r in records:
        if is_ceiling(r):
            if r.get("workers"):
                ceilings.setdefault(int(r["workers"]), []).append(
                    r.get("images_per_sec") if r.get("status", "ok") == "ok" else None)
        elif r.get("workers"):
            by_np.setdefault(int(r["workers"]), []).append(r)
    points = []
    for np_, recs in sorted(by_np.items()):
        ok = [r for r in recs if r.get("status", "ok") == "ok"]
        p = Point(workers=np_, threads=threads if threads is not None else recs[0].get("threads_per_worker"))
        p.repeats = [r.get("images_per_sec") for r in ok]
        p.run_ids = [r.get("run_id") for r in recs]
        p.failures = [f"{r.get('run_id')}: {r.get('status')} ({(r.get('error') or '').splitlines()[-1:]})"
                      for r in recs if r not in ok]
        p.images_per_sec = _median(p.repeats)
        p.time_to_target_s = _median([r.get("time_to_target_s") for r in ok])
        p.final_val_accuracy = _median([r.get("final_val_accuracy") for r in ok])
        p.cpu_cores = _median([r.get("cpu_cores") for r in ok])
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


def check_resources(nps: Sequence[int], threads: int | None, cores: int, gpus: int = 0) -> list[str]:
    """Warnings for sweeps that ask for more cores or GPUs than the machine has."""
    out = []
    for np_ in nps:
        if gpus:
            if np_ > gpus:
                out.append(f"{np_} workers but {gpus} GPU(s): workers share GPUs, so this point understates scaling.")
            continue
        used = np_ * (threads or max(1, cores // np_))
        if np_ > cores:
            out.append(f"{np_} workers on {cores} cores: workers take turns on the cores (oversubscribed), "
                       "so this point measures contention, not scaling.")
        elif used > cores:
            out.append(f"{np_} workers x {threads} threads = {used} threads on {cores} cores: oversubscribed, "
                       "so this point understates scaling; use --threads {t}.".format(t=max(1, cores // np_)))
    return out


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
    shrink = c.get("shrink")
    if shrink:
        lines.append(f"shrunk from outside (the script is unchanged): first {shrink[0]} training and {shrink[1]} test "
                     f"images of load_data(), Conv2D filters divided by {shrink[2]} (at least 16).")
    return "\n".join(lines)


def bench(
    script: str | Path,
    nps: Sequence[int] = (1, 2),
    repeat: int = 1,
    args: Sequence[str] = (),
    launcher: str = "mpirun",
    threads: int | None = None,
    timeout: float | None = None,
    quiet: bool = True,
    runs_file: str | Path | None = None,
    cwd: str | Path | None = None,
    python: str | None = None,
    echo: bool = True,
    env: dict[str, str] | None = None,
    ceiling: bool = False,
    shrink: Sequence[int] | None = None,
    target: float | None = None,
) -> Sweep:
    """Run ``script ARGS`` at each worker count in ``nps``, ``repeat`` times, and compare.

    Any training script works: the runs are observed from outside (:mod:`labkit.observe`).
    ``threads`` is threads per worker (None: cores // workers, the launcher's
    default). ``launcher="cluster"`` runs a tf.distribute script on a local
    cluster (:mod:`labkit.cluster`) instead of under MPI. ``ceiling`` also runs, for
    each worker count N > 1, N independent copies at once (same threads, no
    communication): the throughput this machine gives N workers at best.
    ``shrink=(TRAIN, TEST, DIVISOR)`` trains on the first TRAIN/TEST images with
    Conv2D filters divided by DIVISOR, without touching the script. ``target`` is the
    validation accuracy the time to accuracy is measured for (default: the script's
    ``--target-accuracy``). ``env`` adds variables for every worker (e.g.
    ``{"HOROVOD_CYCLE_TIME": "5"}`` to try a Horovod setting). Records go to
    ``runs_file`` (default: ``$LABKIT_RUNS_FILE`` or ``runs/runs.jsonl``).
    """
    from labkit import launch, observe

    nps = sorted({int(n) for n in nps})
    if not nps or nps[0] < 1:
        raise ValueError(f"worker counts must be >= 1, got {nps}")
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    if shrink is not None and (len(shrink) != 3 or min(shrink) < 0 or shrink[2] < 1):
        raise ValueError(f"shrink is TRAIN,TEST,DIVISOR with DIVISOR >= 1, got {shrink}")
    script = str(script)
    base = Path(cwd or ".")
    records_path = Path(runs_file) if runs_file else runs.runs_file()
    if not records_path.is_absolute():
        records_path = (base / records_path).resolve()
    cores = launch.cpu_count()
    gpus = _gpu_count()
    warn = check_resources(nps, threads, cores, gpus)
    for w in warn if echo else []:
        _say(f"warning: {w}")
    sweep_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]
    # Absolute: independent copies run in folders of their own.
    command = [python or sys.executable, str((base / script).resolve()), *args]
    extra = dict(env or {})
    if shrink is not None:
        extra[observe.SHRINK_VAR] = ",".join(str(int(v)) for v in shrink)
    plan = [(i, np_, False) for i in range(repeat) for np_ in nps]
    if ceiling:  # each repeat: the distributed runs, then the copies, so load changes hit both alike
        plan = [(i, np_, c) for i in range(repeat) for c in (False, True) for np_ in nps if not c or np_ > 1]
    records: list[dict[str, Any]] = []
    for k, (i, np_, copies) in enumerate(plan, 1):
        run_id = f"bench-{sweep_id}-np{np_}-r{i + 1}" + ("-ceiling" if copies else "")
        if echo:
            what = f"{np_} independent copies" if copies else f"{np_} worker(s)"
            _say(f"run {k}/{len(plan)}: {what} x {threads or launch.default_threads(np_, cores)} thread(s), "
                 f"repeat {i + 1}/{repeat} ...")
        job_env = {**extra, runs.RUN_ID_VAR: run_id, runs.FILE_VAR: str(records_path), contract.BENCH: sweep_id}
        if copies or launcher == "cluster":
            duration = _cluster_run(command, np_, timeout, threads, job_env, quiet, cwd, target, copies)
        else:
            duration = launch.run(command, np=np_, launcher=launcher, timeout=timeout, threads=threads,
                                  env=job_env, quiet=quiet, cwd=cwd, target=target).duration
        found = runs.select(runs.read(records_path, warn=False), run_id=run_id)
        rec = found[-1] if found else {"run_id": run_id, "workers": np_, "status": "no record",
                                       "error": "the job left no run record"}
        records.append({**rec, "workers": np_ if copies else rec.get("workers") or np_})
        if echo:
            ips = rec.get("images_per_sec")
            _say(f"  {rec.get('status')}, {'-' if ips is None else f'{ips:.1f}'} images/sec ({duration:.0f} s)")
    points = points_from_records(records, threads)
    for p in points:
        if p.threads is None:
            p.threads = threads or launch.default_threads(p.workers, cores)
    busy = check_busy(points, cores, gpus)
    for w in busy if echo else []:
        _say(f"warning: {w}")
    warn += busy
    conditions = {
        "sweep_id": sweep_id, "launcher": launcher, "threads": threads, "cores": cores,
        "device": f"{gpus} GPU(s)" if gpus else "cpu", "repeat": repeat, "args": list(args),
        "nps": nps, "runs_file": str(records_path), "host": _host(), "env": dict(env or {}),
        "cpu": runs.device_info().get("cpu"), "load_avg": _loadavg(), "ceiling": ceiling,
        "shrink": list(shrink) if shrink is not None else None, "target": target,
    }
    return Sweep(script, points, conditions, warn)


def _say(text: str) -> None:
    """Progress of a sweep: stderr in a terminal (stdout may be --json), stdout in a notebook
    (which shows stderr as an error)."""
    from labkit.output import in_notebook

    print(f"labkit bench: {text}", file=sys.stdout if in_notebook() else sys.stderr, flush=True)


def _cluster_run(command: list[str], workers: int, timeout: float | None, threads: int | None,
                 env: dict[str, str], quiet: bool, cwd: str | Path | None, target: float | None,
                 independent: bool) -> float:
    """Run a tf.distribute cluster of ``workers`` workers (or that many independent copies); its duration."""
    from labkit import cluster

    r = cluster.run(command, workers=workers, timeout=timeout, threads=threads, env=env, quiet=quiet, cwd=cwd,
                    target=target, independent=independent)
    return r.duration


def _gpu_count() -> int:
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return 0
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def _host() -> str:
    import socket

    return socket.gethostname()


def _loadavg() -> list[float] | None:
    import os

    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
