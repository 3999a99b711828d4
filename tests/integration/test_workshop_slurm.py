"""``labkit workshop up --slurm``: learners' jobs on the virtual nodes, limited by Slurm, under a hostile learner.

One workshop for the module (``lifecycle.up`` for one learner with ``slurm=True``, the hub replaced by a canary
``sleep``: the jobs are what is tested, submitted the way the learner's server would, from a process in the
learner's limits). The learner's jobs run as the learner on a node, get the partition's time limit, are held to
their CPUs, are ended by Slurm's control groups at the memory limit, and a fork bomb stops at the learner's task
cap; a job asking for more time or memory never runs. ``down`` leaves no job, node, account or control group.
Needs root, useradd, Slurm and munge; skipped otherwise.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.learner import BOMB, HOG, PYTHON, run_as, skip_unless_a_workshop_can_start, without_hub

from labkit.core.proc import wait_until as proc_wait
from labkit.nodes import net, slurm_conf, virtual
from labkit.nodes import slurm as nodes_slurm
from labkit.workshop import accounts, leftovers, lifecycle, limits, slurmlimits

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None or nodes_slurm.missing() is not None,
                       reason="needs root, useradd, Slurm and munge"),
    pytest.mark.slow,
]

LEARNER, OTHER = "learner01", "learner02"
PIDS = 64
MEMORY = "256M"
MINUTES = 2
RUNNING, NODES = 1, 1  # the learner's caps at once (Slurm's accounting)
# What a hostile learner's job does first: raise its soft task limit as far as the hard one lets it.
RAISE_SOFT_CAP = "import resource; _, hard = resource.getrlimit(resource.RLIMIT_NPROC); " \
                 "resource.setrlimit(resource.RLIMIT_NPROC, (hard, hard))\n"


def _slurm_groups() -> set[Path]:
    """Control groups Slurm's cgroup plugin makes (``slurm*`` under each v1 hierarchy, or the v2 tree)."""
    root = Path("/sys/fs/cgroup")
    return {p for p in (*root.glob("slurm*"), *root.glob("*/slurm*")) if p.is_dir()}


class Workshop:
    def __init__(self, st: lifecycle.State, conf: Path, asked: limits.Limits, procs: dict[str, list[str]]) -> None:
        self.st, self.conf, self.asked, self.procs = st, conf, asked, procs

    def submit(self, *args: str, user: str = LEARNER, script: str | None = None) -> subprocess.CompletedProcess[str]:
        """``sbatch ARGS`` (with ``script`` as the batch script) as ``user``, from a process in the learner's limits
        (as their server is)."""
        return run_as(user, ["sbatch", "--parsable", *args], procs=self.procs.get(user), asked=self.asked,
                      env={"SLURM_CONF": str(self.conf)}, input=script)

    def job(self, job_id: str) -> dict[str, str]:
        out = subprocess.run(["scontrol", "show", "job", "--oneliner", job_id], capture_output=True, text=True,
                             env={**os.environ, "SLURM_CONF": str(self.conf)}, timeout=30)
        return dict(f.split("=", 1) for f in out.stdout.split() if "=" in f)

    def wait(self, job_id: str, timeout: float = 90) -> dict[str, str]:
        """The job's fields once it has ended (or ``timeout`` passed)."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job(job_id)
            if fields.get("JobState") not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", None) \
                    or time.monotonic() > deadline:
                return fields
            time.sleep(0.5)

    def output(self, name: str, user: str = LEARNER) -> str:
        """A file the job wrote in ``user``'s home, read as ``user``."""
        home = pwd.getpwnam(user).pw_dir
        return run_as(user, ["cat", f"{home}/{name}"]).stdout


