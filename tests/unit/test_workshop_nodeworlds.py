"""Each learner's server a network of its own on the virtual nodes (``--spawner slurm``): the seats, the node's
chains, this machine's routes, and root's bounded copier of a server's output. The rules at work are tested with a
real hub in tests/browser/test_workshop_slurm_servers.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from labkit.workshop import nodeworlds, serverlog

NODES = [nodeworlds.Node("node1", 1, "198.18.0.11", "labkit-node1"),
         nodeworlds.Node("node2", 2, "198.18.0.12", "labkit-node2")]


def test_each_account_has_an_address_of_its_own_on_each_node() -> None:
    seats = nodeworlds.plan(["learner01", "learner02", "instructor"], NODES)
    assert len({s.address for s in seats}) == 6 and len({s.netns for s in seats}) == 6
    by = nodeworlds.addresses(seats)
    assert by["node1"] == {"learner01": "198.18.1.2", "learner02": "198.18.1.3", "instructor": "198.18.1.4"}
    assert by["node2"]["learner02"] == "198.18.2.3" and NODES[1].gate == "198.18.2.1"
    assert seats[0].netns == "lkn-node1-learner01" and seats[0].link == "lkn0001"
    assert all(len(s.link) <= 15 for s in seats)


@pytest.mark.parametrize("names,nodes", [(["x; rm"], NODES), (["learner01"], [nodeworlds.Node("n 1", 1, "a", "b")]),
                                         ([f"l{k}" for k in range(300)], NODES), (["learner01"], [])])
def test_a_seat_labkit_would_not_make_is_refused(names: list[str], nodes: list) -> None:
    with pytest.raises(ValueError):
        nodeworlds.plan(names, nodes)


def test_an_account_s_only_routes_lead_to_its_node_and_the_hub() -> None:
    seat = nodeworlds.plan(["learner01"], NODES)[1]
    commands = nodeworlds.seat_commands(seat, "198.18.0.1")
    routes = [c[4:] for c in commands if c[:4] == ["ip", "-n", seat.netns, "route"]]
    assert routes == [["add", "198.18.2.1/32", "dev", "eth0"], ["add", "198.18.0.1/32", "via", "198.18.2.1", "dev",
                                                                   "eth0"]]
    assert not any("default" in c for c in commands)
    assert ["ip", "-n", "labkit-node2", "route", "add", "198.18.2.2/32", "dev", "lkn0001", "src", "198.18.2.1"] \
        in commands


def test_a_node_forwards_only_to_the_hub_s_ports_and_only_the_hub_opens_connections_in() -> None:
    rules = [c[3:] for c in nodeworlds.node_commands(NODES[0], "198.18.0.1", (8081, 6817))]
    assert rules[0][-1] == "echo 1 > /proc/sys/net/ipv4/ip_forward"
    fwd = [r for r in rules if r[2:4] == ["-A", "LKN-SERVERS-fwd"]]
    accepted = [r for r in fwd if r[-1] == "ACCEPT" and "--ctstate" not in r[:-3]]
    assert [r[r.index("--dport") + 1] for r in accepted if "--dport" in r] == ["8081", "6817"]
    assert all(r[r.index("-d") + 1] == "198.18.0.1" for r in accepted if "--dport" in r)
    inward = [r for r in fwd if "-o" in r]
    assert inward and all(r[r.index("-s") + 1] == "198.18.0.1" for r in inward)
    assert fwd[-1][-2:] == ["-j", "REJECT"]
    assert [r for r in rules if r[2:4] == ["-A", "LKN-SERVERS-out"]][-1][-1] == "REJECT"  # the node's own processes
    assert [r for r in rules if r[2:4] == ["-A", "LKN-SERVERS-in"]][-1][-1] == "REJECT"
    assert ["iptables", "-w", "-I", "FORWARD", "1", "-j", "LKN-SERVERS-fwd"] in rules


def test_on_this_machine_only_root_s_sockets_reach_the_servers() -> None:
    rules = nodeworlds.host_commands(NODES)
    assert ["ip", "route", "add", "198.18.1.0/24", "via", "198.18.0.11"] in rules
    out = [r for r in rules if r[2:4] == ["-A", "LKN-SERVERS-out"]]
    assert out[1][-4:] == ["--uid-owner", "0", "-j", "ACCEPT"] and out[-1][-1] == "REJECT"
    removal = nodeworlds.host_remove_commands(NODES)
    made = {tuple(r[3:4] + r[5:]) for r in rules if r[2] == "-I"}  # without the place ("1")
    assert made == {tuple(r[3:]) for r in removal if r[:3] == ["iptables", "-w", "-D"]}


def test_root_s_copier_keeps_a_server_s_output_bounded_over_its_starts(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "learner01.log"
    monkeypatch.setattr(serverlog, "LIMIT", 1000)
    for size in (600, 900):
        read, write = os.pipe()
        os.write(write, b"x" * size)
        os.close(write)
        saved = os.dup(0)
        os.dup2(read, 0)
        try:
            assert serverlog.main([str(log)]) == 0
        finally:
            os.dup2(saved, 0)
            os.close(saved)
            os.close(read)
    text = log.read_text()
    assert text.startswith("x" * 1000) and "500 more bytes of output dropped" in text
    assert oct(log.stat().st_mode & 0o777) == "0o600"
    assert serverlog.main([]) == 2
