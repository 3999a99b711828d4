"""Two machines on this one, for a notebook: run a script on virtual nodes and show where each rank ran.

    result = nodes_lab.ranks_per_host(["python", "fashion_mnist.py", "--epochs", "1"], count=2, slots=2)
    result = nodes_lab.workers_per_host(["python", "fashion_mnist_multiworker.py", "--epochs", "1"])
    results = nodes_lab.slurm_per_host({"mpirun": ["python", "fashion_mnist.py", "--epochs", "1"]})

Brings the nodes up (or uses the ones ``labkit nodes up`` started), runs the command on
``count x slots`` ranks with the nodes' hostfile, prints rank, host and local rank from the
run record, and takes the nodes it started down again. :func:`workers_per_host` does the same for a tf.distribute
script: one worker per node, each started over ssh with its own ``TF_CONFIG``; :func:`slurm_per_host` submits
each command as a Slurm job over the nodes (a controller here, one slurmd per node). Where virtual nodes cannot
start (no root, e.g. Binder), it prints why and what the table would show, and returns None.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from labkit.core import contract, env
from labkit.launching import hosts, launch
from labkit.nodes import net
from labkit.nodes import slurm as nodes_slurm
from labkit.nodes import virtual as nodes
from labkit.records.runrecord import RunRecord
from labkit.ui import notebook


def why_not() -> str | None:
    """Why virtual nodes cannot start here, or None when they can (or are up)."""
    if nodes.VirtualNodes.load() is not None:
        return None
    if os.geteuid() != 0:
        return (f"Virtual nodes need root (network namespaces, a bridge, an sshd per node) and this notebook runs as "
                f"{getpass.getuser()!r}: on Binder or a shared JupyterHub there is no root. On a machine of your own: "
                "`sudo .venv/bin/labkit nodes up --count 2 --slots 2`, then run this cell again.")
    lacking = net.missing_capabilities()
    if lacking:
        return nodes.needs_capabilities(lacking)
    missing = net.missing_tools()
    if missing:
        return f"{', '.join(missing)} not found: `apt-get install iproute2 util-linux openssh-server openssh-client`"
    if net.netns_names() or net.link_exists(net.BRIDGE):
        return "virtual nodes of another state folder are up on this machine: `labkit nodes down` first"
    return None


def table(record: RunRecord | None) -> str:
    """``rank  host  local rank`` lines from a run record's ``ranks``."""
    ranks = (record.ranks if record else None) or []
    if not ranks:
        return "(the record lists no ranks: did the job start?)"
    lines = [f"{'rank':>4}  {'host':<8} local rank"]
    lines += [f"{'?' if r.rank is None else r.rank:>4}  {r.host or '?':<8} "
              f"{'' if r.local_rank is None else r.local_rank}" for r in ranks]
    return "\n".join(lines)


@contextmanager
def using(count: int = 2, slots: int = 1, rate: str | None = None,
          slurm: bool = False) -> Iterator[nodes.VirtualNodes]:
    """The virtual nodes ``labkit nodes up`` started, else ``count`` new ones of ``slots`` slots (links of
    ``rate``; with ``slurm``, a Slurm cluster over them), taken down again whatever happens."""
    running = nodes.VirtualNodes.load()
    if running is not None:
        yield running
        return
    with nodes.VirtualNodes(count=count, slots=slots, rate=rate, slurm=slurm) as cluster:
        extra = (f", links of {rate} each way" if rate else "") + (", Slurm over them" if slurm else "")
        print(f"{count} virtual nodes up in {cluster.seconds_up} s: {', '.join(n.name for n in cluster.nodes)}{extra}")
        yield cluster


RECORDS = "runs/virtual_nodes.jsonl"  # not runs.jsonl: many ranks on one machine's cores are no scaling data


def ranks_per_host(command: Sequence[str], count: int = 2, slots: int = 2, timeout: float = 900,
                   records: str = RECORDS, **run_kw: object) -> launch.JobResult | None:
    """Run ``command`` on ``count`` virtual nodes of ``slots`` slots; print where each rank ran.

    The run is recorded in ``records``, apart from the runs that lab 6 compares."""
    problem = why_not()
    if problem:
        print(f"Not run: {problem}")
        print("What it shows: with 2 nodes x 2 slots ranks 0 and 1 run on node1 (local ranks 0, 1), ranks 2 and 3 "
              "on node2 (local ranks 0, 1 again): the rank is global, the local rank counts within a host.")
        return None
    with using(count, slots) as cluster:
        np = sum(n.slots for n in cluster.nodes)
        result = notebook.run(list(command), np=np, hostfile=cluster.hostfile, timeout=timeout, records=records,
                              **run_kw)
    print(result.summary())
    print(table(result.record))
    return result


def workers_per_host(command: Sequence[str], count: int = 2, timeout: float = 900, records: str = RECORDS,
                     **run_kw: object) -> object | None:
    """Run a tf.distribute ``command`` as a cluster of one worker per virtual node; print where each worker ran."""
    problem = why_not()
    if problem:
        print(f"Not run: {problem}")
        print("What it shows: worker 0 on node1 and worker 1 on node2, each started over ssh with a TF_CONFIG that "
              "names both nodes' addresses.")
        return None
    with using(count, 1) as cluster:
        one_each = [hosts.Host(n.name, 1) for n in cluster.nodes]
        to_records = {contract.RUNS_FILE: str(Path(records).resolve())}
        result = notebook.run_cluster(list(command), workers=len(one_each), host_list=one_each, timeout=timeout,
                                      env=to_records, **run_kw)
    if result is not None:
        print(table(getattr(result, "record", None)))
    return result


def slurm_per_host(jobs: dict[str, Sequence[str]], count: int = 2, tasks_per_node: int = 1, timeout: float = 900,
                   records: str = RECORDS, **run_kw: object) -> list[launch.JobResult] | None:
    """Submit each command of ``jobs`` (start method -> command: ``"mpirun"``, ``"srun"`` or ``"tf_config"``) as one
    Slurm job of ``count`` nodes x ``tasks_per_node`` tasks on virtual nodes with Slurm; print where each task ran."""
    problem = why_not() or nodes_slurm.missing()
    running = nodes.VirtualNodes.load()
    if problem is None and running is not None and not running.slurm:
        problem = "the virtual nodes that are up have no Slurm: `labkit nodes down`, then `labkit nodes up --slurm`"
    if problem:
        print(f"Not run: {problem}")
        print(f"What it shows: sbatch asks for {count} nodes x {tasks_per_node} task(s); Slurm starts the job on "
              "node1 and node2, and each task's host and local rank come from the allocation, not from a hostfile.")
        return None
    results = []
    # sbatch, squeue and scancel of this process talk to the nodes' Slurm for the block only
    with using(count, tasks_per_node, slurm=True) as cluster, env.setting("SLURM_CONF", str(cluster.slurm_conf)):
        for start, command in jobs.items():
            options = launch.SlurmOptions(nodes=count, tasks_per_node=tasks_per_node, start=start)
            result = notebook.run(list(command), launcher="slurm", slurm=options, timeout=timeout, records=records,
                                  **run_kw)
            print(f"{start}: {result.summary()}")
            print(table(result.record))
            results.append(result)
    return results
