"""What the run observer saw in one process, typed: ``observed.PID.json``.

The observer (:mod:`labkit.instrument.observe`) fills in one :class:`Observation` as the script runs and rewrites
the file at every epoch's end and at exit (:func:`labkit.records.typed.dump`); the launcher reads every process's
file back (:func:`read`, every field checked) and :mod:`labkit.records.jobrecord` turns the chief's into the run
record.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.core.identity import World
from labkit.records import boundedjson, typed


@dataclass(frozen=True)
class FitNote:
    """One call of ``Model.fit``: when, with how many images a step (and how that was found), and its arguments."""

    start: float = 0.0
    batch_per_step: int | None = None
    batch_from: str | None = None
    epochs: Any = None  # as the script passed them
    steps_per_epoch: Any = None
    initial_epoch: Any = None


@dataclass(frozen=True)
class EpochNote:
    """One epoch: its end, wall and training time (validation excluded), steps, CPU time, and the metrics the logs
    held at its end (``loss``, ``val_accuracy``...), side by side with these fields in the JSON."""

    epoch: int = 0
    end: float = 0.0
    wall_s: float = 0.0
    train_s: float = 0.0
    steps: int | None = None
    batch_per_step: int | None = None
    cpu_s: float | None = None
    metrics: dict[str, float | None] = field(default_factory=dict, metadata=typed.REST)  # a diverged run: None


@dataclass
class Observation:
    """Everything the observer of one process saw."""

    pid: int = 0
    started: float = 0.0
    folder: str | None = None
    task: str | None = None  # TYPE.INDEX of a tf.distribute task, as the launcher named it
    fits: list[FitNote] = field(default_factory=list)
    epochs: list[EpochNote] = field(default_factory=list)
    config: dict[str, Any] | None = None  # the script's parsed arguments, plain values only
    world: World | None = None
    argv: list[str] = field(default_factory=list)
    updated: float | None = None
    train_begin: float | None = None
    train_end: float | None = None
    ended: float | None = None
    versions: dict[str, str | None] = field(default_factory=dict)
    device: dict[str, Any] | None = None  # labkit.core.identity.device_info
    gradient_bytes: int | None = None
    worker_steps: dict[str, list[float]] = field(default_factory=dict)  # ParameterServerStrategy: steps' ends
    shrink: Any = field(default=None, metadata=typed.OMIT_NONE)  # set from outside: labkit bench --shrink
    optimizer_knobs: Any = field(default=None, metadata=typed.OMIT_NONE)  # and --optimizer
    observer_errors: list[str] = field(default_factory=list)

    @property
    def where(self) -> World:
        return self.world or World()


def path(folder: str | os.PathLike, pid: int) -> Path:
    """Where the observer of process ``pid`` keeps what it saw."""
    return Path(folder) / f"observed.{pid}.json"


def read(folder: str | os.PathLike) -> list[Observation]:
    """Every readable observation left in ``folder``, oldest process first (one cut short or not an observation is
    left out)."""
    out = []
    for file in sorted(Path(folder).glob("observed.*.json")):
        try:
            out.append(typed.parse(Observation, boundedjson.read_file(file), file.name))
        except (OSError, ValueError):  # typed.RecordError is a ValueError
            continue
    return sorted(out, key=lambda o: o.started)
