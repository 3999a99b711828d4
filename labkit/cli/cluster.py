"""``labkit cluster``: run a command as every task of a tf.distribute cluster, from a shell."""

from __future__ import annotations

import argparse
import sys

from labkit.core import tfconfig
from labkit.core.cliargs import add_script, nonnegative_int, positive_float, positive_int
from labkit.launching import hosts, launchers, reach
from labkit.launching.jobspec import JobSpec
from labkit.launching.launch import host_list
from labkit.tfdist import cluster
from labkit.tfdist.cluster import Tasks


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown, examples kept one per line."""


def add_cli(sub) -> None:
    """Register ``labkit cluster``."""
    p = sub.add_parser(
        "cluster", help="run a command as every task of a local tf.distribute cluster",
        description="Run SCRIPT (or a whole COMMAND after --) as every task of a tf.distribute cluster, each "
                    "with its TF_CONFIG.",
        epilog="examples:\n  labkit cluster labs/fashion_mnist_multiworker.py --workers 2 -- --epochs 2\n"
               "  labkit cluster --workers 2 -- python labs/fashion_mnist_multiworker.py --epochs 2",
        formatter_class=_Formatter,
    )
    p.add_argument("--workers", type=positive_int, default=2, help="number of workers")
    p.add_argument("--ps", type=nonnegative_int, default=0, help="number of parameter servers")
    p.add_argument("--chief", action="store_true", help="add a chief task (needed with --ps)")
    p.add_argument("--addresses", default=None, help="comma-separated host:port per task, in order chief, workers, ps")
    p.add_argument("-H", "--hosts", default=None, help="machines and slots, e.g. n1:2,n2:2 (remote tasks over ssh)")
    p.add_argument("--hostfile", default=None, help="OpenMPI hostfile naming the machines")
    p.add_argument("--threads", type=positive_int, default=None, help="threads per task (default: cores // tasks)")
    p.add_argument("--timeout", type=positive_float, default=None, help="seconds before every task is killed")
    p.add_argument("--log-dir", default=None, help="folder for <type>.<index>.log (default: runs/logs/<time>)")
    add_script(p, required=False)  # the grammar of every command that runs a script: labkit.cli.main
    p.set_defaults(func=_cli)


def _cli(a) -> int:
    """``a.command`` and the hosts were checked by :func:`labkit.cli.main.parse`."""
    try:
        addresses = a.addresses.split(",") if a.addresses else None
        machines = host_list(a.hosts, a.hostfile)
        if machines:
            reach.ssh_preflight(machines)
        tasks = Tasks(workers=a.workers, ps=a.ps, chief=a.chief, hosts=addresses, host_list=machines or None)
        result = cluster.run(a.command, tasks, JobSpec(timeout=a.timeout, threads=a.threads, log_dir=a.log_dir))
    except (launchers.LaunchError, tfconfig.ClusterError, hosts.HostError) as e:
        print(f"labkit cluster: {e}", file=sys.stderr)
        return 2
    print(result.summary(), file=sys.stderr)
    return 0 if result.ok else (124 if result.timed_out else 1)
