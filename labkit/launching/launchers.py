"""Launchers: small classes behind one interface, in the manner of ipyparallel's.

A launcher builds the argument lists of the processes it starts on this machine
(:meth:`Launcher.commands`, testable without starting anything), checks what it
needs before a launch (:meth:`Launcher.preflight`), starts them in a
:class:`labkit.core.proc.Job` (:meth:`Launcher.start`), and releases what lives
outside the job, e.g. a batch queue entry (:meth:`Launcher.stop`).

CPU defaults (:func:`worker_env`): each worker gets ``cores // np`` threads for
TensorFlow, OpenMP and BLAS, and OpenMPI yields the core when a rank waits.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from labkit.core import contract, identity, proc
from labkit.core import env as lkenv
from labkit.launching import hosts, reach
from labkit.nodes import access


class LaunchError(RuntimeError):
    """The job cannot be started; the message says how to fix it."""


def default_threads(np: int, cores: int | None = None) -> int:
    """Threads per worker so that all workers together use each core once."""
    if np < 1:
        raise ValueError(f"need at least one worker, got np={np}")
    return max(1, (cores or identity.cpu_count()) // np)


def gpu_count() -> int:
    """NVIDIA GPUs on this machine, from ``nvidia-smi -L`` (no TensorFlow import)."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def worker_env(np: int, threads: int | None = None, gpus: int | None = None) -> dict[str, str]:
    """Environment each worker gets on top of the caller's (documented in the README)."""
    threads = threads or default_threads(np)
    env = dict(lkenv.DEFAULTS)
    env.update(lkenv.thread_env(threads))
    env[contract.THREADS] = str(threads)
    env["OMPI_MCA_mpi_yield_when_idle"] = "1"  # MPI waits yield the core instead of spinning
    if gpus is None:
        gpus = gpu_count()
    if not gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""  # no CUDA probing on CPU-only machines
    return env


def tool(name: str) -> str:
    """``name`` from this interpreter's environment if it is there, else from PATH."""
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def python_command(command: Sequence[str]) -> list[str]:
    """``command`` with a leading ``python``/``python3`` replaced by this interpreter."""
    return [sys.executable if c in ("python", "python3") else c for c in command]


def typed(argv: Sequence[str]) -> list[str]:
    """``argv`` as a person would type it in a terminal of the course's environment (pure): the launcher and
    the environment's own tools by name, this interpreter as ``python``, no ``nsenter ... --`` into a node."""
    argv = list(argv)
    if argv and Path(argv[0]).name == "nsenter" and "--" in argv:
        argv = argv[argv.index("--") + 1:]
    here = Path(sys.executable).parent
    shown = ["python" if a == sys.executable else Path(a).name if "/" in a and Path(a).parent == here else a
             for a in argv]
    return [Path(shown[0]).name, *shown[1:]] if shown else shown


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


@functools.lru_cache(maxsize=8)
def _mpirun_version(path: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"Open MPI\)?\s+(\d+)\.(\d+)(?:\.(\d+))?", out)
    return tuple(int(x) for x in found.groups() if x is not None) if found else None


def mpi_version() -> tuple[int, ...] | None:
    """The OpenMPI version of the ``mpirun`` labkit launches (:func:`tool`), e.g. ``(4, 1, 4)``; None without
    one. Asked once per path (``mpirun --version``) and cached."""
    path = tool("mpirun")
    return _mpirun_version(path) if ("/" in path and os.path.exists(path)) else None


DEFAULT_MPI_MAJOR = 4


def transport_flags(mpi_major: int) -> list[str]:
    """Shared memory within a node, TCP across nodes, no single-copy kernel mechanism (it needs ptrace rights
    containers often lack), for OpenMPI ``mpi_major`` (pure). OpenMPI 5 renamed the ``vader`` transport ``sm``
    and moved single copy into the ``smsc`` framework."""
    if mpi_major >= 5:
        return ["--mca", "btl", "self,sm,tcp", "--mca", "smsc", "^cma"]
    return ["--mca", "btl", "self,vader,tcp", "--mca", "btl_vader_single_copy_mechanism", "none"]


def mpirun_flags(np: int, host_list: Sequence[hosts.Host] | None = None, cores: int | None = None,
                 as_root: bool | None = None, mpi_major: int | None = None) -> list[str]:
    """The options labkit gives ``mpirun`` (also used for ipyparallel MPI engines), for OpenMPI ``mpi_major``
    (default: the detected ``mpirun``'s, :func:`mpi_version`, else 4)."""
    if np < 1:
        raise ValueError(f"need at least one worker, got np={np}")
    args = []
    if as_root if as_root is not None else _is_root():
        args.append("--allow-run-as-root")
    if host_list:
        args += ["-H", hosts.hosts_arg(host_list)]
        # Virtual nodes: their ssh config, TCP on their subnet only.
        args += access.mpirun_args([h.name for h in host_list])
    elif np > (cores or identity.cpu_count()):
        args.append("--oversubscribe")
    # Threads are limited per worker through env; binding to one core would starve
    # multi-threaded workers, so let the kernel place them.
    args += ["--bind-to", "none", "--map-by", "slot"]
    # Shared memory within a node, TCP across nodes; no InfiniBand probing noise.
    if mpi_major is None:
        mpi_major = (mpi_version() or (DEFAULT_MPI_MAJOR,))[0]
    return args + transport_flags(mpi_major)


