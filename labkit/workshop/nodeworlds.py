"""Each learner's server a network of its own on the virtual nodes (``workshop up --spawner slurm``).

A server that is a Slurm job runs on a node, and every server and job on that node would share the node's
network namespace: a ``tf.distribute.Server`` or Gloo port one learner's check opens on ``127.0.0.1`` would be
reachable by another learner's server there. :mod:`labkit.workshop.worlds` gives each server on one machine a
network namespace of its own; this module does the same on each node, made by ``workshop up`` and removed by
``down``:

* on node *i*, one namespace per account, ``lkn-NODE-NAME``, joined to the node by a veth pair; the account's
  address there is ``198.18.i.k`` (:func:`plan`), the node's end of every link is ``198.18.i.1``, and the
  namespace's only routes lead there and on to the hub (``198.18.0.1``, the nodes' bridge on this machine);
* the node forwards from an account's link only to the hub's port and the Slurm controller's, and into it only
  what this machine sends (the hub and its proxy); it forwards nothing between two accounts' links, and its own
  processes (other learners' batch jobs) open no connection into one (iptables chains ``LKN-*`` in the node);
* this machine routes ``198.18.i.0/24`` to node *i*, and only root's sockets open connections there.

The server's job script enters ``lkn-$SLURMD_NODENAME-NAME`` (:func:`namespace`) before it becomes the learner
(:func:`labkit.workshop.worlds.argv`); loopback inside is the learner's alone, as on one machine. Every command
here is built from the hub's own values (node and account names checked against :data:`NAME`).
"""

from __future__ import annotations

import ipaddress
import pwd
import re
from dataclasses import dataclass

from labkit.nodes.slurm_conf import SLURMD_PORT
from labkit.nodes.slurm_seats import SEAT_PREFIX
from labkit.workshop.worlds import NETNS_DIR, left_over, run

NETWORK = ipaddress.ip_network("198.18.0.0/16")  # the nodes' own 198.18.0.0/24 and one /24 per node after it
PREFIX = SEAT_PREFIX  # each account's namespace on a node, lkn-* (the nodes' are labkit-*, one machine's lkw-*)
LINK = "lkn"  # the node's end of each account's link: lkn0001...
CHAIN = "LKN-SERVERS"  # iptables chains: CHAIN-in, CHAIN-out, CHAIN-fwd in each node; CHAIN-out on this machine
NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
MAX_ACCOUNTS = 253  # 198.18.i.2 ... 198.18.i.254


@dataclass(frozen=True)
class Node:
    """A virtual node as the servers' networks need it: its name, 1-based index, address and namespace."""

    name: str
    index: int
    address: str
    netns: str  # the node's own network namespace (labkit-NAME)

    @property
    def gate(self) -> str:  # the node's end of every account's link
        return str(NETWORK.network_address + 256 * self.index + 1)

    @property
    def subnet(self) -> str:
        return f"{NETWORK.network_address + 256 * self.index}/24"


@dataclass(frozen=True)
class Seat:
    """One account's network on one node."""

    name: str
    index: int  # 1-based, the account's place in the workshop
    node: Node

    @property
    def address(self) -> str:
        return str(NETWORK.network_address + 256 * self.node.index + 1 + self.index)

    @property
    def netns(self) -> str:
        return namespace(self.node.name, self.name)

    @property
    def link(self) -> str:  # in the node's namespace (15 characters at most)
        return f"{LINK}{self.index:04d}"


def namespace(node: str, name: str) -> str:
    return f"{PREFIX}{node}-{name}"


def plan(names: list[str], nodes: list[Node]) -> list[Seat]:
    """Every account's seat on every node (ValueError for a name labkit would not give, or too many)."""
    bad = [n for n in [*names, *(node.name for node in nodes)] if not NAME.fullmatch(n)]
    if bad:
        raise ValueError(f"{bad[0]!r} is not a name labkit gives an account or a node")
    if len(names) > MAX_ACCOUNTS or not 0 < len(nodes) < 255 or any(not 0 < n.index < 255 for n in nodes):
        raise ValueError(f"at most {MAX_ACCOUNTS} accounts on at most 254 nodes")
    return [Seat(name, k, node) for node in nodes for k, name in enumerate(names, start=1)]


