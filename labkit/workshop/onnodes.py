"""A workshop on the virtual nodes with Slurm (``workshop up --slurm`` or ``--spawner slurm``): how many nodes, whether
the learners' limits fit them, the nodes started (or reused) with the learners' job limits and the servers'
partition, each account's network on every node, and the workshop's jobs ended at ``down``. What is made is
recorded in the workshop's state before it is made, so that ``down`` can take it away.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

from labkit.nodes import net, slurm_seats, virtual
from labkit.nodes import slurm as nodes_slurm
from labkit.workshop import limits, nodeworlds, slurmlimits, slurmservers
from labkit.workshop.state import State, WorkshopError


def node_count(learners: int, spawner: str) -> int:
    """Virtual nodes a workshop starts: two, or one per learner (up to 8) when each server is a job on a node."""
    return max(2, min(learners, 8)) if spawner == "slurm" else 2


def fits_on_nodes(asked: limits.Limits, count: int) -> None:
    """A learner's server and one job of theirs, each given the learner's memory, fit on one virtual node; else
    :class:`WorkshopError` saying what would fit."""
    node = nodes_slurm.node_memory_mib(count)
    if asked.memory and 2 * (asked.memory // 2**20) > node:
        raise WorkshopError(f"--memory {asked.memory // 2**20} MiB per learner: a learner's server (a Slurm job) and "
                            f"one job of theirs need twice that on a node, and each of the {count} virtual nodes "
                            f"offers {node} MiB (half this machine's memory, shared out). Give at most "
                            f"--memory {node // 2 // 1024}G, or fewer learners")


def start(st: State, extra_env: dict[str, str], jobs: slurmlimits.JobLimits,
          asked: limits.Limits) -> virtual.VirtualNodes:
    """Virtual nodes with Slurm (started unless up already); learners reach their Slurm config by name. Each job
    may run at most ``jobs.minutes`` and, with limits, is held to its CPUs and the learner's memory per node
    (control groups of Slurm's own, and the partition's limits set live: the nodes' own file is unchanged), and
    each learner to ``jobs``' running jobs and nodes at once (Slurm's accounting, :func:`slurmlimits.hold`).
    With the Slurm spawner, the servers' own partition too (:mod:`labkit.workshop.slurmservers`)."""
    confine = bool(asked.asked())
    cluster = virtual.VirtualNodes.load()
    if cluster is None:
        st.made["nodes"] = True
        st.save()
        cluster = virtual.VirtualNodes(count=node_count(len(st.learners), st.spawner), slots=2, slurm=True,
                                       confined=confine, task_cap=asked.pids).up()
    elif not cluster.slurm:
        raise WorkshopError("virtual nodes without Slurm are up: `labkit nodes down` first, or run without --slurm")
    elif confine and (not cluster.confined or cluster.task_cap != asked.pids):
        raise WorkshopError("virtual nodes are up whose Slurm jobs are not held to their cores, memory and this "
                            "workshop's task cap (`labkit nodes up --slurm`): `labkit nodes down` first, so that "
                            "`workshop up --slurm` starts them with these job limits, or run with --no-limits")
    if st.spawner == "slurm":
        fits_on_nodes(asked, cluster.count)  # nodes up before the workshop may be more (or fewer) than it starts
    st.made["nodes_mode"] = cluster.folder.stat().st_mode & 0o777
    st.save()
    cluster.folder.chmod(0o711)  # learners' sbatch reads slurm/slurm.conf and the munge socket below it
    extra_env["SLURM_CONF"] = str(cluster.slurm_conf)
    st.made["slurm_partition"] = slurmlimits.current(cluster.slurm_conf)
    st.save()
    slurmlimits.apply(cluster.slurm_conf, slurmlimits.for_jobs(jobs.minutes, asked.memory))
    if cluster.confined:
        st.made["slurm_users"] = [*st.learners, st.instructor]
        st.save()
        slurmlimits.hold(cluster.slurm_conf, st.learners, st.instructor, jobs)
    if st.spawner == "slurm":
        st.made["servers_partition"] = True
        st.save()
        memory = max(1, asked.memory // 2**20) if asked.memory else None
        slurmservers.create(cluster.slurm_conf, [n.name for n in cluster.nodes], memory)
    return cluster


def server_seats(made: dict) -> list[nodeworlds.Seat]:
    """Each account's network on each node, as ``up`` recorded them in the state (none without the Slurm spawner)."""
    recorded = made.get("server_networks") or {}
    nodes = [nodeworlds.Node(**n) for n in recorded.get("nodes", [])]
    return nodeworlds.plan(list(recorded.get("names", [])), nodes) if nodes else []


def seat_networks(st: State, names: list[str], cluster: virtual.VirtualNodes,
                  hub_port: int) -> dict[str, object]:
    """Each account's network on every node (:mod:`labkit.workshop.nodeworlds`), recorded before it is made, and
    its hosts file there: where its server runs when servers are Slurm jobs, and where its own batch jobs run on a
    confined cluster (Slurm's plug-in :mod:`labkit.nodes.slurm_seats` puts them there). With the Slurm spawner,
    the hub's settings that reach each server in its own; else none."""
    problem = nodeworlds.taken()
    if problem:
        raise WorkshopError(f"the accounts' own networks on the nodes cannot be made: {problem}")
    nodes = [nodeworlds.Node(n.name, k, n.address, n.netns) for k, n in enumerate(cluster.nodes, start=1)]
    st.made["server_networks"] = {"names": list(names), "nodes": [dataclasses.asdict(n) for n in nodes],
                                  "hosts": str(slurm_seats.hosts_dir(cluster.slurm_conf.parent))}
    st.save()
    seats = server_seats(st.made)
    try:
        nodeworlds.make(seats, net.gateway(), (hub_port, nodes_slurm.controller_port(cluster.slurm_conf)))
        base = (cluster.folder / "hosts").read_text()
        folder = slurm_seats.hosts_dir(cluster.slurm_conf.parent)
        folder.mkdir(mode=0o755, exist_ok=True)
        for name in names:
            (folder / name).write_text(nodeworlds.hosts_text([s for s in seats if s.name == name], base))
            (folder / name).chmod(0o644)
    except OSError as e:
        raise WorkshopError(f"the accounts' own networks on the nodes cannot be made here ({e})") from e
    if st.spawner != "slurm":
        return {}
    return {"spawner": "slurm", "hub_ip": net.gateway(), "server_addresses": nodeworlds.addresses(seats)}


def remove_seat_hosts(made: dict) -> list[str]:
    """The accounts' hosts files :func:`seat_networks` wrote (the nodes may outlive the workshop)."""
    recorded = made.get("server_networks") or {}
    folder = recorded.get("hosts")
    removed = []
    for name in recorded.get("names", []):
        path = Path(folder or "/nonexistent") / name
        if folder and nodeworlds.NAME.fullmatch(name) and path.is_file() and not path.is_symlink():
            path.unlink()
            removed.append(name)
    return [f"the hosts files of {len(removed)} accounts on the nodes"] if removed else []


def end_jobs(st: State) -> list[str]:
    """Cancel the workshop's users' Slurm jobs (their servers' too), and delete the servers' partition."""
    cluster = virtual.VirtualNodes.load() if st.slurm else None
    if cluster is None or not cluster.slurm_conf.exists():
        return []
    try:
        ended = slurmservers.cancel(cluster.slurm_conf, [*st.learners, st.instructor])
        if st.made.get("slurm_users"):
            slurmlimits.release(cluster.slurm_conf, st.made["slurm_users"])
            st.made["slurm_users"] = []
            st.save()
        if st.made.get("servers_partition"):
            ended += slurmservers.remove(cluster.slurm_conf)
            st.made["servers_partition"] = False
            st.save()
            ended.append(f"the Slurm partition {slurmservers.PARTITION}")
    except (OSError, subprocess.SubprocessError, slurmlimits.SlurmLimitError) as e:
        ended.append(f"Slurm could not be asked to end the workshop's jobs ({e}); the nodes' down ends them")
    return ended
