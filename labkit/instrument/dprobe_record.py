"""What the tf.distribute probe records of one task (:mod:`labkit.instrument.dprobe`): its record and events,
its strategies, and what each replica is given and holds."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from labkit.core import contract, files, identity
from labkit.records import typed
from labkit.records.tfdist_probe import Batches, Event, Strategy, Task, Variables

PROBE_BATCHES = 6  # batches per replica sampled before training


def task_name() -> str:
    """``TYPE.INDEX`` of this task: as the launcher named it, else from ``TF_CONFIG``, else ``local.0``."""
    if contract.settings().task:
        return contract.settings().task
    task = (identity.tf_config() or {}).get("task", {})
    return f"{task['type']}.{task.get('index', 0)}" if task.get("type") else "local.0"


class Recorder:
    """One task's record (``TASK.json``, rewritten whole) and its events (``TASK.events.jsonl``, appended)."""

    def __init__(self, outdir: Path) -> None:
        self.outdir = outdir
        self.task = task_name()
        self.record = Task(task=self.task, pid=os.getpid(), start=time.time())
        self.strategies: list[Any] = []
        self.model: Any = None
        self.done = False  # the script has returned: stop recording the probe's own objects
        outdir.mkdir(parents=True, exist_ok=True)

    def event(self, kind: str, epoch: int | None = None, lr: list[float | None] | None = None) -> None:
        line = Event(kind, os.getpid(), time.time(), epoch, lr or [])
        with open(self.outdir / f"{self.task}.events.jsonl", "a") as f:
            f.write(json.dumps(typed.dump(line)) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def dump(self) -> None:
        self.record.strategies = [_strategy_info(s) for s in self.strategies]
        files.write_json_atomic(self.outdir / f"{self.task}.json", typed.dump(self.record))


def _strategy_info(s: Any) -> Strategy:
    replicas, error = None, None
    try:
        replicas = int(s.num_replicas_in_sync)
    except Exception as e:  # noqa: BLE001 - parameter-server strategies may refuse
        error = str(e)[:200]
    try:
        devices = [str(d) for d in s.extended.worker_devices]
    except Exception:  # noqa: BLE001
        devices = []
    return Strategy(type(s).__name__, replicas, error, devices)


def digest(arrays: list[Any]) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(a.tobytes())
    return h.hexdigest()[:16]


def batch_ids(x: Any) -> list[float]:
    """The grey level of each image of a batch: its example id (in standardised units)."""
    return [round(float(v), 3) for v in x.numpy()[:, 0, 0, 0]]


def sample_batches(model: Any, x: Any, kw: dict[str, Any]) -> tuple[Batches, Any]:
    """What each local replica receives, distributed as fit distributes it; and the input to give fit.

    Every input fit accepts is sampled: a dataset or a distributed dataset as it is, a
    ``DatasetCreator`` through ``distribute_datasets_from_function`` (as fit does), arrays,
    a ``keras.utils.Sequence`` and the like through tf-keras' own data handler. A generator
    can be read only once: its first batches are sampled, and fit gets them back, then the rest.
    """
    import inspect
    import itertools

    import tensorflow as tf
    from tf_keras.src.engine import data_adapter

    strategy = model.distribute_strategy
    sizes: list[list[int]] = []
    ids: list[list[list[float]]] = []
    steps = max(1, min(int(kw.get("steps_per_epoch") or PROBE_BATCHES), PROBE_BATCHES))
    if isinstance(x, tf.data.Dataset):
        dist = strategy.experimental_distribute_dataset(x)
    elif type(x).__name__.startswith("Distributed"):
        dist = x
    elif isinstance(x, tf.keras.utils.experimental.DatasetCreator):
        dist = strategy.distribute_datasets_from_function(x, options=x.input_options)
    else:
        handler_x = x
        if inspect.isgenerator(x) or (hasattr(x, "__next__") and not hasattr(x, "__len__")):
            first = list(itertools.islice(x, steps))
            handler_x, x = iter(first), itertools.chain(first, x)
            steps = len(first)
        with strategy.scope():
            handler = data_adapter.get_data_handler(
                x=handler_x, y=kw.get("y"), batch_size=kw.get("batch_size"), steps_per_epoch=kw.get("steps_per_epoch")
                if handler_x is x else steps, epochs=1, shuffle=kw.get("shuffle", True), model=model,
                steps_per_execution=getattr(model, "_steps_per_execution", None))
        dist = handler._dataset
    it = iter(dist)
    for _ in range(steps):
        batch = next(it)
        xb = batch[0] if isinstance(batch, tuple | list) else batch
        locals_ = strategy.experimental_local_results(xb)
        sizes.append([int(t.shape[0]) for t in locals_])
        ids.append([batch_ids(t) for t in locals_])
    return Batches(sizes, ids), x


def model_variables(model: Any) -> Variables:
    devices = set()
    equal, copies = True, 1
    for v in model.weights:
        values = getattr(v, "values", None)
        if values is not None and len(values) > 1:
            copies = len(values)
            devices.update(str(c.device) for c in values)
            if type(v).__name__ != "MirroredVariable":
                continue  # sync-on-read variables (batch-norm statistics) differ per replica by design
            first = values[0].numpy()
            equal = equal and all((first == other.numpy()).all() for other in values[1:])
        else:
            devices.add(str(getattr(v, "device", "")))
    return Variables(sorted({type(v).__name__ for v in model.weights}), sorted(devices)[:20],
                     equal if copies > 1 else None, copies)
