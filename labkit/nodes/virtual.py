"""Virtual nodes on one machine: N hosts to try multi-host launches (mpirun, ssh, Slurm) without a cluster.

    with VirtualNodes(count=2, slots=2) as cluster:      # or: labkit nodes up / status / down
        labkit.launching.launch.run(cmd, np=4, hostfile=cluster.hostfile)

Each node is a network + UTS + mount namespace with its own hostname (``node1``, ...),
its own address in 198.18.0.0/24 (a benchmarking range: no default route, no forwarding,
nothing leaves the bridge), a veth link to a bridge on this machine, its own sshd, and
the same file system and process table as the machine. ``rate`` limits each link in both
directions (tc tbf); there is no added delay (that needs tc netem, which many kernels lack).

Names: the hostfile lists the nodes' addresses, which resolve everywhere without a
name service; the ssh config answers to names and addresses; inside the nodes a hosts
file bind-mounted over ``/etc/hosts`` (in the nodes' mount namespaces only) names every
node and ``head`` (this machine on the bridge). Launchers see a virtual-nodes host list
(:func:`labkit.nodes.access.mpirun_args`, :func:`labkit.nodes.access.ssh_args`) and use the cluster's ssh
config and subnet.
State lives in ``$LABKIT_NODES_STATE`` (default ``/run/labkit-nodes``); :meth:`VirtualNodes.down`
removes every namespace, link, daemon and file that ``up`` made, and can run twice.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from labkit.core import contract
from labkit.nodes import net, ssh
from labkit.nodes import slurm as nodes_slurm

DEFAULT_STATE = Path("/run/labkit-nodes")
NEEDS_ROOT = ("virtual nodes need root: labkit creates network namespaces, a bridge and veth links (CAP_NET_ADMIN), "
              "mounts a hosts file inside the nodes and starts an sshd per node (CAP_SYS_ADMIN). "
              "Run it as root, e.g. `sudo .venv/bin/labkit nodes up`.")


def needs_capabilities(missing: list[str]) -> str:
    """Why root cannot start virtual nodes here: it lacks ``missing`` (as a container's root does)."""
    return (f"root here lacks {' and '.join('CAP_' + m for m in missing)}, as root in a container does by default: "
            "virtual nodes create network namespaces, a bridge and veth links and mount a hosts file in each node. "
            "Run the container with `--cap-add NET_ADMIN,SYS_ADMIN` (or `--privileged`), or use a Linux machine of "
            "your own as root.")


class NodesError(RuntimeError):
    """Virtual nodes cannot start (or are already up); the message says what to do."""


@dataclass
class Node:
    name: str
    address: str
    slots: int
    holder: int | None = None  # pid of the process holding the node's namespaces
    sshd: int | None = None

    @property
    def netns(self) -> str:
        return net.PREFIX + self.name


def state_folder(folder: str | os.PathLike[str] | None = None) -> Path:
    return Path(folder or contract.settings().nodes_state or DEFAULT_STATE)


class VirtualNodes:
    """``count`` virtual nodes of ``slots`` slots each; ``up()``/``down()`` or a ``with`` block."""

    def __init__(self, count: int = 2, slots: int = 2, rate: str | None = None, slurm: bool = False,
                 folder: str | os.PathLike[str] | None = None, *, confined: bool = False,
                 task_cap: int | None = None) -> None:
        if not isinstance(count, int) or not 1 <= count <= 200:
            raise ValueError(f"count must be a whole number from 1 to 200, got {count!r}")
        if not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be a whole number >= 1, got {slots!r}")
        if rate is not None:
            net.rate_bits(rate)
        self.folder = state_folder(folder)
        if any(c.isspace() for c in str(self.folder)):
            raise ValueError(f"the state folder {self.folder} must not contain spaces (mpirun's ssh agent names it)")
        self.count, self.slots, self.rate, self.slurm = count, slots, rate, slurm
        self.confined = slurm and confined  # Slurm's job steps in control groups (slurm_conf.CONFINED)
        self.task_cap = task_cap if self.confined else None  # a hard RLIMIT_NPROC for the users of jobs
        self.nodes = [Node(f"node{i}", net.address(i), slots) for i in range(1, count + 1)]
        self.made: dict[str, bool] = {}  # shared things that did not exist before up: netns_dir, privsep, folder
        self.daemons: dict[str, int] = {}  # pids of daemons outside the nodes (Slurm's controller, munged)
        self.seconds_up: float | None = None
        self.children: list = []  # our children, reaped on down

    # -- files --------------------------------------------------------------------------------
    hostfile = property(lambda self: self.folder / "hostfile")
    ssh_config = property(lambda self: self.folder / "ssh_config")
    known_hosts = property(lambda self: self.folder / "known_hosts")
    state_file = property(lambda self: self.folder / "state.json")
    slurm_conf = property(lambda self: self.folder / "slurm" / "slurm.conf")  # SLURM_CONF of --slurm

    def write_hostfile(self) -> Path:
        """The OpenMPI hostfile: one line per node, its address (resolved everywhere) and slots."""
        lines = [f"{n.address} slots={n.slots}  # {n.name}" for n in self.nodes]
        self.hostfile.write_text("# OpenMPI hostfile of labkit's virtual nodes\n" + "\n".join(lines) + "\n")
        return self.hostfile

    def knows(self, name: str) -> bool:
        """True when ``name`` is one of the nodes' names or addresses."""
        return any(name in (n.name, n.address) for n in self.nodes)

    def ssh(self, node: str, *command: str) -> list[str]:
        """The argv that runs ``command`` on ``node`` over ssh with the cluster's config."""
        return ["ssh", "-F", str(self.ssh_config), node, *command]

    def enter(self, node: str) -> list[str]:
        """The argv prefix that runs a command inside ``node`` directly (no ssh): ``nsenter ...``."""
        found = [n for n in self.nodes if n.name == node]
        if not found or found[0].holder is None:
            raise NodesError(f"no running node {node!r}")
        return net.enter(found[0].holder)

    def _save(self, state: str) -> None:
        data = {"state": state, "count": self.count, "slots": self.slots, "rate": self.rate, "slurm": self.slurm,
                "confined": self.confined, "task_cap": self.task_cap, "subnet": str(net.SUBNET), "bridge": net.BRIDGE,
                "made": self.made, "daemons": self.daemons,
                "seconds_up": self.seconds_up, "nodes": [asdict(n) for n in self.nodes]}
        self.state_file.write_text(json.dumps(data, indent=1) + "\n")

    @classmethod
    def load(cls, folder: str | os.PathLike[str] | None = None) -> VirtualNodes | None:
        """The cluster whose state is in ``folder``, or None when nothing is up there."""
        path = state_folder(folder) / "state.json"
        try:
            data = json.loads(path.read_text())
            self = cls(data["count"], data["slots"], data["rate"], data["slurm"], path.parent,
                       confined=data.get("confined", False), task_cap=data.get("task_cap"))
        except (OSError, ValueError, KeyError, TypeError):
            return None
        self.nodes = [Node(**n) for n in data["nodes"]]
        self.made, self.daemons, self.seconds_up = data["made"], data["daemons"], data.get("seconds_up")
        return self

    # -- up -----------------------------------------------------------------------------------
    def up(self) -> VirtualNodes:
        """Start the nodes; on any failure everything made so far is removed again."""
        if os.geteuid() != 0:
            raise NodesError(NEEDS_ROOT)
        lacking = net.missing_capabilities()
        if lacking:
            raise NodesError(needs_capabilities(lacking))
        absent = net.missing_tools(rate=self.rate is not None)
        if absent:
            raise NodesError(f"{', '.join(absent)} not found: install iproute2, util-linux and openssh "
                             "(`apt-get install iproute2 util-linux openssh-server openssh-client`)")
        running = VirtualNodes.load(self.folder)
        if running is not None:
            raise NodesError(f"virtual nodes are already up ({running.count} x {running.slots} slots, hostfile "
                             f"{running.hostfile}): `labkit nodes down` first to start others")
        if net.netns_names() or net.link_exists(net.BRIDGE):
            raise NodesError(f"virtual nodes from another state folder (or a failed start) exist: "
                             f"{', '.join(net.netns_names() + [net.BRIDGE])}; run `labkit nodes down`")
        if self.folder.exists() and any(self.folder.iterdir()):
            raise NodesError(f"the state folder {self.folder} is not empty: choose another ($LABKIT_NODES_STATE)")
        start = time.perf_counter()
        self.made = {"folder": not self.folder.exists(), "netns_dir": not net.NETNS_DIR.exists(),
                     "privsep": not ssh.PRIVSEP.exists()}
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._save("starting")
        try:
            self._start()
        except BaseException:
            self.down()
            raise
        self.seconds_up = round(time.perf_counter() - start, 3)
        self._save("up")
        return self

    def _start(self) -> None:
        ssh.PRIVSEP.mkdir(mode=0o755, exist_ok=True)
        key = self.folder / "id_ed25519"
        ssh.keygen(key)
        authorized = self.folder / "authorized_keys"
        shutil.copyfile(key.with_suffix(".pub"), authorized)
        hosts_file = self.folder / "hosts"
        # First, so that they win: this machine's own name is its bridge address in the nodes (services that
        # advertise it, like ipyparallel's controller, are reached there), as a login node's name on a cluster.
        lines = [f"{net.gateway()} head {socket.gethostname()}", *(f"{n.address} {n.name}" for n in self.nodes)]
        hosts_file.write_text("# labkit virtual nodes\n" + "\n".join(lines) + "\n\n" + Path("/etc/hosts").read_text())
        net.make_bridge()
        for n in self.nodes:
            (self.folder / n.name).mkdir()
            ssh.keygen(self.folder / n.name / "host_key")
            net.make_node_link(n.netns, n.netns, n.address)
            if self.rate:
                net.shape(n.netns, n.netns, self.rate)
        for n in self.nodes:
            p = net.start_holder(n.netns, n.name, hosts_file, self.folder / n.name / "holder.log")
            self.children.append(p)
            n.holder = p.pid
        self._save("starting")
        self._wait(lambda: all(net.held(n.holder or 0) for n in self.nodes), "the nodes' namespaces", "holder.log",
                   self.children)
        for n in self.nodes:
            ssh.sshd_config(self.folder / n.name, n.address, authorized)
        sshds = [self._start_sshd(n) for n in self.nodes]
        self._save("starting")
        ssh.client_files(self.folder, [(n.name, n.address) for n in self.nodes], key)
        self.write_hostfile()
        ssh.wrapper(self.folder / "bin" / "ssh", self.ssh_config)
        self._wait(lambda: all(ssh.answers(n.address) for n in self.nodes), "sshd", "sshd.log", sshds)
        if self.slurm:
            self.daemons.update(nodes_slurm.start(self))

    def _start_sshd(self, n: Node) -> subprocess.Popen[bytes]:
        argv = [*net.enter(n.holder or 0), ssh.sshd_path(), "-D", "-e", "-f", str(self.folder / n.name / "sshd_config")]
        p = net.daemon(argv, self.folder / n.name / "sshd.log", contract.strip(os.environ))  # not part of a job
        self.children.append(p)
        n.sshd = p.pid
        return p

    def set_sshd(self, node: str, running: bool) -> None:
        """Stop (``running=False``) or start again the sshd of ``node``: a machine whose ssh server is down."""
        n = next((n for n in self.nodes if node in (n.name, n.address)), None)
        if n is None or n.holder is None:
            raise NodesError(f"no running node {node!r}")
        if not running:
            if n.sshd and psutil.pid_exists(n.sshd):
                net.stop_processes([psutil.Process(n.sshd)])
            n.sshd = None
        elif not ssh.answers(n.address):
            p = self._start_sshd(n)
            self._wait(lambda: ssh.answers(n.address), "sshd", "sshd.log", [p])
        self._save("up")

    def _wait(self, check, what: str, log: str, procs: list, timeout: float = 15) -> None:
        """Until ``check()``; a :class:`NodesError` with the nodes' ``log`` tails on timeout or when one of
        ``procs`` (what should be running by now) has exited."""
        deadline = time.monotonic() + timeout
        while not check():
            ended = [p for p in procs if p.poll() is not None]
            if ended or time.monotonic() > deadline:
                tails = "\n".join(f"--- {n.name}: {(self.folder / n.name / log).read_text()[-500:]}"
                                  for n in self.nodes if (self.folder / n.name / log).exists())
                why = f"exited with code {ended[0].returncode}" if ended else f"did not start within {timeout:g} s"
                raise NodesError(f"{what} {why}:\n{tails}")
            time.sleep(0.02)

    # -- down ---------------------------------------------------------------------------------
    def down(self) -> list[str]:
        """Stop and remove everything ``up`` made (also leftovers of a failed start); what was removed."""
        netnses = sorted({n.netns for n in self.nodes if net.netns_path(n.netns).exists()} | set(net.netns_names()))
        removed = [ns[len(net.PREFIX):] for ns in netnses]
        net.kill_inside(netnses, [*self.daemons.values(), *(p.pid for p in self.children if p.poll() is None),
                                  *(n.holder or 0 for n in self.nodes if n.holder)])
        for p in self.children:
            p.wait(5)
        self.children = []
        problems = net.remove_links(netnses)
        if self.confined:
            try:
                removed += nodes_slurm.remove_groups([n.name for n in self.nodes])
            except OSError as e:
                problems.append(f"Slurm's control groups of the nodes ({e})")
        if self.made.get("netns_dir"):
            net.release_netns_dir()
        if self.made.get("privsep"):
            try:
                ssh.PRIVSEP.rmdir()
            except OSError:
                pass
        if self.state_file.exists():
            if self.made.get("folder", True):
                shutil.rmtree(self.folder, ignore_errors=True)
            else:
                for child in self.folder.iterdir():
                    shutil.rmtree(child) if child.is_dir() else child.unlink()
            removed.append(str(self.folder))
        if problems:
            raise NodesError("could not remove: " + "; ".join(problems))
        return removed

    # -- status -------------------------------------------------------------------------------
    def status(self) -> dict:
        nodes = []
        for n in self.nodes:
            ok = n.holder is not None and net.held(n.holder) and ssh.answers(n.address)
            nodes.append({"name": n.name, "address": n.address, "slots": n.slots, "state": "up" if ok else "down"})
        daemons = {k: psutil.pid_exists(v) for k, v in self.daemons.items()}
        up = all(n["state"] == "up" for n in nodes) and all(daemons.values())
        return {"state": "up" if up else "broken", "folder": str(self.folder), "hostfile": str(self.hostfile),
                "ssh_config": str(self.ssh_config), "known_hosts": str(self.known_hosts), "subnet": str(net.SUBNET),
                "bridge": net.BRIDGE, "rate": self.rate, "slurm": self.slurm, "confined": self.confined,
                "seconds_up": self.seconds_up,
                "nodes": nodes, **({"slurm_conf": str(self.slurm_conf)} if self.slurm else {})}

    def __enter__(self) -> VirtualNodes:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()


def down(folder: str | os.PathLike[str] | None = None) -> list[str]:
    """Remove the cluster in ``folder`` (and any leftover nodes); an empty list when nothing was up."""
    cluster = VirtualNodes.load(folder) or VirtualNodes(folder=folder)
    if os.geteuid() != 0 and (cluster.state_file.exists() or net.netns_names()):
        raise NodesError("labkit nodes down needs root, like labkit nodes up")
    return cluster.down()


