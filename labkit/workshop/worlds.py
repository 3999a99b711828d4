"""Each learner's server in a world of its own: a private ``/tmp``, ``/var/tmp``, ``/dev/shm`` and ``/run/lock``,
its own SysV IPC, and on one machine a network of its own.

Without this every learner shares the machine's temporary folders and loopback: a learner who makes
``/tmp/ompi.HOST.UID`` for another learner's uid first breaks all of that learner's ``mpirun`` (OpenMPI 4 keeps
its session there), and a ``tf.distribute.Server`` (gRPC, no authentication), Gloo's or MPI's ports that one
learner listens on are reachable by every other learner at ``127.0.0.1``.

:func:`argv` is the prefix of the command that starts a learner's server, run by root (the hub, or root's Slurm
job on a node): ``nsenter`` into the learner's network namespace (on one machine), ``unshare`` a mount and an IPC
namespace, mount a tmpfs on each temporary folder (pages there count against the learner's memory limit), then
``setpriv`` to the learner (their uid, group, groups, no new privileges) and exec the server. Everything the
server starts (kernels, terminals, ``mpirun`` and its ranks) inherits the world; nothing in it is the learner's
to choose (the values are the hub's, checked by :class:`World`), and the namespaces end with the last process.

The network (:class:`Network`, made by ``workshop up`` and removed by ``down``): one namespace per account,
``lkw-NAME``, joined to the machine by a veth pair. The machine's end has no address; the hub listens on
:data:`HUB` (an interface of its own), the learner's end has the account's own address from :data:`NETWORK`, and its
only routes lead to the hub (and, with ``--slurm``, to the Slurm controller on the machine). Inside, loopback is
the learner's alone: their checks' ranks, Gloo, MPI and tf.distribute clusters talk there as on any machine. The
proxy and the hub reach the server at its address; no learner has a route to another's, and the machine forwards
nothing from a learner's link (``forwarding`` off on it, IPv6 off on both ends).
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

TMP_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
TMP_SIZE = "2g"  # per folder; tmpfs pages are charged to the learner's memory limit as well
NETWORK = ipaddress.ip_network("198.19.0.0/16")  # a benchmarking range (RFC 2544) beside the virtual nodes' 198.18
HUB = "198.19.0.1"  # the hub's address for the learners' servers, on HUB_LINK (a bridge without ports)
HUB_LINK = "lkw-hub"
NETNS_DIR = Path("/run/netns")
PREFIX = "lkw-"  # of each learner's namespace (the virtual nodes' are labkit-*)
SIZE = re.compile(r"[1-9][0-9]{0,5}[kmg]")
# Run by root in the new mount namespace: $1 the size, then the folders to keep (the shared environment, when it
# lies in a temporary folder) up to "--", then the command. Each kept folder is opened before the private
# folders hide it and bound again at its place in them (mount --no-canonicalize: the open folder, not its name).
# Nothing here comes from a learner.
MOUNT = (r'size="$1"; shift; n=3; kept=""; '
         r'while [ "$1" != -- ]; do eval "exec $n<\"\$1\"" || exit 1; eval "keep_$n=\"\$1\""; '
         r'kept="$kept $n"; n=$((n+1)); shift; done; shift; '
         r'for d in ' + " ".join(TMP_DIRS) + r'; do [ -d "$d" ] || continue; '
         r'mount -t tmpfs -o "nosuid,nodev,mode=1777,size=$size" labkit-tmp "$d" || exit 1; done; '
         r'if [ -d /dev/mqueue ]; then mount -t mqueue -o nosuid,nodev,noexec labkit-mqueue /dev/mqueue || exit 1; fi; '
         r'for n in $kept; do eval "k=\"\$keep_$n\""; mkdir -p "$k" && '
         r'mount --no-canonicalize --rbind "/proc/self/fd/$n" "$k" || exit 1; eval "exec $n<&-"; done; '
         r'exec "$@"')


def in_temporary(path: str | Path) -> bool:
    """Does ``path`` lie in one of the folders each learner's world replaces (:data:`TMP_DIRS`)?"""
    p = Path(path)
    return any(p == Path(d) or Path(d) in p.parents for d in TMP_DIRS)


