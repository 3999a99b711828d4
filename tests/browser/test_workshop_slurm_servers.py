"""A workshop whose learners' servers are Slurm jobs (``workshop up --spawner slurm``), for real: two learners log
in through Debian's chromium, their JupyterLabs are served from node1 and node2 (two Slurm jobs, one per node), a
check runs in each and both show on the instructor's class page, a learner's own job from their server runs on
the cluster, and a hostile learner can neither submit to the servers' partition nor make the hub run a command of
theirs through batchspawner's API. Stopping a server cancels its job; ``down`` leaves no job, node, account or
process. Needs root, JupyterHub, batchspawner, Slurm and munge, Playwright and chromium; skipped otherwise."""

from __future__ import annotations

import grp
import json
import os
import pwd
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import psutil
import pytest
from helpers import browser, hubpage, paths
from helpers.hubconf import hub_missing

from labkit.core import proc, tfconfig
from labkit.nodes import net, virtual
from labkit.nodes import slurm as nodes_slurm
from labkit.records import classlog
from labkit.workshop import accounts, hub, leftovers, lifecycle, nodeworlds, onnodes, slurmservers

ROOT = paths.ROOT
SOLUTION = ROOT / "solutions" / "fashion_mnist_after_step_01.py"
LEARNERS = ("learner01", "learner02")


def _missing() -> str | None:
    if hub_missing() is not None:
        return hub_missing()
    if nodes_slurm.missing() is not None:
        return nodes_slurm.missing()
    try:
        import batchspawner  # noqa: F401
    except ImportError:
        return "batchspawner is not installed: pip install -e '.[workshop]'"
    return browser.missing()


# 115 s on a clean clone with the hub's and the nodes' bring-up: make test-heavy, for make test's budget
# (test_workshop_slurm.py keeps learners' batch jobs in their seats, hostile learners included, in make test).
pytestmark = [pytest.mark.slow, pytest.mark.heavy,
              pytest.mark.skipif(_missing() is not None, reason=str(_missing()))]


def _snapshot() -> dict[str, object]:
    return {"users": {p.pw_name for p in pwd.getpwall()}, "groups": {g.gr_name for g in grp.getgrall()},
            "homes": set(os.listdir("/home")), "netns": set(net.netns_names())}


def _squeue(conf: Path) -> list[list[str]]:
    """Slurm's jobs: id, partition, name, state, node."""
    out = subprocess.run(["squeue", "--noheader", "--format=%i %P %j %T %N"], capture_output=True, text=True,
                         env={**os.environ, "SLURM_CONF": str(conf)}, timeout=30)
    return [line.split() for line in out.stdout.splitlines()]


@pytest.fixture(scope="module")
def workshop() -> Iterator[tuple[lifecycle.State, dict[str, str]]]:
    state = Path(f"/run/labkit-workshop-test-slurm-{os.getpid()}")
    if lifecycle.State.load() is not None or accounts.user_exists("learner01") or state.exists() \
            or Path("/run/labkit-nodes/state.json").exists():
        pytest.skip("a workshop or virtual nodes are up on this machine already")
    before = _snapshot()
    uids: set[int] = set()
    job = ""
    try:
        st, pw = lifecycle.up(lifecycle.Plan(len(LEARNERS), port=tfconfig.free_ports(1)[0], folder=str(state), cores=1,
                              memory="2G", spawner="slurm"), say=print)
        uids, job = accounts.uids_of(st.made["users"]), st.job_id
        yield st, pw
    finally:
        lifecycle.down(str(state))
        assert lifecycle.down(str(state)) == []  # safe twice
        after = _snapshot()
        for kind in ("users", "groups", "homes", "netns"):
            assert after[kind] == before[kind], kind
        assert not state.exists() and not Path("/run/labkit-nodes").exists()  # the nodes and their Slurm
        assert len(uids) == 3 and leftovers.processes_of(uids) == [] and leftovers.temp_files(uids) == []
        assert proc.marked(job) == []  # the hub and its proxy
        netns = Path("/run/netns")
        assert not [n for n in (os.listdir(netns) if netns.is_dir() else []) if n.startswith(nodeworlds.PREFIX)]
        rules = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True, timeout=30).stdout
        assert nodeworlds.CHAIN not in rules and "198.18.1.0/24" not in subprocess.run(
            ["ip", "route"], capture_output=True, text=True, timeout=30).stdout
        names = {"slurmctld", "slurmd", "slurmstepd", "munged"}
        assert [p.info for p in psutil.process_iter(["name", "cmdline"]) if p.info["name"] in names
                and str(state) in " ".join(p.info["cmdline"] or [])] == []