@pytest.fixture(scope="module")
def workshop() -> Iterator[Workshop]:
    if virtual.VirtualNodes.load() is not None or net.netns_names():
        pytest.skip("virtual nodes are up on this machine already")
    asked = limits.Limits(None, limits.parse_memory(MEMORY), PIDS)
    skip_unless_a_workshop_can_start(asked, LEARNER)
    state = Path(f"/run/labkit-workshop-slurm-{os.getpid()}")
    groups_before = _slurm_groups()
    users_before = {p.pw_name for p in pwd.getpwall()}
    fake_hub = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL, start_new_session=True)
    uids: set[int] = set()
    with pytest.MonkeyPatch.context() as mp:
        without_hub(mp, fake_hub.pid)
        try:
            start = time.monotonic()
            st, _ = lifecycle.up(lifecycle.Plan(2, port=1, folder=str(state), slurm=True, memory=MEMORY, pids=PIDS,
                                 job_minutes=MINUTES, jobs_per_learner=RUNNING, nodes_per_learner=NODES),
                                 say=print)
            print(f"\nworkshop up --slurm: {time.monotonic() - start:.1f} s")
            uids = accounts.uids_of(st.made["users"])
            cluster = virtual.VirtualNodes.load()
            assert cluster is not None and cluster.confined
            procs = {}
            for name in (LEARNER, OTHER):
                procs[name], problem = limits.make(name, asked)
                assert problem is None
            yield Workshop(st, cluster.slurm_conf, asked, procs)
        finally:
            leftovers.stop_processes(uids)
            lifecycle.down(str(state))
            fake_hub.kill()
            fake_hub.wait()
    assert virtual.VirtualNodes.load() is None and net.netns_names() == []
    assert {p.pw_name for p in pwd.getpwall()} == users_before and not state.exists()
    assert leftovers.processes_of(uids) == []
    assert _slurm_groups() <= groups_before  # Slurm's groups of the nodes are gone with them


def test_a_learners_job_runs_as_the_learner_held_to_its_cpus_time_and_tasks(workshop: Workshop) -> None:
    nproc_cap = f"{PYTHON} -c 'import resource; print(resource.getrlimit(resource.RLIMIT_NPROC)[1])'"
    script = f"echo WHO $(id -un) $(nproc) $({nproc_cap}) $(hostname)"
    out = workshop.submit("-c", "1", "-o", "who-%j.out", f"--chdir={pwd.getpwnam(LEARNER).pw_dir}",
                          "--wrap", script)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip()
    fields = workshop.wait(job)
    assert fields["JobState"] == "COMPLETED", {k: fields.get(k) for k in ("JobState", "Reason", "NodeList")}
    assert fields["TimeLimit"] == f"00:{MINUTES:02d}:00"  # the partition's MaxTime, as no --time was asked
    text = workshop.output(f"who-{job}.out")
    who = next((line.split()[1:] for line in text.splitlines() if line.startswith("WHO ")), [])
    assert len(who) == 4, text
    user, cpus, tasks, host = who
    assert (user, cpus, tasks) == (LEARNER, "1", str(PIDS)) and host.startswith("node"), (user, cpus, tasks, host)


def test_a_job_asking_for_more_time_or_memory_never_runs(workshop: Workshop) -> None:
    for ask in (["-t", str(MINUTES + 5)], ["--mem", "1G"]):
        out = workshop.submit(*ask, "--wrap", "echo RAN")
        if out.returncode != 0:  # refused at once: fine, it did not run
            assert "limit" in out.stderr.lower() or "memory" in out.stderr.lower(), out.stderr
            print(f"\nsbatch {' '.join(ask)}: refused: {out.stderr.strip()}")
            continue
        job = out.stdout.strip()
        time.sleep(3)
        fields = workshop.job(job)
        try:
            assert fields["JobState"] == "PENDING", (ask, fields)
            assert fields["Reason"] in ("PartitionTimeLimit", "PartitionConfig", "MaxMemPerLimit"), (ask, fields)
            print(f"\nsbatch {' '.join(ask)}: pending, {fields['Reason']}")
        finally:
            subprocess.run(["scancel", job], env={**os.environ, "SLURM_CONF": str(workshop.conf)}, check=False)


def test_a_memory_hog_in_a_job_is_ended_by_slurm(workshop: Workshop) -> None:
    out = workshop.submit("-o", "/dev/null", "--wrap", f"{PYTHON} -c '{HOG}'")
    assert out.returncode == 0, out.stderr
    fields = workshop.wait(out.stdout.strip())
    assert fields["JobState"] == "OUT_OF_MEMORY", fields
    print(f"\nmemory hog in a job under {MEMORY}: {fields['JobState']} after {fields.get('RunTime')}")


