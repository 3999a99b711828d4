"""Every multi-node path on virtual nodes (labkit.nodes.virtual): two nodes with Slurm, brought up once for this file.

Launchers (mpirun, horovodrun, gloo, ssh for tf.distribute, Slurm's three starts and the plain batch script,
ipyparallel engines, ``labkit bench``) run the solutions across node1 and node2, and each run's record says
where every rank ran. Then what a workshop meets: a node that does not take ssh is named before anything
starts; a node that dies mid-job ends the job, named, with nothing left running; MultiWorkerMirrored with
BackupAndRestore resumes when the node's worker comes back. The module fixture fails the file if anything of
the nodes (namespace, link, bridge, daemon, Slurm job, process) is left behind, whether the tests passed or not.
Needs root; skipped otherwise.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import paths

from labkit.core import contract, proc
from labkit.launching import engines, hosts, launch, reach
from labkit.launching.jobspec import JobSpec
from labkit.measure import elastic
from labkit.nodes import net
from labkit.nodes import slurm as nodes_slurm
from labkit.nodes import virtual as nodes
from labkit.records import runs
from labkit.records.runrecord import RunRecord
from labkit.tfdist import cluster as tf_cluster
from labkit.tfdist import faults
from labkit.tfdist.cluster import Tasks

ROOT = paths.ROOT
SOLUTION = ROOT / "solutions" / "fashion_mnist_solution.py"
MULTIWORKER = ROOT / "solutions" / "fashion_mnist_multiworker_after_step_05.py"
PS = ROOT / "solutions" / "fashion_mnist_ps_after_step_03.py"
ELASTIC = ROOT / "solutions" / "fashion_mnist_at_scale_after_step_05.py"  # lab 9's script made elastic (step 5)
TINY = ["--epochs", "1", "--train-size", "256", "--test-size", "128"]
FOREVER = '''
import time
from mpi4py import MPI
comm = MPI.COMM_WORLD
print("allreducing on", MPI.Get_processor_name(), flush=True)
while True:
    comm.allreduce(1)
    time.sleep(0.05)
'''


def _problem() -> str | None:
    if os.geteuid() != 0:
        return "virtual nodes need root"
    if net.missing_tools():
        return f"{', '.join(net.missing_tools())} not installed"
    if nodes_slurm.missing():
        return str(nodes_slurm.missing())
    if net.netns_names() or net.link_exists(net.BRIDGE):
        return "virtual nodes are already up on this machine"
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_problem() is not None, reason=str(_problem()))]
HOME_SSH = Path.home() / ".ssh"


def _ours(folder: Path, before: set[int] = frozenset()) -> list[str]:
    """Processes still alive that this file started: children of this process that were not there ``before``
    (a session's JupyterLab, say), or naming its temporary folder (the nodes' state, the tests' working
    folders) - not other users' jobs on a shared machine."""
    mine = {c.pid for c in psutil.Process().children(recursive=True)} - set(before)
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        line = " ".join(p.info["cmdline"] or [])
        if p.pid in before or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if p.pid in mine or f"{folder.parent}/" in line:
            found.append(f"{p.pid}: {line[:160]}")
    return found


def _job_processes(cluster: nodes.VirtualNodes) -> list[str]:
    """Processes inside the nodes that are not the nodes' own daemons (holder, sshd listener, slurmd)."""
    out = []
    for n in cluster.nodes:
        for p in net.inside(n.netns):
            try:
                name, line = p.name(), " ".join(p.cmdline())
            except psutil.Error:
                continue
            if p.pid in (n.holder, n.sshd) or name in ("slurmd", "sleep", "nsenter") or line.endswith("sshd_config"):
                continue
            out.append(f"{n.name} {p.pid}: {line[:160]}")
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[nodes.VirtualNodes]:
    """Two nodes of two slots with Slurm, for the whole file; after it, nothing of them may remain."""
    folder = tmp_path_factory.getbasetemp() / "nodes"  # its parent holds every test's working folder
    had_ssh = HOME_SSH.exists()
    saved = {k: os.environ.get(k) for k in (contract.NODES_STATE, "SLURM_CONF")}
    os.environ[contract.NODES_STATE] = str(folder)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    c = nodes.VirtualNodes(count=2, slots=2, slurm=True, folder=folder).up()
    os.environ["SLURM_CONF"] = c.status()["slurm_conf"]
    problems = []
    try:
        yield c
    finally:
        queue = subprocess.run(["squeue", "-h", "-o", "%i %j %T"], capture_output=True, text=True, timeout=30)
        if queue.stdout.strip():
            problems.append(f"Slurm jobs left in the queue: {queue.stdout.strip()}")
        if _job_processes(c):
            problems.append(f"job processes left on the nodes: {_job_processes(c)}")
        nodes.down(folder)
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        if net.netns_names() or net.link_exists(net.BRIDGE):
            problems.append(f"namespaces or bridge left: {net.netns_names()}")
        if [line for line in net.run(["ip", "-br", "link"]).stdout.splitlines() if net.PREFIX in line]:
            problems.append("links of the nodes left")
        deadline = time.monotonic() + 10
        while _ours(folder, before) and time.monotonic() < deadline:
            time.sleep(0.5)
        if _ours(folder, before):
            problems.append(f"processes left: {_ours(folder, before)}")
        if folder.exists():
            problems.append(f"state folder {folder} left")
        if HOME_SSH.exists() != had_ssh:
            problems.append(f"{HOME_SSH} was created")
    assert not problems, "\n".join(problems)


