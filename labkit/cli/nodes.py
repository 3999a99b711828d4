"""``labkit nodes up|status|down``: virtual nodes on this machine (see :mod:`labkit.nodes.virtual`)."""

from __future__ import annotations

import argparse
import json
import sys

from labkit.core.cliargs import positive_int
from labkit.nodes import virtual as nodes

HELP = """\
Virtual nodes: N hosts on this machine (network, hostname and mount namespaces; a veth link each to a
bridge; addresses in 198.18.0.0/24 that never leave it; an sshd each; the same files and processes).
Then launch across them with the hostfile that `labkit nodes status` shows:
  labkit run --hostfile /run/labkit-nodes/hostfile --np 4 -- python train.py
  ssh -F /run/labkit-nodes/ssh_config node1 hostname
--rate limits each link (both directions); no latency is added (that needs tc netem, which many kernels lack), so the
links are fast and near: a rate shows bandwidth costs, not the delays of a far network. Needs root."""


def add_cli(sub) -> None:
    """Register ``labkit nodes``."""
    p = sub.add_parser("nodes", help="virtual nodes on this machine for multi-host launches (root)",
                       description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    acts = p.add_subparsers(dest="action", required=True)
    u = acts.add_parser("up", help="start the nodes", description=HELP,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    u.add_argument("--count", type=positive_int, default=2, help="nodes (default: %(default)s)")
    u.add_argument("--slots", type=positive_int, default=2, help="slots per node (default: %(default)s)")
    u.add_argument("--rate", default=None, metavar="RATE",
                   help="link rate each way, as tc writes it: 50mbit, 1gbit (default: unlimited). Bandwidth only: "
                   "no delay is added (that needs tc netem, which many kernels lack)")
    u.add_argument("--slurm", action="store_true", help="also run Slurm: a controller here, a slurmd per node")
    u.add_argument("--json", action="store_true", help="print the status as JSON")
    u.set_defaults(func=_up)
    s = acts.add_parser("status", help="show the nodes, their addresses and the hostfile")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=_status)
    d = acts.add_parser("down", help="stop the nodes and remove everything they made (safe to repeat)")
    d.set_defaults(func=_down)


def _show(status: dict) -> None:
    if status["state"] == "down":
        print("virtual nodes: down (start them with `labkit nodes up`)")
        return
    rate = status["rate"] or "unlimited"
    print(f"virtual nodes: {status['state']}, links {rate}, subnet {status['subnet']} on bridge {status['bridge']}")
    for n in status["nodes"]:
        print(f"  {n['name']:<8} {n['address']:<15} slots={n['slots']}  {n['state']}")
    print(f"hostfile:   {status['hostfile']}")
    print(f"ssh config: {status['ssh_config']}   (ssh -F {status['ssh_config']} node1)")
    if status.get("slurm_conf"):
        print(f"Slurm:      SLURM_CONF={status['slurm_conf']}")
    first = status["nodes"][0]["address"] if status["nodes"] else ""
    slots = sum(n["slots"] for n in status["nodes"])
    print(f"try:        labkit run --hostfile {status['hostfile']} --np {slots} -- python -c "
          f"\"import socket; print(socket.gethostname())\"   ({first} is {status['nodes'][0]['name']})")


def status(folder: str | None = None) -> dict:
    cluster = nodes.VirtualNodes.load(folder)
    return cluster.status() if cluster else {"state": "down", "folder": str(nodes.state_folder(folder))}


def _up(a: argparse.Namespace) -> int:
    try:
        cluster = nodes.VirtualNodes(count=a.count, slots=a.slots, rate=a.rate, slurm=a.slurm).up()
    except nodes.NodesError as e:
        print(f"labkit nodes up: {e}", file=sys.stderr)
        return 1
    st = cluster.status()
    if a.json:
        print(json.dumps(st, indent=1))
    else:
        _show(st)
        print(f"up in {cluster.seconds_up:.2f} s; stop with `labkit nodes down`")
    return 0


def _status(a: argparse.Namespace) -> int:
    st = status()
    if a.json:
        print(json.dumps(st, indent=1))
    else:
        _show(st)
    return 0 if st["state"] in ("up", "down") else 1


def _down(a: argparse.Namespace) -> int:
    try:
        removed = nodes.down()
    except nodes.NodesError as e:
        print(f"labkit nodes down: {e}", file=sys.stderr)
        return 1
    print("removed: " + ", ".join(removed) if removed else "virtual nodes: nothing was up")
    return 0
