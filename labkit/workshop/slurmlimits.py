"""Learners' Slurm jobs (``workshop up --slurm``) limited by Slurm: a time limit on the virtual nodes' partition.

The workshop sets the partition's ``MaxTime`` live with ``scontrol update`` (the virtual nodes' own
``slurm.conf``, shared with lab 7, is not changed) and ``down`` puts the old value back when the nodes were
up before the workshop. A job asking for more than ``MaxTime`` stays pending; a job without ``--time`` gets
``MaxTime`` and is ended by Slurm when it runs out. Cores and memory of a job are not limited by Slurm here:
the virtual nodes run ``TaskPlugin=task/none`` (docs/workshop.md says why).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

DEFAULT_MINUTES = 30  # per learner's job: the labs' jobs take a few minutes
SLURM_TIME = re.compile(r"UNLIMITED|INFINITE|\d+|\d+:\d+(:\d+)?|\d+-\d+(:\d+(:\d+)?)?")


class SlurmLimitError(RuntimeError):
    """scontrol could not read or set the partition's limit; the message has its output."""


def _scontrol(conf: Path, *args: str) -> str:
    env = {**os.environ, "SLURM_CONF": str(conf)}
    try:
        out = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmLimitError(f"scontrol {' '.join(args)}: {e}") from e
    if out.returncode != 0:
        raise SlurmLimitError(f"scontrol {' '.join(args)} failed: {(out.stderr or out.stdout).strip()[-500:]}")
    return out.stdout


def partition(conf: Path) -> tuple[str, str]:
    """The default (first) partition's name and its ``MaxTime``."""
    for line in _scontrol(conf, "show", "partition", "--oneliner").splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "PartitionName" in fields:
            return fields["PartitionName"], fields.get("MaxTime", "UNLIMITED")
    raise SlurmLimitError("Slurm lists no partition")


def max_time(conf: Path) -> str:
    return partition(conf)[1]


def set_max_time(conf: Path, value: str) -> None:
    """Set the partition's ``MaxTime`` (minutes, or ``UNLIMITED``)."""
    if not SLURM_TIME.fullmatch(value):
        raise SlurmLimitError(f"MaxTime {value!r} is not a Slurm time")
    name, _ = partition(conf)
    _scontrol(conf, "update", f"PartitionName={name}", f"MaxTime={value}")
