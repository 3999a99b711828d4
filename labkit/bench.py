"""Scaling benchmark: run a training script at 1..N workers and compare throughput.

From a shell::

    labkit bench solutions/fashion_mnist_solution.py --np 1,2 --threads 1 -- --epochs 3

From a cell: ``labkit.bench.bench("fashion_mnist.py", nps=[1, 2], args=["--epochs", "3"])``.

Every run goes through :func:`labkit.launch.run` and writes its run record
(:mod:`labkit.runs`); the benchmark finds each run's record by the run id it gave
the job. Throughput is the record's steady-state images/sec (training steps only,
first epoch left out when there are several); over repeats the median is kept.
Speedup is throughput over the 1-worker run's, efficiency is speedup / workers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from labkit import runs


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
    return points


def points_from_records(records: list[dict[str, Any]], threads: int | None = None) -> list[Point]:
    """Group run records by worker count into points (median over repeats); speedup filled in."""
    by_np: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        if r.get("workers"):
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
        points.append(p)
    return compute(points)


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


def format_table(points: list[Point]) -> str:
    """A plain-text table: workers, threads, images/sec, speedup, efficiency, time to accuracy."""
    head = f"{'workers':>7}  {'threads':>7}  {'images/sec':>10}  {'speedup':>7}  {'efficiency':>10}  " \
           f"{'time to acc.':>12}  {'val acc.':>8}  {'cores/worker':>12}"
    rows = [head, "-" * len(head)]
    for p in points:
        eff = None if p.efficiency is None else 100 * p.efficiency
        rows.append(
            f"{p.workers:>7}  {_fmt(p.threads, 'd') if p.threads else 'auto':>7}  {_fmt(p.images_per_sec, '.1f'):>10}  "
            f"{_fmt(p.speedup, '.2f', 'x'):>7}  {_fmt(eff, '.0f', '%'):>10}  "
            f"{_fmt(p.time_to_target_s, '.1f', ' s'):>12}  {_fmt(p.final_val_accuracy, '.3f'):>8}  "
            f"{_fmt(p.cpu_cores, '.2f'):>12}"
        )
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
) -> Sweep:
    """Run ``script ARGS`` at each worker count in ``nps``, ``repeat`` times, and compare.

    ``threads`` is threads per worker (None: cores // workers, the launcher's
    default). ``launcher="cluster"`` runs a tf.distribute script on a local
    cluster (:mod:`labkit.cluster`) instead of under MPI. ``env`` adds variables for
    every worker (e.g. ``{"HOROVOD_CYCLE_TIME": "5"}`` to try a Horovod setting).
    Records go to ``runs_file`` (default: ``$LABKIT_RUNS_FILE`` or ``runs/runs.jsonl``).
    """
    from labkit import launch

    nps = sorted({int(n) for n in nps})
    if not nps or nps[0] < 1:
        raise ValueError(f"worker counts must be >= 1, got {nps}")
    if repeat < 1:
        raise ValueError(f"repeat must be >= 1, got {repeat}")
    script = str(script)
    base = Path(cwd or ".")
    records_path = Path(runs_file) if runs_file else runs.runs_file()
    if not records_path.is_absolute():
        records_path = (base / records_path).resolve()
    cores = launch.cpu_count()
    gpus = _gpu_count()
    warn = check_resources(nps, threads, cores, gpus)
    for w in warn if echo else []:
        print(f"labkit bench: warning: {w}", file=sys.stderr, flush=True)
    sweep_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:4]
    command = [python or sys.executable, script, *args]
    records: list[dict[str, Any]] = []
    # Repeats are interleaved (1, 2, 1, 2, ...) so that a change in the machine's load
    # during the sweep affects every worker count alike.
    for i in range(repeat):
        for np_ in nps:
            run_id = f"bench-{sweep_id}-np{np_}-r{i + 1}"
            if echo:
                print(f"labkit bench: {np_} worker(s) x {threads or launch.default_threads(np_, cores)} thread(s), "
                      f"run {i + 1}/{repeat} ...", file=sys.stderr, flush=True)
            job_env = {**(env or {}), runs.RUN_ID_VAR: run_id, runs.FILE_VAR: str(records_path),
                       "LABKIT_BENCH": sweep_id}
            if launcher == "cluster":  # tf.distribute: one task per worker with its own TF_CONFIG
                result = _cluster_run(command, np_, timeout, threads, job_env, quiet, cwd)
            else:
                result = launch.run(command, np=np_, launcher=launcher, timeout=timeout, threads=threads,
                                    env=job_env, quiet=quiet, cwd=cwd)
            found = runs.select(runs.read(records_path, warn=False), run_id=run_id)
            if not found:  # nothing recorded, e.g. a script without the Recorder
                found = [runs.record_failed_job(result, run_id, command, records_path) or {
                    "run_id": run_id, "workers": np_, "status": "no record",
                    "error": "the job wrote no run record: does the script append labkit.runs.Recorder?"}]
            rec = found[-1]
            records.append({**rec, "workers": rec.get("workers") or np_})
            if echo:
                ips = rec.get("images_per_sec")
                print(f"labkit bench:   {rec.get('status')}, "
                      f"{'-' if ips is None else f'{ips:.1f}'} images/sec ({result.duration:.0f} s)",
                      file=sys.stderr, flush=True)
    points = points_from_records(records, threads)
    for p in points:
        if p.threads is None:
            p.threads = threads or launch.default_threads(p.workers, cores)
    busy = check_busy(points, cores, gpus)
    for w in busy if echo else []:
        print(f"labkit bench: warning: {w}", file=sys.stderr, flush=True)
    warn += busy
    conditions = {
        "sweep_id": sweep_id, "launcher": launcher, "threads": threads, "cores": cores,
        "device": f"{gpus} GPU(s)" if gpus else "cpu", "repeat": repeat, "args": list(args),
        "nps": nps, "runs_file": str(records_path), "host": _host(), "env": dict(env or {}),
        "cpu": runs.device_info().get("cpu"), "load_avg": _loadavg(),
    }
    return Sweep(script, points, conditions, warn)


def _cluster_run(command: list[str], workers: int, timeout: float | None, threads: int | None,
                 env: dict[str, str], quiet: bool, cwd: str | Path | None) -> Any:
    """Run a tf.distribute script on a local cluster of ``workers`` workers; a JobResult-like answer."""
    from types import SimpleNamespace

    from labkit import cluster

    env = {**env, runs.LAUNCHER_VAR: "cluster"}
    r = cluster.run(command, workers=workers, timeout=timeout, threads=threads, env=env, quiet=quiet, cwd=cwd)
    code = 0 if r.ok else next((c for c in r.returncodes.values() if c), 1)
    return SimpleNamespace(ok=r.ok, returncode=code, np=workers, duration=r.duration, timed_out=r.timed_out,
                           interrupted=r.interrupted, rank_errors=dict(r.errors), log_dir=r.log_dir)


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


def parse_nps(text: str) -> list[int]:
    """``"1,2,4"`` or ``"1-4"`` to a list of worker counts."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            lo, hi = part.split("-", 1)
            out += list(range(int(lo), int(hi) + 1))
        elif part:
            out.append(int(part))
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"bad worker counts {text!r}: use e.g. 1,2,4")
    return out


