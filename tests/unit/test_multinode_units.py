"""The parts of multi-node launches that need no root: ssh fixes, the host watch, ranks in records, lab 7's cell."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from labkit.core import identity
from labkit.launching import hosts, launch, reach
from labkit.records import jobrecord, typed
from labkit.records.observation import Observation
from labkit.ui import nodes_lab


@pytest.mark.parametrize("error, fix", [
    ("ssh: connect to host n2 port 22: Connection refused", "start it there"),
    ("Host key verification failed.", "ssh-keygen -R n2"),
    ("root@n2: Permission denied (publickey).", "ssh-copy-id USER@n2"),
    ("ssh: Could not resolve hostname n2: Name or service not known", "does not resolve"),
    ("ssh: connect to host n2 port 22: Connection timed out", "ping n2"),
    ("something else entirely", "see the steps below"),
])
def test_each_ssh_failure_gets_its_fix(error: str, fix: str) -> None:
    assert fix in reach.ssh_fix("n2", error)


def test_host_watch_names_a_host_that_stops_answering() -> None:
    server = socket.create_server(("127.0.0.2", 0))
    port = server.getsockname()[1]
    # 127.0.0.2 is this machine, which the watch skips: watch it under another name
    watch = reach.HostWatch([], port=port, every=0.1, misses=2)
    watch.names = ["127.0.0.2"]
    watch.start()
    time.sleep(0.5)
    assert watch.lost == []  # it answers
    server.close()
    deadline = time.monotonic() + 5
    while not watch.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.stop()
    assert watch.lost == ["127.0.0.2"]
    assert "lost host 127.0.0.2" in watch.message() and "stopped answering" in watch.message()


def test_host_watch_reaches_virtual_nodes_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    server = socket.create_server(("127.0.0.2", 0))
    port = server.getsockname()[1]
    cluster = SimpleNamespace(nodes=[SimpleNamespace(name="node1", address="127.0.0.2")])
    monkeypatch.setattr(reach.access, "for_hosts", lambda names: cluster if names == ["node1"] else None)
    # "node1" resolves only through the cluster (as the nodes' names do, through their ssh config)
    watch = reach.HostWatch([hosts.Host("node1", 1)], port=port, every=0.1, misses=2).start()
    time.sleep(0.6)
    watch.stop()
    server.close()
    assert watch.targets == {"node1": "127.0.0.2"} and watch.lost == []
    assert reach.address_of("node1") == "127.0.0.2" and reach.address_of("elsewhere") == "elsewhere"


def test_a_watch_of_local_hosts_does_nothing() -> None:
    watch = reach.HostWatch([hosts.Host("localhost", 2)]).start()
    watch.stop()
    assert watch.names == [] and watch.lost == []


def test_records_list_the_host_and_local_rank_of_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1")
    assert identity.world().host == socket.gethostname() and identity.world().local_rank == 1
    observed = [  # a Python launcher (horovodrun) is observed too, and looks like rank 0
        {"pid": 10, "world": {"rank": 0, "host": "head", "local_rank": None}},
        {"pid": 12, "fits": [{}], "world": {"rank": 1, "host": "node1", "local_rank": 1}},
        {"pid": 11, "fits": [{}], "world": {"rank": 0, "host": "node1", "local_rank": 0}},
        {"pid": 13, "task": "worker.1", "world": {"rank": 2, "host": "node2", "local_rank": None}},
    ]
    assert [(r.rank, r.host, r.local_rank, r.task) for r in jobrecord.ranks_of(
        [typed.parse(Observation, o) for o in observed]) or []] == [
        (0, "node1", 0, None), (1, "node1", 1, None), (2, "node2", None, "worker.1")]


def test_failure_reports_name_the_host_of_each_rank_when_ranks_spread(tmp_path: Path) -> None:
    for rank, host in enumerate(["node1", "node2"]):
        (tmp_path / f"rank.{rank}.host").write_text(host)
    assert launch.rank_hosts(tmp_path, 2) == {0: "node1", 1: "node2"}
    result = launch.JobResult(137, [], tmp_path, 2, 1.0, rank_exit={1: 137}, rank_errors={1: "Killed"},
                              rank_hosts=launch.rank_hosts(tmp_path, 2))
    assert "--- rank 1 on node2 (exit 137) ---" in result.summary()
    (tmp_path / "rank.1.host").write_text("node1")
    assert launch.rank_hosts(tmp_path, 2) == {}  # one host: nothing to say


def test_lab_7_cell_says_why_without_root(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    monkeypatch.setenv("LABKIT_NODES_STATE", str(tmp_path / "none"))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert nodes_lab.ranks_per_host(["python", "fashion_mnist.py"]) is None
    out = capsys.readouterr().out
    assert "need root" in out and "Binder" in out and "local rank" in out


def test_the_capabilities_virtual_nodes_need_are_read_from_the_effective_set() -> None:
    from labkit.nodes import net

    assert net.missing_capabilities("Name:\tx\nCapEff:\t000001ffffffffff\n") == []  # root on its own machine
    assert net.missing_capabilities("CapEff:\t00000000a80425fb\n") == ["NET_ADMIN", "SYS_ADMIN"]  # a container's root
    assert net.missing_capabilities(f"CapEff:\t{1 << 12:016x}\n") == ["SYS_ADMIN"]
    assert net.missing_capabilities("no such line\n") == []  # unreadable: up finds out by trying
    assert isinstance(net.missing_capabilities(), list)


def test_root_without_the_capabilities_is_told_how_to_run_the_container(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    from labkit.nodes import net
    from labkit.nodes import virtual as nodes

    monkeypatch.setenv("LABKIT_NODES_STATE", str(tmp_path / "state"))
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(net, "missing_capabilities", lambda status=None: ["NET_ADMIN", "SYS_ADMIN"])
    monkeypatch.setattr(net, "make_bridge", lambda: pytest.fail("nothing may be made"))
    with pytest.raises(nodes.NodesError, match=r"--cap-add NET_ADMIN,SYS_ADMIN"):
        nodes.VirtualNodes(count=2, slots=1).up()
    assert not (tmp_path / "state").exists()
    why = nodes_lab.why_not()
    assert why is not None and "CAP_NET_ADMIN and CAP_SYS_ADMIN" in why and "--privileged" in why
