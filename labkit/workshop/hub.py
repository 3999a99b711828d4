"""The hub process: find or install the proxy, start JupyterHub so it outlives the command, wait, stop.

The hub runs as root from the shared environment (``jupyterhub -f STATE/jupyterhub_config.py``) in a
session of its own, marked with the workshop's job id (:mod:`labkit.core.proc`): the proxy it starts
carries the mark too, so :func:`stop` finds both. The hub is signalled only while its pid still has the
start time and command line recorded at start (:class:`~labkit.workshop.started.Started`): after a reboot
or once the pid is reused, the process with that pid is left alone. The learners' servers and the class view
service run as the workshop's users and are stopped by user (:func:`labkit.workshop.leftovers.stop_processes`).
configurable-http-proxy comes from npm (:data:`PROXY_PACKAGE`), installed into labkit's cache once.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from labkit.core import contract, proc
from labkit.nodes import net
from labkit.workshop.started import Started

PROXY = "configurable-http-proxy"
PROXY_PACKAGE = "configurable-http-proxy@5.3.0"  # works with JupyterHub 6.1 (pinned with it in the workshop extra)


class HubError(RuntimeError):
    """The hub cannot start or stop; the message says why (with its log's end)."""


def cache_dir() -> Path:
    return Path(os.environ.get(contract.CACHE) or Path.home() / ".cache" / "labkit")


def find_proxy() -> str | None:
    """configurable-http-proxy on PATH or in labkit's cache, or None."""
    cached = cache_dir() / "npm" / "node_modules" / ".bin" / PROXY
    return shutil.which(PROXY) or (str(cached) if cached.exists() else None)


def install_proxy(say=print) -> str:
    """Install configurable-http-proxy from npm into labkit's cache; its path."""
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise HubError(f"{PROXY} is missing and npm is not here to install it: `apt-get install nodejs npm`, "
                       f"then `npm install -g {PROXY_PACKAGE}`")
    prefix = cache_dir() / "npm"
    prefix.mkdir(parents=True, exist_ok=True)
    say(f"installing {PROXY_PACKAGE} from npm into {prefix} (once)")
    out: list[bytes] = []
    with proc.Job() as job:
        code = job.spawn([npm, "install", "--no-audit", "--no-fund", "--prefix", str(prefix), PROXY_PACKAGE],
                         on_output=out.append).wait(300)
    found = find_proxy()
    if code != 0 or found is None:
        tail = b"".join(out).decode(errors="replace")[-800:]
        raise HubError(f"npm could not install {PROXY_PACKAGE} (is the npm registry reachable?):\n{tail}")
    return found


def jupyterhub() -> str:
    path = Path(sys.executable).parent / "jupyterhub"
    if not path.exists():
        pip = Path(sys.executable).parent / "pip"
        raise HubError(f"JupyterHub is not installed in this environment: `{pip} install -e '.[workshop]'`")
    return str(path)


def start(config: Path, log: Path, job_id: str) -> Started:
    """Start the hub in its own session, marked ``job_id``; its pid, start time and command line."""
    env = proc.Job(job_id).env()
    p = net.daemon([jupyterhub(), "-f", str(config)], log, env)
    return Started.of(p.pid)


def api(port: int, path: str = "", timeout: float = 2.0) -> dict | None:
    """The hub's public API answer (``/hub/api/``: its version), or None."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/hub/api/{path}", timeout=timeout) as r:
            return json.loads(r.read())
    except (OSError, ValueError, urllib.error.URLError):
        return None


def alive(started: Started | None) -> bool:
    """True while the recorded hub runs (the same pid, start time and command line)."""
    return started is not None and started.alive()


def tail(log: Path, chars: int = 2000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else ""


def wait_ready(started: Started, port: int, log: Path, timeout: float = 90) -> float:
    """Seconds until the hub answers on ``port``; :class:`HubError` with the log's end if it ends or times out."""
    start_time = time.monotonic()
    while api(port) is None:
        if not alive(started):
            raise HubError(f"JupyterHub exited while starting:\n{tail(log)}")
        if time.monotonic() - start_time > timeout:
            raise HubError(f"JupyterHub did not answer on port {port} within {timeout:g} s:\n{tail(log)}")
        time.sleep(0.2)
    return time.monotonic() - start_time


def stop(started: Started | None, job_id: str, grace: float = 30) -> None:
    """SIGTERM the hub (it stops the learners' servers and its proxy), then end whatever carries the mark."""
    if started is not None and started.signal(signal.SIGTERM):
        proc.wait_until(lambda: not alive(started), grace)
        try:
            os.waitpid(started.pid, os.WNOHANG)  # our child when started by this process (a test); else not ours
        except ChildProcessError:
            pass
    if job_id:
        proc.stop_marked(job_id)
