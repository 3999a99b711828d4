"""The evidence of the checks that probe a tf.distribute run, typed: each task's record and events
(:mod:`labkit.records.tfdist_probe`, read once as the task wrote them), and what each lab's check saw from outside
(the files left, a worker killed and the cluster restarted, what a process left running).

Each lab's ``collect`` returns its class here (:class:`Mirrored`, :class:`MultiWorker`, :class:`ParameterServer`), its
judges read it, and the check saves it and reads it back (:mod:`labkit.records.evidence`). The JSON has the keys it
always had: a field left out of it in some runs says so (``ranks`` only when a process left something running, the
kill's fields as far as the kill went).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from labkit.records import typed
from labkit.records.evidence import Evidence
from labkit.records.tfdist_probe import Event, Task


@dataclass(frozen=True)
class Left:
    """What a task's process left running when it ended."""

    left_running: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Run(Evidence):
    """What every tf.distribute check's evidence has; ``unreadable``: a record or event a task wrote that could not
    be read (left out), named with the field that is wrong."""

    lab: str = ""
    records: dict[str, Task] = field(default_factory=dict)
    timed_out: bool = False
    run_error: str | None = None
    ranks: dict[str, Left] = field(default_factory=dict, metadata=typed.OMIT_DEFAULT)
    unreadable: str | None = field(default=None, metadata=typed.OMIT_NONE)

    def cut_short(self) -> bool:
        return self.timed_out

    def run_failure(self) -> str | None:
        return self.run_error

    def record_error(self) -> str | None:
        return self.unreadable

    def processes_left(self) -> list[tuple[str, list[str]]]:
        return [(name, left.left_running) for name, left in self.ranks.items()]


@dataclass(frozen=True)
class Mirrored(Run):
    """The MirroredStrategy check: one process on ``devices`` logical CPUs, and the files it left."""

    devices: int = 2
    batch: int = 16
    train: int = 0
    model_path: str = ""
    files: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Kill:
    """Worker 1 killed during training and the dead restarted (or why not); empty when step 4 was not asked."""

    killed: bool | None = field(default=None, metadata=typed.OMIT_NONE)
    epoch: int | None = field(default=None, metadata=typed.OMIT_NONE)
    restarted: list[str] | None = field(default=None, metadata=typed.OMIT_NONE)
    why: str | None = field(default=None, metadata=typed.OMIT_NONE)


@dataclass(frozen=True)
class MultiWorker(Run):
    """The MultiWorkerMirroredStrategy check: a 2-worker cluster, each worker in a folder of its own."""

    workers: int = 2
    batch: int = 16
    train: int = 0
    epochs: int = 0
    base_lr: float | None = None
    model_path: str = ""
    events: dict[str, list[Event]] = field(default_factory=dict)
    files: dict[str, list[str]] = field(default_factory=dict)
    progress_bar: dict[str, bool] = field(default_factory=dict)
    kill: Kill = field(default_factory=Kill)


@dataclass(frozen=True)
class ParameterServer(Run):
    """The ParameterServerStrategy check: a chief, 2 workers and a parameter server."""

    epochs: int = 0
    steps_per_epoch: int = 0
