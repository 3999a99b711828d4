"""``labkit run``: the command line of :func:`labkit.launching.launch.run`."""

from __future__ import annotations

import sys

from labkit.core.cliargs import add_script, nonnegative_int, positive_float, positive_int
from labkit.launching.jobspec import JobSpec
from labkit.launching.launch import run
from labkit.launching.launchers import (
    LaunchError,
)
from labkit.launching.slurm import SlurmOptions
from labkit.launching.table import names


def add_cli(sub) -> None:
    """Register ``labkit run``."""
    p = sub.add_parser(
        "run", help="run a command on N workers",
        description="Run SCRIPT (or a whole COMMAND after --) on N workers, stream rank 0, log every rank.",
        epilog="examples:\n  labkit run labs/fashion_mnist.py --np 2 -- --epochs 1\n"
               "  labkit run --np 2 -- python labs/fashion_mnist.py --epochs 1",
    )
    p.add_argument("--np", type=positive_int, default=None,
        help="number of workers (default: 2, or nodes x tasks with slurm)")
    p.add_argument("--launcher", choices=names(), default="mpirun", help="default: %(default)s")
    p.add_argument("--timeout", type=positive_float, default=None, help="seconds before every rank is killed")
    p.add_argument("--threads", type=positive_int, default=None, help="threads per worker (default: cores // np)")
    p.add_argument("-H", "--hosts", default=None, help="host list, e.g. node1:2,node2:2 (mpirun, horovodrun, ssh)")
    p.add_argument("--hostfile", default=None, help="OpenMPI hostfile: one 'HOST slots=N' per line")
    p.add_argument("--log-dir", default=None, help="folder for rank.N.log (default: runs/logs/<time>)")
    s = p.add_argument_group("Slurm (--launcher slurm)")
    s.add_argument("--nodes", type=positive_int, default=None, help="nodes to allocate (default: 1)")
    s.add_argument("--tasks-per-node", type=positive_int, default=None, help="ranks per node (default: --np or 2)")
    s.add_argument("--gpus-per-task", type=nonnegative_int, default=None, help="GPUs per rank")
    s.add_argument("--cpus-per-task", type=positive_int, default=None, help="CPU cores per rank")
    s.add_argument("--partition", default=None, help="Slurm partition")
    s.add_argument("--account", default=None, help="Slurm account to charge")
    s.add_argument("--time", default=None, help="time limit, HH:MM:SS")
    s.add_argument("--start", choices=("mpirun", "srun", "tf_config"), default="mpirun",
                   help="how ranks start inside the allocation: mpirun, srun --mpi=pmix, or srun with a "
                   "TF_CONFIG per task for tf.distribute (default: %(default)s)")
    s.add_argument("--script-only", default=None, metavar="FILE", help="only write the sbatch script to FILE")
    s.add_argument("--plain", action="store_true", help="with --script-only: a script that needs no labkit on the "
                   "nodes (only Slurm, MPI and Python), to submit yourself")
    add_script(p, required=False)  # the grammar of every command that runs a script: labkit.cli.main
    p.set_defaults(func=_cli_run)


def _slurm_options(a) -> SlurmOptions | None:
    given = [a.nodes, a.tasks_per_node, a.gpus_per_task, a.cpus_per_task, a.partition, a.account, a.time]
    if a.launcher != "slurm" and all(v is None for v in given) and a.start == "mpirun" and not a.plain:
        if a.script_only:
            raise LaunchError("--script-only writes a Slurm batch script: add --launcher slurm")
        return None
    per_node = a.tasks_per_node or (a.np // (a.nodes or 1) if a.np else 2)
    return SlurmOptions(nodes=a.nodes or 1, tasks_per_node=max(1, per_node), gpus_per_task=a.gpus_per_task,
                        cpus_per_task=a.cpus_per_task, partition=a.partition, account=a.account, time=a.time,
                        start=a.start, plain=a.plain, script_only=a.script_only)


def _cli_run(a) -> int:
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    try:
        slurm = _slurm_options(a)
        np = a.np or (slurm.nodes * slurm.tasks_per_node if slurm else 2)
        if slurm and a.np and a.np != slurm.nodes * slurm.tasks_per_node:
            raise LaunchError(f"--np {a.np} does not match --nodes {slurm.nodes} x --tasks-per-node "
                              f"{slurm.tasks_per_node}")
        job = JobSpec(timeout=a.timeout, threads=a.threads, log_dir=a.log_dir)
        result = run(command, np=np, launcher=a.launcher, job=job, hosts=a.hosts, hostfile=a.hostfile, slurm=slurm)
    except LaunchError as e:
        print(f"labkit run: {e}", file=sys.stderr)
        return 2
    if a.script_only:
        print(f"wrote {a.script_only}; submit it with: sbatch {a.script_only}", file=sys.stderr)
        return 0
    if result.ok:
        print(result.summary(), file=sys.stderr)
    return result.returncode if not result.timed_out else 124