def test_a_fork_bomb_in_a_job_stops_at_the_learners_task_cap(workshop: Workshop) -> None:
    home = pwd.getpwnam(LEARNER).pw_dir
    out = run_as(LEARNER, ["sbatch", "--parsable", "-o", "bomb-%j.out", f"--chdir={home}"],
                 procs=workshop.procs[LEARNER], asked=workshop.asked, env={"SLURM_CONF": str(workshop.conf)},
                 input=f"#!/bin/sh\n{PYTHON} - <<'EOF'\n{RAISE_SOFT_CAP}{BOMB}\nEOF\n")
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip()
    try:
        workshop.wait(job)
        born = int(workshop.output(f"bomb-{job}.out").split()[0])
        assert 0 < born < PIDS, born  # the rest were refused by the kernel
    finally:
        subprocess.run(["scancel", job], env={**os.environ, "SLURM_CONF": str(workshop.conf)}, check=False)
    print(f"\nfork bomb in a job under the task cap {PIDS}: {born} children, then fork failed")


def test_a_learner_submits_from_their_own_world_through_its_firewall(workshop: Workshop) -> None:
    """As from their server: in their own network namespace (routes to the hub and the controller only), sbatch
    reaches Slurm and the job runs; nothing else of the machine is reached from there."""
    from labkit.workshop import worlds

    info = pwd.getpwnam(LEARNER)
    network = next(n for n in worlds.plan(workshop.st.made["worlds"]) if n.name == LEARNER)
    prefix = worlds.argv(worlds.World(info.pw_uid, info.pw_gid, info.pw_dir, network.path))
    env = {"PATH": "/usr/bin:/bin", "HOME": info.pw_dir, "SLURM_CONF": str(workshop.conf), "LANG": "C.UTF-8"}
    done = subprocess.run([*prefix, "sbatch", "--parsable", "--wait", "-o", "/dev/null", "--wrap", "true"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout.strip().isdigit(), (done.stdout, done.stderr)


# What a job says of its temporary folder: TMPDIR, where Python puts temporary files, and where OpenMPI keeps its
# session folder (the name another learner could take first in a shared /tmp).
TMP_REPORT = (f"echo TMP $TMPDIR $(stat -c '%U %a' $TMPDIR) "
              f"$({PYTHON} -c 'import tempfile; print(tempfile.gettempdir())'); "
              "mpirun --oversubscribe -np 1 sh -c 'ls -d $TMPDIR/ompi.*' | sed 's/^/OMPI /'; "
              "touch /tmp/mine /var/tmp/mine2 /dev/shm/mine3; echo SEEN $(ls $TMPDIR/mine* | wc -l) "
              "$(stat -c '%U %a' /dev/shm)")


def test_each_job_has_a_temporary_folder_of_its_own(workshop: Workshop) -> None:
    """TMPDIR is the job's own folder on its node (made by root's Prolog, the learner's, closed to others),
    Python and OpenMPI keep their files there, the job's /tmp, /var/tmp and /dev/shm are its own, and all of it
    is gone when the job ends (root's Epilog)."""
    home = pwd.getpwnam(LEARNER).pw_dir
    out = workshop.submit("-o", "tmp-%j.out", f"--chdir={home}", "--wrap", TMP_REPORT)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip()
    assert workshop.wait(job)["JobState"] == "COMPLETED"
    text = workshop.output(f"tmp-{job}.out")
    said = next((line.split()[1:] for line in text.splitlines() if line.startswith("TMP ")), [])
    assert len(said) == 4, text
    folder, owner, mode, python_tmp = said
    assert folder.endswith(f"/jobs/{job}/tmp") and folder.startswith(str(workshop.conf.parent)), text
    assert (owner, mode, python_tmp) == (LEARNER, "700", folder), text
    assert any(line.startswith(f"OMPI {folder}/ompi.") for line in text.splitlines()), text
    # /tmp and /var/tmp are that folder, /dev/shm the job's own: nothing lands in the machine's
    assert f"SEEN 2 {LEARNER} 700" in text, text
    assert not any(Path(p).exists() for p in ("/tmp/mine", "/var/tmp/mine2", "/dev/shm/mine3"))
    out = workshop.submit("-o", f"{home}/rel-%j.out", "--chdir=/tmp", "--wrap", "touch rel-mine; stat -c '%U %a' .")
    assert out.returncode == 0, out.stderr
    assert workshop.wait(out.stdout.strip())["JobState"] == "COMPLETED"
    assert workshop.output(f"rel-{out.stdout.strip()}.out").split() == [LEARNER, "700"]  # started in /tmp: its own
    assert not Path("/tmp/rel-mine").exists()
    assert not Path(folder).parent.exists()  # removed with the job
    jobs = Path(folder).parent.parent
    assert jobs.stat().st_uid == 0 and (jobs.stat().st_mode & 0o777) == 0o711


PORT = 45123  # where a learner's job listens, in its own network (a free port in every seat)
# Listens on 0.0.0.0:PORT, answers itself at 127.0.0.1 and at its node's name, says READY, then counts every
# connection it accepts until the file `stop` appears in its folder (60 s at most).
LISTENER = f"""
import os, socket, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", {PORT})); s.listen(50)
for host in ("127.0.0.1", socket.gethostname()):
    socket.create_connection((host, {PORT}), timeout=5); s.accept()
print("READY", flush=True)
s.settimeout(0.5); got = 0; end = time.time() + 60
while time.time() < end and not os.path.exists("stop"):
    try:
        s.accept(); got += 1
    except OSError:
        pass
print("ACCEPTED", got, flush=True)
"""
# Tries each address given, and says what happened.
PROBE = f"""
import socket, sys
for host in sys.argv[1:]:
    try:
        socket.create_connection((host, {PORT}), timeout=3).close(); print("REACHED", host)
    except OSError as e:
        print("REFUSED", host, type(e).__name__)
"""
# Two tasks on the two nodes of one job: task 0 (node1) listens, task 1 (node2) reaches it at the name node1.
PAIR = f"""
import os, socket, time
if os.environ["SLURM_PROCID"] == "0":
    s = socket.socket(); s.bind(("0.0.0.0", {PORT})); s.listen(5); s.settimeout(30)
    c, peer = s.accept(); print("PAIR-ACCEPTED", peer[0], socket.gethostbyname(socket.gethostname()), flush=True)
else:
    for _ in range(60):
        try:
            socket.create_connection(("node1", {PORT}), timeout=2).close(); print("PAIR-REACHED node1"); break
        except OSError:
            time.sleep(0.5)
"""


def _script(code: str) -> str:
    return f"#!/bin/sh\n{PYTHON} - \"$@\" <<'EOF'\n{code}\nEOF\n"


def test_a_learners_batch_jobs_live_in_their_own_network(workshop: Workshop) -> None:
    """Slurm's plug-in puts each account's jobs in the account's seat on the node: learner02's listener on
    0.0.0.0 answers learner02 (at 127.0.0.1 and its node's name) and is refused to learner01's jobs on both nodes
    at every address that could lead there; the instructor's two-node job reaches its own task on the other node
    by name. Each job has its own /tmp: nothing learner01 leaves there is learner02's to see."""
    from labkit.workshop import onnodes

    seats = onnodes.server_seats(workshop.st.made)
    theirs = [s.address for s in seats if s.name == OTHER]
    nodes = sorted({s.node.name: s.node.address for s in seats}.items())
    env = {**os.environ, "SLURM_CONF": str(workshop.conf)}
    taken: list[str] = []
    try:
        homes = {u: pwd.getpwnam(u).pw_dir for u in (LEARNER, OTHER, workshop.st.instructor)}
        out = workshop.submit("-w", nodes[0][0], "-o", "listen-%j.out", f"--chdir={homes[OTHER]}",
                              user=OTHER, script=_script(LISTENER))
        assert out.returncode == 0, out.stderr
        listener = out.stdout.strip()
        taken.append(listener)
        assert proc_wait(lambda: "READY" in workshop.output(f"listen-{listener}.out", OTHER), 60), \
            (workshop.job(listener), workshop.output(f"listen-{listener}.out", OTHER))
        said = []
        for node, address in nodes:  # learner01's jobs (one at a time: their cap) on each node
            targets = ["127.0.0.1", nodes[0][0], address, nodes[0][1], *theirs]
            out = workshop.submit("-w", node, "-o", "probe-%j.out", f"--chdir={homes[LEARNER]}",
                                  script=_script(PROBE.replace("sys.argv[1:]", repr(targets))))
            assert out.returncode == 0, out.stderr
            taken.append(out.stdout.strip())
            assert workshop.wait(taken[-1])["JobState"] == "COMPLETED"
            said += workshop.output(f"probe-{taken[-1]}.out").splitlines()
        assert len(said) == 2 * len(targets) and all(line.startswith("REFUSED") for line in said), said
        run_as(OTHER, ["touch", f"{homes[OTHER]}/stop"])
        assert workshop.wait(listener)["JobState"] == "COMPLETED"
        assert "ACCEPTED 0" in workshop.output(f"listen-{listener}.out", OTHER)  # none of learner01's got in
        pair = subprocess.run(
            ["runuser", "-u", workshop.st.instructor, "--", "sbatch", "--parsable", "-N", "2", "-n", "2",
             "-o", "pair-%j.out", f"--chdir={homes[workshop.st.instructor]}",
             "--wrap", f"srun {PYTHON} - <<'EOF'\n{PAIR}\nEOF"], capture_output=True, text=True, env=env, timeout=60)
        assert pair.returncode == 0, pair.stderr
        taken.append(pair.stdout.strip())
        assert workshop.wait(taken[-1])["JobState"] == "COMPLETED", workshop.job(taken[-1])
        text = workshop.output(f"pair-{taken[-1]}.out", workshop.st.instructor)
        assert "PAIR-REACHED node1" in text and "PAIR-ACCEPTED" in text, text
        seat_of = {s.address for s in seats if s.name == workshop.st.instructor}
        accepted = next(line.split() for line in text.splitlines() if line.startswith("PAIR-ACCEPTED"))
        assert accepted[1] in seat_of and accepted[2] in seat_of, (accepted, seat_of)  # seat to seat, by name
    finally:
        for job in taken:
            subprocess.run(["scancel", job], env=env, check=False)


def _submit_until_refused(workshop: Workshop, most: int, *args: str, cancel: bool = False) -> tuple[list[str], str]:
    """Submit held jobs (each cancelled at once with ``cancel``) until Slurm refuses one; the ids taken and the
    refusal ("" when none of ``most`` was refused)."""
    taken: list[str] = []
    for _ in range(most):
        out = workshop.submit("--hold", "-o", "/dev/null", "--wrap", "true")
        if out.returncode != 0:
            return taken, out.stderr
        taken.append(out.stdout.strip())
        if cancel:
            run_as(LEARNER, ["scancel", taken[-1]], env={"SLURM_CONF": str(workshop.conf)})
    return taken, ""


def test_a_learner_holds_at_most_their_jobs_and_nodes_at_once(workshop: Workshop) -> None:
    """The fixture's caps (one running job, one node, four in the queue): a second job waits for the first, a
    two-node job never starts, a submission past the queue's cap is refused; a user the workshop did not add
    cannot submit at all."""
    env = {"SLURM_CONF": str(workshop.conf)}
    taken: list[str] = []
    try:
        first = workshop.submit("-o", "/dev/null", "--wrap", "sleep 120")
        assert first.returncode == 0, first.stderr
        taken.append(first.stdout.strip())
        assert proc_wait(lambda: workshop.job(taken[0]).get("JobState") == "RUNNING", 30), workshop.job(taken[0])
        for ask in ([], ["-N", "2"]):
            out = workshop.submit(*ask, "-o", "/dev/null", "--wrap", "true")
            if out.returncode != 0:  # Slurm may refuse at once a job no cap lets run
                assert ask and "QOS" in out.stderr, out.stderr
                continue
            taken.append(out.stdout.strip())
            reason, job = "QOSMaxJobsPerUserLimit" if not ask else "QOSMax", taken[-1]
            assert proc_wait(lambda r=reason, j=job: r in workshop.job(j).get("Reason", ""), 15), workshop.job(job)
            assert workshop.job(taken[-1])["JobState"] == "PENDING"
        more, refused = _submit_until_refused(workshop, 10)
        taken += more
        assert len(taken) == RUNNING * slurmlimits.QUEUED_PER_RUNNING and "QOSMaxSubmitJobPerUserLimit" in refused, \
            (taken, refused)
    finally:
        if taken:
            run_as(LEARNER, ["scancel", *taken], env=env)
    stranger = run_as("nobody", ["sbatch", "--parsable", "-D", "/", "-o", "/dev/null", "--wrap", "true"], env=env)
    assert stranger.returncode != 0 and "Invalid account" in stranger.stderr, stranger


def test_a_learner_cannot_fill_the_queue(workshop: Workshop) -> None:
    """Jobs submitted and cancelled at once, up to the per-user hourly cap, are taken; the next is refused
    (job_submit/throttle). Last in the module: the learner's cap is spent for the hour."""
    taken, refused = _submit_until_refused(workshop, slurm_conf.JOBS_PER_USER_PER_HOUR + 1, cancel=True)
    assert len(taken) <= slurm_conf.JOBS_PER_USER_PER_HOUR and refused, (len(taken), refused)
