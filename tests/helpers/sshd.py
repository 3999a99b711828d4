"""A throwaway OpenSSH server on 127.0.0.1 for tests: keys, configs and the daemon all live in one directory."""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ALIAS = "labkit-loopback"
SBIN = os.pathsep.join(["/usr/sbin", "/usr/local/sbin", os.environ.get("PATH", "")])


class Unavailable(RuntimeError):
    """No loopback sshd can run here; the message says why."""


@dataclass(frozen=True)
class Loopback:
    """A running loopback sshd and ssh client configs for it."""

    port: int
    config: Path  # client config (``ssh -F``) whose ``ALIAS`` logs in with an authorised key
    unauthorised_config: Path  # same host, a key the server does not know


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keygen(path: Path) -> None:
    cmd = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        raise Unavailable(f"ssh-keygen failed: {e}") from e


def _client_config(d: Path, name: str, port: int, key: Path) -> Path:
    cfg = d / name
    cfg.write_text(
        f"Host {ALIAS}\n  HostName 127.0.0.1\n  Port {port}\n  User {getpass.getuser()}\n"
        f"  IdentityFile {key}\n  IdentitiesOnly yes\n  IdentityAgent none\n"
        f"  UserKnownHostsFile {d / 'known_hosts'}\n  StrictHostKeyChecking accept-new\n"
        "  PasswordAuthentication no\n  LogLevel ERROR\n"
    )
    return cfg


def _wait_for_port(proc: subprocess.Popen[bytes], port: int, log: Path, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Unavailable(f"sshd exited with code {proc.returncode}: {log.read_text().strip()[-500:]}")
        try:  # the SSH banner, so that another program on the port is not taken for our daemon
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                if s.recv(64).startswith(b"SSH-"):
                    return
        except OSError:
            pass
        time.sleep(0.05)
    raise Unavailable(f"sshd did not answer on port {port} within {seconds:g} s: {log.read_text().strip()[-500:]}")


@contextmanager
def loopback_sshd(d: Path) -> Iterator[Loopback]:
    """Start sshd on a free port of 127.0.0.1 with keys made in ``d``; always stop it on exit."""
    sshd = shutil.which("sshd", path=SBIN)
    missing = [
        n
        for n, p in (("sshd", sshd), ("ssh", shutil.which("ssh")), ("ssh-keygen", shutil.which("ssh-keygen")))
        if p is None
    ]
    if missing:
        raise Unavailable(f"{', '.join(missing)} not installed (Debian: openssh-server, openssh-client)")
    try:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation directory
    except OSError as e:
        raise Unavailable(f"cannot create /run/sshd: {e}") from e
    for name in ("host_key", "client_key", "stranger_key"):
        _keygen(d / name)
    (d / "authorized_keys").write_text((d / "client_key.pub").read_text())
    port = _free_port()
    config = d / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d / 'host_key'}\nPidFile {d / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {d / 'authorized_keys'}\nStrictModes no\nUsePAM no\nPermitRootLogin yes\n"
        "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
    )
    log = d / "sshd.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(  # own process group: stopping it also ends any session it forked
            [str(sshd), "-D", "-e", "-f", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_for_port(proc, port, log)
        yield Loopback(
            port,
            _client_config(d, "ssh_config", port, d / "client_key"),
            _client_config(d, "ssh_config_stranger", port, d / "stranger_key"),
        )
    finally:
        _stop(proc)


def _busy(pgid: int) -> bool:
    """True while a process other than the daemon itself (a session) is alive in its process group."""
    import psutil

    for p in psutil.process_iter(["status"]):
        try:
            if p.pid != pgid and p.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(p.pid) == pgid:
                return True
        except (psutil.Error, OSError):
            continue
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Let finished sessions exit (killed ones linger as zombies of init), then end the daemon's process group."""
    deadline = time.monotonic() + 2
    while proc.poll() is None and time.monotonic() < deadline and _busy(proc.pid):
        time.sleep(0.05)
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
