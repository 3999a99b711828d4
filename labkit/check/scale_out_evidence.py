"""The evidence of the scale-out lab's check, typed: the hostfile's job maps and the batch script's dry run.

:func:`labkit.check.lab_scale_out.collect` returns a :class:`ScaleOutEvidence`, its judges read it, and the check saves
it as JSON and reads it back once, every field checked (:mod:`labkit.records.evidence`). The job maps
(:class:`labkit.launching.mpimap.JobMap`) and launches (:class:`labkit.check.scale_out_ranks.Launched`) are kept as
the dataclasses the check made. The JSON has the keys it always had: what a file that is missing, refused or not
run never had is left out of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from labkit.check.sbatch_dry import BatchRun
from labkit.check.scale_out_ranks import Launched
from labkit.launching.mpimap import JobMap
from labkit.records import typed
from labkit.records.evidence import Evidence


@dataclass(frozen=True)
class Hostfile:
    """Step 1's file: the map of ``mpirun --hostfile FILE -np 8`` (``map``) and every slot it offers (``offered``)."""

    file: str
    exists: bool = False
    map: JobMap | None = field(default=None, metadata=typed.OMIT_NONE)  # None: no file to map
    offered: JobMap | None = field(default=None, metadata=typed.OMIT_NONE)
    mapper: str = field(default="mpirun", metadata=typed.omit_unless("map"))  # or "labkit", where there is no mpirun
    command: str = field(default="", metadata=typed.omit_unless("map"))


@dataclass(frozen=True)
class Request:
    """What the batch script asks Slurm for, and (when Slurm would grant it) the allocation on the lab's cluster:
    its nodes, tasks and GPUs by node, and the GPUs bound to each task (None when each task sees its node's), all
    None without one."""

    time: int | None = None
    time_given: bool = False
    ignored: list[int] = field(default_factory=list)  # #SBATCH lines sbatch would not read
    gpu_option: str = ""
    nodes: list[str] | None = field(default=None, metadata=typed.OMIT_NONE)
    tasks: list[int] | None = field(default=None, metadata=typed.omit_unless("nodes"))
    gpus: list[int] | None = field(default=None, metadata=typed.omit_unless("nodes"))
    task_gpus: int | None = field(default=None, metadata=typed.omit_unless("nodes"))


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

    @classmethod
    def of(cls, run: BatchRun) -> DryRun:
        """What the dry run ``run`` did, as kept: its calls without their environment, its time rounded."""
        return cls(code=run.code, timed_out=run.timed_out, seconds=round(run.seconds, 2), bound=run.bound,
                   output=run.output, calls=[Call(c.tool, list(c.argv), c.cwd) for c in run.calls],
                   still_running=list(run.still_running), left=list(run.left), syntax=run.syntax)


@dataclass(frozen=True)
class Batch:
    """Step 2's file: refused as it stands, or read, allocated and run dry."""

    file: str
    exists: bool = False
    python: bool = field(default=False, metadata=typed.OMIT_DEFAULT)  # a Python file given as the batch script
    refused: str = field(default="", metadata=typed.OMIT_DEFAULT)  # why sbatch or Slurm would refuse it
    request: Request | None = field(default=None, metadata=typed.OMIT_NONE)
    run: DryRun | None = field(default=None, metadata=typed.OMIT_NONE)
    launches: list[Launched] | None = field(default=None, metadata=typed.OMIT_NONE)  # with the dry run


@dataclass(frozen=True)
class ScaleOutEvidence(Evidence):
    """The scale-out check: step 1's hostfile, and step 2's batch script (only when step 2 is judged)."""

    lab: str = "scale-out"
    hostfile: Hostfile | None = field(default=None, metadata=typed.OMIT_NONE)
    batch: Batch | None = field(default=None, metadata=typed.OMIT_NONE)
    timed_out: bool | None = field(default=None, metadata=typed.OMIT_NONE)  # the dry run's, with the batch script

    def cut_short(self) -> bool:
        return bool(self.timed_out)
