"""Learners' Slurm jobs (``workshop up --slurm``) limited by Slurm: a time limit and a memory limit per job.

The workshop starts the virtual nodes *confined* (``slurm_conf.CONFINED``: every job step in control groups
that hold it to its job's CPUs and memory) and sets the partition's limits live with ``scontrol update`` (the
nodes' own ``slurm.conf``, shared with lab 7, is not changed): ``MaxTime`` (a job asking for more stays pending,
a job without ``--time`` gets it and is ended when it runs out) and, when the workshop limits memory,
``DefMemPerNode`` and ``MaxMemPerNode`` (a job gets the learner's memory limit per node, and cannot ask for
more). ``down`` puts the old values back when the nodes were up before the workshop.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

DEFAULT_MINUTES = 30  # per learner's job: the labs' jobs take a few minutes
FIELDS = ("MaxTime", "DefMemPerNode", "MaxMemPerNode")  # the partition's settings the workshop sets
SLURM_TIME = re.compile(r"UNLIMITED|INFINITE|\d+|\d+:\d+(:\d+)?|\d+-\d+(:\d+(:\d+)?)?")
SLURM_MEMORY = re.compile(r"UNLIMITED|INFINITE|\d+")  # MiB


class SlurmLimitError(RuntimeError):
    """scontrol could not read or set the partition's limit; the message has its output."""


def scontrol(conf: Path, *args: str) -> str:
    env = {**os.environ, "SLURM_CONF": str(conf)}
    try:
        out = subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmLimitError(f"scontrol {' '.join(args)}: {e}") from e
    if out.returncode != 0:
        raise SlurmLimitError(f"scontrol {' '.join(args)} failed: {(out.stderr or out.stdout).strip()[-500:]}")
    return out.stdout


def _partition(conf: Path) -> dict[str, str]:
    for line in scontrol(conf, "show", "partition", "--oneliner").splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "PartitionName" in fields:
            return fields
    raise SlurmLimitError("Slurm lists no partition")


def current(conf: Path) -> dict[str, str]:
    """The default (first) partition's values of :data:`FIELDS` (``UNLIMITED`` when Slurm shows none)."""
    fields = _partition(conf)
    return {k: fields.get(k, "UNLIMITED") for k in FIELDS}


def for_jobs(minutes: int, memory_bytes: int | None) -> dict[str, str]:
    """The partition settings that hold each job to ``minutes`` and, when given, the memory per node."""
    values = {"MaxTime": str(minutes)}
    if memory_bytes:
        mib = str(max(1, memory_bytes // 2**20))
        values.update(DefMemPerNode=mib, MaxMemPerNode=mib)
    return values


def apply(conf: Path, values: dict[str, str]) -> None:
    """Set the partition's :data:`FIELDS` in ``values``, each checked first (nothing else can be slipped in)."""
    for key, value in values.items():
        pattern = SLURM_TIME if key == "MaxTime" else SLURM_MEMORY
        if key not in FIELDS or not pattern.fullmatch(value):
            raise SlurmLimitError(f"{key}={value!r} is not a partition limit labkit sets")
    name = _partition(conf)["PartitionName"]
    scontrol(conf, "update", f"PartitionName={name}", *(f"{k}={v}" for k, v in values.items()))
