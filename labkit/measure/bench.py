"""Scaling benchmark: run a training script at 1..N workers and compare throughput.

From a shell::

    labkit bench solutions/fashion_mnist_solution.py --np 1,2 --threads 1 -- --epochs 3

From a cell: ``bench.bench("fashion_mnist.py", bench.SweepPlan(nps=[1, 2], args=["--epochs", "3"]))``.

Every run goes through :func:`labkit.launching.launch.run` (or :mod:`labkit.tfdist.cluster`), which
observes the script from outside and writes its run record (:mod:`labkit.records.jobrecord`);
the benchmark finds each run's record by the run id it gave the job. Any Keras
script works, unchanged. ``--ceiling`` adds, per worker count N, N independent
copies at once: what this machine gives N workers without communication.
Throughput is the record's steady-state images/sec (training steps only, first
epoch left out when there are several); over repeats the median is kept.
Speedup is throughput over the 1-worker run's, efficiency is speedup / workers.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from labkit.core import contract, identity, output
from labkit.instrument import observe, optimizer_knobs
from labkit.launching import launch
from labkit.launching.jobspec import JobSpec
from labkit.records import runs
from labkit.records.runrecord import RunRecord
from labkit.records.sweep import (  # noqa: F401 - the results' names, also reached as labkit.measure.bench.NAME
    Point,
    Sweep,
    check_busy,
    compute,
    describe_conditions,
    format_table,
    is_ceiling,
    points_from_records,
)
from labkit.tfdist import cluster
from labkit.tfdist.cluster import Tasks


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


@dataclass(frozen=True)
class SweepPlan:
    """What a sweep runs: ``script ARGS`` at each worker count in ``nps``, ``repeat`` times.

    ``launcher="cluster"`` runs a tf.distribute script on a local cluster (:mod:`labkit.tfdist.cluster`) instead
    of under MPI (``hostfile`` places MPI's ranks). ``ceiling`` also runs, for each worker count N > 1, N
    independent copies at once (same threads, no communication): the throughput this machine gives N workers at
    best. ``shrink=(TRAIN, TEST, DIVISOR)`` trains on the first TRAIN/TEST images with Conv2D filters divided by
    DIVISOR, without touching the script; ``optimizer="compression=fp16"`` gives Horovod's ``DistributedOptimizer``
    knobs the same way (:mod:`labkit.instrument.optimizer_knobs`). Records go to ``runs_file`` (default:
    ``$LABKIT_RUNS_FILE`` or ``runs/runs.jsonl``); ``python`` runs the script (default: this one); ``echo``
    says each run's progress.
    """

    nps: Sequence[int] = (1, 2)
    repeat: int = 1
    args: Sequence[str] = ()
    launcher: str = "mpirun"
    hostfile: str | Path | None = None
    ceiling: bool = False
    shrink: Sequence[int] | None = None
    optimizer: str | None = None
    runs_file: str | Path | None = None
    python: str | None = None
    echo: bool = True


QUIET = JobSpec(quiet=True)  # a sweep's runs show no output of their own by default


def bench(script: str | Path, plan: SweepPlan | None = None, job: JobSpec = QUIET) -> Sweep:
    """Run ``plan`` (:class:`SweepPlan`) of ``script`` and compare; every run gets ``job``.

    Any training script works: the runs are observed from outside (:mod:`labkit.instrument.observe`).
    ``job.threads`` is threads per worker (None: cores // workers, the launcher's default); ``job.env`` adds
    variables for every worker (e.g. ``{"HOROVOD_CYCLE_TIME": "5"}`` to try a Horovod setting); ``job.target`` is
    the validation accuracy the time to accuracy is measured for (default: the script's ``--target-accuracy``);
    ``job.stop_when`` ends a run early (:func:`labkit.launching.launch.run`, :class:`labkit.tfdist.cluster.Cluster`).
    """
    plan = plan or SweepPlan()
    nps, repeat, args, launcher, hostfile = plan.nps, plan.repeat, plan.args, plan.launcher, plan.hostfile
    ceiling, shrink, optimizer, runs_file, python, echo = (plan.ceiling, plan.shrink, plan.optimizer,
                                                           plan.runs_file, plan.python, plan.echo)
    threads, cwd, env, target = job.threads, job.cwd, job.env, job.target
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
    cores = identity.cpu_count()
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
    if optimizer is not None:
        optimizer_knobs.parse(optimizer)  # ValueError before anything starts
        extra[contract.OPTIMIZER] = optimizer
    order = [(i, np_, False) for i in range(repeat) for np_ in nps]
    if ceiling:  # each repeat: the distributed runs, then the copies, so load changes hit both alike
        order = [(i, np_, c) for i in range(repeat) for c in (False, True) for np_ in nps if not c or np_ > 1]
    records: list[RunRecord] = []
    for k, (i, np_, copies) in enumerate(order, 1):
        run_id = f"bench-{sweep_id}-np{np_}-r{i + 1}" + ("-ceiling" if copies else "")
        if echo:
            what = f"{np_} independent copies" if copies else f"{np_} worker(s)"
            _say(f"run {k}/{len(order)}: {what} x {threads or launch.default_threads(np_, cores)} thread(s), "
                 f"repeat {i + 1}/{repeat} ...")
        job_env = {**extra, runs.RUN_ID_VAR: run_id, runs.FILE_VAR: str(records_path), contract.BENCH: sweep_id}
        spec = job.but(env=job_env, stop_when=None if copies else job.stop_when)
        if copies or launcher == "cluster":
            duration = cluster.run(command, Tasks(workers=np_, independent=copies), spec).duration
        else:
            duration = launch.run(command, np_, launcher, spec, hostfile=hostfile).duration
        found = runs.select(runs.read(records_path, warn=False), run_id=run_id)
        rec = found[-1] if found else RunRecord(run_id=run_id, workers=np_, status="no record",
                                                error="the job left no run record")
        records.append(dataclasses.replace(rec, workers=np_ if copies else rec.workers or np_))
        if echo:
            ips = rec.images_per_sec
            _say(f"  {rec.status}, {'-' if ips is None else f'{ips:.1f}'} images/sec ({duration:.0f} s)")
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
        "cpu": identity.device_info().get("cpu"), "load_avg": _loadavg(), "ceiling": ceiling,
        "shrink": list(shrink) if shrink is not None else None, "target": target, "optimizer": optimizer,
    }
    return Sweep(script, points, conditions, warn, records)


def _say(text: str) -> None:
    """Progress of a sweep: stderr in a terminal (stdout may be --json), stdout in a notebook
    (which shows stderr as an error)."""
    print(f"labkit bench: {text}", file=sys.stdout if output.in_notebook() else sys.stderr, flush=True)


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
