"""Lab 7's exercise, judged by what the files do: a hostfile and a Slurm batch script for two GPU nodes.

The cluster (:data:`CLUSTER`): two nodes, ``gpu01`` and ``gpu02``, with 4 GPUs (and 32 cores) each. The learner
writes ``cluster_hostfile`` and ``cluster.sbatch`` (the lab's files, next to each other; either may be the file
given to ``labkit check scale-out``). Nothing needs root, a cluster, or the nodes to exist:

1. The hostfile goes to OpenMPI's own mapper as a dry run (:mod:`labkit.launching.mpimap`): ``mpirun --hostfile
   FILE -np 8 --do-not-launch --display-map``. The map must put 8 ranks, 4 on each node (local ranks 0-3 on each),
   and the file must offer no more than the cluster's 8 slots (a second run of 64 ranks with ``--oversubscribe``
   shows every node it names and their slots). Whatever spelling OpenMPI accepts passes (``slots=4``,
   ``max_slots=4``, one line per slot, comments); what it refuses fails with OpenMPI's reason and what to write.
   Where there is no ``mpirun``, labkit's own reader (:mod:`labkit.launching.hosts`) places the ranks, and the
   step says so.
2. The batch script is read as ``sbatch`` reads it (:mod:`labkit.launching.sbatch_read`) and given the allocation
   Slurm would grant on this cluster (:mod:`labkit.launching.slurm_alloc`); its body then runs with ``bash`` as a
   dry run (:mod:`labkit.check.sbatch_dry`), its launchers recording instead of starting, and each launch becomes
   what its ranks would be (:mod:`labkit.check.scale_out_ranks`). The judge wants one launch of 8 ranks, 4 on each
   node, one MPI world, every rank running ``python fashion_mnist.py``, every rank seeing a GPU at its local rank
   (as the script's ``gpus[hvd.local_rank()]`` needs), and a time limit of at most 30 minutes.
   ``mpirun python fashion_mnist.py``, ``mpirun -np 8 ...``, ``srun --mpi=pmix python ...`` and
   ``horovodrun -np 8 -H gpu01:4,gpu02:4 ...`` all pass.

The dry run runs the learner's script as the learner, for a few seconds at most
(:data:`labkit.check.sbatch_dry.SECONDS`), and kills all it started; :mod:`labkit.check.sbatch_dry` says what it
can and cannot keep the script from.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from labkit.check import sbatch_dry
from labkit.check.scale_out_evidence import Batch, DryRun, Hostfile, Request, ScaleOutEvidence
from labkit.check.scale_out_ranks import ALONE, Launched, Rank, as_root, clean_env, launched, mpirun_path, run_mapper
from labkit.check.verdict import Failed
from labkit.core import pycommand
from labkit.course import labs
from labkit.launching import hosts, mpimap, slurm_alloc
from labkit.launching import sbatch_read as sr
from labkit.launching.launch_lines import python_script
from labkit.records import evidence as saved

LAB = "scale-out"
CLUSTER = slurm_alloc.Cluster()
NP = len(CLUSTER.names) * CLUSTER.gpus  # one rank per GPU
WIDE = 64  # ranks of the second, oversubscribed map: past every slot, so that every node the hostfile names shows
SCRIPT = "fashion_mnist.py"
MAX_SECONDS = 30 * 60
LAUNCH_HINT = "`mpirun python fashion_mnist.py` or `srun --mpi=pmix python fashion_mnist.py`"
PER_NODE_HINT = "#SBATCH --nodes=2 and #SBATCH --ntasks-per-node=4"
GPU_HINT = "#SBATCH --gpus-per-node=4 (or --gres=gpu:4)"
EVIDENCE = ScaleOutEvidence  # what collect returns and the judges read (labkit.check.judging saves and loads it)
evidence = saved.from_json(EVIDENCE)  # the evidence from its JSON, every field checked (how a test builds one)


def files(script: Path) -> tuple[Path, Path]:
    """The hostfile and the batch script a check of ``script`` judges: either may be given, the other is next to it
    under the name the lab gives it."""
    lab = labs.get(LAB)
    hostfile = lab.step_file(1)
    if script.name == hostfile:
        return script, script.parent / lab.starter
    return script.parent / hostfile, script


def syntax_error(script: Path) -> None:
    """No check before the run: the batch script is not Python, and bash's own reading of it is step 2's."""
    return None


def upto(step: int) -> int:
    """Step 1 needs only the hostfile's dry run; step 2 runs the batch script's too."""
    return step


def collect(script: Path, upto: int, timeout: float, work: Path) -> ScaleOutEvidence:
    """The hostfile's job map and, for step 2, the batch script's allocation and dry run."""
    hostfile, batch = files(script)
    mapped = hostfile_evidence(hostfile, work / "hostfile")
    if upto < 2:
        return ScaleOutEvidence(lab=LAB, hostfile=mapped)
    ran = batch_evidence(batch, hostfile, work / "batch")
    return ScaleOutEvidence(lab=LAB, hostfile=mapped, batch=ran, timed_out=ran.run is not None and ran.run.timed_out)


# ----------------------------------------------------------------------------- step 1: the hostfile


def hostfile_evidence(path: Path, work: Path) -> Hostfile:
    """The job map of ``mpirun --hostfile PATH -np 8`` and every node the file offers, by OpenMPI's mapper (or
    labkit's reading where there is no mpirun)."""
    if not path.is_file():
        return Hostfile(path.name, exists=False)
    work.mkdir(parents=True, exist_ok=True)
    mpirun = mpirun_path()
    if mpirun:
        job = run_mapper(mpimap.hostfile_command(mpirun, str(path), NP, as_root()), clean_env(), work)
        wide = run_mapper(mpimap.hostfile_command(mpirun, str(path), WIDE, as_root(), oversubscribe=True),
                          clean_env(), work)
    else:
        try:
            listed = hosts.parse_hostfile(path)
        except hosts.HostError as e:
            job = wide = mpimap.JobMap(error=str(e), mapper="labkit")
        else:
            job = mpimap.place_by_slot(listed, NP)
            wide = mpimap.place_by_slot(listed, sum(h.slots or 1 for h in listed))
    job, wide = (dataclasses.replace(m, error=m.error.replace(str(path), path.name)) for m in (job, wide))
    return Hostfile(path.name, exists=True, map=job, offered=wide, mapper=job.mapper,
                    command=shlex.join(["mpirun", "--hostfile", path.name, "-np", str(NP)]))


