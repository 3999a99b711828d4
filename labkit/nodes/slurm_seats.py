"""The Slurm plug-in that puts each workshop account's jobs in the account's own world on each node.

A confined cluster (a workshop's) loads ``labkit_seats.so`` in every slurmd (``PlugStackConfig``). The plug-in
(``labkit/nodes/spank/labkit_seats.c``, a SPANK plug-in, compiled here when the nodes start: needs ``gcc`` and
``libslurm-dev``'s header) acts in each task of a job, as root, before the task becomes its user: when the user
has a network namespace ``/run/netns/lkn-NODE-USER`` on the node (the workshop's seats,
:mod:`labkit.workshop.nodeworlds`), the task joins it, and in a mount namespace of its own gets ``/etc/hosts``
from :func:`hosts_dir` (each node's name is the account's own address there) and the job's own ``/tmp``,
``/var/tmp`` and ``/dev/shm`` (the folders root's Prolog made, :mod:`labkit.nodes.slurm_conf`). So one learner's
batch jobs reach their own jobs on every node and nobody else's, and share no temporary folder with them. A job
of a user without a seat (root's, the servers') is left as it is; one with a seat that cannot be put in it does
not start.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from labkit.nodes import net
from labkit.nodes.slurm_conf import SAFE_PATH

SOURCE = Path(__file__).parent / "spank" / "labkit_seats.c"
HEADER = Path("/usr/include/slurm/spank.h")
PLUGIN = "labkit_seats.so"
PLUGSTACK = "plugstack.conf"
SEAT_PREFIX = "lkn-"  # an account's namespace on a node: lkn-NODE-NAME (labkit.workshop.nodeworlds makes them)


def missing() -> str | None:
    """Why the plug-in cannot be built here, or None."""
    if shutil.which("gcc") is None:
        return "gcc not found: install it (`apt-get install gcc`, or `make setup` as root)"
    if not HEADER.is_file():
        return f"{HEADER} not found: install Slurm's plug-in header (`apt-get install libslurm-dev`, or `make setup`)"
    return None


def compile_argv(source: Path, out: Path) -> list[str]:
    """The compiler's command that builds the plug-in (an argument list; nothing is started)."""
    return ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(out), str(source)]


def hosts_dir(folder: Path) -> Path:
    """Where each account's hosts file lies, in the cluster's Slurm folder ``folder`` (root's)."""
    return folder / "hosts"


def plugstack_text(folder: Path) -> str:
    """``plugstack.conf`` for the cluster whose Slurm folder is ``folder`` (its nodes' folders inside it)."""
    paths = [folder / PLUGIN, net.NETNS_DIR, hosts_dir(folder), folder]
    bad = [str(p) for p in paths if not SAFE_PATH.fullmatch(str(p))]
    if bad:
        raise ValueError(f"{bad[0]!r}: the plug-in's paths must be absolute, of letters, digits and _./+-")
    return (f"# Written by labkit: each workshop account's jobs in their own network and folders\n"
            f"required {folder / PLUGIN} netns={net.NETNS_DIR} prefix={SEAT_PREFIX} hosts={hosts_dir(folder)} "
            f"nodes={folder}\n")
