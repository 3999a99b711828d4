"""The run record, typed: what one training run did, as one line of ``runs/runs.jsonl`` holds it.

:mod:`labkit.records.jobrecord` composes a :class:`RunRecord` when a job ends and :func:`labkit.records.runs.append`
writes it (:func:`labkit.records.typed.dump`); :func:`labkit.records.runs.read` parses every line back with every
field checked (:func:`parse`), so a reader gets attributes (``record.images_per_sec``,
``record.epochs[0].val_accuracy``), never a ``KeyError``, and a line that does not fit is skipped and counted, its
file named. The live progress file of a running job (``runs/live/RUN_ID.json``) is the same record, partly filled in.

What a job's starter adds beyond these fields (the benchmark sweep it belongs to, a cluster's tasks, what a fault
did, a reference's name and label: ``JobEnd.extra`` of :mod:`labkit.records.jobrecord`) is kept in
``RunRecord.extra``, side by side with the fields in the JSON; so are the metrics of an epoch in
``EpochStats.metrics``. Nothing a record file holds is lost on a round trip: ``typed.dump(parse(line))`` has every
key of ``line``.

Settings the learner's script parsed (``mode``, ``train_size``, its whole ``config``) are kept as the plain JSON
value recorded (:data:`Setting`): a script may give a number, a string or a flag, and each reader says what it
expects.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from labkit.records import typed

SCHEMA = 2  # the version of the record's JSON: bumped when a field changes its meaning or shape
Setting = str | int | float | bool | None  # a value the script parsed, as recorded


@dataclass(frozen=True)
class EpochStats:
    """One epoch of the chief: its wall and training time (validation excluded), steps, images and their rate, the
    cores it got, when it ended since the job's start, and its metrics (``loss``, ``accuracy``, ``val_loss``,
    ``val_accuracy``, as Keras named them), side by side with these fields in the JSON."""

    epoch: int = 0
    wall_s: float | None = None
    train_s: float | None = None
    steps: int | None = None
    images: int | None = None
    images_per_sec: float | None = None
    cpu_cores: float | None = None  # CPU seconds per second of training: about the cores the process got
    elapsed_s: float | None = None
    metrics: dict[str, float | None] = field(default_factory=dict, metadata=typed.REST)

    @property
    def loss(self) -> float | None:
        return self.metrics.get("loss")

    @property
    def accuracy(self) -> float | None:
        return self.metrics.get("accuracy")

    @property
    def val_loss(self) -> float | None:
        return self.metrics.get("val_loss")

    @property
    def val_accuracy(self) -> float | None:
        return self.metrics.get("val_accuracy")


@dataclass(frozen=True)
class RankPlace:
    """Where one observed process of the job ran."""

    rank: int | None = None
    task: str | None = None  # TYPE.INDEX of a tf.distribute task
    host: str | None = None
    local_rank: int | None = None
    pid: int | None = None


@dataclass(frozen=True)
class CopyStats:
    """One of a job's independent copies (a ceiling measurement): how fast and how accurate it trained alone."""

    images_per_sec: float | None = None
    cpu_cores: float | None = None
    final_val_accuracy: float | None = None


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """One training run: what ran (script, command, launcher, workers, threads), what was measured (the chief's
    epochs, images/sec on training steps, accuracy, time to the target), and how it ended. Only ``run_id`` is
    required: the live progress file and an unobserved job's record leave the rest at their defaults."""

    schema: int = SCHEMA
    run_id: str
    script: str | None = None
    command: list[str] = field(default_factory=list)
    lab: str | None = None
    step: str | None = None
    launcher: str | None = None
    workers: int | None = None
    processes: int | None = None
    threads_per_worker: int | None = None
    strategy: str | None = None
    batch_per_worker: int | None = None
    global_batch: int | None = None
    batch_from: str | None = None
    widen_factor: Setting = None
    train_size: Setting = None
    test_size: Setting = None
    mode: Setting = None
    epochs_requested: Setting = None
    target_accuracy: float | None = None
    config: dict[str, Setting] = field(default_factory=dict)  # the script's parsed arguments, plain values only
    shrink: Any = None  # set from outside: labkit bench --shrink
    gradient_bytes: int | None = None
    optimizer_knobs: Any = None  # set from outside: labkit bench --optimizer
    device: dict[str, Any] | None = None  # labkit.core.identity.device_info
    versions: dict[str, str | None] = field(default_factory=dict)
    epochs: list[EpochStats] = field(default_factory=list)
    epochs_run: int = 0
    val_accuracy: list[float | None] = field(default_factory=list)
    final_val_accuracy: float | None = None
    images_per_sec: float | None = None  # steady state: the median over epochs, the first left out
    cpu_cores: float | None = None
    time_to_target_s: float | None = None
    epochs_to_target: int | None = None
    train_time_s: float | None = None
    called_fit: bool = False
    worker_steps: dict[str, int] | None = None  # ParameterServerStrategy: steps each worker ran
    worker_step_times: dict[str, list[float]] | None = None  # and when each ended, since training began
    observer_errors: list[str] | None = None
    copies: list[CopyStats] | None = field(default=None, metadata=typed.OMIT_NONE)  # independent copies only
    exit_status: int | None = None
    status: str | None = None  # ok, failed, timeout, interrupted, stopped (running: the live file)
    error: str | None = None
    start_time: str | None = None
    duration_s: float | None = None
    host: str | None = None
    ranks: list[RankPlace] | None = None
    log_dir: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, metadata=typed.REST)  # JobEnd.extra: bench, tasks, ...

    def lookup(self, key: str) -> Any:
        """The field called ``key``, else the extra key ``key`` (None when there is neither)."""
        return getattr(self, key) if key in field_names() else self.extra.get(key)

    def with_extra(self, **more: Any) -> RunRecord:
        """This record with ``more`` extra keys (a reference's name and label, ...)."""
        return dataclasses.replace(self, extra={**self.extra, **more})


@cache
def field_names() -> frozenset[str]:
    """The names of :class:`RunRecord`'s own fields (the keys that are not extra)."""
    return frozenset(f.name for f in dataclasses.fields(RunRecord) if not f.metadata.get("rest"))


def parse(data: Any, where: str = "run record") -> RunRecord:
    """``data`` (one decoded line) as a :class:`RunRecord`; :class:`labkit.records.typed.RecordError` names
    ``where`` and the field that does not fit."""
    return typed.parse(RunRecord, data, where)