def _records(st: lifecycle.State, who: str) -> list[classlog.Record]:
    return classlog.read_file(st.class_dir / f"{who}{classlog.SUFFIX}").records


# What a hostile learner's terminal runs: batchspawner's API, told to change the command the hub runs as root to
# cancel the job, and the port once more; then a job of their own in the servers' root-only partition.
HOSTILE = """python - <<'EOF'
import json, os, urllib.request
url = os.environ["JUPYTERHUB_API_URL"] + "/batchspawner"
for body in ({{"batch_cancel_cmd": "touch {canary}", "port": 40000}}, {{"exec_prefix": "touch {canary};"}},
             {{"port": 40001}}):
    req = urllib.request.Request(url, json.dumps(body).encode(), method="POST",
                                 headers={{"Authorization": "token " + os.environ["JUPYTERHUB_API_TOKEN"]}})
    try:
        print("API", urllib.request.urlopen(req).status)
    except urllib.error.HTTPError as e:
        print("API", e.code)
EOF
sbatch --partition=labkit-servers --wrap 'touch {canary}' 2>&1 | tail -1"""


def test_servers_are_slurm_jobs_on_the_nodes(workshop: tuple[lifecycle.State, dict[str, str]],
                                             tmp_path: Path) -> None:
    st, pw = workshop
    nodes = virtual.VirtualNodes.load()
    assert nodes is not None
    conf = nodes.slurm_conf
    canary = tmp_path / "canary"  # root's temporary folder: only a command run as root could make it
    took = {}
    with browser.browser() as one, browser.browser() as two:
        pages = dict(zip(LEARNERS, (one, two), strict=True))
        for who, page in pages.items():
            took[who] = hubpage.login(page, st.url, who, pw[who])
        print(f"\nworkshop up: {st.seconds_up} s; login to a running JupyterLab (a Slurm job): "
              f"{json.dumps({k: round(v, 1) for k, v in took.items()})} s")
        jobs = _squeue(conf)
        servers = {row[2]: row for row in jobs if row[1] == slurmservers.PARTITION}
        assert set(servers) == {"jupyterlab-learner01", "jupyterlab-learner02"}, jobs
        assert {row[3] for row in servers.values()} == {"RUNNING"}
        assert {row[4] for row in servers.values()} == {"node1", "node2"}, jobs
        hosts = {}
        for who, page in pages.items():
            out = hubpage.terminal(page, who, 'echo "HOST-IS $(hostname) $(id -un) $SLURM_JOB_PARTITION $(nproc) '
                                   '$(pwd)"')
            hosts[who] = out.split("HOST-IS ")[-1].split()[:5]
            home = pwd.getpwnam(who).pw_dir
            assert hosts[who][1:] == [who, slurmservers.PARTITION, "1", home], out  # held to its job's one CPU
        assert {h[0] for h in hosts.values()} == {"node1", "node2"}, hosts  # one server on each node
        # a learner's own job, from their server, runs on the cluster (the default partition, as the learner)
        out = hubpage.terminal(one, "learner01", "sbatch --wait --output=$HOME/job.out --wrap 'echo RAN-ON "
                               "$(hostname) $(id -un)' && cat $HOME/job.out", timeout=120)
        assert "RAN-ON node" in out and "learner01" in out.split("RAN-ON")[-1], out
        # hostile: batchspawner's API takes the port only, once; the servers' partition is root's
        out = hubpage.terminal(two, "learner02", HOSTILE.format(canary=canary), timeout=60)
        assert out.count("API 400") == 2 and "API 409" in out, out
        assert "denied" in out.lower() or "not available" in out.lower(), out
        # apart on the network: learner02's listener on 0.0.0.0 answers learner02 and root (the hub's side) only;
        # learner01's server and learner01's batch job reach it at no address, on either node
        on_nodes = nodeworlds.addresses(onnodes.server_seats(st.made))
        seats = {who: {node: per[who] for node, per in on_nodes.items()} for who in LEARNERS}
        node_of = {who: h[0] for who, h in hosts.items()}
        out = hubpage.terminal(two, "learner02", LISTEN, timeout=60)
        assert "OWN b'SECRET-OF-02'" in out, out
        assert _reach(seats["learner02"][node_of["learner02"]]) == "SECRET-OF-02"  # root on the hub's machine
        targets = ["127.0.0.1", *seats["learner02"].values(), *(n.address for n in nodes.nodes), net.gateway()]
        home1 = Path(pwd.getpwnam("learner01").pw_dir)
        (home1 / "probe.py").write_text(PROBE.format(hosts=targets))
        os.chown(home1 / "probe.py", *accounts_ids("learner01"))
        out = hubpage.terminal(one, "learner01", "python ~/probe.py", timeout=60)
        assert out.count("REFUSED ") == len(targets) and "REACHED " not in out, out
        for node in sorted(node_of.values()):  # learner01's own batch job, on each node
            out = hubpage.terminal(one, "learner01", f"sbatch --wait -w {node} --output=$HOME/probe-{node}.out "
                                   f"--wrap 'python3 $HOME/probe.py' && cat $HOME/probe-{node}.out", timeout=120)
            assert out.count("REFUSED ") == len(targets) and "REACHED " not in out, (node, out)
        # each server's output goes through root's copier on its node into root's file (the bound it keeps is
        # tested in tests/unit/test_workshop_nodeworlds.py); the job's own output file is none
        for who in LEARNERS:
            log = st.private / "servers" / f"{who}.log"
            assert log.stat().st_uid == 0 and (log.stat().st_mode & 0o077) == 0, log.stat()
            assert "Jupyter" in log.read_text(errors="replace"), log.read_text(errors="replace")[-1500:]
        assert sorted(p.name for p in (st.private / "servers").iterdir()) == [f"{w}.log" for w in LEARNERS]
        # a check in each JupyterLab (one passing, one failing), recorded for the class
        (home1 / "course" / "labs" / "fashion_mnist.py").write_bytes(SOLUTION.read_bytes())
        os.chown(home1 / "course" / "labs" / "fashion_mnist.py", *accounts_ids("learner01"))
        check = "cd ~/course/labs && labkit check horovod fashion_mnist.py --step 1 > check.out 2>&1; tail -3 check.out"
        outs = {who: hubpage.terminal(page, who, check, timeout=600) for who, page in pages.items()}
        assert [(r.step, r.passed) for r in _records(st, "learner01")] == [(1, True)], outs
        assert [(r.step, r.passed) for r in _records(st, "learner02")] == [(1, False)], outs
        # apart: another's files and server are closed to a learner, wherever the servers run
        out = hubpage.terminal(one, "learner01", "cat ~learner02/course/labs/fashion_mnist.py")
        assert "Permission denied" in out, out
        one.goto(st.url + "user/learner02/lab", timeout=60_000)
        assert "403" in one.content() or "permission" in one.content().lower()
        assert "jp-main-dock-panel" not in one.content()
        # stopping a server cancels its job
        one.goto(st.url + "hub/home", timeout=60_000)
        one.click("#stop")
        proc.wait_until(lambda: "jupyterlab-learner01" not in {r[2] for r in _squeue(conf)}, 60, every=1)
        assert [r[2] for r in _squeue(conf)] == ["jupyterlab-learner02"]
        # hostile server options, as the learner's browser sends them: a crafted spawn link, then the REST API
        # (cookie and XSRF header) with options that would write the canary as root or ask for a root server
        options = {"memory": f"1G\nid > {canary}", "uid": "0", "gid": "0", "cmd": f"id > {canary}"}
        for start in ("link", "api"):
            one.goto(st.url + "hub/home", timeout=60_000)
            assert proc.wait_until(lambda: one.evaluate(SERVERS, st.url + "hub/api/user") == 0, 60, every=1)
            if start == "link":
                one.goto(st.url + "hub/spawn?" + urlencode(options), timeout=120_000)
            else:
                assert one.evaluate(POST_SERVER, [st.url + "hub/api/users/learner01/server",
                                                  {"user_options": options}]) in (201, 202)
            assert proc.wait_until(lambda: _running(conf, "jupyterlab-learner01"), 120, every=1), (
                _squeue(conf), hub.tail(st.log, 6000))
            # the job runs; its server becomes learner01 once its world is made (never root, whatever was asked)
            assert proc.wait_until(lambda: _server_users() == {"learner01", "learner02"}, 60, every=1), (
                start, _server_users())
            assert not canary.exists(), start
            one.goto(st.url + "hub/home", timeout=60_000)
            one.click("#stop")
            proc.wait_until(lambda: not _running(conf, "jupyterlab-learner01"), 60, every=1)
    with browser.browser() as teacher:
        hubpage.login(teacher, st.url, "instructor", pw["instructor"])
        teacher.goto(st.url + "services/class/", timeout=60_000)
        grid = teacher.inner_text("#grid")
        row = {line.split()[0]: line for line in grid.splitlines() if line.startswith("learner")}
        assert "✔" in row["learner01"] and "✘" in row["learner02"], grid
    assert not canary.exists()  # the hub never ran the hostile learner's command
    status = lifecycle.status(st.folder)
    assert status["state"] == "up" and status["spawner"] == "slurm"


