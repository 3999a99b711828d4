"""Host lists for multi-machine launches, checked before anything starts.

The same list feeds ``mpirun -H`` / ``horovodrun -H`` (:func:`hosts_arg`), an
OpenMPI hostfile (:func:`write_hostfile`) and a tf.distribute cluster
(:func:`tf_cluster`)::

    >>> hosts = parse_hosts("node1:2,node2:1")
    >>> place(hosts, 3)
    ['node1', 'node1', 'node2']
    >>> tf_cluster(hosts, workers=3)
    {'worker': ['node1:2222', 'node1:2223', 'node2:2222']}

:func:`validate` and :func:`labkit.launching.reach.ssh_preflight` turn the usual causes of an MPI error page
(a misspelt name, too few slots, no passwordless ssh) into a message that says how to fix
them. The resolver does not know ``~/.ssh/config`` aliases: validate those with
``resolve=False`` and let ``ssh_preflight`` (with the same ``-F`` file) reach them.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import psutil

from labkit.core import identity, tfconfig
from labkit.nodes import virtual as nodes

_NAME = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9_.-]*|[0-9a-fA-F:]*:[0-9a-fA-F:.]*)$")
_SLOTS_KEYS = ("slots", "slot", "count", "cpu", "cpus")  # OpenMPI's spellings of slots=
_MAX_KEYS = ("max_slots", "max-slots")
_THIS = "this machine"
class HostError(ValueError):
    """A host list is wrong or a host cannot be reached; the message says how to fix it."""


@dataclass(frozen=True)
class Host:
    """A machine and how many processes it takes (``None``: not stated, see :func:`slots`)."""

    name: str
    slots: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise HostError(f"{self.name!r} is not a host name (letters, digits, '.', '-', '_', or an IP address)")
        if self.slots is not None and not _whole(self.slots, 1):
            raise HostError(f"host {self.name}: slots must be a whole number >= 1, got {self.slots!r}")


def _whole(value: object, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def slots(host: Host) -> int:
    """Slots of ``host``: as stated, else this machine's cores if local, else 1 (as ``mpirun -H`` counts)."""
    if host.slots is not None:
        return host.slots
    return identity.cpu_count() if is_local(host.name) else 1


def _key(name: str) -> str:
    return name.lower().rstrip(".")


def _machine(name: str) -> str:
    """One key per machine: the names of this machine share one."""
    return _THIS if is_local(name) else _key(name)


