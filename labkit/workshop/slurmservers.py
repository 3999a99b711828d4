"""The Slurm side of learners' servers as jobs (``workshop up --spawner slurm``): their partition and, on
``down``, the end of every job the workshop's users still have.

The servers' partition (:data:`PARTITION`) spans the workshop's nodes, is created live with ``scontrol create``
(the nodes' own ``slurm.conf``, shared with lab 7, is not changed) and deleted by ``down``. It is ``RootOnly``:
only root's jobs run there (the hub submits each server as root's job, which becomes the learner on its node),
so a learner's own jobs stay in the default partition with its time limit. ``LLN`` (least loaded node) spreads
the servers over the nodes instead of filling one first. Its memory per node is the learners' limit when there
is one, like the default partition's.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from labkit.workshop import slurmlimits

PARTITION = "labkit-servers"
NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")  # a Unix user's or a node's name: written into commands root runs


def partition_args(nodes: list[str], memory_mib: int | None) -> list[str]:
    """``scontrol`` arguments that create the servers' partition on ``nodes``."""
    bad = [n for n in nodes if not NAME.fullmatch(n)]
    if bad or not nodes:
        raise ValueError(f"node names {bad or nodes!r} are not names labkit gives its nodes")
    args = ["create", f"PartitionName={PARTITION}", f"Nodes={','.join(nodes)}", "RootOnly=YES", "LLN=YES",
            "MaxTime=UNLIMITED", "Default=NO", "State=UP"]
    if memory_mib:
        args.append(f"MaxMemPerNode={int(memory_mib)}")
    return args


def create(conf: Path, nodes: list[str], memory_mib: int | None = None) -> None:
    """Create the servers' partition (:class:`~labkit.workshop.slurmlimits.SlurmLimitError` when Slurm refuses)."""
    slurmlimits.scontrol(conf, *partition_args(nodes, memory_mib))


def exists(conf: Path) -> bool:
    try:
        slurmlimits.scontrol(conf, "show", "partition", PARTITION)
    except slurmlimits.SlurmLimitError:
        return False
    return True


def remove(conf: Path) -> list[str]:
    """Delete the servers' partition when it is there (its jobs cancelled first: Slurm keeps a busy partition);
    the jobs ended."""
    if not exists(conf):
        return []
    ended = cancel(conf, partition=PARTITION)
    slurmlimits.scontrol(conf, "delete", f"PartitionName={PARTITION}")
    return ended


def cancel(conf: Path, users: Sequence[str] = (), partition: str | None = None, timeout: float = 60) -> list[str]:
    """``scancel`` every job of ``users`` (and of ``partition``), then wait until Slurm lists none; what was ended."""
    env = {"SLURM_CONF": str(conf), "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"}
    filters = [["--user", u] for u in users if NAME.fullmatch(u)] + ([["--partition", partition]] if partition else [])
    ended = []
    for f in filters:
        listed = _jobs(env, f)
        if listed:
            subprocess.run(["scancel", "--full", *f], env=env, capture_output=True, timeout=30)
            ended += [f"Slurm job {j} ({' '.join(f)[2:]})" for j in listed]
    deadline = time.monotonic() + timeout
    while any(_jobs(env, f) for f in filters) and time.monotonic() < deadline:
        time.sleep(0.5)
    return ended


def _jobs(env: dict[str, str], filt: list[str]) -> list[str]:
    out = subprocess.run(["squeue", "--noheader", "--format=%i", *filt], env=env, capture_output=True, text=True,
                         timeout=30)
    return out.stdout.split() if out.returncode == 0 else []
