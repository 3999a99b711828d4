"""The allocation Slurm would grant a batch script's request on a described cluster, and the variables it sets.

:func:`allocate` makes, from a :class:`~labkit.launching.sbatch_read.BatchRequest`, the allocation an idle
:class:`Cluster` would grant: the nodes, the tasks on each, each node's GPUs and how many GPUs a task sees; or a
:class:`~labkit.launching.sbatch_read.BatchError` where Slurm would refuse the job. :meth:`Allocation.environ` gives
the ``SLURM_*`` variables (and ``CUDA_VISIBLE_DEVICES``) the batch script finds on the first node: the node list
as Slurm writes it (:func:`compress_nodelist`, the inverse of :func:`labkit.launching.slurm.expand_nodelist`) and
the tasks per node (:func:`counts_text`, the inverse of :func:`labkit.launching.slurm.tasks_per_node`).

Modelled after Slurm 22.05 on idle nodes of one kind: ``--ntasks`` without ``--ntasks-per-node`` spreads the tasks
over the nodes as evenly as the allocation's cyclic distribution does, and without ``--nodes`` takes as few nodes
as the tasks' cores need. A GPU request per task (``--gpus-per-task``, ``--ntasks-per-gpu``, ``--gpu-bind`` binding
one each) binds that many GPUs to each task, which then sees only its own, numbered from 0; a request per node or
per job (``--gpus-per-node``, ``--gres=gpu:N``, ``--gpus``) lets every task see its node's GPUs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from labkit.launching.sbatch_read import BatchError, BatchRequest


@dataclass(frozen=True)
class Cluster:
    """An idle cluster of identical nodes."""

    names: tuple[str, ...] = ("gpu01", "gpu02")
    gpus: int = 4  # per node
    cpus: int = 32  # cores per node
    partition: str = "gpu"
    name: str = "lab7"


def binds_gpus(gpu_bind: str | None) -> bool:
    """Whether ``--gpu-bind`` gives each task only some of its node's GPUs (``none`` and ``verbose`` do not)."""
    if not gpu_bind:
        return False
    kinds = [k for k in gpu_bind.split(",") if k and k != "verbose"]
    return any(k != "none" for k in kinds)


@dataclass(frozen=True)
class Allocation:
    """What Slurm grants: the nodes, the tasks on each, each node's GPUs, and how many GPUs a task sees."""

    nodes: tuple[str, ...]
    tasks: tuple[int, ...]  # per node
    gpus: tuple[int, ...]  # per node
    task_gpus: int | None  # GPUs bound to each task (None: a task sees all of its node's)
    cpus_per_task: int
    ntasks_given: bool  # whether the job asked for tasks (srun then starts SLURM_NTASKS of them)
    request: BatchRequest
    job_id: int = 4242

    @property
    def ntasks(self) -> int:
        return sum(self.tasks)

    def environ(self, submit_dir: str, cluster: Cluster) -> dict[str, str]:
        """The ``SLURM_*`` variables (and ``CUDA_VISIBLE_DEVICES``) the batch script finds on the first node."""
        r = self.request
        nodelist = compress_nodelist(self.nodes)
        env = {
            "SLURM_JOB_ID": str(self.job_id), "SLURM_JOBID": str(self.job_id),
            "SLURM_JOB_NAME": r.job_name or "batch", "SLURM_JOB_NODELIST": nodelist, "SLURM_NODELIST": nodelist,
            "SLURM_JOB_NUM_NODES": str(len(self.nodes)), "SLURM_NNODES": str(len(self.nodes)),
            "SLURM_TASKS_PER_NODE": counts_text(self.tasks),
            "SLURM_JOB_CPUS_PER_NODE": counts_text([t * self.cpus_per_task for t in self.tasks]),
            "SLURM_CPUS_ON_NODE": str(self.tasks[0] * self.cpus_per_task),
            "SLURM_SUBMIT_DIR": submit_dir, "SLURM_SUBMIT_HOST": "login01", "SLURM_CLUSTER_NAME": cluster.name,
            "SLURM_JOB_PARTITION": cluster.partition, "SLURMD_NODENAME": self.nodes[0], "SLURM_NODEID": "0",
            "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_GTIDS": "0", "ENVIRONMENT": "BATCH",
            "HOSTNAME": self.nodes[0],
        }
        if self.ntasks_given:
            env["SLURM_NTASKS"] = env["SLURM_NPROCS"] = str(self.ntasks)
        if r.ntasks_per_node:
            env["SLURM_NTASKS_PER_NODE"] = str(r.ntasks_per_node)
        if r.cpus_per_task > 1 or r.given("cpus-per-task"):
            env["SLURM_CPUS_PER_TASK"] = str(r.cpus_per_task)
        for name, value in (("SLURM_GPUS_PER_NODE", r.gpus_per_node), ("SLURM_GPUS_PER_TASK", r.gpus_per_task),
                            ("SLURM_GPUS", r.gpus), ("SLURM_NTASKS_PER_GPU", r.ntasks_per_gpu)):
            if value is not None:
                env[name] = str(value)
        if r.gpu_bind:
            env["SLURM_GPU_BIND"] = r.gpu_bind
        if self.gpus[0]:
            ids = ",".join(str(i) for i in range(self.gpus[0]))
            env.update(CUDA_VISIBLE_DEVICES=ids, SLURM_JOB_GPUS=ids, GPU_DEVICE_ORDINAL=ids,
                       SLURM_GPUS_ON_NODE=str(self.gpus[0]))
        return env


