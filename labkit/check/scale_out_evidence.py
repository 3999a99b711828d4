"""The evidence of the scale-out lab's check, typed: the hostfile's job maps and the batch script's dry run.

:func:`labkit.check.lab_scale_out.collect` keeps it as JSON (:data:`labkit.check.judging.FORMAT`); :func:`read`
turns it into these records once, every field checked (:mod:`labkit.records.typed`), for the lab's judges.
The job maps (:class:`labkit.launching.mpimap.JobMap`) and launches (:class:`labkit.check.scale_out_ranks.Launched`)
are read as the same dataclasses that wrote them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from labkit.check.scale_out_ranks import Launched
from labkit.launching.mpimap import JobMap
from labkit.records import typed


@dataclass(frozen=True)
class Hostfile:
    """Step 1's file: the map of ``mpirun --hostfile FILE -np 8`` (``map``) and every slot it offers (``offered``)."""

    file: str
    exists: bool = False
    map: JobMap = field(default_factory=JobMap)
    offered: JobMap = field(default_factory=JobMap)
    mapper: str = "mpirun"
    command: str = ""


@dataclass(frozen=True)
class Request:
    """What the batch script asks Slurm for, and (when Slurm would grant it) the allocation on the lab's cluster."""

    time: int | None = None
    time_given: bool = False
    ignored: list[int] = field(default_factory=list)  # #SBATCH lines sbatch would not read
    gpu_option: str = ""
    nodes: list[str] = field(default_factory=list)
    tasks: list[int] = field(default_factory=list)
    gpus: list[int] = field(default_factory=list)
    task_gpus: int | None = None


@dataclass(frozen=True)
class Call:
    """One call of a launcher or python the dry run recorded."""

    tool: str = ""
    argv: list[str] = field(default_factory=list)
    cwd: str = ""


@dataclass(frozen=True)
class DryRun:
    """The batch script's body run with bash, its launchers recording instead of starting
    (:class:`labkit.check.sbatch_dry.BatchRun`)."""

    code: int | None = None
    timed_out: bool = False
    seconds: float = 0.0
    bound: float = 0.0
    output: str = ""
    calls: list[Call] = field(default_factory=list)
    still_running: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    syntax: str = ""


@dataclass(frozen=True)
class Batch:
    """Step 2's file: refused as it stands, or read, allocated and run dry."""

    file: str
    exists: bool = False
    python: bool = False
    refused: str = ""
    request: Request | None = None
    run: DryRun | None = None
    launches: list[Launched] = field(default_factory=list)


@dataclass(frozen=True)
class Evidence:
    lab: str = "scale-out"
    hostfile: Hostfile | None = None
    batch: Batch | None = None  # only when step 2 is judged
    timed_out: bool = False


def read(data: Any) -> Evidence:
    """The check's evidence (decoded JSON) as :class:`Evidence`; :class:`typed.RecordError` names what is wrong."""
    return typed.parse(Evidence, data, "evidence")
