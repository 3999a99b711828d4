"""What the tf.distribute labs' checks share: the probe's command line, reading its
records (typed, once), and judges of a fit call that more than one lab needs."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from labkit.check.verdict import Failed
from labkit.core import proc
from labkit.instrument import start
from labkit.launching import launchers
from labkit.records import boundedjson, evidence, typed
from labkit.records.tfdist_probe import Event, Fit, Task

TRAIN, TEST, BATCH = 256, 128, 16
COMMON = ["--train-size", str(TRAIN), "--test-size", str(TEST), "--batch-size", str(BATCH),
          "--val-batch-size", str(BATCH), "--widen-factor", "1", "--mode", "small", "--target-accuracy", "2"]


def probe_command(probe: Path, script: Path, *args: str) -> list[str]:
    """The learner's script under :mod:`labkit.instrument.dprobe`, on the check's tiny data."""
    return start.command("tfdist", str(probe), [sys.executable, str(script), *COMMON, *args])


def records(probe: Path, unreadable: list[str] | None = None) -> dict[str, Task]:
    """Each task's record (``worker.0``, ``ps.0``, ``local.0``, ...), typed; one cut short is left out, and one of
    the wrong shape too, named in ``unreadable``."""
    out = {}
    for f in sorted(probe.glob("*.json")):
        task = evidence.record(Task, f, unreadable)
        if task is not None:
            out[f.stem] = task
    return out


def events(probe: Path, task: str, unreadable: list[str] | None = None) -> list[Event]:
    """The events ``task`` wrote (``TASK.events.jsonl``), typed; a line cut short by a kill is left out, and one of
    the wrong shape too, named in ``unreadable``."""
    path = probe / f"{task}.events.jsonl"
    try:
        with open(path, "rb") as f:  # the learner's process wrote it: read bounded, decoded bounded
            raw = f.read(boundedjson.FILE_LIMIT + 1)
    except OSError:
        return []
    if len(raw) > boundedjson.FILE_LIMIT:
        if unreadable is not None:
            unreadable.append(f"{path.name}: larger than {boundedjson.FILE_LIMIT} bytes, not read")
        return []
    out = []
    for n, line in enumerate(raw.decode(errors="replace").splitlines(), 1):
        try:
            data = boundedjson.loads(line)
        except ValueError:
            continue  # a line cut short by a kill (or no JSON at all)
        try:
            out.append(typed.parse(Event, data, f"{path.name} line {n}"))
        except typed.RecordError as e:
            if unreadable is not None:
                unreadable.append(str(e))
    return out


def files(folder: Path) -> list[str]:
    if not folder.exists():
        return []
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def run_single(cmd: list[str], timeout: float, log: Path, env: dict[str, str] | None = None,
               cwd: Path | None = None, left: list[str] | None = None) -> tuple[int, bool]:
    """Run one process through the process layer; everything it started is stopped at the end.

    The exit code (negative for a signal, as Popen says), whether it timed out; what the process
    left running when it ended is appended to ``left``.
    """
    with proc.Job() as job:
        p = job.spawn(cmd, env={**launchers.worker_env(1), **(env or {}), "PYTHONUNBUFFERED": "1"}, cwd=cwd,
                      log=log)
        code = p.returncode if _ends(p, timeout) else None
    if left is not None:
        left += job.left_behind
    p.drain(1.0)
    return (code if code is not None else p.returncode if p.returncode is not None else -9), code is None


def _ends(p: proc.Proc, timeout: float) -> bool:
    """Whether the process itself ends within ``timeout`` (whatever it left holding its output)."""
    return proc.wait_until(lambda: not p.alive(), timeout, every=0.1)


def last_fit(rec: Task, who: str) -> Fit:
    """The last ``fit`` call ``who`` made; fails when it crashed or never trained."""
    if rec.error:
        raise Failed(f"{who} stopped with an error: {rec.error[-600:]}")
    if not rec.fits:
        raise Failed(f"{who} never called model.fit(...)")
    return rec.fits[-1]


def global_batch(f: Fit, per_replica: int, replicas: int, train: int, who: str) -> Any:
    """Each replica got ``per_replica`` examples and steps_per_epoch covers the data once; returns it."""
    b = f.batches
    if b is None or not b.per_replica_batch:
        why = f.batches_error or (b.note if b else None) or "nothing was recorded"
        raise Failed(f"could not sample the batches fit trains on ({why}): pass fit a tf.data.Dataset, a "
                     "distributed dataset, a DatasetCreator with steps_per_epoch, or arrays with batch_size")
    sizes = {s for row in b.per_replica_batch for s in row}
    gb = per_replica * replicas
    if sizes != {per_replica}:
        raise Failed(f"{who} received batches of {sorted(sizes)} examples but --batch-size is {per_replica} per "
                     "replica: batch the dataset by the global batch, batch_size * strategy.num_replicas_in_sync "
                     "(the strategy splits it over the replicas)")
    spe = f.steps_per_epoch
    if spe and not (train * 0.9 <= spe * gb <= train + gb):
        raise Failed(f"steps_per_epoch={spe} with a global batch of {gb} is {spe * gb} "
                     f"examples per epoch for {train} training images: compute it from the global batch")
    return spe