def addresses(seats: list[Seat]) -> dict[str, dict[str, str]]:
    """Node -> account -> the address the proxy reaches that account's server at, on that node."""
    out: dict[str, dict[str, str]] = {}
    for s in seats:
        out.setdefault(s.node.name, {})[s.name] = s.address
    return out


def _in(netns: str, *argv: str) -> list[str]:
    return ["nsenter", f"--net={NETNS_DIR / netns}", "--", *argv]


def seat_commands(s: Seat, hub: str) -> list[list[str]]:
    """The namespace, the link, the addresses and the only routes the account has on the node (to the node's end
    of its link, and through it to ``hub``, the address of the hub and the Slurm controller, and the rest of the
    nodes' network, where the node's chains let through only the account's own seats and the slurmds)."""
    inside = ["ip", "-n", s.netns]
    return [["ip", "netns", "add", s.netns],
            ["ip", "-n", s.node.netns, "link", "add", s.link, "type", "veth", "peer", "name", "eth0", "netns",
             s.netns],
            [*inside, "addr", "add", f"{s.address}/32", "dev", "eth0"],
            [*inside, "link", "set", "lo", "up"],
            [*inside, "link", "set", "eth0", "up"],
            [*inside, "route", "add", f"{s.node.gate}/32", "dev", "eth0"],
            [*inside, "route", "add", f"{hub}/32", "via", s.node.gate, "dev", "eth0"],
            [*inside, "route", "add", str(NETWORK), "via", s.node.gate, "dev", "eth0"],  # its seats, the slurmds
            ["ip", "-n", s.node.netns, "addr", "add", f"{s.node.gate}/32", "dev", s.link],
            ["ip", "-n", s.node.netns, "link", "set", s.link, "up"],
            ["ip", "-n", s.node.netns, "route", "add", f"{s.address}/32", "dev", s.link, "src", s.node.gate],
            _in(s.netns, "/bin/sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"),
            _in(s.node.netns, "/bin/sh", "-c",
                f"echo 1 > /proc/sys/net/ipv4/conf/{s.link}/rp_filter; "
                f"echo 1 > /proc/sys/net/ipv6/conf/{s.link}/disable_ipv6")]


