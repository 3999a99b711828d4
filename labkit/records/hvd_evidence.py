"""The evidence of the checks that probe a 2-rank Horovod run, typed: each run, how each of its ranks ended, and what
each lab adds (the Horovod lab its checkpoint and learning-rate runs, the communication lab what each rank
all-reduced, lab 9 its options, profiles and elastic run).

:func:`labkit.check.hvd_runs.run` makes a :class:`Run` (each rank's record, :mod:`labkit.records.hvd_probe`, read
once as the rank wrote it); each lab's ``collect`` keeps it as its lab's evidence (:func:`kept`), which its judges
read and the check saves and reads back (:mod:`labkit.records.evidence`). The JSON has the keys it always had:
a field left out of it in some runs says so (``oom_kills`` only when the kernel killed a process, ``resume`` only
for the Horovod lab's steps 7 and 8...).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

from labkit.records import typed
from labkit.records.evidence import Evidence
from labkit.records.hvd_probe import Allreduced, ElasticRun, Profiled, RankRecord
from labkit.records.still_running import StillRunning


@dataclass(frozen=True)
class RankEnd:
    """How one rank's process ended, seen from the launcher: exit status, what it said, where it was stopped, what
    it left running."""

    exit: int | None = None
    error: str = ""
    log_tail: str = ""
    stalled: bool = False
    running_at_end: StillRunning | None = field(default=None, metadata=typed.OMIT_NONE)
    left_running: list[str] = field(default_factory=list, metadata=typed.OMIT_DEFAULT)


@dataclass(frozen=True)
class Run:
    """One probed run of the script on ``np`` ranks; ``unreadable``: a rank's record that could not be read (left
    out of ``states``), named with the field that is wrong."""

    np: int
    batch: int = 16
    lab: str = "horovod"
    states: dict[int, RankRecord] = field(default_factory=dict)
    weights: dict[int, dict[str, list[float]]] = field(default_factory=dict)
    ranks: dict[int, RankEnd] = field(default_factory=dict)
    timed_out: bool = False
    interrupted: bool = False
    returncode: int | None = None
    start_error: str | None = None
    oom_kills: int = field(default=0, metadata=typed.OMIT_DEFAULT)
    unreadable: str | None = field(default=None, metadata=typed.OMIT_NONE)

    def state(self, rank: int) -> RankRecord:
        """Rank ``rank``'s record (a ``KeyError`` for a rank that left none: the judges ask :func:`need` first)."""
        return self.states[rank]

    def end(self, rank: int) -> RankEnd:
        return self.ranks.get(rank, RankEnd())


@dataclass(frozen=True)
class RunEvidence(Run, Evidence):
    """A check's evidence made of one probed run (and, for a lab that makes more, :meth:`runs`)."""

    def runs(self) -> list[Run]:
        """Every run the check made, the main one first."""
        return [self]

    def cut_short(self) -> bool:
        return self.interrupted or self.timed_out

    def record_error(self) -> str | None:
        return next((run.unreadable for run in self.runs() if run.unreadable), None)

    def processes_left(self) -> list[tuple[str, list[str]]]:
        return [(str(rank), end.left_running) for run in self.runs() for rank, end in run.ranks.items()]


@dataclass(frozen=True)
class Resume:
    """The Horovod lab's checkpoint runs: the first saves, the second must resume from what it saved."""

    first: Run
    second: Run | None = field(default=None, metadata=typed.OMIT_NONE)


@dataclass(frozen=True)
class HorovodEvidence(RunEvidence):
    """The Horovod lab's check: its main run, and for steps 7 and 8 the checkpoint runs and the learning-rate run
    (the main run, kept as both)."""

    resume: Resume | None = field(default=None, metadata=typed.OMIT_NONE)
    lr_run: Run | None = field(default=None, metadata=typed.OMIT_NONE)

    def runs(self) -> list[Run]:
        later = [self.resume.first, self.resume.second] if self.resume else []
        return [run for run in (self, *later, self.lr_run) if run is not None]


@dataclass(frozen=True)
class CommunicationEvidence(RunEvidence):
    """Lab 8's check: the run with ``--fp16-allreduce`` (its command line), and what each rank all-reduced."""

    args: list[str] = field(default_factory=list)
    allreduce: dict[int, Allreduced] = field(default_factory=dict)


@dataclass(frozen=True)
class AtScaleEvidence(RunEvidence):
    """Lab 9's check: the run with the options of the steps asked (its command line), what each rank left in its
    profile folder (step 4) and the elastic run (step 5)."""

    args: list[str] = field(default_factory=list)
    profiles: dict[int, Profiled] = field(default_factory=dict, metadata=typed.OMIT_DEFAULT)
    elastic: ElasticRun | None = field(default=None, metadata=typed.OMIT_NONE)


R = TypeVar("R", bound=RunEvidence)


def kept(run: Run, cls: type[R], **more: Any) -> R:
    """``run`` kept as a check's evidence of the class ``cls``, with the fields ``more`` (which may replace the
    run's own: its ``lab``, its ``unreadable``)."""
    own = {f.name: getattr(run, f.name) for f in dataclasses.fields(Run)}
    return cls(**{**own, **more})