def _ranges(ranks: list[int]) -> str:
    """``0-3``, ``0,2,4``."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and runs[-1][1] + 1 == r:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def layout_text(placed: list[tuple[str, int]]) -> str:
    """``ranks 0-3 on gpu01 and 4-7 on gpu02`` from ``(node, rank)`` pairs."""
    by_node: dict[str, list[int]] = {}
    for node, rank in placed:
        by_node.setdefault(node, []).append(rank)
    parts = [f"{_ranges(rs)} on {node}" for node, rs in by_node.items()]
    head = "rank" if len(placed) == 1 else "ranks"
    return f"{head} {' and '.join(parts)}" if parts else "no rank"


def brief(text: str, chars: int = 400) -> str:
    """A launcher's message cut after the sentence that ends within ``chars`` (OpenMPI's run to a page)."""
    if len(text) <= chars:
        return text
    cut = text.rfind(". ", 0, chars)
    return text[:cut + 1] if cut > 0 else text[:chars - 3] + "..."


def _offered_text(offered: mpimap.JobMap) -> str:
    return ", ".join(f"{n.name} {n.slots}" for n in offered.nodes) or "none"


def _hostfile_error(name: str, error: str, offered: mpimap.JobMap) -> str:
    if "parse error" in error or "bad parameter" in error:
        return (f"OpenMPI cannot read {name}: {error} Each line names a host, then slots=N (and max_slots=M if you "
                "like); # starts a comment.")
    if "multiple definitions of the slot count" in error:
        return (f"{name} gives a node slots= on more than one line, which OpenMPI refuses: {error} Give each node "
                "one line, with the slots of all its GPUs.")
    if "not enough slots" in error:
        total = offered.total_slots
        return (f"`mpirun -np {NP}` finds only {total if total is not None else 'too few'} slots in {name} (by node: "
                f"{_offered_text(offered)}): the cluster has {len(CLUSTER.names)} nodes of {CLUSTER.gpus} GPUs, one "
                "rank per GPU. Give each node as many slots as it has GPUs (slots=N).")
    if "No nodes" in error or "names no hosts" in error:
        return f"{name} names no host: write one line per node of the cluster ({' and '.join(CLUSTER.names)})."
    return f"OpenMPI refuses {name}: {error}"


def step_1(ev: ScaleOutEvidence) -> str:
    h = ev.hostfile
    if h is None:
        raise Failed("the hostfile was not looked at")
    name = h.file
    if not h.exists:
        raise Failed(f"there is no {name} next to the batch script: write the hostfile there, one line per node of "
                     "the cluster.")
    job, offered = h.map or mpimap.JobMap(), h.offered or mpimap.JobMap()
    how = ("OpenMPI's mapper" if h.mapper == "mpirun" else
           "labkit's reading of the hostfile: there is no mpirun here, and OpenMPI reads a few lines differently")
    names = [n.name for n in offered.nodes] or [n.name for n in job.nodes]
    colon = next((n for n in names if ":" in n), None)
    if colon:
        host, _, count = colon.partition(":")
        raise Failed(f"OpenMPI reads `{colon}` in {name} as a host name with one slot: `host:slots` is the form of "
                     f"`mpirun -H`. In a hostfile, write `{host} slots={count}`.")
    if job.error and not offered.nodes:
        raise Failed(_hostfile_error(name, job.error, offered))
    known = {n.lower() for n in CLUSTER.names}
    unknown = [n for n in names if n.lower() not in known]
    if unknown:
        raise Failed(f"{name} names {', '.join(unknown)}, which {'is' if len(unknown) == 1 else 'are'} not a node "
                     f"of this cluster ({' and '.join(CLUSTER.names)}): check the spelling (localhost and this "
                     "machine's own names are this machine, not a node).")
    if job.error:
        raise Failed(_hostfile_error(name, job.error, offered))
    placed = [(node, r) for r, (node, _local, _app) in enumerate(job.placement())]
    per_node = {n.lower(): sum(1 for node, _ in placed if node.lower() == n.lower()) for n in CLUSTER.names}
    if any(count != CLUSTER.gpus for count in per_node.values()):
        raise Failed(f"`{h.command}` puts {layout_text(placed)}: the cluster's nodes have {CLUSTER.gpus} GPUs "
                     f"each, one rank per GPU, so {CLUSTER.gpus} ranks on each node. Give each node slots="
                     f"{CLUSTER.gpus} (by node now: {_offered_text(offered)}).")
    if offered.total_slots is not None and offered.total_slots > NP:
        raise Failed(f"{name} offers {offered.total_slots} slots (by node: {_offered_text(offered)}) on a cluster of "
                     f"{NP} GPUs: `mpirun --hostfile {name}` without -np would start {offered.total_slots} ranks. "
                     "Give each node as many slots as it has GPUs.")
    return (f"`{h.command}` puts {layout_text(placed)}, local ranks 0-{CLUSTER.gpus - 1} on each "
            f"(placed by {how}).")


# ----------------------------------------------------------------------------- step 2: the batch script


def request_summary(r: sr.BatchRequest, a: slurm_alloc.Allocation | None) -> Request:
    """What the batch script ``r`` asks Slurm for, and the allocation ``a`` Slurm would grant it (None: refused)."""
    gpu_option = next((o.given + (f" {o.value}" if o.value and o.value not in o.given else "")
                       for o in reversed(r.options) if o.name in ("gpus-per-task", "ntasks-per-gpu", "gpu-bind")), "")
    asked = Request(time=r.time, time_given=r.time_given, ignored=list(r.ignored), gpu_option=gpu_option)
    if a is None:
        return asked
    return dataclasses.replace(asked, nodes=list(a.nodes), tasks=list(a.tasks), gpus=list(a.gpus),
                               task_gpus=a.task_gpus)


def batch_evidence(batch: Path, hostfile: Path, work: Path) -> Batch:
    """What ``sbatch`` makes of the batch script, and its dry run's launches."""
    if not batch.is_file():
        return Batch(batch.name, exists=False)
    if batch.suffix == ".py":
        return Batch(batch.name, exists=True, python=True)
    try:
        request = sr.read_request(batch.read_text(errors="replace"))
    except sr.BatchError as e:
        return Batch(batch.name, exists=True, refused=str(e))
    try:
        alloc = slurm_alloc.allocate(request, CLUSTER)
    except sr.BatchError as e:
        return Batch(batch.name, exists=True, request=request_summary(request, None), refused=str(e))
    work.mkdir(parents=True, exist_ok=True)
    run = sbatch_dry.run(batch, alloc.environ("", CLUSTER), list(alloc.nodes), work, hostfile)
    calls = [c for c in run.calls if c.tool in sbatch_dry.LAUNCHERS or c.tool in pycommand.NAMES]
    return Batch(batch.name, exists=True, request=request_summary(request, alloc), run=DryRun.of(run),
                 launches=[launched(c, alloc) for c in calls])