def mpi_missing() -> str | None:
    if shutil.which(tool("mpirun")):
        return None
    return ("mpirun was not found. Install OpenMPI: `sudo apt-get install openmpi-bin libopenmpi-dev` "
            "(or run `make setup`), or use launcher='gloo'.")


Command = tuple[str, list[str], dict[str, str]]  # (name, argv, extra environment) of one local process


class Launcher:
    """Starts ``np`` workers of one command; subclasses say how."""

    name: ClassVar[str] = ""
    strip_tags: ClassVar[bool] = False  # output lines carry per-rank tags to remove

    def __init__(self, np: int = 2, host_list: Sequence[hosts.Host] | None = None, cores: int | None = None,
                 as_root: bool | None = None) -> None:
        if np < 1:
            raise LaunchError(f"need at least one worker, got np={np}")
        self.np = np
        self.hosts = list(host_list or [])
        self.cores = cores
        self.as_root = as_root

    def commands(self, command: Sequence[str], env: Mapping[str, str]) -> list[Command]:
        """The processes to start here for ``command`` on ``np`` workers (pure)."""
        raise NotImplementedError

    def preflight(self) -> None:
        """Raise :class:`LaunchError` with a fix when the launch cannot work."""
        problem = lkenv.keras_problem()
        if problem:
            raise LaunchError(problem)
        if self.hosts:
            try:
                hosts.validate(self.hosts, self.np)
                reach.ssh_preflight(self.hosts)
            except hosts.HostError as e:
                raise LaunchError(str(e)) from None

    def start(self, job: proc.Job, command: Sequence[str], env: Mapping[str, str], log_dir: Path,
              on_output: Callable[[bytes], None] | None = None, on_end: Callable[[], None] | None = None,
              cwd: str | Path | None = None) -> list[proc.Proc]:
        """Start the processes in ``job``; the first one's output goes to ``on_output``."""
        started = []
        for i, (name, argv, extra) in enumerate(self.commands(command, env)):
            started.append(job.spawn(argv, env={**env, **extra}, cwd=cwd, log=log_dir / f"{name}.out",
                                     on_output=on_output if i == 0 else None, on_end=on_end if i == 0 else None,
                                     name=name))
        return started

    def stop(self) -> None:
        """Release what the launch holds outside the job's processes (nothing by default)."""


class MPIRun(Launcher):
    """``mpirun -np N [-H hosts] -x VAR ... COMMAND`` (OpenMPI)."""

    name = "mpirun"

    def commands(self, command: Sequence[str], env: Mapping[str, str]) -> list[Command]:
        args = [tool("mpirun"), "-np", str(self.np), *mpirun_flags(self.np, self.hosts, self.cores, self.as_root)]
        for key in sorted(env):
            args += ["-x", key]
        return [("launcher", args + list(command), {})]

    def preflight(self) -> None:
        problem = mpi_missing()
        if problem:
            raise LaunchError(problem)
        super().preflight()


class HorovodRun(Launcher):
    """``horovodrun -np N -H hosts --mpi COMMAND`` (Horovod's own launcher over MPI)."""

    name = "horovodrun"
    strip_tags = True
    controller = "--mpi"
    cwd: str | None = None

    def start(self, job: proc.Job, command: Sequence[str], env: Mapping[str, str], log_dir: Path,
              on_output: Callable[[bytes], None] | None = None, on_end: Callable[[], None] | None = None,
              cwd: str | Path | None = None) -> list[proc.Proc]:
        self.cwd = str(Path(cwd or os.getcwd()).resolve())  # where it starts, also on a virtual node
        return super().start(job, command, env, log_dir, on_output, on_end, cwd)

    def commands(self, command: Sequence[str], env: Mapping[str, str]) -> list[Command]:
        where = hosts.hosts_arg(self.hosts) if self.hosts else f"localhost:{self.np}"
        # Virtual nodes: run it on the first node.
        head, extra = access.head_node([h.name for h in self.hosts], self.cwd)
        return [("launcher", [*head, tool("horovodrun"), "-np", str(self.np), "-H", where, self.controller, *command],
                 extra)]

    def preflight(self) -> None:
        problem = mpi_missing() if self.controller == "--mpi" else None
        if problem:
            raise LaunchError(problem)
        if not Path(tool("horovodrun")).exists() and not shutil.which("horovodrun"):
            raise LaunchError("horovodrun was not found: Horovod is not installed in this environment; "
                              "run `make setup`.")
        super().preflight()


