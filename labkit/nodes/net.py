"""The plumbing of virtual nodes: namespaces, a bridge, veth links, link rates, and the processes inside.

A node is a named network namespace (``ip netns add``) plus a UTS namespace (its
hostname) and a mount namespace (its own ``/etc/hosts``, bind-mounted there only),
held open by a ``sleep`` process; daemons join all three with ``nsenter`` (not
``ip netns exec``, which remounts ``/sys`` and hides the cgroup file systems).
Every name made here starts with :data:`PREFIX`, so that :func:`netns_names` finds
what a crashed start left behind.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

PREFIX = "labkit-"  # netns, bridge and host-side veth names
BRIDGE = PREFIX + "br0"
SUBNET = ipaddress.ip_network("198.18.0.0/24")  # RFC 2544 benchmarking range: never routed
NETNS_DIR = Path("/run/netns")
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps|tbps)$", re.IGNORECASE)
_SCALE = {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


class NetError(RuntimeError):
    """A network command failed; the message holds the command and its error."""


def run(argv: Sequence[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a short command (``ip``, ``tc``); :class:`NetError` with its stderr when ``check`` and it fails."""
    r = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and r.returncode != 0:
        raise NetError(f"`{' '.join(argv)}` failed: {(r.stderr or r.stdout).strip()}")
    return r


def gateway() -> str:
    """The bridge's address on this machine (the nodes' only neighbour that is not a node)."""
    return str(SUBNET.network_address + 1)


def address(index: int) -> str:
    """The address of node ``index`` (1-based): .11, .12, ..."""
    return str(SUBNET.network_address + 10 + index)


def rate_bits(rate: str) -> float:
    """Bits per second of a tc rate like ``50mbit`` or ``1gbit`` (``bps`` units are bytes); ValueError if not one."""
    m = _RATE.match(rate.strip())
    if not m:
        raise ValueError(f"rate {rate!r} is not understood: write a number and a unit, like 50mbit, 200mbit or 1gbit")
    number, unit = float(m.group(1)), m.group(2).lower()
    bits = number * _SCALE[unit[0] if unit[0] in "kmgt" else ""] * (8 if unit.endswith("bps") else 1)
    if bits < 8000:
        raise ValueError(f"rate {rate!r} is below 8 kbit/s")
    return bits


def netns_path(name: str) -> Path:
    return NETNS_DIR / name


def netns_names() -> list[str]:
    """Network namespaces on this machine whose names start with :data:`PREFIX`."""
    try:
        return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(PREFIX))
    except OSError:
        return []


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def make_bridge() -> None:
    run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    run(["ip", "addr", "add", f"{gateway()}/{SUBNET.prefixlen}", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])


def make_node_link(netns: str, veth: str, addr: str) -> None:
    """A namespace ``netns`` whose ``eth0`` (``addr``) is the far end of ``veth`` on the bridge; no default route."""
    run(["ip", "netns", "add", netns])
    run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns])
    run(["ip", "link", "set", veth, "master", BRIDGE, "up"])
    run(["ip", "-n", netns, "addr", "add", f"{addr}/{SUBNET.prefixlen}", "dev", "eth0"])
    run(["ip", "-n", netns, "link", "set", "eth0", "up"])
    run(["ip", "-n", netns, "link", "set", "lo", "up"])


def shape(netns: str, veth: str, rate: str) -> None:
    """Limit both directions of a node's link to ``rate`` with a token bucket (tbf) on each veth end."""
    burst = max(256 * 1024, int(rate_bits(rate) / 8 / 100))  # at least 10 ms of traffic at the rate
    qdisc = ["root", "tbf", "rate", rate, "burst", str(burst), "latency", "50ms"]
    run(["tc", "qdisc", "add", "dev", veth, *qdisc])
    run(["tc", "-n", netns, "qdisc", "add", "dev", "eth0", *qdisc])


def start_holder(netns: str, hostname: str, hosts_file: Path, log: Path) -> subprocess.Popen[bytes]:
    """The process that holds a node's UTS and mount namespaces: hostname set, ``hosts_file`` on /etc/hosts."""
    script = (f"hostname {hostname} && mount -n --bind {hosts_file} /etc/hosts && exec sleep infinity")
    argv = ["nsenter", f"--net={netns_path(netns)}", "--", "unshare", "--uts", "--mount", "--propagation", "slave",
            "--", "sh", "-c", script]
    return daemon(argv, log)