@dataclass(frozen=True)
class World:
    """Whom the server runs as, and in which network namespace (None: the one it starts in, e.g. a Slurm node's)."""

    uid: int
    gid: int
    home: str
    netns: str | None = None  # /run/netns/lkw-NAME
    tmp_size: str = TMP_SIZE
    keep: tuple[str, ...] = ()  # folders in temporary folders the server must still see (the shared environment)

    def __post_init__(self) -> None:
        if type(self.uid) is not int or type(self.gid) is not int or self.uid <= 0 or self.gid <= 0:
            raise ValueError(f"a learner's world is never root's (uid {self.uid!r}, gid {self.gid!r})")
        if not SIZE.fullmatch(self.tmp_size):
            raise ValueError(f"temporary folder size {self.tmp_size!r} is not e.g. 2g")
        if not self.home.startswith("/") or "\n" in self.home:
            raise ValueError(f"home {self.home!r} is not an absolute path")
        for folder in self.keep:
            if not folder.startswith("/") or "\n" in folder or folder == "--" or not in_temporary(folder):
                raise ValueError(f"{folder!r} is not a folder in a temporary folder to keep")
        if self.netns is not None and Path(self.netns).parent != NETNS_DIR:
            raise ValueError(f"network namespace {self.netns!r} is not one under {NETNS_DIR}")


def kept(*folders: str | Path | None) -> tuple[str, ...]:
    """Of ``folders`` (the shared environment, the release, the data set), those a world must keep: the ones in a
    temporary folder (a checkout in ``/tmp``), which the private folders would hide."""
    return tuple(dict.fromkeys(str(f) for f in folders if f and in_temporary(f)))


def argv(world: World) -> list[str]:
    """The command prefix that runs what follows it as the learner, in ``world`` (root runs it)."""
    enter = ["nsenter", f"--net={world.netns}"] if world.netns else []
    return [*enter, "unshare", "--mount", "--ipc", "--propagation", "private", "--",
            "/bin/sh", "-c", MOUNT, "labkit-world", world.tmp_size, *world.keep, "--",
            "setpriv", f"--reuid={world.uid}", f"--regid={world.gid}", "--init-groups", "--no-new-privs", "--",
            "env", f"--chdir={world.home}"]


@dataclass(frozen=True)
class Network:
    """One account's network namespace and link (:func:`plan`)."""

    name: str  # the account
    index: int  # 1...: its address and link name
    address: str

    @property
    def netns(self) -> str:
        return f"{PREFIX}{self.name}"

    @property
    def path(self) -> str:
        return str(NETNS_DIR / self.netns)

    @property
    def outer(self) -> str:  # the machine's end of the link (15 characters at most)
        return f"lkw{self.index:04d}"

    @property
    def inner(self) -> str:  # the learner's end, before it moves into the namespace and becomes eth0
        return f"lkw{self.index:04d}n"


def plan(names: list[str]) -> list[Network]:
    """Each account's namespace, link and address, in order."""
    hosts = NETWORK.hosts()
    next(hosts)  # HUB
    if len(names) > 9999:
        raise ValueError("at most 9999 accounts")
    return [Network(name, k, str(next(hosts))) for k, name in enumerate(names, start=1)]


def hub_commands() -> list[list[str]]:
    """The hub's address, on an interface of the machine of its own (a bridge without ports)."""
    return [["ip", "link", "add", HUB_LINK, "type", "bridge"],
            ["ip", "addr", "add", f"{HUB}/32", "dev", HUB_LINK],
            ["ip", "link", "set", HUB_LINK, "up"]]