class Gloo(HorovodRun):
    """``horovodrun --gloo``: Horovod's launcher without MPI."""

    name = "gloo"
    controller = "--gloo"


class Elastic(Gloo):
    """``horovodrun`` in elastic mode (Gloo): the job runs on whichever hosts ``discover_hosts.sh`` prints now,
    between ``min_np`` and ``np`` workers. The script prints ``LOG_DIR/hosts.now`` (``host:slots`` lines), which
    starts as the host list: change that file and the job shrinks or grows at its next commit."""

    name = "elastic"
    min_np = 1

    def start(self, job: proc.Job, command: Sequence[str], env: Mapping[str, str], log_dir: Path,
              on_output: Callable[[bytes], None] | None = None, on_end: Callable[[], None] | None = None,
              cwd: str | Path | None = None) -> list[proc.Proc]:
        if not self.hosts:
            raise LaunchError("elastic training needs a host list or a hostfile (e.g. `labkit nodes up`'s)")
        hosts_file, script = self.files(env)
        hosts_file.write_text("".join(f"{h.name}:{hosts.slots(h)}\n" for h in self.hosts))
        script.write_text(f"#!/bin/sh\n# the hosts the elastic job may use now (labkit run --launcher elastic)\n"
                          f"cat {shlex.quote(str(hosts_file))}\n")
        script.chmod(0o755)
        return super().start(job, command, env, log_dir, on_output, on_end, cwd)

    @staticmethod
    def files(env: Mapping[str, str]) -> tuple[Path, Path]:
        """``hosts.now`` and ``discover_hosts.sh`` in the job's log folder."""
        folder = Path(env.get(contract.LOG_DIR) or ".").resolve()
        return folder / "hosts.now", folder / "discover_hosts.sh"

    def commands(self, command: Sequence[str], env: Mapping[str, str]) -> list[Command]:
        head, extra = access.head_node([h.name for h in self.hosts], self.cwd)
        # Every host this one: horovodrun cannot tell the interfaces from other hosts' and waits out its elastic
        # timeout before it asks for one; the loopback is the one.
        local = ["--network-interface", "lo"] if all(hosts.is_local(h.name) for h in self.hosts) else []
        return [("launcher", [*head, tool("horovodrun"), "-np", str(self.np), "--min-np", str(self.min_np),
                              "--max-np", str(self.np), "--host-discovery-script", str(self.files(env)[1]), "--gloo",
                              *local, *command], extra)]


def remote_command(host: str, argv: Sequence[str], env: Mapping[str, str], cwd: str | Path | None = None,
                ssh_args: Sequence[str] = ()) -> list[str]:
    """``ssh HOST 'cd CWD && env K=V ... ARGV'``: ``argv`` run on ``host`` with ``env``.

    ``-tt`` gives the remote command a terminal, so it is hung up when the connection
    closes: stopping the local ssh stops the remote process too.
    """
    remote = ["env", *(f"{k}={v}" for k, v in sorted(env.items())), *argv]
    line = shlex.join(remote)
    if cwd:
        line = f"cd {shlex.quote(str(cwd))} && exec {line}"
    return ["ssh", "-tt", "-o", "BatchMode=yes", *ssh_args, host, line]


class SSH(Launcher):
    """One process per slot over ssh (no MPI): each worker gets ``LABKIT_RANK`` and the job's env.

    Meant for scripts that find their peers themselves (a ``TF_CONFIG`` per worker,
    see :class:`labkit.tfdist.cluster.Cluster`, or a custom rendezvous); local hosts run
    without ssh.
    """

    name = "ssh"

    def __init__(self, np: int = 2, host_list: Sequence[hosts.Host] | None = None, ssh_args: Sequence[str] = (),
                 cwd: str | Path | None = None, **kw: object) -> None:
        super().__init__(np, host_list, **kw)
        if not self.hosts:
            raise LaunchError("the ssh launcher needs hosts: give --hosts h1:2,h2:2 or --hostfile FILE")
        self.ssh_args = list(ssh_args) or access.ssh_args([h.name for h in self.hosts])
        self.cwd = cwd or os.getcwd()

    def start(self, job: proc.Job, command: Sequence[str], env: Mapping[str, str], log_dir: Path,
              on_output: Callable[[bytes], None] | None = None, on_end: Callable[[], None] | None = None,
              cwd: str | Path | None = None) -> list[proc.Proc]:
        if cwd:  # remote ranks start in the same folder as local ones
            self.cwd = str(Path(cwd).resolve())
        return super().start(job, command, env, log_dir, on_output, on_end, cwd)

    def commands(self, command: Sequence[str], env: Mapping[str, str]) -> list[Command]:
        out = []
        for rank, host in enumerate(hosts.place(self.hosts, self.np)):
            extra = {contract.RANK: str(rank)}
            if hosts.is_local(host):
                out.append((f"rank.{rank}", list(command), extra))
            else:
                out.append((f"rank.{rank}", remote_command(host, command, {**env, **extra}, self.cwd, self.ssh_args),
                            {}))
        return out
