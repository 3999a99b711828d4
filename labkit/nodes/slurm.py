"""Slurm on virtual nodes (``labkit nodes up --slurm``): a controller on this machine, one slurmd per node.

munged runs with its own key and socket in the state folder; slurmctld runs here in a
UTS namespace of its own whose hostname is ``head`` (slurmctld only starts on the host
its config names); each node's slurmd joins the node's namespaces with ``nsenter`` (so
it keeps this machine's /sys and cgroup file systems). Commands reach the cluster with
``SLURM_CONF=STATE/slurm/slurm.conf``. Needs Debian's ``slurm-wlm`` and ``munge``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from labkit.core import proc
from labkit.core.tfconfig import free_ports
from labkit.nodes import net
from labkit.nodes import slurm_accounting as accounting
from labkit.nodes import slurm_seats as seats
from labkit.nodes.slurm_conf import CGROUP_CONF, SETTINGS, SLURMD_PORT, job_folders, tracking

if TYPE_CHECKING:
    from labkit.nodes.virtual import VirtualNodes


CGROUP_ROOT = Path("/sys/fs/cgroup")


class SlurmError(RuntimeError):
    """Slurm could not start on the virtual nodes; the message holds the daemons' logs."""


def _find(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


def missing() -> str | None:
    absent = [d for d in ("munged", "slurmctld", "slurmd", "sinfo", "sbatch", "srun") if not _find(d)]
    if absent:
        return f"{', '.join(absent)} not found: install Slurm and munge (`apt-get install slurm-wlm munge`)"
    return None


def node_memory_mib(count: int) -> int:
    """The memory each of ``count`` virtual nodes offers Slurm (MiB): half this machine's, shared out."""
    return max(256, psutil.virtual_memory().total // 2**20 // (2 * count))


def controller_port(conf: Path) -> int:
    """The port slurmctld listens on, as ``conf`` (a cluster's slurm.conf) says (6817, Slurm's default, otherwise)."""
    for line in conf.read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "SlurmctldPort" and value.strip().isdigit():
            return int(value.strip())
    return 6817


def conf_text(cluster: VirtualNodes, folder: Path, ports: tuple[int, int], munge_socket: Path) -> str:
    """``slurm.conf`` for the cluster: controller ``head`` on the bridge (``ports``: its own and, for a confined
    cluster, slurmdbd's), every node's CPUs = its slots."""
    port, dbd_port = ports
    memory = node_memory_mib(cluster.count)
    names = ",".join(n.name for n in cluster.nodes)
    return "\n".join([
        "# Written by labkit nodes up --slurm: Slurm on labkit's virtual nodes",
        f"ClusterName={accounting.CLUSTER}",
        f"SlurmctldHost=head({net.gateway()})",
        f"SlurmctldPort={port}",
        f"SlurmdPort={SLURMD_PORT}",  # each slurmd listens in its own node
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / '%n' / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / '%n' / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / '%n' / 'slurmd.log'}",
        f"TmpFS={folder / '%n' / 'tmp'}",  # job steps of different nodes must not share /tmp (pmix files)
        *SETTINGS,
        *tracking(cluster.confined),
        *(accounting.conf_lines(dbd_port, munge_socket) if cluster.confined else []),
        *([f"Prolog={folder / 'prolog.sh'}", f"TaskProlog={folder / 'task_prolog.sh'}",
           f"Epilog={folder / 'epilog.sh'}"] if cluster.confined else []),  # each job's own TMPDIR
        *([f"PlugStackConfig={folder / seats.PLUGSTACK}"] if cluster.confined else []),  # each account's own world
        *([f"DefMemPerCPU={memory // cluster.slots}"] if cluster.confined else []),
        "SlurmdParameters=config_overrides",  # the nodes share this machine's cores: CPUs are the slots
        *(f"NodeName={n.name} NodeAddr={n.address} CPUs={n.slots} RealMemory={memory} State=UNKNOWN"
          for n in cluster.nodes),
        f"PartitionName=nodes Nodes={names} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


def start(cluster: VirtualNodes, timeout: float = 60) -> dict[str, int]:
    """Start munged, slurmctld and a slurmd per node; the pids of the daemons outside the nodes."""
    problem = missing()
    if problem:
        raise SlurmError(problem)
    conf = cluster.slurm_conf
    folder = conf.parent
    munge = folder / "munge"
    for sub in (munge, folder / "state", *(folder / n.name / d for n in cluster.nodes for d in ("spool", "tmp"))):
        sub.mkdir(parents=True, exist_ok=True)
    munge.chmod(0o755)  # clients in every node reach the socket
    key = munge / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    sock = munge / "munge.socket.2"
    ports = (free_ports(1, net.gateway())[0], free_ports(1, "127.0.0.1")[0])
    conf.write_text(conf_text(cluster, folder, ports, sock))
    if cluster.confined:
        (folder / "cgroup.conf").write_text(CGROUP_CONF)
        for name, text in job_folders(str(folder)).items():
            (folder / name).write_text(text)
            (folder / name).chmod(0o755)
        for n in cluster.nodes:  # the jobs' own folders: each its user's; this one lists none of them to users
            (folder / n.name / "jobs").mkdir(mode=0o711, exist_ok=True)
            (folder / n.name / "jobs").chmod(0o711)
        _build_seats(folder)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    pids: dict[str, int] = {}
    p = net.daemon([_find("munged") or "munged", "-F", "--force", f"--socket={sock}", f"--key-file={key}",
                    f"--log-file={munge / 'munged.log'}", f"--pid-file={munge / 'munged.pid'}",
                    f"--seed-file={munge / 'seed'}"], munge / "out.log", env)
    cluster.children.append(p)
    pids["munged"] = p.pid
    _wait(sock.exists, "munged", timeout, [munge / "out.log"])
    if cluster.confined:  # per-user caps need Slurm's accounting, registered before slurmctld starts
        pids.update(_start_accounting(cluster, ports[1], sock, env, timeout))
    p = net.daemon(["unshare", "--uts", "--", "sh", "-c",
                    f"hostname head && exec {_find('slurmctld')} -D -i -f {conf}"], folder / "slurmctld.out", env)
    cluster.children.append(p)
    pids["slurmctld"] = p.pid
    for n in cluster.nodes:
        # A job's tasks inherit slurmd's hard limits (Slurm hands on only the submitter's soft ones): with a task
        # cap, a learner's job cannot raise its soft RLIMIT_NPROC past it (root's slurmd is not held by it).
        cap = ["prlimit", f"--nproc={cluster.task_cap}:{cluster.task_cap}", "--"] if cluster.task_cap else []
        argv = [*net.enter(n.holder or 0), *cap, _find("slurmd") or "slurmd", "-D", "-N", n.name, "-f", str(conf)]
        cluster.children.append(net.daemon(argv, folder / n.name / "slurmd.out", env))
    logs = [folder / "slurmctld.out", folder / "slurmctld.log", *(folder / n.name / "slurmd.out"
                                                                for n in cluster.nodes)]
    _wait(lambda: _idle(env, cluster.count), "slurmd on every node", timeout, logs)
    return pids


def _build_seats(folder: Path) -> None:
    """The plug-in that puts each workshop account's jobs in their own world (:mod:`labkit.nodes.slurm_seats`),
    built into ``folder``, its ``plugstack.conf`` and the (empty) folder of the accounts' hosts files."""
    problem = seats.missing()
    if problem:
        raise SlurmError(f"the plug-in that keeps learners' jobs apart cannot be built: {problem}")
    plugin = folder / seats.PLUGIN
    try:
        built = subprocess.run(seats.compile_argv(seats.SOURCE, plugin), capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmError(f"building {plugin.name} failed: {e}") from e
    if built.returncode != 0:
        raise SlurmError(f"building {plugin.name} failed:\n{built.stderr[-2000:]}")
    plugin.chmod(0o755)
    (folder / seats.PLUGSTACK).write_text(seats.plugstack_text(folder))
    (folder / seats.PLUGSTACK).chmod(0o644)
    seats.hosts_dir(folder).mkdir(mode=0o755, exist_ok=True)


def _start_accounting(cluster: VirtualNodes, port: int, munge_socket: Path, env: dict[str, str],
                      timeout: float) -> dict[str, int]:
    folder = cluster.slurm_conf.parent
    try:
        accounting.prepare(folder, port, munge_socket)
    except accounting.AccountingError as e:
        raise SlurmError(str(e)) from e
    pids = {}
    for name, argv, extra in (("mariadbd", accounting.mariadb_argv(folder), {}),
                              ("slurmdbd", accounting.slurmdbd_argv(), accounting.slurmdbd_env(folder))):
        p = net.daemon(argv, folder / f"{name}.out", {**env, **extra})
        cluster.children.append(p)
        pids[name] = p.pid
        ready = (lambda: accounting.db_socket(folder).exists()) if name == "mariadbd" else (
            lambda: accounting.answers(port))
        _wait(ready, name, timeout, [folder / f"{name}.out", folder / "mariadb.log", folder / "slurmdbd.log"])
    try:
        accounting.register(cluster.slurm_conf)
    except accounting.AccountingError as e:
        raise SlurmError(str(e)) from e
    return pids


def remove_groups(nodes: list[str], root: Path = CGROUP_ROOT) -> list[str]:
    """Remove the control groups a confined cluster's slurmd made for ``nodes`` (``slurm_NODE`` in each v1
    hierarchy, or at the v2 root), deepest first; they must hold no process any more. What was removed."""
    removed = []
    for name in nodes:
        for top in (*root.glob(f"*/slurm_{name}"), *root.glob(f"slurm_{name}")):
            if top.is_symlink() or not top.is_dir():
                continue
            for folder in sorted((d for d in top.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
                folder.rmdir()
            top.rmdir()
            removed.append(str(top))
    return removed


def _idle(env: dict[str, str], count: int) -> bool:
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=10, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return False
    states = [s.rstrip("*") for s in out.stdout.split()]
    return out.returncode == 0 and len(states) == count and all(s == "idle" for s in states)


def _wait(ready: Callable[[], bool], what: str, timeout: float, logs: list[Path]) -> None:
    if not proc.wait_until(ready, timeout, every=0.3):
        tails = "\n".join(f"--- {p}\n{p.read_text(errors='replace')[-800:]}" for p in logs if p.exists())
        raise SlurmError(f"Slurm did not start on the virtual nodes ({what} not ready in {timeout:g} s):\n{tails}")
