"""Turn what the processes of a job were seen doing into its run record.

The launcher calls :func:`finish` when a job ends: it reads the observations the
processes left (:mod:`labkit.instrument.observe`), takes the chief's (Horovod rank 0, the
tf.distribute chief or worker 0), adds what only the launcher knows (command,
launcher, threads, exit status, wall time) and appends one record (a
:class:`labkit.records.runrecord.RunRecord`) to the records file. A job whose processes
were never seen training (a custom loop, a crash before ``fit``, a shell script) still
gets a record with its wall time and status.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.core import identity
from labkit.core.identity import World
from labkit.records import observation, runrecord, runs
from labkit.records.observation import Observation
from labkit.records.runrecord import CopyStats, EpochStats, RankPlace, RunRecord, Setting

ACCURACY_KEYS = ("val_accuracy", "val_acc", "val_categorical_accuracy", "val_sparse_categorical_accuracy")
TRAIN_ACCURACY_KEYS = tuple(k[4:] for k in ACCURACY_KEYS)


def _first(metrics: Mapping[str, float | None], keys: Sequence[str]) -> float | None:
    for key in keys:
        if metrics.get(key) is not None:
            return float(metrics[key])
    return None


def images_per_step(world: World | None, batch_per_step: int | None) -> int | None:
    """Images all workers together train on in one step.

    tf.distribute ``fit``: the batch given to fit is already the global batch
    (all-reduce strategies) or one worker's step (parameter servers). Otherwise
    (Horovod, or processes started side by side) every process trains its own batch.
    """
    if not batch_per_step:
        return None
    if is_tf_distribute(world):
        return batch_per_step
    return batch_per_step * int((world.workers if world else 1) or 1)


def is_tf_distribute(world: World | None) -> bool:
    return world is not None and world.strategy not in (None, "horovod", "tf_config")


def epochs_of(seen: Observation, t0: float | None = None) -> list[EpochStats]:
    """Per-epoch measurements of one process; ``elapsed_s`` counts from ``t0`` (default: its training start)."""
    t0 = t0 or seen.train_begin or seen.started or 0.0
    out = []
    for e in seen.epochs:
        per_step = images_per_step(seen.world, e.batch_per_step)
        images = (e.steps or 0) * per_step if per_step else None
        train = e.train_s or 0.0
        out.append(EpochStats(
            epoch=e.epoch, wall_s=e.wall_s, train_s=train, steps=e.steps, images=images,
            images_per_sec=round(images / train, 2) if images and train > 0 else None,
            # CPU seconds per second of training: about the cores this process got.
            cpu_cores=round(e.cpu_s / train, 3) if e.cpu_s is not None and train > 0 else None,
            elapsed_s=round(e.end - t0, 3) if e.end else None,
            metrics={"loss": e.metrics.get("loss"), "accuracy": _first(e.metrics, TRAIN_ACCURACY_KEYS),
                     "val_loss": e.metrics.get("val_loss"), "val_accuracy": _first(e.metrics, ACCURACY_KEYS)}))
    return out


def chief_of(observations: list[Observation]) -> list[Observation]:
    """The chief's observations (several after a restart), else the first process's.

    Processes that trained come first: a launcher written in Python (horovodrun) is
    observed too, and looks like rank 0.
    """
    trained = [o for o in observations if o.fits] or observations
    chiefs = [o for o in trained if o.world is not None and o.world.is_chief]
    return chiefs or trained[:1]


def _setting(value: Any) -> Setting:
    """A value the script gave, as a record keeps it: a plain value as it is, anything else as text."""
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


def measured(observations: list[Observation], target: float | None = None,
             t0: float | None = None, run_id: str = "") -> RunRecord:
    """The measured part of a record from a job's observations (the chief's): a :class:`RunRecord` whose other
    fields are left at their defaults, ``workers`` the workers the chief saw (None when it saw none)."""
    chief = chief_of(observations)
    by_epoch: dict[int, EpochStats] = {}
    for o in chief:  # a restarted chief repeats nothing it finished: later epochs win
        for e in epochs_of(o, t0):
            by_epoch[e.epoch] = e
    epochs = [by_epoch[k] for k in sorted(by_epoch)]
    last = chief[-1] if chief else Observation()
    config = {str(k): _setting(v) for k, v in (last.config or {}).items()}
    if target is None and isinstance(config.get("target_accuracy"), (int, float)):
        target = float(config["target_accuracy"])
    ttt = epochs_to = None
    if target is not None:
        for e in epochs:
            if e.val_accuracy is not None and e.val_accuracy >= target and e.elapsed_s is not None:
                ttt, epochs_to = e.elapsed_s, e.epoch
                break
    world = last.world
    fits = last.fits
    per_step = next((f.batch_per_step for f in reversed(fits) if f.batch_per_step), None)
    workers = int((world.workers if world else 1) or 1)
    global_batch = images_per_step(world, per_step)
    if not is_tf_distribute(world) or (world and world.strategy == "ParameterServerStrategy") or not global_batch:
        per_worker = per_step
    else:
        per_worker = max(1, global_batch // workers)
    accs = [e.val_accuracy for e in epochs]
    steps = last.worker_steps  # ParameterServerStrategy: when each worker finished each step
    t_steps = t0 or last.train_begin or 0.0
    return RunRecord(
        run_id=run_id,
        workers=workers if world else None,
        strategy=world.strategy if world else None,
        batch_per_worker=per_worker,
        global_batch=global_batch,
        batch_from=next((f.batch_from for f in reversed(fits)), None),
        widen_factor=config.get("widen_factor"),
        train_size=config.get("train_size"),
        test_size=config.get("test_size"),
        mode=config.get("mode"),
        epochs_requested=config.get("epochs") or _setting(next((f.epochs for f in fits), None)),
        target_accuracy=target,
        config=config,
        shrink=last.shrink,
        gradient_bytes=last.gradient_bytes,
        optimizer_knobs=last.optimizer_knobs,  # set from outside: labkit bench --optimizer
        device=last.device,
        versions=last.versions or identity.versions(),
        epochs=epochs,
        epochs_run=len(epochs),
        val_accuracy=accs,
        final_val_accuracy=next((a for a in reversed(accs) if a is not None), None),
        images_per_sec=runs.summarize(e.images_per_sec for e in epochs),
        cpu_cores=runs.summarize(e.cpu_cores for e in epochs),
        time_to_target_s=ttt,
        epochs_to_target=epochs_to,
        train_time_s=round(sum(e.train_s or 0.0 for e in epochs), 4),
        called_fit=bool(fits),
        worker_steps={k: len(v) for k, v in sorted(steps.items())} or None,
        worker_step_times={k: [round(t - t_steps, 2) for t in v] for k, v in sorted(steps.items())} or None,
        observer_errors=[err for o in observations for err in o.observer_errors] or None,
    )


def ranks_of(observations: list[Observation]) -> list[RankPlace] | None:
    """Where each observed process ran: ``rank``, ``host``, ``local_rank``, ``pid``, by rank."""
    ranks = [o for o in observations  # a launcher written in Python (horovodrun) is observed too: not a rank
             if o.fits or o.task or (o.world is not None and o.world.local_rank is not None)]
    out = [RankPlace(rank=w.rank, task=o.task, host=w.host, local_rank=w.local_rank, pid=o.pid)
           for o in ranks or observations if (w := o.world) is not None]
    return sorted(out, key=lambda r: (r.rank is None, r.rank or 0)) or None


def observed_record(seen: Observation, run_id: str) -> RunRecord:
    """A record-shaped view of one running process (the live progress file)."""
    return dataclasses.replace(measured([seen], run_id=run_id), workers=seen.world.workers if seen.world else None)


@dataclass(frozen=True)
class JobEnd:
    """What the starter of a finished job knows of it, for its run record.

    ``start`` is the job's start (seconds since the epoch): the time to the target accuracy counts from there,
    so it includes start-up, as a learner's wall clock does. ``copies``: the processes were independent copies (a
    ceiling measurement); their throughputs are added up. ``extra``: more fields for the record (the sweep it
    belongs to, a cluster's tasks, what a fault did).
    """

    run_id: str
    command: Sequence[str]
    launcher: str
    workers: int
    threads: int | None
    start: float
    duration: float
    exit_status: int
    status: str
    error: str | None = None
    log_dir: str | Path | None = None
    target: float | None = None
    copies: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)


def finish(end: JobEnd, folder: str | Path, path: str | Path | None = None) -> RunRecord:
    """Compose the run record of the job that ``end`` describes, from its observations in ``folder``, and
    append it to ``path`` (default: the runs file); return it."""
    observations = observation.read(folder)
    m = measured(observations, end.target, t0=end.start)
    copies = None
    if end.copies:  # independent copies: throughput adds up; each trained alone
        each = [measured([o], end.target, t0=end.start) for o in observations if o.epochs]
        rates = [c.images_per_sec for c in each]
        copies = [CopyStats(c.images_per_sec, c.cpu_cores, c.final_val_accuracy) for c in each]
        m = dataclasses.replace(
            m, images_per_sec=round(sum(r for r in rates if r is not None), 2)
            if rates and None not in rates and len(rates) == end.workers else None,
            time_to_target_s=None, epochs_to_target=None, workers=end.workers)
    script = next((str(c) for c in end.command if str(c).endswith(".py")), None)
    lab, step = runs.lab_and_step(script or "")
    fields: dict[str, Any] = {
        "schema": runs.SCHEMA,
        "run_id": end.run_id,
        "script": script,
        "command": [str(c) for c in end.command],
        "lab": lab,
        "step": step,
        "launcher": end.launcher,
        "workers": m.workers or end.workers,
        "processes": end.workers,
        "threads_per_worker": end.threads,
        "device": m.device if m.device is not None else identity.device_info(),
        "copies": copies,
        "exit_status": end.exit_status,
        "status": end.status,
        "error": (end.error or "")[-2000:] or None,
        "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(end.start)),
        "duration_s": round(end.duration, 3),
        "host": socket.gethostname(),
        "ranks": ranks_of(observations),
        "log_dir": str(end.log_dir) if end.log_dir else None,
        "extra": {k: v for k, v in end.extra.items() if k not in runrecord.field_names()},
    }
    # An extra field a record declares (none today) is set as that field, as the starter said.
    fields.update({k: v for k, v in end.extra.items() if k in runrecord.field_names()})
    record = dataclasses.replace(m, **fields)
    runs.append(record, path)
    try:
        runs.write_live(record, path)
    except OSError:
        pass
    return record
