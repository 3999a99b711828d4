"""ssh for virtual nodes: keys made for the cluster, one sshd per node, and the client files launchers use.

Nothing under ``/etc/ssh`` or ``~/.ssh`` is read or written: the client key, the
authorised key, each node's host key and the ``known_hosts`` written from those host
keys (so parallel ``ssh`` calls never race to accept a key) all live in the state folder.
``ssh -F STATE/ssh_config node1`` (or the node's address) logs in.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

PRIVSEP = Path("/run/sshd")  # Debian's sshd refuses to start without its privilege separation folder
_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def sshd_path() -> str:
    return shutil.which("sshd", path=_PATH) or "/usr/sbin/sshd"


def keygen(path: Path) -> None:
    """An ed25519 key pair at ``path`` and ``path``.pub, without a passphrase."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "labkit-nodes", "-f", str(path)],
                   check=True, capture_output=True, timeout=30, stdin=subprocess.DEVNULL)


def sshd_config(folder: Path, address: str, authorized_keys: Path) -> Path:
    """The config of a node's sshd: its address only, the cluster's authorised key, no PAM, no DNS."""
    conf = folder / "sshd_config"
    conf.write_text("\n".join([
        "# sshd of a labkit virtual node (labkit nodes up)",
        f"ListenAddress {address}",
        "Port 22",
        f"HostKey {folder / 'host_key'}",
        f"PidFile {folder / 'sshd.pid'}",
        f"AuthorizedKeysFile {authorized_keys}",
        "PermitRootLogin prohibit-password",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "StrictModes no",  # the state folder may belong to another user than the one logging in
        "UseDNS no",
        "PrintMotd no",
        "PrintLastLog no",
        "X11Forwarding no",
        "MaxStartups 100:30:200",  # mpirun and preflights open many connections at once
        "MaxSessions 100",
        "",
    ]))
    return conf


def client_files(folder: Path, nodes: Sequence[tuple[str, str]], key: Path) -> tuple[Path, Path]:
    """``ssh_config`` (a ``Host`` entry per node, by name and by address) and ``known_hosts`` for the nodes.

    ``nodes`` is ``(name, address)`` pairs; each node's host key is ``folder/NAME/host_key.pub``.
    """
    known = folder / "known_hosts"
    known.write_text("".join(
        f"{name},{addr} {' '.join((folder / name / 'host_key.pub').read_text().split()[:2])}\n"
        for name, addr in nodes))
    entries = ["# ssh client config of labkit's virtual nodes: ssh -F THIS_FILE node1", ""]
    for name, addr in nodes:
        entries += [f"Host {name} {addr}", f"  HostName {addr}", ""]
    entries += [
        "Host *",
        f"  User {getpass.getuser()}",
        f"  IdentityFile {key}",
        "  IdentitiesOnly yes",
        "  IdentityAgent none",
        f"  UserKnownHostsFile {known}",
        "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes",
        "  PasswordAuthentication no",
        "  BatchMode yes",
        "  ConnectTimeout 10",
        "  LogLevel ERROR",
        "",
    ]
    config = folder / "ssh_config"
    config.write_text("\n".join(entries))
    return config, known


def wrapper(path: Path, config: Path) -> Path:
    """An ``ssh`` at ``path`` that is ssh with ``-F config``: for launchers that cannot be given ssh options."""
    path.parent.mkdir(exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec {shutil.which("ssh") or "ssh"} -F {config} "$@"\n')
    path.chmod(0o755)
    return path


def answers(address: str, port: int = 22) -> bool:
    """True when an SSH server greets on ``address:port`` (its banner, not just an open port)."""
    try:
        with socket.create_connection((address, port), timeout=1) as s:
            return s.recv(64).startswith(b"SSH-")
    except OSError:
        return False
