"""Learners' Slurm jobs (``workshop up --slurm``) limited by Slurm: a time limit and a memory limit per job, and
caps on what each learner holds at once (running jobs, jobs in the queue, nodes).

The workshop starts the virtual nodes *confined* (``slurm_conf.CONFINED``: every job step in control groups
that hold it to its job's CPUs and memory) and sets the partition's limits live with ``scontrol update`` (the
nodes' own ``slurm.conf``, shared with lab 7, is not changed): ``MaxTime`` (a job asking for more stays pending,
a job without ``--time`` gets it and is ended when it runs out) and, when the workshop limits memory,
``DefMemPerNode`` and ``MaxMemPerNode`` (a job gets the learner's memory limit per node, and cannot ask for
more). ``down`` puts the old values back when the nodes were up before the workshop.

The caps per learner are a QOS in the confined cluster's accounting (:mod:`labkit.nodes.slurm_accounting`):
:func:`hold` gives every learner that QOS (a job past a cap waits, ``QOSMaxJobsPerUserLimit``; a submission past
the queue's cap is refused), the instructor an association without it; a user the workshop did not add cannot
submit at all. ``down`` removes them again (:func:`release`).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from labkit.nodes import slurm_accounting as accounting

DEFAULT_MINUTES = 30  # per learner's job: the labs' jobs take a few minutes
DEFAULT_RUNNING = 2  # jobs a learner has running at once
DEFAULT_NODES = 2  # nodes a learner's running jobs hold at once: lab 8's jobs span two
QUEUED_PER_RUNNING = 4  # a learner's jobs in the queue (running or waiting), per running job allowed
FIELDS = ("MaxTime", "DefMemPerNode", "MaxMemPerNode")  # the partition's settings the workshop sets
SLURM_TIME = re.compile(r"UNLIMITED|INFINITE|\d+|\d+:\d+(:\d+)?|\d+-\d+(:\d+(:\d+)?)?")
SLURM_MEMORY = re.compile(r"UNLIMITED|INFINITE|\d+")  # MiB


@dataclass(frozen=True)
class JobLimits:
    """What each learner's Slurm jobs may take: minutes per job, and jobs and nodes at once."""

    minutes: int = DEFAULT_MINUTES
    running: int = DEFAULT_RUNNING
    nodes: int = DEFAULT_NODES

    def caps(self) -> accounting.Caps:
        return accounting.Caps(running_jobs=self.running, queued_jobs=self.running * QUEUED_PER_RUNNING,
                               nodes=self.nodes)


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


def hold(conf: Path, learners: Sequence[str], instructor: str, jobs: JobLimits) -> None:
    """Give each learner the capped QOS of ``jobs`` and the instructor an uncapped association."""
    try:
        accounting.add_users(conf, learners, jobs.caps())
        accounting.run(conf, accounting.users_command("add", [instructor], capped=False))
    except accounting.AccountingError as e:
        raise SlurmLimitError(f"the learners' Slurm caps could not be set: {e}") from e


def release(conf: Path, names: Sequence[str]) -> None:
    """Remove the associations :func:`hold` made (their jobs ended first)."""
    try:
        accounting.delete_users(conf, names)
    except accounting.AccountingError as e:
        raise SlurmLimitError(f"the learners' Slurm associations could not be removed: {e}") from e
