"""Build ``TF_CONFIG`` for a tf.distribute cluster, without importing TensorFlow.

A cluster maps task types to ``host:port`` lists::

    >>> spec = cluster_spec(workers=2, hosts=["node1:2222", "node2:2222"])
    >>> spec
    {'worker': ['node1:2222', 'node2:2222']}
    >>> tf_config(spec, "worker", 1)
    '{"cluster": {"worker": ["node1:2222", "node2:2222"]}, "task": {"type": "worker", "index": 1}}'

Every task gets the same ``cluster`` and its own ``task``. Without ``hosts`` the
tasks run on localhost on free ports.
"""

from __future__ import annotations

import json
import random
import re
import socket
from collections.abc import Sequence
from pathlib import Path

TASK_TYPES = ("chief", "worker", "ps", "evaluator")
_HOSTPORT = re.compile(r"^(\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


class ClusterError(ValueError):
    """A cluster description or task is wrong; the message says how."""


def _ephemeral_low(default: int = 32768) -> int:
    """The lowest port the kernel hands to outgoing connections (Linux: ``ip_local_port_range``)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports free now, below the ephemeral range.

    A port the kernel picked for a listener a moment ago (bind to port 0) can be handed to an outgoing connection
    (ipyparallel's and gRPC's own) before the task binds it ("Could not start gRPC server"); ports below
    ``ip_local_port_range`` are never handed out that way. Random, so that two clusters rarely try the same."""
    if n < 0:
        raise ClusterError(f"cannot ask for {n} ports")
    high = min(_ephemeral_low(), 65536)
    low = max(1024, high - 12000)
    found: list[int] = []
    for port in random.sample(range(low, high), min(high - low, 50 * n + 200)):
        if len(found) == n:
            break
        if port_is_free(port, host):
            found.append(port)
    if len(found) < n:
        raise ClusterError(f"could not find {n} free ports between {low} and {high}")
    return found


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when ``port`` can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def serving(address: str, timeout: float = 0.5) -> bool:
    """True when a process accepts connections at a task's ``host:port`` (its TensorFlow server is up)."""
    host, port = check_address(address).rsplit(":", 1)
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def check_address(address: str) -> str:
    """``address`` if it is ``host:port`` with a port in 1..65535, else a :class:`ClusterError`."""
    m = _HOSTPORT.match(str(address).strip())
    if not m or not 1 <= int(m.group(2)) <= 65535:
        raise ClusterError(f"{address!r} is not host:port (e.g. 'localhost:12345' or 'node1:2222')")
    return str(address).strip()


def cluster_spec(
    workers: int = 2,
    ps: int = 0,
    chief: bool = False,
    hosts: Sequence[str] | None = None,
    host: str = "localhost",
) -> dict[str, list[str]]:
    """The ``cluster`` part of TF_CONFIG: a chief (optional), workers, parameter servers.

    ``hosts`` lists ``host:port`` addresses in task order (chief, workers, ps);
    without it every task gets a free port on ``host``.
    """
    for name, value in (("workers", workers), ("ps", ps)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ClusterError(f"{name} must be a whole number >= 0, got {value!r}")
    if workers + int(chief) < 1:
        raise ClusterError("a cluster needs at least one worker or a chief")
    if ps and not (chief or workers):
        raise ClusterError("parameter servers need workers to serve")
    n = int(chief) + workers + ps
    if hosts is None:
        addresses = [f"{host}:{p}" for p in free_ports(n)]
    else:
        addresses = [check_address(a) for a in hosts]
        if len(addresses) != n:
            raise ClusterError(
                f"{len(addresses)} host:port addresses for {n} tasks "
                f"({int(chief)} chief + {workers} workers + {ps} ps); give one per task"
            )
        dup = sorted({a for a in addresses if addresses.count(a) > 1})
        if dup:
            raise ClusterError(f"each task needs its own host:port; repeated: {', '.join(dup)}")
    spec: dict[str, list[str]] = {}
    i = 0
    for task_type, count in (("chief", int(chief)), ("worker", workers), ("ps", ps)):
        if count:
            spec[task_type] = addresses[i : i + count]
            i += count
    return spec


def validate(cluster: dict[str, list[str]]) -> dict[str, list[str]]:
    """``cluster`` if it is a valid cluster dict, else a :class:`ClusterError`."""
    if not isinstance(cluster, dict) or not cluster:
        raise ClusterError("the cluster must be a non-empty dict like {'worker': ['localhost:12345', ...]}")
    for task_type, addresses in cluster.items():
        if task_type not in TASK_TYPES:
            raise ClusterError(f"unknown task type {task_type!r}: use {', '.join(TASK_TYPES)}")
        if isinstance(addresses, str) or not isinstance(addresses, Sequence) or not addresses:
            raise ClusterError(f"cluster[{task_type!r}] must be a non-empty list of host:port strings")
        for a in addresses:
            check_address(a)
    if len(cluster.get("chief", [])) > 1:
        raise ClusterError("a cluster has at most one chief")
    return cluster


def tasks(cluster: dict[str, list[str]]) -> list[tuple[str, int]]:
    """Every ``(task_type, index)`` of the cluster, chief first."""
    validate(cluster)
    order = sorted(cluster, key=TASK_TYPES.index)
    return [(t, i) for t in order for i in range(len(cluster[t]))]


def chief_task(cluster: dict[str, list[str]]) -> tuple[str, int]:
    """The task that leads: the chief if there is one, else worker 0."""
    validate(cluster)
    return ("chief", 0) if "chief" in cluster else ("worker", 0)


def tf_config(cluster: dict[str, list[str]], task_type: str, index: int) -> str:
    """The ``TF_CONFIG`` JSON string for one task of ``cluster``."""
    validate(cluster)
    if task_type not in cluster:
        raise ClusterError(f"task type {task_type!r} is not in the cluster (it has {', '.join(cluster)})")
    if not isinstance(index, int) or not 0 <= index < len(cluster[task_type]):
        raise ClusterError(f"{task_type} index must be in 0..{len(cluster[task_type]) - 1}, got {index!r}")
    spec = {k: list(v) for k, v in cluster.items()}
    return json.dumps({"cluster": spec, "task": {"type": task_type, "index": index}})


def parse(value: str) -> tuple[dict[str, list[str]], str, int]:
    """``(cluster, task_type, index)`` from a TF_CONFIG string."""
    try:
        obj = json.loads(value)
        cluster, task = obj["cluster"], obj["task"]
        return validate(cluster), str(task["type"]), int(task["index"])
    except (ValueError, KeyError, TypeError) as e:
        raise ClusterError(f"not a TF_CONFIG value ({e}): {value[:200]!r}") from e


def ports(cluster: dict[str, list[str]]) -> list[int]:
    """The port of every task."""
    return [int(a.rsplit(":", 1)[1]) for t in validate(cluster) for a in cluster[t]]
