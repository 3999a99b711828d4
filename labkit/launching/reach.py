"""Can the hosts be reached: passwordless ssh checked before a job starts, and hosts watched while it runs.

:func:`ssh_preflight` turns a failing ``ssh HOST true`` into the fix for that host; :class:`HostWatch` notices a host
that stops answering during a job, whose peers would otherwise wait in a collective for ever.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from labkit.launching.hosts import Host, HostError, is_local
from labkit.nodes import access
from labkit.nodes import virtual as nodes

SSH_HELP = """\
Set up passwordless ssh from this machine to every host, as the same user on all of them:
  ssh-keygen -t ed25519      # once; accept the defaults, empty passphrase
  ssh-copy-id HOST           # once per host
  ssh HOST true              # once per host, to accept its host key
Every host also needs the same paths: the project directory and its .venv at the same place."""


def address_of(host: str) -> str:
    """What to connect to for ``host``: a virtual node's address from its cluster (their names resolve only
    through the cluster's ssh config), else the name as given."""
    cluster = access.for_hosts([host])
    return next(n.address for n in cluster.nodes if host in (n.name, n.address)) if cluster else host


def address_toward(host: str) -> str:
    """This machine's address on the route to ``host``: where processes there reach a server here."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((socket.gethostbyname(address_of(host)), 9))  # nothing is sent: the kernel picks the route
        return s.getsockname()[0]


def ssh_command(host: str, timeout: float = 10, ssh: str = "ssh", ssh_args: Sequence[str] = ()) -> list[str]:
    """The command that checks passwordless ssh to ``host`` (runs ``true`` there)."""
    connect = max(1, int(timeout))
    return [ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect}", *ssh_args, host, "true"]


def _try_ssh(cmd: list[str], timeout: float) -> str | None:
    """None when ``cmd`` succeeds, else what went wrong."""
    try:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=3 * timeout)
    except subprocess.TimeoutExpired:
        return f"no answer within {3 * timeout:g} s"
    except OSError as e:
        return str(e)
    if r.returncode == 0:
        return None
    return r.stderr.strip() or r.stdout.strip() or f"ssh exited with code {r.returncode}"


def ssh_preflight(hosts: Sequence[Host], timeout: float = 10, ssh: str = "ssh", ssh_args: Sequence[str] = ()) -> None:
    """Check that every non-local host runs ``ssh HOST true`` without a password; :class:`HostError` if not.

    Virtual nodes (:mod:`labkit.nodes.virtual`) are reached with their own ssh config unless ``ssh_args`` are given.

    All hosts are tried at once; the error lists every failing host with ssh's own message.
    """
    if timeout <= 0:
        raise HostError(f"timeout must be > 0 seconds, got {timeout!r}")
    names = list(dict.fromkeys(h.name for h in hosts if not is_local(h.name)))
    if not names:
        return
    ssh_args = list(ssh_args) or access.ssh_args([h.name for h in hosts])
    exe = shutil.which(ssh)
    if exe is None:
        raise HostError(f"{ssh!r} is not installed: apt-get install openssh-client to launch on {', '.join(names)}")
    cmds = [ssh_command(n, timeout, exe, ssh_args) for n in names]
    with ThreadPoolExecutor(max_workers=min(16, len(cmds))) as pool:
        errors = list(pool.map(_try_ssh, cmds, [timeout] * len(cmds)))
    failed = [f"  {n}: {e}\n    fix: {ssh_fix(n, e)}" for n, e in zip(names, errors, strict=True) if e is not None]
    if failed:
        raise HostError("passwordless ssh failed, nothing was started:\n" + "\n".join(failed) + "\n" + SSH_HELP)


SSH_FIXES = (  # what ssh says -> what to do about it on HOST
    (("connection refused",), "no ssh server answers on HOST: start it there (`sudo systemctl start ssh`), "
     "or check the name and port"),
    (("host key verification failed", "remote host identification has changed", "no .* host key is known"),
     "HOST's host key is unknown here or has changed (a reinstalled or re-created machine): check that it is the "
     "right machine, then `ssh-keygen -R HOST` and `ssh HOST true` once to accept its key"),
    (("permission denied",), "HOST refuses your key for this user: `ssh-copy-id USER@HOST`, and use the same user "
     "name on every host (or set `User` for it in ~/.ssh/config)"),
    (("could not resolve", "name or service not known"), "HOST's name does not resolve: check it, or add it to "
     "/etc/hosts"),
    (("timed out", "no route to host", "no answer within", "network is unreachable"),
     "HOST does not answer at all: is it up and on this network (`ping HOST`)? a firewall?"),
)


def ssh_fix(host: str, error: str) -> str:
    """The fix for one failed ``ssh HOST true``, from ssh's message."""
    low = error.lower()
    for needles, fix in SSH_FIXES:
        if any(re.search(n, low) for n in needles):
            return fix.replace("HOST", host)
    return "see the steps below"


class HostWatch:
    """Watches the hosts of a running job: ``lost`` names those whose ssh port stopped answering.

    Every ``every`` seconds each remote host gets a TCP connection to ``port``; after
    ``misses`` failures in a row it is lost (a dead or unplugged machine: its ranks' peers
    would wait in a collective for ever, and MPI's own connections notice nothing).
    """

    def __init__(self, host_list: Sequence[Host], port: int = 22, every: float = 2.0, misses: int = 3) -> None:
        self.names = list(dict.fromkeys(h.name for h in host_list if not is_local(h.name)))
        self.targets = {name: address_of(name) for name in self.names}
        self.port, self.every, self.misses = port, every, misses
        self.lost: list[str] = []
        self.since: float | None = None  # when the first lost host was last seen answering
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="labkit-host-watch")

    def start(self) -> HostWatch:
        if self.names:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.every + 3)

    def _answers(self, name: str) -> bool:
        try:
            with socket.create_connection((self.targets.get(name, name), self.port), timeout=min(2.0, self.every)):
                return True
        except OSError:
            return False

    def _loop(self) -> None:
        failed = dict.fromkeys(self.names, 0)
        seen = dict.fromkeys(self.names, time.time())
        while not self._stop.wait(self.every):
            for name in self.names:
                if self._answers(name):
                    failed[name], seen[name] = 0, time.time()
                else:
                    failed[name] += 1
            lost = [n for n in self.names if failed[n] >= self.misses]
            if lost:
                self.since = min(seen[n] for n in lost)
                self.lost = lost
                return

    def message(self) -> str:
        """What happened, naming the lost hosts (virtual nodes by name too) and what to do."""
        virtual = nodes.VirtualNodes.load()
        named = [next((f"{n.name} ({n.address})" for n in virtual.nodes if name in (n.name, n.address)), name)
                 if virtual else name for name in self.lost]
        ago = f" for {time.time() - self.since:.0f} s" if self.since else ""
        return (f"lost host {', '.join(named)}: its ssh port {self.port} stopped answering{ago}, so the job was "
                "stopped (its peers would wait for it for ever). Processes still on that host could not be stopped "
                "from here; they end when their ssh connection breaks. Check the machine (`ping HOST`, its console), "
                "then start the job again, without that host if it stays down.")