# learner02's terminal: a listener on every address of its server's network, and its own reach to it
LISTEN = """nohup python -c "
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', 47001)); s.listen()
while True:
    c, _ = s.accept(); c.sendall(b'SECRET-OF-02'); c.close()
" > /dev/null 2>&1 &
sleep 2; python -c "import socket; print('OWN', socket.create_connection(('127.0.0.1', 47001), 3).recv(20))\""""
PROBE = """import socket
for host in {hosts!r}:
    try:
        print("REACHED", host, socket.create_connection((host, 47001), 2).recv(20))
    except OSError as e:
        print("REFUSED", host, type(e).__name__)"""
def _reach(host: str) -> str:
    import socket

    with socket.create_connection((host, 47001), 5) as c:
        return c.recv(20).decode()


SERVERS = """async (url) => {
  const xsrf = (document.cookie.split("; ").find(c => c.startsWith("_xsrf=")) || "=").split("=")[1];
  const r = await fetch(url, {credentials: "same-origin", headers: {"X-XSRFToken": decodeURIComponent(xsrf)}});
  const user = await r.json();
  return Object.keys(user.servers || {}).length + (user.pending ? 1 : 0);
}"""
POST_SERVER = """async ([url, body]) => {
  const xsrf = (document.cookie.split("; ").find(c => c.startsWith("_xsrf=")) || "=").split("=")[1];
  const r = await fetch(url, {method: "POST", credentials: "same-origin", body: JSON.stringify(body),
                              headers: {"X-XSRFToken": decodeURIComponent(xsrf), "Content-Type": "application/json"}});
  return r.status;
}"""


def _server_users() -> set[str]:
    """Who the learners' servers run as (the world's root part, which names the server in its arguments, left out)."""
    users = set()
    for p in psutil.process_iter(["username", "cmdline"]):
        line = p.info["cmdline"] or []
        server = any("jupyterhub-singleuser" in a for a in line[1:3])
        if line[:1] and Path(line[0]).name.startswith("python") and server:
            users.add(p.info["username"])
    return users


def _running(conf: Path, name: str) -> bool:
    return any(row[2] == name and row[3] == "RUNNING" for row in _squeue(conf))


def accounts_ids(who: str) -> tuple[int, int]:
    info = pwd.getpwnam(who)
    return info.pw_uid, info.pw_gid