@lru_cache(maxsize=1)
def _local_names() -> frozenset[str]:
    names = {"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback", "::1"}
    hostname = socket.gethostname()
    names |= {hostname, socket.getfqdn()}
    try:
        names |= {str(info[4][0]) for info in socket.getaddrinfo(hostname, None)}
    except OSError:
        pass
    try:
        names |= {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    except OSError:
        pass
    return frozenset(_key(n) for n in names if n)


def is_local(name: str) -> bool:
    """True when ``name`` is this machine: localhost, 127.x, ::1, its hostname, fqdn or addresses."""
    key = _key(name)
    return key.startswith("127.") or key in _local_names()


def parse_hosts(spec: str) -> list[Host]:
    """Hosts from the ``-H`` form ``h1:4,h2:4``; a host without ``:N`` gets 1 slot, as OpenMPI's ``-H``."""
    if not spec or not spec.strip():
        raise HostError("no hosts given: use -H host1:4,host2:4 (host:slots, comma separated)")
    hosts = []
    for i, raw in enumerate(spec.split(","), 1):
        entry = raw.strip()
        if not entry:
            raise HostError(f"empty entry {i} in hosts {spec!r}: remove the stray comma")
        if entry.startswith("["):  # [IPv6]:N
            name, close, rest = entry[1:].partition("]")
            if not close or (rest and not rest.startswith(":")):
                raise HostError(f"entry {entry!r}: write an IPv6 host as [address]:slots, like [fe80::1]:4")
            count = rest[1:] if rest else "1"
        elif entry.count(":") > 1:
            raise HostError(f"host {entry!r}: write an IPv6 address in brackets, like [{entry}]:4")
        else:
            name, sep, count = entry.partition(":")
            count = count if sep else "1"
        if not name.strip():
            raise HostError(f"entry {entry!r} in hosts {spec!r} has no host name: use host:slots, like node1:4")
        if not count.strip().isdecimal() or int(count) < 1:
            raise HostError(f"entry {entry!r}: slots must be a whole number >= 1 after the ':', like node1:4")
        hosts.append(Host(name.strip(), int(count)))
    return hosts


def parse_hostfile_text(text: str, source: str = "hostfile") -> list[Host]:
    """Hosts from OpenMPI hostfile text: ``node1 slots=4 max_slots=8``, ``#`` comments, blank lines."""
    hosts = []
    for lineno, line in enumerate(text.splitlines(), 1):
        words = re.sub(r"\s*=\s*", "=", line.split("#", 1)[0]).split()
        if not words:
            continue
        where = f"{source}, line {lineno}"
        name, count, most = words[0], None, None
        if "=" in name:
            raise HostError(f"{where}: {line.strip()!r} must start with a host name, like 'node1 slots=4'")
        for word in words[1:]:
            key, sep, value = word.partition("=")
            if key.lower() not in _SLOTS_KEYS + _MAX_KEYS or not sep:
                raise HostError(f"{where}: {word!r} is not understood; write 'HOST slots=N' (max_slots=M optional)")
            if not value.isdecimal() or int(value) < 1:
                raise HostError(f"{where}: {word!r}: {key} must be a whole number >= 1")
            if key.lower() in _SLOTS_KEYS:
                count = int(value)
            else:
                most = int(value)
        if count is not None and most is not None and most < count:
            raise HostError(f"{where}: max_slots={most} is less than slots={count}")
        try:
            hosts.append(Host(name, count))
        except HostError as e:
            raise HostError(f"{where}: {e}") from None
    if not hosts:
        raise HostError(f"{source} names no hosts: write one 'HOST slots=N' per line")
    return hosts


def parse_hostfile(path: str | os.PathLike[str]) -> list[Host]:
    """Hosts from an OpenMPI hostfile on disk."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise HostError(f"hostfile {p} does not exist: check the path, or give hosts with -H host1:4,host2:4") from None
    except (OSError, UnicodeDecodeError) as e:
        raise HostError(f"cannot read hostfile {p}: {e}") from None
    return parse_hostfile_text(text, str(p))


def validate(hosts: Sequence[Host], np: int, resolve: bool = True) -> list[Host]:
    """``hosts`` as a list if ``np`` workers fit on them, else a :class:`HostError` saying why.

    Two names for this machine (``localhost`` and its hostname) count as a duplicate.
    """
    hosts = list(hosts)
    if not hosts:
        raise HostError("no hosts given: use -H host1:4,host2:4 or a hostfile")
    if not _whole(np, 1):
        raise HostError(f"need at least one worker, got --np {np!r}")
    seen: dict[str, Host] = {}
    for h in hosts:
        key = _machine(h.name)
        if key in seen:
            a = seen[key]
            same = "both name this machine" if key == _THIS else "are the same host"
            raise HostError(
                f"{a.name!r} and {h.name!r} {same}: list it once and merge the slots, like {a.name}:"
                f"{slots(a) + slots(h)}"
            )
        seen[key] = h
    total = sum(slots(h) for h in hosts)
    if np > total:
        unstated = [h.name for h in hosts if h.slots is None and not is_local(h.name)]
        note = f" ({', '.join(unstated)} state no slots and count as 1: add slots=N)" if unstated else ""
        raise HostError(
            f"--np {np} needs {np} slots but the hosts have {total}{note}: add hosts or slots, or lower --np"
        )
    if resolve:
        virtual = nodes.VirtualNodes.load()  # virtual nodes' names resolve through their ssh config
        bad = [h.name for h in hosts
               if not is_local(h.name) and not (virtual and virtual.knows(h.name)) and not _resolves(h.name)]
        if bad:
            raise HostError(f"cannot resolve {', '.join(bad)}: check the name (ping it), or add it to /etc/hosts")
    return hosts


def _resolves(name: str) -> bool:
    try:
        socket.getaddrinfo(name, None)
    except (OSError, UnicodeError):
        return False
    return True


def _bracket(name: str) -> str:
    return f"[{name}]" if ":" in name else name


def hosts_arg(hosts: Sequence[Host]) -> str:
    """``h1:4,h2:4`` for ``mpirun -H`` and ``horovodrun -H``."""
    return ",".join(f"{_bracket(h.name)}:{slots(h)}" for h in hosts)


def write_hostfile(hosts: Sequence[Host], path: str | os.PathLike[str]) -> Path:
    """Write ``hosts`` as an OpenMPI hostfile (for ``mpirun --hostfile``) and return its path."""
    lines = ["# OpenMPI hostfile written by labkit"]
    lines += [h.name if h.slots is None else f"{h.name} slots={h.slots}" for h in hosts]
    p = Path(path)
    p.write_text("\n".join(lines) + "\n")
    return p


def place(hosts: Sequence[Host], np: int) -> list[str]:
    """The host of each of ``np`` ranks, filling each host's slots in order (``--map-by slot``)."""
    if not _whole(np, 1):
        raise HostError(f"need at least one worker, got {np!r}")
    order = [h.name for h in hosts for _ in range(slots(h))]
    if np > len(order):
        raise HostError(f"{np} processes need {np} slots but the hosts have {len(order)}: add hosts or slots")
    return order[:np]


def tf_cluster(
    hosts: Sequence[Host], workers: int, ps: int = 0, chief: bool = False, base_port: int = 2222
) -> dict[str, list[str]]:
    """The TF_CONFIG cluster of chief, workers, then ps, placed by slot like :func:`place` (ps take slots too).

    Tasks on the same machine get consecutive ports from ``base_port``.
    """
    for label, value in (("workers", workers), ("ps", ps)):
        if not _whole(value, 0):
            raise HostError(f"{label} must be a whole number >= 0, got {value!r}")
    if workers + int(chief) < 1:
        raise HostError("a cluster needs at least one worker or a chief")
    n = int(chief) + workers + ps
    if not isinstance(base_port, int) or not 1 <= base_port <= 65535:
        raise HostError(f"base_port must be in 1..65535, got {base_port!r}")
    used: dict[str, int] = {}
    addresses = []
    for name in place(hosts, n):
        key = _machine(name)
        port = base_port + used.get(key, 0)
        if port > 65535:
            raise HostError(f"too many tasks on {name} for ports from {base_port}: use a lower base_port")
        used[key] = used.get(key, 0) + 1
        addresses.append(f"{_bracket(name)}:{port}")
    return tfconfig.validate(tfconfig.cluster_spec(workers=workers, ps=ps, chief=chief, hosts=addresses))