def runs_script(command: tuple[str, ...]) -> bool:
    script = python_script(command)
    return script is not None and Path(script).name == SCRIPT


def _ignored_note(req: Request | None) -> str:
    lines = req.ignored if req else []
    if not lines:
        return ""
    return (f" Note: sbatch reads no #SBATCH line after the first command, so it ignores line"
            f"{'s' if len(lines) > 1 else ''} {', '.join(map(str, lines))}: move {'them' if len(lines) > 1 else 'it'} "
            "up, before any command.")


def job_text(req: Request) -> str:
    """``the job holds 2 nodes (gpu01, gpu02) with 4 tasks each``."""
    nodes, tasks = req.nodes or [], req.tasks or []
    each = f"{tasks[0]} task{'s' if tasks[0] > 1 else ''} each" if len(set(tasks)) == 1 else \
        f"{' and '.join(map(str, tasks))} tasks"
    if len(nodes) == 1:
        each = each.replace(" each", "")
    return f"the job holds {len(nodes)} node{'s' if len(nodes) > 1 else ''} ({', '.join(nodes)}) with {each}"


def _training(launches: list[Launched]) -> list[Launched]:
    return [la for la in launches
            if any(runs_script(r.command) for r in la.ranks) or (la.error and SCRIPT in la.line)]


