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


def test_an_account_s_only_routes_lead_through_its_node() -> None:
    seat = nodeworlds.plan(["learner01"], NODES)[1]
    commands = nodeworlds.seat_commands(seat, "198.18.0.1")
    routes = [c[4:] for c in commands if c[:4] == ["ip", "-n", seat.netns, "route"]]
    assert routes == [["add", "198.18.2.1/32", "dev", "eth0"],
                      ["add", "198.18.0.1/32", "via", "198.18.2.1", "dev", "eth0"],
                      ["add", "198.18.0.0/16", "via", "198.18.2.1", "dev", "eth0"]]  # nothing past the node's chains
    assert not any("default" in c for c in commands)
    assert ["ip", "-n", "labkit-node2", "route", "add", "198.18.2.2/32", "dev", "lkn0001", "src", "198.18.2.1"] \
        in commands


SEATS = nodeworlds.plan(["learner01", "learner02"], NODES)


def _chain(rules: list[list[str]], name: str) -> list[list[str]]:
    return [r for r in rules if r[2:4] == ["-A", f"LKN-SERVERS-{name}"]]


def test_a_node_forwards_to_the_hub_the_slurmds_and_the_same_account_s_seats_only() -> None:
    uids = {"learner01": 1001, "learner02": 1002}
    rules = [c[3:] if c[0] == "nsenter" else c for c in nodeworlds.node_commands(NODES[0], "198.18.0.1",
                                                                                 (8081, 6817), SEATS, uids)]
    assert rules[0][-1] == "echo 1 > /proc/sys/net/ipv4/ip_forward"
    assert ["ip", "-n", "labkit-node1", "route", "add", "198.18.2.0/24", "via", "198.18.0.12"] in rules
    fwd = _chain(rules, "fwd")
    out_of_links = [r for r in fwd if "-i" in r]
    assert [(r[r.index("-i") + 1], r[r.index("-d") + 1], r[r.index("--dport") + 1] if "--dport" in r else None)
            for r in out_of_links] == [
        ("lkn+", "198.18.0.1", "8081"), ("lkn+", "198.18.0.1", "6817"), ("lkn+", "198.18.0.0/24", "6818"),
        ("lkn0001", "198.18.2.2", None), ("lkn0002", "198.18.2.3", None)]  # each account: its own seat only
    into_links = [(r[r.index("-o") + 1], r[r.index("-s") + 1]) for r in fwd if "-o" in r]
    assert into_links == [("lkn+", "198.18.0.0/24"), ("lkn0001", "198.18.2.2"), ("lkn0002", "198.18.2.3")]
    assert fwd[-1][-2:] == ["-j", "REJECT"]
    out, remote = _chain(rules, "out"), _chain(rules, "remote")
    # into a seat: root's processes and the account's own (Slurm's step daemon acting for it), nobody else's
    assert out[1][-4:] == ["--uid-owner", "0", "-j", "ACCEPT"] and out[-1][-1] == "REJECT"
    assert [(r[r.index("-o") + 1], r[r.index("--uid-owner") + 1]) for r in out[2:-1]] == [
        ("lkn0001", "1001"), ("lkn0002", "1002")]
    assert remote[0][-4:] == ["-d", "198.18.0.0/24", "-j", "RETURN"] and remote[-1][-1] == "REJECT"
    assert [(r[r.index("-d") + 1], r[r.index("--uid-owner") + 1]) for r in remote[3:-1]] == [
        ("198.18.2.2", "1001"), ("198.18.2.3", "1002")]
    inward = _chain(rules, "in")  # to the node itself: answers and its slurmd, nothing else
    assert len(inward) == 3 and inward[1][-4:] == ["--dport", "6818", "-j", "ACCEPT"] and inward[2][-1] == "REJECT"
    assert ["iptables", "-w", "-I", "FORWARD", "1", "-j", "LKN-SERVERS-fwd"] in rules
    made = {tuple(r[3:4] + r[5:]) for r in rules if r[2:3] == ["-I"]}
    removal = [c[3:] for c in nodeworlds.node_remove_commands(NODES[0])]
    assert made == {tuple(r[3:]) for r in removal if r[:3] == ["iptables", "-w", "-D"]}


def test_an_account_s_hosts_file_names_each_node_by_its_own_address_there() -> None:
    mine = [s for s in SEATS if s.name == "learner02"]
    text = nodeworlds.hosts_text(mine, "198.18.0.1 head\n127.0.0.1 localhost\n")
    assert text.splitlines()[1:3] == ["198.18.1.3 node1", "198.18.2.3 node2"]
    assert text.endswith("198.18.0.1 head\n127.0.0.1 localhost\n")


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