def _options(p: argparse.ArgumentParser, defaults: bool = True) -> None:
    from labkit.launch import LAUNCHERS

    d = (lambda v: v) if defaults else (lambda v: argparse.SUPPRESS)
    p.add_argument("--np", type=parse_nps, default=d([1, 2]), help="worker counts, e.g. 1,2,4 (default: 1,2)")
    p.add_argument("--repeat", type=int, default=d(1), help="runs per worker count; the median is kept (default: 1)")
    p.add_argument("--threads", type=int, default=d(None),
                   help="threads per worker (default: cores // workers); 1 gives equal cores per worker")
    p.add_argument("--launcher", choices=(*LAUNCHERS, "cluster"), default=d("mpirun"),
                   help="mpirun/horovodrun/gloo for Horovod scripts, cluster for tf.distribute ones (TF_CONFIG); "
                        "default: mpirun")
    p.add_argument("--timeout", type=float, default=d(None), help="seconds per run before it is killed")
    p.add_argument("--runs-file", default=d(None), help="records file (default: $LABKIT_RUNS_FILE or runs/runs.jsonl)")
    p.add_argument("--json", action="store_true", default=d(False), help="print one JSON object instead of the table")
    p.add_argument("--plot", default=d(None), metavar="OUT.png", help="also save throughput/speedup plots here")
    p.add_argument("--verbose", action="store_true", default=d(False), help="stream rank 0's output")


def add_cli(sub) -> None:  # noqa: ANN001
    """Register ``labkit bench SCRIPT [options] -- ARGS``."""
    p = sub.add_parser(
        "bench", help="measure throughput, speedup and efficiency at several worker counts",
        description="Run SCRIPT at each worker count, record every run, print speedup and efficiency. "
                    "Example: labkit bench solutions/fashion_mnist_solution.py --np 1,2 --threads 1 -- --epochs 3",
    )
    _options(p)
    # One REMAINDER positional keeps a lone "--" (argparse drops it when it starts a remainder).
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="SCRIPT [options] -- ARGS",
                   help="training script (it must append labkit.runs.Recorder), then its ARGS after --")
    p.set_defaults(func=_cli)


def split_rest(a: argparse.Namespace) -> argparse.Namespace:
    """The script, options given after it, and the script's ARGS after ``--``."""
    if not a.command:
        raise SystemExit("labkit bench: give a training script, e.g. labkit bench train.py --np 1,2 -- --epochs 3")
    a.script, rest = a.command[0], list(a.command[1:])
    cut = rest.index("--") if "--" in rest else len(rest)
    late = argparse.ArgumentParser(prog="labkit bench", add_help=False)
    _options(late, defaults=False)
    late.parse_args(rest[:cut], namespace=a)
    a.args = rest[cut + 1 :]
    return a


def _cli(a) -> int:  # noqa: ANN001
    from labkit.launch import LaunchError

    split_rest(a)
    args = a.args
    if not Path(a.script).exists():
        print(f"labkit bench: {a.script} not found", file=sys.stderr)
        return 2
    try:
        sweep = bench(a.script, a.np, a.repeat, args, a.launcher, a.threads, a.timeout, quiet=not a.verbose,
                      runs_file=a.runs_file)
    except (LaunchError, ValueError) as e:
        print(f"labkit bench: {e}", file=sys.stderr)
        return 2
    if a.plot:
        from labkit import plot

        out = plot.save(plot.scaling(sweep), a.plot)
        print(f"labkit bench: plot saved to {out}", file=sys.stderr)
    print(sweep.to_json() if a.json else str(sweep))
    return 0 if all(p.ok for p in sweep.points) else 1
