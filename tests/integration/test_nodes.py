"""Virtual nodes (labkit.nodes.virtual):
namespaces, ssh, link rates and mpirun across them. Needs root; skipped otherwise."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import paths
from helpers.nodes import nodes_problem

from labkit.core import contract
from labkit.launching import hosts, launch, launchers, reach
from labkit.launching.jobspec import JobSpec
from labkit.nodes import access, net
from labkit.nodes import slurm as nodes_slurm
from labkit.nodes import ssh as nodes_ssh
from labkit.nodes import virtual as nodes

ROOT = paths.ROOT
TCP = '''
import socket, sys, time
if sys.argv[1] == "serve":
    s = socket.create_server(("0.0.0.0", int(sys.argv[2])))
    print("ready", flush=True)
    c, _ = s.accept()
    n = 0
    while (b := c.recv(1 << 16)):
        n += len(b)
    c.sendall(str(n).encode())
    c.close()
else:
    host, port, size = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    c = socket.create_connection((host, port), timeout=30)
    start = time.perf_counter()
    block = b"x" * (1 << 16)
    for _ in range(size // len(block)):
        c.sendall(block)
    c.shutdown(socket.SHUT_WR)
    got = int(c.recv(64))
    print(got, got * 8 / (time.perf_counter() - start) / 1e6)
'''
WHO = '''
import os, socket
from mpi4py import MPI
print("rank", MPI.COMM_WORLD.Get_rank(), socket.gethostname(), os.environ["OMPI_COMM_WORLD_LOCAL_RANK"], flush=True)
'''


_problem = nodes_problem


needs_root = pytest.mark.skipif(_problem() is not None, reason=str(_problem()))
def system_folders() -> dict[str, bool]:
    """Whether the system folders the nodes may make exist (``/run/netns`` is also made by podman and ``ip``)."""
    return {"netns_dir": net.NETNS_DIR.exists(), "privsep": nodes_ssh.PRIVSEP.exists()}


def assert_nothing_left(folder: Path, before: dict[str, bool]) -> None:
    """No namespace, link, bridge, daemon or file of virtual nodes remains; the system folders are as ``before``."""
    assert net.netns_names() == []
    assert not net.link_exists(net.BRIDGE)
    assert not [line for line in net.run(["ip", "-br", "link"]).stdout.splitlines() if net.PREFIX in line]
    ours = [p.pid for p in psutil.process_iter(["cmdline"]) if str(folder) in " ".join(p.info["cmdline"] or [])]
    assert ours == [], "a daemon of the virtual nodes is still running"
    assert not folder.exists()
    assert system_folders() == before


@pytest.fixture
def before() -> dict[str, bool]:
    """The system folders as the test found them."""
    return system_folders()


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: dict[str, bool]) -> Iterator[Path]:
    folder = tmp_path / "nodes"
    monkeypatch.setenv(contract.NODES_STATE, str(folder))
    yield folder
    nodes.down(folder)
    assert_nothing_left(folder, before)


def test_up_refuses_without_root_and_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(nodes.NodesError, match="need root.*CAP_NET_ADMIN"):
        nodes.VirtualNodes(folder=tmp_path / "s").up()
    assert not (tmp_path / "s").exists()


def test_rates_are_read_as_tc_writes_them() -> None:
    assert net.rate_bits("50mbit") == 50e6
    assert net.rate_bits("1Gbit") == 1e9
    assert net.rate_bits("10mbps") == 80e6
    for bad in ("fast", "50", "50 mb", "-1mbit", "1bit"):
        with pytest.raises(ValueError):
            net.rate_bits(bad)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "labkit.cli", "nodes", *args], capture_output=True, text=True,
                          timeout=120)


def _transfer(cluster: nodes.VirtualNodes, size: int, port: int = 5201) -> float:
    """Mbit/s of a python TCP transfer of ``size`` bytes from node1 to node2 (by name, as node1 resolves it)."""
    server = subprocess.Popen([*cluster.enter("node2"), sys.executable, "-c", TCP, "serve", str(port)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        out = subprocess.run([*cluster.enter("node1"), sys.executable, "-c", TCP, "send", "node2", str(port),
                              str(size)], capture_output=True, text=True, timeout=120, check=True).stdout.split()
        assert int(out[0]) == size
        return float(out[1])
    finally:
        server.kill()
        server.wait()


@pytest.mark.slow  # several seconds: out of make test-fast
@needs_root
def test_cli_up_status_down_and_down_again(state: Path, before: dict[str, bool]) -> None:
    up = _cli("up", "--count", "2", "--slots", "2")
    assert up.returncode == 0, up.stderr
    st = json.loads(_cli("status", "--json").stdout)
    assert st["state"] == "up" and Path(st["hostfile"]).exists()
    assert [(n["name"], n["address"], n["slots"], n["state"]) for n in st["nodes"]] == [
        ("node1", "198.18.0.11", 2, "up"), ("node2", "198.18.0.12", 2, "up")]
    assert hosts.parse_hostfile(st["hostfile"]) == [hosts.Host("198.18.0.11", 2), hosts.Host("198.18.0.12", 2)]
    again = _cli("up")
    assert again.returncode == 1 and "already up" in again.stderr
    cluster = nodes.VirtualNodes.load(state)
    assert cluster is not None
    unshaped = _transfer(cluster, 64 << 20)
    print(f"node1 -> node2, no rate limit: {unshaped:.0f} Mbit/s")
    assert unshaped > 500  # far above the rate limit tested below
    psutil.Process(cluster.nodes[1].sshd).kill()  # a node whose sshd died shows as down
    broken = _cli("status", "--json")
    assert broken.returncode == 1
    assert [n["state"] for n in json.loads(broken.stdout)["nodes"]] == ["up", "down"]
    down = _cli("down")
    assert down.returncode == 0 and "node1, node2" in down.stdout, down.stderr
    assert_nothing_left(state, before)
    twice = _cli("down")
    assert twice.returncode == 0 and "nothing was up" in twice.stdout
    assert json.loads(_cli("status", "--json").stdout)["state"] == "down"


@needs_root
def test_a_failed_start_leaves_nothing(state: Path, before: dict[str, bool], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nodes_ssh, "sshd_path", lambda: "/bin/false")  # every sshd exits at once
    start = time.perf_counter()
    with pytest.raises(nodes.NodesError, match="sshd exited with code 1"):
        nodes.VirtualNodes(count=2, folder=state).up()
    assert time.perf_counter() - start < 10
    assert_nothing_left(state, before)


@needs_root
@pytest.mark.slow
@pytest.mark.skipif(nodes_slurm.missing() is not None, reason=str(nodes_slurm.missing()))
def test_slurm_runs_a_job_on_both_nodes(state: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = nodes.VirtualNodes(count=2, slots=2, slurm=True, folder=state).up()
    monkeypatch.setenv("SLURM_CONF", cluster.status()["slurm_conf"])
    out = subprocess.run(["srun", "-N2", "-n4", "hostname"], capture_output=True, text=True, timeout=60)
    assert sorted(out.stdout.split()) == ["node1", "node1", "node2", "node2"], out.stderr
    script = tmp_path / "who.py"
    script.write_text(WHO)  # ranks start with mpirun inside the allocation (labkit's default)
    result = launch.run(["python", str(script)], job=JobSpec(quiet=True, record=False, cwd=tmp_path, timeout=240),
                        launcher="slurm", slurm=launch.SlurmOptions(nodes=2, tasks_per_node=2))
    assert result.ok, result.summary()
    ranks = sorted(line.split()[1:] for r in range(4) for line in
                   (result.log_dir / f"rank.{r}.log").read_text().splitlines() if line.startswith("rank "))
    assert ranks == [["0", "node1", "0"], ["1", "node1", "1"], ["2", "node2", "0"], ["3", "node2", "1"]]


# The tests above start clusters of their own: they run before the module's cluster is up.
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[nodes.VirtualNodes]:
    """Two nodes of two slots, links limited to 50 Mbit/s, for the whole module; nothing may be left after."""
    problem = _problem()
    if problem:
        pytest.skip(problem)
    folder = tmp_path_factory.mktemp("vn") / "nodes"
    before = system_folders()
    saved = os.environ.get(contract.NODES_STATE)
    os.environ[contract.NODES_STATE] = str(folder)  # launchers find the cluster through it
    try:
        with nodes.VirtualNodes(count=2, slots=2, rate="50mbit", folder=folder) as c:
            yield c
        assert_nothing_left(folder, before)
    finally:
        if saved is None:
            os.environ.pop(contract.NODES_STATE, None)
        else:
            os.environ[contract.NODES_STATE] = saved


@needs_root
def test_ssh_reaches_each_node_by_name_and_address(cluster: nodes.VirtualNodes) -> None:
    for n in cluster.nodes:
        for target in (n.name, n.address):
            out = subprocess.run(cluster.ssh(target, "hostname"), capture_output=True, text=True, timeout=30)
            assert (out.returncode, out.stdout.strip()) == (0, n.name), out.stderr
    by_address = hosts.parse_hostfile(cluster.hostfile)
    reach.ssh_preflight(by_address, timeout=5)  # the cluster's ssh config, found from the hosts alone
    reach.ssh_preflight(launch.host_list("node1:2,node2:2"), timeout=5)


@needs_root
def test_rate_limits_tcp_between_nodes(cluster: nodes.VirtualNodes) -> None:
    rate = _transfer(cluster, 6 << 20)
    print(f"node1 -> node2 over 50mbit links: {rate:.1f} Mbit/s")
    assert 10 < rate < 80, f"{rate:.1f} Mbit/s over a 50mbit link"


@needs_root
def test_mpirun_places_two_ranks_on_each_node(cluster: nodes.VirtualNodes, tmp_path: Path) -> None:
    script = tmp_path / "who.py"
    script.write_text(WHO)
    mpirun = launchers.MPIRun(4, hosts.parse_hostfile(cluster.hostfile))
    [(_, argv, _)] = mpirun.commands([sys.executable, str(script)], {})
    assert "btl_tcp_if_include" in argv and f"ssh -F {cluster.ssh_config}" in argv
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    seen = sorted(tuple(line.split()[2:]) for line in out.stdout.splitlines() if line.startswith("rank "))
    assert seen == [("node1", "0"), ("node1", "1"), ("node2", "0"), ("node2", "1")]


@needs_root
def test_launch_preflight_accepts_node_names(cluster: nodes.VirtualNodes) -> None:
    by_name = launch.host_list("node1:2,node2:2")  # names resolve only through the cluster's ssh config
    launchers.MPIRun(4, by_name).preflight()
    assert access.mpirun_args([h.name for h in by_name]) == access.mpirun_args(
        [h.name for h in hosts.parse_hostfile(cluster.hostfile)]) != []
    assert hosts.validate(by_name, 4) == by_name  # names known to the cluster need no name service here
    with pytest.raises(hosts.HostError, match="cannot resolve node3"):
        hosts.validate([*by_name, hosts.Host("node3", 2)], 4)
    assert access.mpirun_args(["localhost"]) == []


@needs_root
@pytest.mark.slow
@pytest.mark.heavy  # 36 s: make test's budget; test_multinode.py trains the Horovod solution across the nodes by mpirun
def test_labkit_run_trains_across_the_nodes(cluster: nodes.VirtualNodes, tmp_path: Path) -> None:
    train = [sys.executable, str(ROOT / "solutions/fashion_mnist_solution.py"), "--epochs", "1", "--train-size", "256",
             "--test-size", "128"]
    where = f"hostname > {tmp_path}/host.$OMPI_COMM_WORLD_RANK && exec {shlex.join(train)}"
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "labkit.cli", "run", "--hostfile", str(cluster.hostfile), "--np", "4", "--timeout",
         "400", "--log-dir", str(tmp_path / "logs"), "--", "sh", "-c", where],
        capture_output=True, text=True, timeout=450, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "4 workers" in out.stderr, out.stderr
    assert [(tmp_path / f"host.{r}").read_text().strip() for r in range(4)] == ["node1", "node1", "node2", "node2"]
    print(f"trained on 2 virtual nodes x 2 ranks in {time.perf_counter() - start:.1f} s")