def counts_text(counts: Sequence[int]) -> str:
    """Per-node counts as Slurm writes them: ``4(x2)``, ``4,3``."""
    parts: list[str] = []
    for value in counts:
        if parts and parts[-1].split("(")[0] == str(value):
            head, _, times = parts[-1].partition("(x")
            parts[-1] = f"{head}(x{int(times.rstrip(')') or 1) + 1})"
        else:
            parts.append(str(value))
    return ",".join(parts)


def compress_nodelist(names: Sequence[str]) -> str:
    """Node names as Slurm lists them: ``gpu[01-02]`` for gpu01 and gpu02 (``scontrol show hostlist``)."""
    groups: list[tuple[str, int, list[int]]] = []  # prefix, digits, numbers
    for name in names:
        m = re.fullmatch(r"(.*?)(\d+)", name)
        if not m:
            groups.append((name, 0, []))
            continue
        prefix, digits = m.groups()
        if groups and groups[-1][2] and groups[-1][:2] == (prefix, len(digits)):
            groups[-1][2].append(int(digits))
        else:
            groups.append((prefix, len(digits), [int(digits)]))
    out = []
    for prefix, width, numbers in groups:
        runs: list[list[int]] = []
        for n in numbers:
            if runs and runs[-1][1] + 1 == n:
                runs[-1][1] = n
            else:
                runs.append([n, n])
        texts = [f"{a:0{width}d}" if a == b else f"{a:0{width}d}-{b:0{width}d}" for a, b in runs]
        out.append(prefix if not numbers else f"{prefix}{texts[0]}" if len(numbers) == 1 else
                   f"{prefix}[{','.join(texts)}]")
    return ",".join(out)


def spread(total: int, bins: int, cap: int | None = None) -> list[int]:
    """``total`` tasks over ``bins`` nodes cyclically (as evenly as can be), none above ``cap``."""
    counts = [total // bins + (1 if i < total % bins else 0) for i in range(bins)]
    if cap is not None and max(counts) > cap:
        raise BatchError(f"{total} tasks do not fit on {bins} node(s) of {cap} each")
    return counts


def refused(why: str) -> BatchError:
    return BatchError(f"Slurm would refuse this job ({why}): sbatch answers \"Requested node configuration is not "
                      "available\"")


def allocate(r: BatchRequest, cluster: Cluster) -> Allocation:
    """The allocation an idle ``cluster`` grants ``r``; a :class:`BatchError` when Slurm would refuse it."""
    per_node_cap = cluster.cpus // r.cpus_per_task
    if r.nodes is not None and r.nodes > len(cluster.names):
        raise refused(f"it asks for {r.nodes} nodes; the cluster has {len(cluster.names)}")
    ntasks_given = r.ntasks is not None or r.ntasks_per_node is not None
    if r.ntasks is not None:
        ntasks = r.ntasks
        nodes = r.nodes or max(1, math.ceil(ntasks / (r.ntasks_per_node or per_node_cap)))
        if r.gpus_per_task and not r.nodes:  # GPUs bound to tasks take nodes too
            nodes = max(nodes, math.ceil(ntasks * r.gpus_per_task / cluster.gpus))
    else:
        nodes = r.nodes or 1
        ntasks = nodes * (r.ntasks_per_node or 1)
    if nodes > len(cluster.names):
        raise refused(f"{ntasks} tasks need {nodes} nodes; the cluster has {len(cluster.names)}")
    if ntasks < nodes:
        raise BatchError(f"--ntasks={ntasks} is fewer than --nodes={nodes}: Slurm needs a task on every node")
    tasks = spread(ntasks, nodes, r.ntasks_per_node or None) if r.ntasks is not None else [ntasks // nodes] * nodes
    if max(tasks) > per_node_cap:
        raise refused(f"{max(tasks)} tasks of {r.cpus_per_task} core(s) on a node of {cluster.cpus} cores")
    task_gpus: int | None = None
    if r.gpus_per_task:
        task_gpus = r.gpus_per_task
        gpus = [t * r.gpus_per_task for t in tasks]
    elif r.ntasks_per_gpu:
        task_gpus = 1
        gpus = [math.ceil(t / r.ntasks_per_gpu) for t in tasks]
    elif r.gpus_per_node is not None:
        gpus = [r.gpus_per_node] * nodes
    elif r.gpus is not None:
        gpus = spread(r.gpus, nodes)
    else:
        gpus = [0] * nodes
    if max(gpus) > cluster.gpus:
        raise refused(f"{max(gpus)} GPUs on one node; each node has {cluster.gpus}")
    if task_gpus is None and binds_gpus(r.gpu_bind) and max(gpus):
        task_gpus = 1
    return Allocation(tuple(cluster.names[:nodes]), tuple(tasks), tuple(gpus), task_gpus, r.cpus_per_task,
                      ntasks_given, r)