def daemon(argv: Sequence[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start a process that outlives this one (``labkit nodes up`` returns, the nodes stay): own session,
    output to ``log``. :func:`kill_inside` and the state's pid list stop it."""
    with open(log, "ab") as out:
        return subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)


def enter(holder: int) -> list[str]:
    """The ``nsenter`` prefix that runs a command inside the node held by process ``holder``."""
    return ["nsenter", "-t", str(holder), "--net", "--uts", "--mount", "--"]


def held(pid: int) -> bool:
    """True while ``pid`` is a live holder (``sleep``, after it set the hostname and mounted the hosts file)."""
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE and p.name() == "sleep"
    except psutil.Error:
        return False


def _netns_inode(netns: str) -> int | None:
    try:
        return os.stat(netns_path(netns)).st_ino
    except OSError:
        return None


def inside(netns: str) -> list[psutil.Process]:
    """Live processes whose network namespace is ``netns`` (what ``ip netns pids`` lists)."""
    ino = _netns_inode(netns)
    if ino is None:
        return []
    found = []
    for p in psutil.process_iter():
        try:
            if os.stat(f"/proc/{p.pid}/ns/net").st_ino == ino and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (OSError, psutil.Error):
            continue
    return found


def _gone(p: psutil.Process) -> bool:
    """Ended (a zombie counts: once its parent has exited, only init reaps it, sometimes slowly)."""
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.Error:
        return True


def stop_processes(procs: Sequence[psutil.Process], grace: float = 3.0) -> None:
    """SIGTERM all at once, wait up to ``grace`` s, SIGKILL the rest."""
    left = list(procs)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 2.0)):
        for p in left:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        deadline = time.monotonic() + wait
        while (left := [p for p in left if not _gone(p)]) and time.monotonic() < deadline:
            time.sleep(0.02)
        if not left:
            return


def kill_inside(netnses: Sequence[str], extra: Sequence[int] = ()) -> None:
    """Stop every process in the ``netnses`` plus the pids ``extra`` (daemons outside the nodes)."""
    procs = {p.pid: p for ns in netnses for p in inside(ns)}
    for pid in extra:
        try:
            procs.setdefault(pid, psutil.Process(pid))
        except psutil.Error:
            continue
    stop_processes(list(procs.values()))


def remove_links(netnses: Sequence[str]) -> list[str]:
    """Delete the host ends of the nodes' links, the namespaces and the bridge; what could not be removed."""
    problems = []
    for ns in netnses:
        if link_exists(ns):  # the host-side veth carries the namespace's name
            r = run(["ip", "link", "del", ns], check=False)
            if r.returncode:
                problems.append(f"link {ns}: {r.stderr.strip()}")
        if netns_path(ns).exists():
            r = run(["ip", "netns", "delete", ns], check=False)
            if r.returncode:
                problems.append(f"namespace {ns}: {r.stderr.strip()}")
    if link_exists(BRIDGE):
        r = run(["ip", "link", "del", BRIDGE], check=False)
        if r.returncode:
            problems.append(f"bridge {BRIDGE}: {r.stderr.strip()}")
    return problems


def release_netns_dir() -> None:
    """Undo what the first ``ip netns add`` did to ``/run/netns`` (a bind mount), once no namespace is left in it."""
    try:
        if any(NETNS_DIR.iterdir()):
            return
    except OSError:
        return
    for _ in range(4):  # a bind mount onto itself: same device, so Path.is_mount() cannot tell
        if not _mounted(NETNS_DIR):
            break
        run(["umount", "-n", str(NETNS_DIR)], check=False)
    try:
        NETNS_DIR.rmdir()
    except OSError:
        pass


def _mounted(path: Path) -> bool:
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return False
    return any(line.split()[4] == str(path) for line in lines if len(line.split()) > 4)


# What virtual nodes do as root: network devices and namespaces (CAP_NET_ADMIN), mounts (CAP_SYS_ADMIN); each
# capability's bit in the effective set (linux/capability.h).
CAPABILITIES = {"NET_ADMIN": 12, "SYS_ADMIN": 21}


def missing_capabilities(status: str | None = None) -> list[str]:
    """The capabilities of :data:`CAPABILITIES` this process lacks, read from ``CapEff`` in /proc/self/status (or
    ``status``): a container's root usually lacks both. Empty where the set cannot be read."""
    if status is None:
        try:
            status = Path("/proc/self/status").read_text()
        except OSError:
            return []
    found = re.search(r"^CapEff:\s*([0-9a-fA-F]+)\s*$", status, re.M)
    if found is None:
        return []
    effective = int(found[1], 16)
    return [name for name, bit in CAPABILITIES.items() if not effective >> bit & 1]


def missing_tools(rate: bool = False) -> list[str]:
    need = ["ip", "nsenter", "unshare", "mount", "sshd", "ssh", "ssh-keygen"] + (["tc"] if rate else [])
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [t for t in need if shutil.which(t, path=path) is None]