def up_commands(n: Network, also_reach: tuple[str, ...] = ()) -> list[list[str]]:
    """The ``ip`` commands that make ``n``: its namespace, the link, the addresses and the only routes it has
    (to the hub, and to each address of ``also_reach``, e.g. the Slurm controller's)."""
    inside = ["ip", "-n", n.netns]
    return [["ip", "netns", "add", n.netns],
            ["ip", "link", "add", n.outer, "type", "veth", "peer", "name", n.inner],
            ["ip", "link", "set", n.inner, "netns", n.netns],
            [*inside, "link", "set", n.inner, "name", "eth0"],
            [*inside, "addr", "add", f"{n.address}/32", "dev", "eth0"],
            [*inside, "link", "set", "lo", "up"],
            [*inside, "link", "set", "eth0", "up"],
            *([*inside, "route", "add", f"{ip}/32", "dev", "eth0"] for ip in (HUB, *also_reach)),
            ["ip", "link", "set", n.outer, "up"],
            ["ip", "route", "add", f"{n.address}/32", "dev", n.outer, "src", HUB]]


def sysctls(n: Network) -> list[tuple[str, str, bool]]:
    """``(file under /proc/sys, value, inside the namespace)``: no forwarding from the learner's link, no IPv6."""
    return [(f"net/ipv4/conf/{n.outer}/forwarding", "0", False),
            (f"net/ipv4/conf/{n.outer}/rp_filter", "1", False),  # no packet from a learner with another's address
            (f"net/ipv6/conf/{n.outer}/disable_ipv6", "1", False),
            ("net/ipv6/conf/all/disable_ipv6", "1", True)]


CHAIN = "LKW-WORLDS"  # the workshop's own iptables chains: CHAIN-in, CHAIN-out, CHAIN-fwd


def firewall_commands(hub_port: int, reach: tuple[tuple[str, int], ...] = ()) -> list[list[str]]:
    """iptables rules that hold the learners' networks to what they are for, whatever else the machine serves:

    * into the machine from a learner's link: only the hub's port at :data:`HUB` and each ``(address, port)`` of
      ``reach`` (the Slurm controller's), and answers on connections made; nothing else the machine listens on
      (sshd, a database on ``0.0.0.0``...);
    * out to a learner's link: only root's sockets (the hub and its proxy) open connections, so that a process
      of another user on the machine (a learner's ``ssh -L``, an instructor's tool) does not reach a learner;
    * nothing forwarded to or from a learner's link."""
    links = "lkw+"
    inbound = [["iptables", "-w", "-A", f"{CHAIN}-in", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED",
                "-j", "ACCEPT"],
               ["iptables", "-w", "-A", f"{CHAIN}-in", "-p", "tcp", "-d", HUB, "--dport", str(int(hub_port)),
                "-j", "ACCEPT"],
               *(["iptables", "-w", "-A", f"{CHAIN}-in", "-p", "tcp", "-d", ip, "--dport", str(int(port)), "-j",
                  "ACCEPT"] for ip, port in reach),
               ["iptables", "-w", "-A", f"{CHAIN}-in", "-j", "DROP"]]
    outbound = [["iptables", "-w", "-A", f"{CHAIN}-out", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED",
                 "-j", "ACCEPT"],
                ["iptables", "-w", "-A", f"{CHAIN}-out", "-m", "owner", "--uid-owner", "0", "-j", "ACCEPT"],
                ["iptables", "-w", "-A", f"{CHAIN}-out", "-j", "REJECT"]]
    chains = [["iptables", "-w", "-N", f"{CHAIN}-{kind}"] for kind in ("in", "out", "fwd")]
    forward = [["iptables", "-w", "-A", f"{CHAIN}-fwd", "-j", "DROP"]]
    jumps = [["iptables", "-w", "-I", "INPUT", "1", "-i", links, "-j", f"{CHAIN}-in"],
             ["iptables", "-w", "-I", "OUTPUT", "1", "-o", links, "-j", f"{CHAIN}-out"],
             ["iptables", "-w", "-I", "FORWARD", "1", "-i", links, "-j", f"{CHAIN}-fwd"],
             ["iptables", "-w", "-I", "FORWARD", "1", "-o", links, "-j", f"{CHAIN}-fwd"]]
    return [*chains, *inbound, *outbound, *forward, *jumps]