def _judge_layout(la: Launched, req: Request) -> None:
    ranks = la.ranks
    placed = [(r.node, r.rank) for r in ranks]
    per_node = {n: sum(1 for r in ranks if r.node == n) for n in CLUSTER.names}
    if len(ranks) == NP and all(v == CLUSTER.gpus for v in per_node.values()):
        return
    job = job_text(req)
    wants_job = (req.nodes or []) != list(CLUSTER.names) or (req.tasks or []) != [CLUSTER.gpus] * len(CLUSTER.names)
    fix = (f"ask Slurm for {len(CLUSTER.names)} nodes and {CLUSTER.gpus} tasks on each ({PER_NODE_HINT})"
           if wants_job else f"start one rank per task of the job: {NP} ranks (mpirun and srun start one per task "
                             "when not told how many)")
    raise Failed(f"`{la.line}` starts {len(ranks)} rank{'s' if len(ranks) != 1 else ''}: {layout_text(placed)}; "
                 f"{job}. The cluster has {NP} GPUs, {CLUSTER.gpus} on each node, one rank per GPU: {fix}."
                 + _ignored_note(req))


def _judge_gpus(ranks: tuple[Rank, ...], req: Request) -> None:
    blind = [r for r in ranks if r.gpus <= r.local_rank]
    if not blind:
        return
    if not max(req.gpus or [], default=0):
        raise Failed("the job asks Slurm for no GPUs: every rank would see none and train on the CPU. Ask for each "
                     f"node's GPUs: {GPU_HINT}." + _ignored_note(req))
    r = blind[0]
    if req.task_gpus:
        option = req.gpu_option or "the job's GPU request"
        raise Failed(f"{option} binds {r.gpus} GPU to each task: each rank sees only its own, as GPU 0, and "
                     f"`gpus[hvd.local_rank()]` fails on local ranks 1-{CLUSTER.gpus - 1} (rank {r.rank}, local rank "
                     f"{r.local_rank} on {r.node}, sees {r.gpus}). Ask for GPUs per node instead, {GPU_HINT}: every "
                     "rank then sees its node's GPUs and pins its own by local rank.")
    raise Failed(f"rank {r.rank} (local rank {r.local_rank} on {r.node}) sees {r.gpus} GPU(s), so "
                 f"`gpus[hvd.local_rank()]` has no GPU {r.local_rank}: ask for {GPU_HINT}.")


def _judge_time(req: Request) -> str:
    if not req.time_given:
        raise Failed("the job asks for no time limit: Slurm gives it the partition's default, often hours or days. "
                     "Add #SBATCH --time=00:30:00 (30 minutes)." + _ignored_note(req))
    secs = req.time
    if secs is None or secs > MAX_SECONDS:
        raise Failed(f"the job asks for {sr.minutes_text(secs)}; the exercise allows 30 minutes at most: "
                     "#SBATCH --time=00:30:00 (or --time=30).")
    return sr.minutes_text(secs)


