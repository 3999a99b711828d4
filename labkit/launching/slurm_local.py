"""A single-node Slurm cluster on the loopback address, for trying Slurm jobs on one machine.

    with LocalSlurm() as cluster:             # munged, slurmctld and slurmd in a scratch folder
        os.environ.update(cluster.env())      # SLURM_CONF: sbatch, squeue, scancel talk to it
        ...                                   # labkit run --launcher slurm ...

It needs Debian's ``slurm-wlm`` and ``munge`` (``make setup-slurm``) and root, as
slurmd starts jobs as their users. Everything runs from a generated
``slurm.conf`` that declares this machine's CPUs and memory; nothing under
``/etc`` is touched, and :meth:`LocalSlurm.stop` stops every daemon it started.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from labkit.core import files, proc
from labkit.core.tfconfig import free_ports
from labkit.launching import slurm
from labkit.launching.launchers import LaunchError
from labkit.nodes.slurm_conf import SETTINGS, UNCONFINED

DAEMONS = ("munged", "slurmctld", "slurmd")


def missing() -> str | None:
    """Why a local cluster cannot start here, or None."""
    absent = [d for d in (*DAEMONS, "sbatch", "squeue", "scancel") if not _find(d)]
    if absent:
        return (f"{', '.join(absent)} not found: install Slurm and munge (`sudo apt-get install slurm-wlm munge`, "
                "or `make setup-slurm`)")
    if os.geteuid() != 0:
        return "a local Slurm cluster needs root (slurmd starts jobs as their users)"
    return None


def _find(name: str) -> str | None:
    return shutil.which(name) or next((str(p) for d in ("/usr/sbin", "/sbin") if (p := Path(d) / name).exists()),
                                      None)


def slurm_conf(folder: Path, node: str, cpus: int, memory_mb: int, ports: tuple[int, int],
               munge_socket: Path) -> str:
    """The ``slurm.conf`` of a one-node cluster whose daemons keep all state in ``folder``."""
    return "\n".join([
        "# Written by labkit.launching.slurm_local: a one-node cluster on the loopback address",
        "ClusterName=labkit",
        f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={munge_socket}",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}",
        *SETTINGS,
        *UNCONFINED,
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN",
        # Oversubscription lets a lab put more ranks than cores on this one node.
        f"PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
        "",
    ])


class LocalSlurm:
    """munged + slurmctld + slurmd for this machine, in a scratch folder; stopped on exit."""

    def __init__(self, folder: str | Path | None = None, cpus: int | None = None) -> None:
        self.folder = Path(folder or tempfile.mkdtemp(prefix="labkit-slurm-"))
        self.owned = folder is None  # a scratch folder of its own is removed when the cluster stops
        self.node = socket.gethostname().split(".")[0]
        self.cpus = cpus or psutil.cpu_count() or 1
        self.job = proc.Job()
        self.conf = self.folder / "slurm.conf"
        self.started = 0.0
        self.stopped = False

    def env(self) -> dict[str, str]:
        """What Slurm's commands need to talk to this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 60) -> LocalSlurm:
        problem = missing()
        if problem:
            raise LaunchError(problem)
        self.started = time.time() - 1
        for sub in ("state", "spool", "munge"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        munge = self.folder / "munge"
        munge.chmod(0o711)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        sock = munge / "munge.socket.2"
        memory = max(1024, psutil.virtual_memory().total // 2**20 - 1024)
        self.conf.write_text(slurm_conf(self.folder, self.node, self.cpus, memory, tuple(free_ports(2)), sock))
        env = self.env()
        try:
            self.job.spawn([_find("munged") or "munged", "-F", "--force", f"--socket={sock}", f"--key-file={key}",
                            f"--log-file={munge / 'munged.log'}", f"--pid-file={munge / 'munged.pid'}",
                            f"--seed-file={munge / 'seed'}"], log=munge / "out.log", name="munged")
            self._wait_for(lambda: sock.exists(), "munged", timeout)
            self.job.spawn([_find("slurmctld") or "slurmctld", "-D", "-i", "-f", str(self.conf)], env=env,
                           log=self.folder / "slurmctld.out", name="slurmctld")
            self.job.spawn([_find("slurmd") or "slurmd", "-D", "-f", str(self.conf)], env=env,
                           log=self.folder / "slurmd.out", name="slurmd")
            self._wait_for(self._node_ready, "slurmd", timeout)
        except BaseException:
            self.stop()
            raise
        atexit.register(self.stop)
        return self

    def _node_ready(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, timeout=20,
                             env={**os.environ, **self.env()})
        return out.returncode == 0 and out.stdout.strip().rstrip("*") in ("idle", "mixed", "allocated")

    def _wait_for(self, ready: object, what: str, timeout: float) -> None:
        if not proc.wait_until(ready, timeout, every=0.3):
            logs = "\n".join(p.output()[-2000:] for p in self.job.procs)
            raise LaunchError(f"the local Slurm cluster did not start ({what} not ready in {timeout:.0f} s):\n{logs}")

    def use(self) -> LocalSlurm:
        """Point this process's Slurm commands (and the processes it starts) at this cluster."""
        os.environ.update(self.env())
        return self

    def queue(self) -> list[str]:
        """Job ids Slurm holds now."""
        out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=20,
                             env={**os.environ, **self.env()})
        return out.stdout.split()

    def stop(self) -> None:
        """Cancel every job, then stop the daemons (and anything they started)."""
        if self.stopped:
            return
        self.stopped = True
        if any(p.alive() for p in self.job.procs):
            try:
                subprocess.run(["scancel", "--full", "--quiet", "-u", "root"], capture_output=True, timeout=30,
                               env={**os.environ, **self.env()})
            except (OSError, subprocess.TimeoutExpired):
                pass  # the daemons are stopped below, and their jobs with them
        self.job.stop(grace=5)
        # Job steps run under slurmstepd, which slurmd starts with an environment of its own.
        for p in psutil.process_iter(["name", "create_time"]):
            if p.info["name"] == "slurmstepd" and (p.info["create_time"] or 0) >= self.started:
                try:
                    p.kill()
                except psutil.Error:
                    pass
        if self.owned:
            try:
                files.remove_tree(self.folder)
            except OSError:
                pass  # a job's file that cannot go stays; the daemons are stopped

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def reach() -> LocalSlurm | bool:
    """A Slurm cluster to submit to: ``True`` when one already answers, else a started single-node
    :class:`LocalSlurm` when this machine can run one, else ``False`` (say why with :func:`missing`)."""
    if slurm.reachable():
        return True
    if missing():
        return False
    return LocalSlurm().start().use()
