"""What a Slurm batch script asks for: the options, checked, and their ``#SBATCH`` lines.

Shared by the batch script labkit submits (:mod:`labkit.launching.slurm`) and the one it writes for users to submit
themselves (:mod:`labkit.launching.slurm_plain`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from labkit.launching.launchers import LaunchError

STARTS = ("mpirun", "srun", "tf_config")
_TIME = re.compile(r"^(\d+-)?\d{1,3}(:\d{2}){0,2}$")
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass
class SlurmOptions:
    """What the batch script asks Slurm for, and whether it runs the ranks without labkit (``plain``)."""

    nodes: int = 1
    tasks_per_node: int = 2
    gpus_per_task: int | None = None
    cpus_per_task: int | None = None
    partition: str | None = None
    account: str | None = None
    time: str | None = None
    job_name: str = "labkit"
    start: str = "mpirun"
    plain: bool = False  # a script to submit yourself, needing no labkit on the nodes (labkit.launching.slurm_plain)
    script_only: str | Path | None = None  # write the batch script to this file and submit nothing

    def check(self) -> None:
        """Raise :class:`LaunchError` naming the bad option."""
        if self.nodes < 1 or self.tasks_per_node < 1:
            raise LaunchError(f"need at least one node and one task per node, got --nodes {self.nodes} "
                              f"--tasks-per-node {self.tasks_per_node}")
        for name in ("gpus_per_task", "cpus_per_task"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise LaunchError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
        if self.time is not None and not _TIME.match(self.time):
            raise LaunchError(f"--time {self.time!r} is not a Slurm time: use HH:MM:SS, MM:SS or D-HH:MM:SS")
        for name in ("partition", "account", "job_name"):
            value = getattr(self, name)
            if value is not None and not _NAME.match(value):
                raise LaunchError(f"--{name.replace('_', '-')} {value!r}: letters, digits, '.', '_' and '-' only")
        if self.start not in STARTS:
            raise LaunchError(f"unknown start {self.start!r}: choose one of {', '.join(STARTS)}")


def output_pattern(folder: str | Path, name: str = "slurm-%j.out") -> str:
    """``folder/name`` for ``--output``: a ``%`` in the folder doubled, as Slurm reads ``%j`` and the like."""
    return str(Path(str(folder).replace("%", "%%")) / name)


def directive_value(value: str) -> str:
    """A value as an ``#SBATCH`` line takes it: in double quotes when it has spaces."""
    if '"' in value or "\n" in value:
        raise LaunchError(f"Slurm cannot take a path with a double quote or a line break: {value!r}")
    return f'"{value}"' if any(c.isspace() for c in value) else value


def directives(o: SlurmOptions, output: str) -> list[str]:
    """The ``#SBATCH`` lines for ``o``."""
    lines = [f"--job-name={o.job_name}", f"--nodes={o.nodes}", f"--ntasks-per-node={o.tasks_per_node}"]
    if o.cpus_per_task:
        lines.append(f"--cpus-per-task={o.cpus_per_task}")
    if o.gpus_per_task:
        lines.append(f"--gpus-per-node={o.gpus_per_task * o.tasks_per_node}")
    for flag, value in (("partition", o.partition), ("account", o.account), ("time", o.time)):
        if value:
            lines.append(f"--{flag}={value}")
    lines.append(f"--output={directive_value(output)}")
    return [*(GPU_NOTE if o.gpus_per_task else []), *(f"#SBATCH {line}" for line in lines)]


# Why GPUs are asked per node: the scripts pin `gpus[hvd.local_rank()]`, which needs every GPU of the node
# visible to every rank. Where Slurm binds one GPU to each task (--gpus-per-task), each rank sees only its own,
# as GPU 0, and local rank 1 finds no gpus[1].
GPU_NOTE = ["# GPUs per node, not per task: every rank sees all of its node's GPUs and takes its own by local",
            "# rank (gpus[hvd.local_rank()]); bound one per task, each rank would see only its own as GPU 0."]