def _no_training(b: Batch, launches: list[Launched]) -> str:
    run = b.run
    if launches:
        started = "; ".join(f"`{la.line}`" for la in launches)
        return (f"no rank runs {SCRIPT}: the script started {started}. Start `python {SCRIPT}` on every rank, e.g. "
                f"{LAUNCH_HINT}.")
    if run is not None and run.code:
        tail = "\n".join(run.output.strip().splitlines()[-6:])
        return (f"the script stopped (exit code {run.code}) before it started any rank of {SCRIPT}"
                + (f":\n{tail}" if tail else "."))
    return f"the script starts no rank of {SCRIPT}: add a line that starts it, e.g. {LAUNCH_HINT}."


def step_2(ev: ScaleOutEvidence) -> str:
    b = ev.batch
    if b is None:
        raise Failed("the batch script was not looked at")
    name = b.file
    if not b.exists:
        raise Failed(f"there is no {name}: write the batch script there.")
    if b.python:
        raise Failed(f"{name} is a Python file: give the Slurm batch script ({labs.get(LAB).starter}).")
    if b.refused:
        raise Failed(b.refused + _ignored_note(b.request))
    run, req = b.run, b.request
    if run is None or req is None:
        raise Failed(f"the dry run of {name} left no record")
    if run.syntax:
        raise Failed(f"bash cannot read {name}: {run.syntax}")
    if run.timed_out:
        still = "; ".join(f"`{c}`" for c in run.still_running[:4]) or "its shell"
        raise Failed(f"the script was still running after {run.bound:.0f} s of the dry run, where srun, "
                     f"mpirun and horovodrun return at once (still running: {still}). A batch script only starts "
                     "the ranks: remove what waits or loops.")
    launches = b.launches or []
    training = _training(launches)
    if not training:
        raise Failed(_no_training(b, launches) + _ignored_note(req))
    if len(training) > 1:
        raise Failed(f"the script starts {SCRIPT} {len(training)} times ("
                     + "; ".join(f"`{la.line}`" for la in training) + "): start it once, on all the ranks.")
    la = training[0]
    if la.error.startswith(ALONE):
        raise Failed(f"`{la.line}`: {brief(la.error)} Give horovodrun the job's hosts, -H gpu01:4,gpu02:4 (or "
                     "start the ranks with mpirun or srun, which read the job).")
    if la.error and "not enough slots" in la.error:
        raise Failed(f"`{la.line}` asks for more ranks than there are slots, and mpirun refuses (\"There are not "
                     f"enough slots available\"): {job_text(req)}, a slot per task. Start one rank per task: {NP} "
                     f"ranks, {CLUSTER.gpus} on each node." + _ignored_note(req))
    if la.error:
        raise Failed(f"`{la.line}`: {brief(la.error)}" + _ignored_note(req))
    if la.tool == "python":
        raise Failed(f"`{la.line}` starts one process, on {la.ranks[0].node}: Slurm runs the batch script on the "
                     "first node only, and python starts no ranks. Start it with a launcher, which starts one rank "
                     f"per task of the job: {LAUNCH_HINT}.")
    _judge_layout(la, req)
    if any(r.world != len(la.ranks) for r in la.ranks):
        raise Failed(f"`{la.line}` starts {len(la.ranks)} tasks, but with --mpi=none each is an MPI world of its "
                     f"own: {len(la.ranks)} trainings of one rank each, not one of {len(la.ranks)}. Use srun "
                     "--mpi=pmix.")
    other = next((r for r in la.ranks if not runs_script(r.command)), None)
    if other is not None:
        raise Failed(f"rank {other.rank} runs `{shlex.join(other.command)}`: every rank runs python {SCRIPT}.")
    _judge_gpus(la.ranks, req)
    limit = _judge_time(req)
    placed = [(r.node, r.rank) for r in la.ranks]
    note = f" ({la.note})" if la.note else ""
    return (f"`{la.line}` starts {NP} ranks, {layout_text(placed)}, local ranks 0-{CLUSTER.gpus - 1} on each, every "
            f"one running `{shlex.join(la.ranks[0].command)}` and seeing its node's {la.ranks[0].gpus} GPUs; time "
            f"limit {limit}{note}.")


STEPS = [step_1, step_2]