def node_commands(node: Node, hub: str, ports: tuple[int, ...], peers: list[Seat],
                  uids: dict[str, int]) -> list[list[str]]:
    """In the node: forwarding on, routes to the other nodes' seats, and the chains that hold the accounts' links:

    * from a link, forwarded: to ``hub`` at one of ``ports`` (the hub's and the Slurm controller's), to any node's
      slurmd (``srun`` in a batch job), to the same account's seats on the other nodes (``peers``: every seat of
      the workshop), and answers; to the node itself only its slurmd;
    * into a link, forwarded: connections from this machine (where only root's sockets may open them), from the
      other nodes (where only root's may: their slurmstepds answering ``srun``), and from the same account's
      seats on the other nodes;
    * nothing else forwarded, between links or otherwise; no connection into a seat opened by a process of the
      node but root's and the seat's account's (``uids``: Slurm's step daemon connects to ``srun`` as the job's
      user), on this node (chain ``-out``) or another (chain ``-remote``)."""
    ipt = ["iptables", "-w"]
    links = f"{LINK}+"
    est = ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"]
    new = ["-m", "conntrack", "--ctstate", "NEW", "-j", "ACCEPT"]
    nodes_net = str(NETWORK.network_address) + "/24"  # the nodes' bridge: this machine and every node
    root = ["-m", "owner", "--uid-owner", "0", "-j", "ACCEPT"]
    rules = [[*ipt, "-N", f"{CHAIN}-{kind}"] for kind in ("in", "out", "fwd", "remote")]
    # refused at once (REJECT): a learner's connection that goes nowhere says so instead of hanging
    rules += [[*ipt, "-A", f"{CHAIN}-in", *est],
              [*ipt, "-A", f"{CHAIN}-in", "-p", "tcp", "--dport", str(SLURMD_PORT), "-j", "ACCEPT"],
              [*ipt, "-A", f"{CHAIN}-in", "-j", "REJECT"],
              [*ipt, "-A", f"{CHAIN}-out", *est], [*ipt, "-A", f"{CHAIN}-out", *root],
              *([*ipt, "-A", f"{CHAIN}-out", "-o", s.link, "-m", "owner", "--uid-owner", str(int(uids[s.name])),
                 "-j", "ACCEPT"] for s in peers if s.node.name == node.name and s.name in uids),
              [*ipt, "-A", f"{CHAIN}-out", "-j", "REJECT"],
              [*ipt, "-A", f"{CHAIN}-remote", "-d", nodes_net, "-j", "RETURN"],
              [*ipt, "-A", f"{CHAIN}-remote", *est], [*ipt, "-A", f"{CHAIN}-remote", *root],
              *([*ipt, "-A", f"{CHAIN}-remote", "-d", s.address, "-m", "owner", "--uid-owner",
                 str(int(uids[s.name])), "-j", "ACCEPT"] for s in peers if s.node.name != node.name and s.name in uids),
              [*ipt, "-A", f"{CHAIN}-remote", "-j", "REJECT"],
              [*ipt, "-A", f"{CHAIN}-fwd", *est]]
    rules += [[*ipt, "-A", f"{CHAIN}-fwd", "-i", links, "-d", hub, "-p", "tcp", "--dport", str(int(port)), "-j",
               "ACCEPT"] for port in ports]
    rules += [[*ipt, "-A", f"{CHAIN}-fwd", "-i", links, "-d", nodes_net, "-p", "tcp", "--dport", str(SLURMD_PORT),
               "-j", "ACCEPT"],
              [*ipt, "-A", f"{CHAIN}-fwd", "-o", links, "-s", nodes_net, "-p", "tcp", *new]]
    for s in peers:  # the same account's seat on another node, both ways
        if s.node.name != node.name:
            rules += [[*ipt, "-A", f"{CHAIN}-fwd", "-i", s.link, "-d", s.address, "-j", "ACCEPT"],
                      [*ipt, "-A", f"{CHAIN}-fwd", "-o", s.link, "-s", s.address, *new]]
    rules += [[*ipt, "-A", f"{CHAIN}-fwd", "-j", "REJECT"],
              [*ipt, "-I", "INPUT", "1", "-i", links, "-j", f"{CHAIN}-in"],
              [*ipt, "-I", "OUTPUT", "1", "-o", links, "-j", f"{CHAIN}-out"],
              [*ipt, "-I", "OUTPUT", "1", "-o", "eth0", "-d", str(NETWORK), "-j", f"{CHAIN}-remote"],
              [*ipt, "-I", "FORWARD", "1", "-j", f"{CHAIN}-fwd"]]
    routes = [["ip", "-n", node.netns, "route", "add", other.subnet, "via", other.address]
              for other in {s.node.name: s.node for s in peers}.values() if other.name != node.name]
    return [_in(node.netns, "/bin/sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"),
            *routes, *(_in(node.netns, *r) for r in rules)]


def hosts_text(seat_list: list[Seat], base: str) -> str:
    """An account's ``/etc/hosts`` inside its jobs: each node's name is the account's own address on that node
    (``seat_list``: the account's seats), then ``base`` (the nodes' own hosts file: the controller, localhost)."""
    lines = [f"{s.address} {s.node.name}" for s in seat_list]
    return "# labkit: this account's own address on each node\n" + "\n".join(lines) + "\n\n" + base