def firewall_remove_commands() -> list[list[str]]:
    """Remove the jumps, then empty and delete the chains (each may be missing: every command is tried)."""
    links = "lkw+"
    return [["iptables", "-w", "-D", "INPUT", "-i", links, "-j", f"{CHAIN}-in"],
            ["iptables", "-w", "-D", "OUTPUT", "-o", links, "-j", f"{CHAIN}-out"],
            ["iptables", "-w", "-D", "FORWARD", "-i", links, "-j", f"{CHAIN}-fwd"],
            ["iptables", "-w", "-D", "FORWARD", "-o", links, "-j", f"{CHAIN}-fwd"],
            *(["iptables", "-w", "-F", f"{CHAIN}-{kind}"] for kind in ("in", "out", "fwd")),
            *(["iptables", "-w", "-X", f"{CHAIN}-{kind}"] for kind in ("in", "out", "fwd"))]


def down_commands(n: Network) -> list[list[str]]:
    """Removing the namespace removes the learner's end and with it the pair."""
    return [["ip", "netns", "delete", n.netns], ["ip", "link", "delete", n.outer]]


def run(argv: list[str]) -> None:
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise OSError(f"`{' '.join(argv)}` failed: {(done.stderr or done.stdout).strip()[:300]}")


def _write_sysctl(n: Network, file: str, value: str, inside: bool) -> None:
    path = f"/proc/sys/{file}"
    if inside:  # /proc/sys/net is the opener's network namespace: write it from a process inside
        run(["nsenter", f"--net={n.path}", "/bin/sh", "-c", f"[ ! -e {path} ] || echo {value} > {path}"])
    elif Path(path).exists():
        Path(path).write_text(value)


def left_over(chain: str, prefix: str) -> str | None:
    """Why a workshop's networks cannot be made here: iptables missing, or its chains ``chain-*`` or namespaces
    ``prefix*`` left by a workshop not taken down; None when nothing is in the way."""
    try:
        rules = subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as e:
        return f"`iptables` cannot be run ({e}); install iptables"
    if rules.returncode != 0:
        return f"`iptables -S` failed: {(rules.stderr or rules.stdout).strip()[:200]}"
    if chain in rules.stdout:
        return f"the firewall's chains {chain}-* exist: a workshop is up, or one was not taken down"
    if any(p.name.startswith(prefix) for p in (NETNS_DIR.iterdir() if NETNS_DIR.is_dir() else [])):
        return f"network namespaces {prefix}* exist in {NETNS_DIR}: a workshop's, not taken down"
    return None


def taken() -> str | None:
    """Why the learners' network cannot be made here (an address or name of it in use), or None."""
    try:
        shown = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return f"`ip` cannot be run ({e}); install iproute2"
    if f" {HUB}/" in shown or f"{HUB_LINK}:" in shown:
        return f"{HUB} or the interface {HUB_LINK} is in use: a workshop is up, or one was not taken down"
    return left_over(CHAIN, PREFIX)


def make(networks: list[Network], hub_port: int, also_reach: tuple[tuple[str, int], ...] = ()) -> None:
    """The hub's address, the firewall's rules and every account's network (OSError says which command failed)."""
    for argv_ in hub_commands():
        run(argv_)
    for argv_ in firewall_commands(hub_port, also_reach):
        run(argv_)
    for n in networks:
        for argv_ in up_commands(n, tuple(ip for ip, _ in also_reach)):
            run(argv_)
        for file, value, inside in sysctls(n):
            _write_sysctl(n, file, value, inside)


def remove(networks: list[Network]) -> list[str]:
    """Remove what :func:`make` made (whatever of it exists); what was removed."""
    removed = []
    for n in networks:
        if Path(n.path).exists():
            for argv_ in down_commands(n):
                try:
                    run(argv_)
                except OSError:
                    continue  # the link goes with the namespace
            removed.append(f"{n.name}'s network namespace")
    try:
        run(["ip", "link", "delete", HUB_LINK])
        removed.append(f"the hub's address {HUB}")
    except OSError:
        pass
    gone = 0
    for argv_ in firewall_remove_commands():
        try:
            run(argv_)
            gone += 1
        except OSError:
            continue  # already gone
    if gone:
        removed.append(f"the firewall's rules for the learners' networks ({CHAIN}-*)")
    return removed
