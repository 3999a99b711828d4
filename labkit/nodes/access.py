"""How launchers reach virtual nodes: their ssh config, mpirun's options for their subnet, a head node for
launchers that call plain ssh."""

from __future__ import annotations

import os
from collections.abc import Sequence

from labkit.nodes import net
from labkit.nodes.virtual import VirtualNodes


def for_hosts(host_names: Sequence[str]) -> VirtualNodes | None:
    """The running virtual cluster when every host of ``host_names`` is one of its nodes (name or address)."""
    if not host_names:
        return None
    cluster = VirtualNodes.load()
    if cluster is None:
        return None
    return cluster if all(cluster.knows(name) for name in host_names) else None


def ssh_args(host_names: Sequence[str]) -> list[str]:
    """``-F CONFIG`` when ``host_names`` are virtual nodes (their keys and known hosts), else nothing."""
    cluster = for_hosts(host_names)
    return ["-F", str(cluster.ssh_config)] if cluster else []


def mpirun_args(host_names: Sequence[str]) -> list[str]:
    """mpirun options for virtual nodes: their ssh config, and TCP (data and control) on their subnet only."""
    cluster = for_hosts(host_names)
    if cluster is None:
        return []
    return ["--mca", "plm_rsh_agent", f"ssh -F {cluster.ssh_config}", "--mca", "btl_tcp_if_include", str(net.SUBNET),
            "--mca", "oob_tcp_if_include", str(net.SUBNET)]


def head_node(host_names: Sequence[str], cwd: str | None = None) -> tuple[list[str], dict[str, str]]:
    """How to start a launcher that calls plain ``ssh HOST`` (horovodrun) on virtual nodes: the argv prefix that
    runs it inside the first node (as on a cluster's head node: its network is the nodes' one, so Gloo's
    rendezvous address and the interface all nodes share, ``eth0``, are reachable) and the environment that
    puts an ``ssh`` adding the cluster's config first on PATH. Nothing for other hosts."""
    cluster = for_hosts(host_names)
    if cluster is None:
        return [], {}
    first = next(n for n in cluster.nodes if host_names[0] in (n.name, n.address))
    enter = cluster.enter(first.name)
    path = f"{cluster.folder / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    return [*enter[:-1], f"--wd={cwd or os.getcwd()}", "--"], {"PATH": path}
