"""What a probed tf.distribute task records, typed: ``TASK.json`` and the lines of ``TASK.events.jsonl``.

A task under :mod:`labkit.instrument.dprobe` fills in a :class:`Task` as the script runs (its strategies, fit calls,
saves, the parameter-server coordinator) and writes it, and appends an :class:`Event` per epoch
(:class:`labkit.instrument.dprobe_record.Recorder`); :mod:`labkit.check.tfdist` reads them back once, every field
checked, into the evidence of the MirroredStrategy, MultiWorkerMirroredStrategy or ParameterServerStrategy lab's check
(:mod:`labkit.records.tfdist_evidence`), which its judges read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from labkit.records import typed


@dataclass(frozen=True)
class Strategy:
    """A ``tf.distribute`` strategy the task created."""

    cls: str = field(default="", metadata={typed.JSON_KEY: "class"})
    replicas: int | None = None
    replicas_error: str | None = None
    devices: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Variables:
    """The model's variables: their classes, devices, copies, and whether the replicas' copies are equal."""

    types: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    replicas_equal: bool | None = None
    copies: int = 1


@dataclass(frozen=True)
class Batches:
    """The first batches each local replica received: their sizes, and the ids of their examples."""

    per_replica_batch: list[list[int]] = field(default_factory=list)
    ids: list[list[list[float]]] = field(default_factory=list)
    note: str | None = None


@dataclass
class Fit:
    """One call of ``Model.fit`` in a task."""

    strategy: str = ""
    replicas: int | None = None
    input: str = ""
    epochs: Any = None  # as the script passed them
    steps_per_epoch: Any = None
    callbacks: list[str] = field(default_factory=list)
    variables: Variables = field(default_factory=Variables)
    after: Variables | None = None  # after training
    batches: Batches | None = None
    batches_error: str | None = None
    weights: str | None = None  # a digest of the trained weights
    iterations: int | None = None
    dataset_fn_calls: list[int | None] | None = None  # a DatasetCreator's calls, by input pipeline


@dataclass
class Coordinator:
    """The parameter-server ``ClusterCoordinator``: created, steps scheduled, joins, per-worker datasets."""

    created: int = 0
    scheduled: int = 0
    joined: int = 0
    workers: int | None = None
    per_worker_datasets: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Load:
    """The saved model, loaded again after the script: whether it loads, with the trained weights."""

    ok: bool = False
    same_weights: bool = False
    error: str | None = None


@dataclass
class Task:
    """``TASK.json``: what one task (``worker.0``, ``ps.0``, ``chief.0``, ``local.0``) did."""

    task: str = ""
    pid: int | None = None
    start: float | None = None
    fits: list[Fit] = field(default_factory=list)
    saves: list[str] = field(default_factory=list)
    strategies: list[Strategy] = field(default_factory=list)
    coordinator: Coordinator = field(default_factory=Coordinator)
    ps_variable_devices: dict[str, int] = field(default_factory=dict)
    error: str | None = field(default=None, metadata=typed.OMIT_NONE)  # the exception that ended the script
    exit: int | None = field(default=None, metadata=typed.OMIT_NONE)  # None: it never ended by itself
    load: Load | None = field(default=None, metadata=typed.OMIT_NONE)


@dataclass(frozen=True)
class Event:
    """One line of ``TASK.events.jsonl``: ``fit_begin``, ``epoch_begin``, ``epoch_end`` (with the rate of each
    batch), ``fit_end``."""

    kind: str
    pid: int = 0
    t: float = 0.0
    epoch: int | None = None
    lr: list[float | None] = field(default_factory=list)