def node_remove_commands(node: Node) -> list[list[str]]:
    ipt = ["iptables", "-w"]
    links = f"{LINK}+"
    rules = [[*ipt, "-D", "INPUT", "-i", links, "-j", f"{CHAIN}-in"],
             [*ipt, "-D", "OUTPUT", "-o", links, "-j", f"{CHAIN}-out"],
             [*ipt, "-D", "OUTPUT", "-o", "eth0", "-d", str(NETWORK), "-j", f"{CHAIN}-remote"],
             [*ipt, "-D", "FORWARD", "-j", f"{CHAIN}-fwd"],
             *([*ipt, "-F", f"{CHAIN}-{kind}"] for kind in ("in", "out", "fwd", "remote")),
             *([*ipt, "-X", f"{CHAIN}-{kind}"] for kind in ("in", "out", "fwd", "remote"))]
    return [_in(node.netns, "/bin/sh", "-c", "echo 0 > /proc/sys/net/ipv4/ip_forward"),
            *(_in(node.netns, *r) for r in rules)]


def host_commands(nodes: list[Node]) -> list[list[str]]:
    """On this machine: each node's accounts' addresses routed to it, and only root's sockets open connections
    there (the hub and its proxy; not an instructor's tool or a process of a learner's account)."""
    ipt = ["iptables", "-w"]
    rules = [["ip", "route", "add", n.subnet, "via", n.address] for n in nodes]
    rules += [[*ipt, "-N", f"{CHAIN}-out"],
              [*ipt, "-A", f"{CHAIN}-out", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
              [*ipt, "-A", f"{CHAIN}-out", "-m", "owner", "--uid-owner", "0", "-j", "ACCEPT"],
              [*ipt, "-A", f"{CHAIN}-out", "-j", "REJECT"]]
    rules += [[*ipt, "-I", "OUTPUT", "1", "-d", n.subnet, "-j", f"{CHAIN}-out"] for n in nodes]
    return rules


def host_remove_commands(nodes: list[Node]) -> list[list[str]]:
    ipt = ["iptables", "-w"]
    return [*(["ip", "route", "delete", n.subnet] for n in nodes),
            *([*ipt, "-D", "OUTPUT", "-d", n.subnet, "-j", f"{CHAIN}-out"] for n in nodes),
            [*ipt, "-F", f"{CHAIN}-out"], [*ipt, "-X", f"{CHAIN}-out"]]


def taken() -> str | None:
    """Why the servers' networks cannot be made here (a workshop's left, or iptables missing), or None."""
    return left_over(CHAIN, PREFIX)


def make(seats: list[Seat], hub: str, ports: tuple[int, ...]) -> None:
    """Every node's chains, every seat, then this machine's routes and chain (OSError names the command that
    failed; :func:`remove` takes away whatever was made). The accounts exist already."""
    nodes = list({s.node.name: s.node for s in seats}.values())
    uids = {name: pwd.getpwnam(name).pw_uid for name in {s.name for s in seats}}
    for node in nodes:
        for argv in node_commands(node, hub, ports, seats, uids):
            run(argv)
    for s in seats:
        for argv in seat_commands(s, hub):
            run(argv)
    for argv in host_commands(nodes):
        run(argv)


def remove(seats: list[Seat]) -> list[str]:
    """Remove what :func:`make` made, whatever of it exists (each command is tried); what was removed."""
    removed = []
    for s in seats:
        if (NETNS_DIR / s.netns).exists():
            try:
                run(["ip", "netns", "delete", s.netns])  # the link goes with it
                removed.append(f"{s.name}'s network on {s.node.name}")
            except OSError:
                continue
    nodes = list({s.node.name: s.node for s in seats}.values())
    tried = [*(argv for n in nodes if (NETNS_DIR / n.netns).exists() for argv in node_remove_commands(n)),
             *host_remove_commands(nodes)]
    gone = 0
    for argv in tried:
        try:
            run(argv)
            gone += 1
        except OSError:
            continue  # already gone (or the node with it)
    if gone:
        removed.append(f"the servers' networks' routes and rules ({CHAIN}-*)")
    return removed