@pytest.fixture
def work(cluster: nodes.VirtualNodes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A working folder with its own records file; after each test no job process runs on the nodes."""
    monkeypatch.setenv(contract.RUNS_FILE, str(tmp_path / "runs.jsonl"))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    deadline = time.monotonic() + 30
    while _job_processes(cluster) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _job_processes(cluster) == [], "a job left processes on the nodes"


def _records(work: Path) -> list[RunRecord]:
    return runs.read(work / "runs.jsonl")


def _placement(record: RunRecord | None) -> dict[int | None, tuple[str | None, int | None]]:
    """rank -> (host, local rank) of the processes that trained."""
    return {r.rank: (r.host, r.local_rank) for r in (record.ranks if record else None) or []}


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "labkit.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def _hosts(cluster: nodes.VirtualNodes, slots: int) -> str:
    return ",".join(f"{n.address}:{slots}" for n in cluster.nodes)


# ----------------------------------------------------------------------------- launchers


@pytest.mark.horovod
# In make test-heavy (make test's budget): finished lab 7 in the browser runs the Horovod script on two virtual
# nodes of two slots by mpirun (nodes_lab.ranks_per_host), and lab 8's cells run Gloo across the nodes.
@pytest.mark.heavy
@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun", "gloo"])
def test_horovod_solution_runs_on_two_nodes_and_records_where_each_rank_ran(
        cluster: nodes.VirtualNodes, work: Path, launcher: str) -> None:
    r = _cli("run", "--launcher", launcher, "--hostfile", str(cluster.hostfile), "--np", "4", "--",
             "python", str(SOLUTION), *TINY)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (record,) = _records(work)
    assert record.launcher == launcher and record.workers == 4 and record.status == "ok"
    assert _placement(record) == {0: ("node1", 0), 1: ("node1", 1), 2: ("node2", 0), 3: ("node2", 1)}


def test_multiworker_cluster_runs_a_worker_on_each_node(cluster: nodes.VirtualNodes, work: Path) -> None:
    r = _cli("cluster", "--hosts", _hosts(cluster, 1), "--workers", "2", "--", "python", str(MULTIWORKER), *TINY,
             "--backup-dir", str(work / "backup"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (record,) = _records(work)
    assert record.strategy == "MultiWorkerMirroredStrategy" and record.workers == 2
    assert {r.host for r in record.ranks or []} == {"node1", "node2"}


def test_parameter_server_cluster_has_tasks_on_both_nodes(cluster: nodes.VirtualNodes, work: Path) -> None:
    r = _cli("cluster", "--hostfile", str(cluster.hostfile), "--chief", "--workers", "2", "--ps", "1", "--",
             "python", str(PS), *TINY)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (record,) = _records(work)
    assert record.strategy == "ParameterServerStrategy"
    assert len(record.worker_steps or {}) == 2, record.worker_steps  # both workers stepped
    assert [r.host for r in record.ranks or [] if r.task == "chief.0"] == ["node1"]
    # placed by slots: chief and worker 0 on node1, worker 1 and the ps on node2, each started over ssh
    started = {re.search(r"LABKIT_TASK=(\S+)", line).group(1): line
               for line in (Path(str(record.log_dir)) / "command.txt").read_text().splitlines()
               if "LABKIT_TASK=" in line}
    node1, node2 = (n.address for n in cluster.nodes)
    assert {t: node1 in line.split("'")[0] for t, line in started.items()} == {
        "chief.0": True, "worker.0": True, "worker.1": False, "ps.0": False}, started
    assert all(node2 in started[t].split("'")[0] for t in ("worker.1", "ps.0"))


# ----------------------------------------------------------------------------- Slurm on the nodes


@pytest.mark.horovod
# srun once in make test (one task per node); every other start and task count in make test-heavy (make test's
# budget: finished lab 7 in the browser submits the Horovod script by mpirun and the multi-worker script by
# tf_config to the nodes, nodes_lab.slurm_per_host; TF_CONFIG across the nodes also runs in
# test_multiworker_cluster_runs_a_worker_on_each_node).
@pytest.mark.parametrize(("start", "tasks"), [
    pytest.param(s, t, marks=[] if (s, t) == ("srun", 1) else [pytest.mark.heavy])
    for s in ("mpirun", "srun", "tf_config") for t in (1, 2)])
def test_slurm_runs_across_both_nodes(cluster: nodes.VirtualNodes, work: Path, start: str, tasks: int) -> None:
    script = MULTIWORKER if start == "tf_config" else SOLUTION
    extra = ["--backup-dir", str(work / "backup")] if start == "tf_config" else []
    result = launch.run(["python", str(script), *TINY, *extra], job=JobSpec(quiet=True, cwd=work, timeout=600),
                        launcher="slurm", slurm=launch.SlurmOptions(nodes=2, tasks_per_node=tasks, start=start))
    assert result.ok, result.summary()
    placed = _placement(result.record)
    assert len(placed) == 2 * tasks
    assert sorted(placed.values()) == sorted((f"node{n}", i) for n in (1, 2) for i in range(tasks)) or (
        start == "tf_config" and {h for h, _ in placed.values()} == {"node1", "node2"}), placed


@pytest.mark.horovod
@pytest.mark.heavy  # 37 s: make test's budget; finished lab 7 in the browser submits its batch script to the nodes
def test_plain_batch_script_runs_across_both_nodes(cluster: nodes.VirtualNodes, work: Path) -> None:
    job = work / "job.sbatch"
    launch.run(["python", str(SOLUTION), *TINY], job=JobSpec(quiet=True, cwd=work), launcher="slurm",
               slurm=launch.SlurmOptions(nodes=2, tasks_per_node=2, plain=True, script_only=job))
    assert job.exists()
    venv = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # activated
    waited = subprocess.run([sys.executable, "-m", "labkit.launching.slurm_wait", job.name], cwd=work,
                            capture_output=True, text=True, timeout=900, env=venv)
    (output,) = work.glob("slurm-*.out")
    log = output.read_text(errors="replace")
    assert waited.returncode == 0, waited.stdout + waited.stderr + log
    assert "Test accuracy:" in log
    job_id = re.search(r"slurm-(\d+)\.out", output.name).group(1)
    shown = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30).stdout
    assert re.search(r"\bNodeList=node\[1-2\]", shown), shown


# ----------------------------------------------------------------------------- engines and bench


@pytest.mark.horovod
@pytest.mark.heavy  # make test's budget: finished lab 7 in the browser starts engines on the nodes through Slurm
def test_engines_on_both_nodes_allreduce_with_horovod(cluster: nodes.VirtualNodes, work: Path) -> None:
    rc = engines.start(4, hostfile=cluster.hostfile, activate=False, timeout=180)
    job_id = engines._CURRENT["job_id"]
    try:
        rc[:].execute(  # as a %%px cell would
            "import socket\nimport horovod.tensorflow as hvd\nimport tensorflow as tf\nhvd.init()\n"
            "result = (hvd.rank(), socket.gethostname(), hvd.local_rank(),"
            " float(hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum)))", block=True)
        results = sorted(rc[:].pull("result", block=True))
    finally:
        engines.stop()
    assert results == [(0, "node1", 0, 10.0), (1, "node1", 1, 10.0), (2, "node2", 0, 10.0), (3, "node2", 1, 10.0)]
    assert proc.marked(job_id) == []


@pytest.mark.horovod
@pytest.mark.heavy  # 17 s, make test's budget: bench runs in make test on one machine (test_bench.py)
def test_bench_across_nodes(cluster: nodes.VirtualNodes, work: Path) -> None:
    hostfile = work / "hostfile"
    hosts.write_hostfile([hosts.Host(n.address, 1) for n in cluster.nodes], hostfile)
    r = _cli("bench", str(SOLUTION), "--np", "2", "--hostfile", str(hostfile), "--json", "--", *TINY)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (record,) = [x for x in _records(work) if x.workers == 2]
    assert _placement(record) == {0: ("node1", 0), 1: ("node2", 0)}
    assert record.images_per_sec and record.images_per_sec > 0


# ----------------------------------------------------------------------------- failures a workshop meets


def test_a_node_without_sshd_is_named_before_launch(cluster: nodes.VirtualNodes, work: Path) -> None:
    cluster.set_sshd("node2", running=False)
    try:
        start = time.monotonic()
        r = _cli("run", "--hostfile", str(cluster.hostfile), "--np", "4", "--", "python", "-c", "print('ran')",
                 timeout=120)
        took = time.monotonic() - start
    finally:
        cluster.set_sshd("node2", running=True)
    assert r.returncode != 0 and "ran" not in r.stdout
    text = r.stdout + r.stderr
    assert cluster.nodes[1].address in text and "refused" in text and "start it there" in text, text
    assert cluster.nodes[0].address + ":" not in text  # node1 answers: not named
    assert took < 60
    assert not list(work.glob("runs/logs/*/rank.*"))  # nothing started


def test_unknown_host_key_and_wrong_user_are_named_with_their_fix(cluster: nodes.VirtualNodes, tmp_path: Path) -> None:
    hosts_ = hosts.parse_hostfile(cluster.hostfile)
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(hosts.HostError) as e:
        reach.ssh_preflight(hosts_, ssh_args=["-F", str(cluster.ssh_config), "-o", f"UserKnownHostsFile={empty}"])
    assert "Host key verification failed" in str(e.value) and "ssh-keygen -R 198.18.0.12" in str(e.value)
    with pytest.raises(hosts.HostError) as e:
        reach.ssh_preflight(hosts_, ssh_args=["-F", str(cluster.ssh_config), "-l", "nobody"])
    assert "Permission denied" in str(e.value) and "ssh-copy-id USER@198.18.0.11" in str(e.value)
    reach.ssh_preflight(hosts_)  # with the nodes' own config both answer


def _running_on(cluster: nodes.VirtualNodes, node: int, needle: str) -> list[psutil.Process]:
    found = []
    for p in net.inside(cluster.nodes[node - 1].netns):
        try:
            if needle in " ".join(p.cmdline()):
                found.append(p)
        except psutil.Error:
            continue
    return found


def _forever(cluster: nodes.VirtualNodes, work: Path, break_node2) -> tuple[launch.JobResult, float]:
    """Run an endless MPI allreduce on node1 and node2, break node2 once it runs; the result and seconds after."""
    script = work / "forever.py"
    script.write_text(FOREVER)
    out: dict = {}
    import threading

    def go() -> None:
        out["result"] = launch.run(["python", str(script)],
                                   job=JobSpec(quiet=True, record=False, cwd=work,
                                               timeout=300), np=2, hosts=_hosts(cluster, 1))

    t = threading.Thread(target=go)
    t.start()
    deadline = time.monotonic() + 120
    while t.is_alive() and time.monotonic() < deadline and not _running_on(cluster, 2, "forever.py"):
        time.sleep(0.5)
    time.sleep(2)
    broken = time.monotonic()
    break_node2()
    t.join(300)
    assert "result" in out, "the job did not run"
    return out["result"], time.monotonic() - broken


def test_a_node_whose_processes_die_ends_the_job_naming_it(cluster: nodes.VirtualNodes, work: Path) -> None:
    def kill() -> None:
        for p in _running_on(cluster, 2, "forever.py"):
            p.send_signal(signal.SIGKILL)

    result, after = _forever(cluster, work, kill)
    assert not result.ok and after < 60
    summary = result.summary()
    assert "node2" in summary or cluster.nodes[1].address in summary, summary


def test_a_node_whose_link_goes_down_ends_the_job_naming_it(cluster: nodes.VirtualNodes, work: Path) -> None:
    link = cluster.nodes[1].netns  # the host's end of node2's veth
    try:
        result, after = _forever(cluster, work, lambda: net.run(["ip", "link", "set", link, "down"]))
    finally:
        net.run(["ip", "link", "set", link, "up"])
    assert not result.ok and after < 30, (after, result.summary())
    assert result.lost and "node2 (198.18.0.12)" in result.lost and "lost host" in result.summary()
    # once the link is back, node2's ranks see their ssh connection gone and end (checked by the fixture)


def test_a_tf_distribute_cluster_whose_node_goes_away_ends_naming_it(cluster: nodes.VirtualNodes,
                                                                      work: Path) -> None:
    """The same for `labkit cluster`: a task on a host that stops answering ends the run, named, not a hang."""
    script = work / "serve.py"
    script.write_text("import time\nwhile True:\n    time.sleep(0.5)\n")
    placed = [hosts.Host(n.address, 1) for n in cluster.nodes]
    out: dict = {}

    def go() -> None:
        out["result"] = tf_cluster.run(["python", str(script)], tasks=Tasks(workers=2, host_list=placed),
                                       job=JobSpec(quiet=True, record=False, cwd=work, timeout=300))

    t = threading.Thread(target=go)
    t.start()
    deadline = time.monotonic() + 120
    while t.is_alive() and time.monotonic() < deadline and not _running_on(cluster, 2, "serve.py"):
        time.sleep(0.5)
    link = cluster.nodes[1].netns  # the host's end of node2's veth
    broken = time.monotonic()
    try:
        net.run(["ip", "link", "set", link, "down"])
        t.join(120)
    finally:
        net.run(["ip", "link", "set", link, "up"])
    assert "result" in out, "the cluster did not end"
    result = out["result"]
    assert not result.ok and time.monotonic() - broken < 60, result.summary()
    assert result.lost and "node2 (198.18.0.12)" in result.lost and "lost host" in result.summary()


@pytest.mark.horovod
@pytest.mark.heavy  # make test runs the same elastic job on virtual nodes in lab 8 (test_notebook_communication.py)
def test_an_elastic_job_shrinks_when_a_node_leaves_and_grows_when_it_returns(cluster: nodes.VirtualNodes,
                                                                             work: Path) -> None:
    """Horovod Elastic over Gloo: node2 leaves the host discovery after 3 epochs and returns after 4 more."""
    report = elastic.leave_and_return(cluster.hostfile, epochs=18, leave_after=3, away=4, log_dir=work / "logs")
    print(report)
    sizes = report.sizes()
    assert report.ok, report.summary
    shrunk = sizes.index(2) if 2 in sizes else -1
    assert sizes[0] == 4 and shrunk > 0 and 4 in sizes[shrunk:], sizes  # 4 workers, then node1's 2, then 4 again
    assert report.completed() == set(range(18)), "an epoch was lost"


@pytest.mark.horovod
@pytest.mark.heavy  # make test runs lab 9's elastic check on one machine's slots (test_lab_at_scale.py)
def test_lab9s_elastic_script_loses_a_node_and_gets_it_back(cluster: nodes.VirtualNodes, work: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Lab 9's cell on the nodes `labkit nodes up` started: the learner's elastic script, one worker per node,
    node2 taken away and given back; the check's judge of step 5 passes."""
    from labkit.ui import scale_lab

    copy = work / "fashion_mnist.py"  # a learner's own copy, not the course's file
    copy.write_text(ELASTIC.read_text())
    run = scale_lab.elastic_on_nodes(str(copy))
    out = capsys.readouterr().out
    assert run is not None and "It worked: " in out, out
    assert run.left is not None and run.returned is not None and len({w.pid for w in run.workers}) >= 3, run


@pytest.mark.heavy  # 34 s, make test's budget: the lab's check kills and restarts a worker on one machine
def test_multiworker_resumes_when_the_node_comes_back(cluster: nodes.VirtualNodes, work: Path) -> None:
    placed = [hosts.Host(n.address, 1) for n in cluster.nodes]
    report = faults.kill_and_resume(["python", str(MULTIWORKER), "--epochs", "3", "--train-size", "256",
                                     "--test-size", "128", "--backup-dir", str(work / "backup")],
                                    workers=2, kill=("worker", 1), kill_in_epoch=2, timeout=900, host_list=placed)
    assert report.ok, str(report)
    assert report.after and min(report.after) >= 2, str(report)  # resumed, not started over
    assert report.result is not None and report.result.ok
