"""``jupyterhub_config.py`` for a workshop, written from :class:`HubSettings` (no secret in the text but
the passwords of the shared-password mode; the file is ``rw-------``, root's).

Authentication, one of two (the Unix accounts themselves have a locked password and no login shell):

* ``hub`` (default): each learner and the instructor log in with their own password, made by
  ``workshop up`` and printed once, checked by the hub against scrypt hashes in a file only root reads
  (:class:`labkit.workshop.hubauth.WorkshopAuthenticator`). Nobody can log in as another learner.
* ``shared``: JupyterHub's ``SharedPasswordAuthenticator`` (5.3+, throttled too): one workshop password for every
  learner, a separate one (32+ characters) for the instructor. JupyterHub warns that anyone holding the
  shared password can log in as any learner: for short events where that is acceptable.

Either way only the workshop's learners (and the instructor, the hub's only admin) may log in; each
server is a JupyterLab in ``~/course`` started by :class:`labkit.workshop.spawner.WorkshopSpawner`;
the class view is a hub-managed service (``/services/class/``) run as the instructor's Unix user,
open to holders of ``access:services!service=class``, which only the admin role has. JupyterLab's
terminals run ``bash -l`` (:data:`TERMINAL`), whatever the account's shell (``nologin``).
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from labkit.core import contract

SERVICE = "class"  # the class view's service name: /services/class/
QUEUE_SERVICE = "check-queue"  # the class's check queue (labkit.workshop.checkqueue): a socket, no web page
NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
DEFAULT_URL = "/lab/tree/labs/00_start_here.ipynb"
TERMINAL = ["/usr/bin/env", "SHELL=/bin/bash", "/bin/bash", "-l"]  # the account's shell is nologin
AUTHS = ("hub", "shared")
SPAWNERS = {"local": "labkit.workshop.spawner.WorkshopSpawner",  # servers on this machine, in the learners' limits
            "slurm": "labkit.workshop.slurmspawner.WorkshopSlurmSpawner"}  # servers as Slurm jobs on the nodes
# A wildcard DNS name, or localhost (browsers resolve NAME.localhost to this machine: a workshop tried locally)
SUBDOMAIN_HOST = re.compile(r"https?://(localhost|[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+)"
                            r"(:[0-9]{1,5})?")
SHARED_ORIGIN = ("every learner's server is served from the hub's own address (no subdomain host): a page a learner "
                 "serves from their server, opened by the instructor, can act as the instructor on the hub. Do not "
                 "open learners' pages (/user/NAME/...) while logged in as the instructor, or give the hub a wildcard "
                 "name (*.hub.example.org) with HTTPS and a subdomain host (JupyterHub's subdomain_host)")


@dataclass
class HubSettings:
    state: Path  # the hub's private folder: database, cookie secret, pid files
    port: int
    hub_port: int
    proxy_api_port: int
    service_port: int
    learners: list[str]
    instructor: str
    release: Path  # the learners' released course, root's, read-only (labkit.workshop.readonly.publish)
    class_dir: Path
    python: str  # the shared environment's interpreter (runs the class view service)
    proxy: str  # configurable-http-proxy
    ip: str = "127.0.0.1"
    auth: str = "hub"  # or "shared"
    user_password: str | None = None  # shared mode
    admin_password: str | None = None  # shared mode
    data_dir: Path | None = None
    cores: float | None = None
    memory: int | None = None  # bytes (limits.parse_memory of "2G")
    pids: int | None = None  # tasks per learner (pids.max)
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. SLURM_CONF for every learner
    logins: Path | None = None  # hub mode: the password hashes (passwords.save_hashes)
    subdomain_host: str = ""  # e.g. https://hub.example.org: each learner's server at https://NAME.hub.example.org
    spawner: str = "local"  # or "slurm" (SPAWNERS)
    hub_ip: str = "127.0.0.1"  # where servers reach the hub: the nodes' bridge for Slurm jobs
    server_addresses: dict[str, dict[str, str]] = field(default_factory=dict)  # slurm: node -> account -> address
    addresses: dict[str, str] = field(default_factory=dict)  # local: each account's own network (worlds.plan)

    def check(self) -> None:
        if self.subdomain_host:
            check_subdomain_host(self.subdomain_host)
        if self.spawner not in SPAWNERS:
            raise ValueError(f"spawner is one of {', '.join(SPAWNERS)}, got {self.spawner!r}")
        if self.spawner == "slurm" and not (self.server_addresses and self.extra_env.get("SLURM_CONF")):
            raise ValueError("the Slurm spawner needs the servers' addresses on the nodes and their SLURM_CONF")
        on_nodes = [a for per_node in self.server_addresses.values() for a in per_node.items()]
        for address in (self.hub_ip, *(a for _, a in on_nodes), *self.addresses.values()):
            check_ip(address)
        if any(not NAME.fullmatch(n) for n in [*self.addresses, *self.server_addresses, *(n for n, _ in on_nodes)]):
            raise ValueError("an account's name is not a Unix user name")
        if self.auth not in AUTHS:
            raise ValueError(f"auth is hub or shared, got {self.auth!r}")
        if self.auth == "hub" and self.logins is None:
            raise ValueError("the hub's login needs the file of password hashes (logins)")
        check_ip(self.ip)
        for port in (self.port, self.hub_port, self.proxy_api_port, self.service_port):
            if type(port) is not int or not 0 < port < 65536:
                raise ValueError(f"port {port!r} is not a port number")
        if self.cores is not None and (not math.isfinite(self.cores) or self.cores <= 0):
            raise ValueError(f"cores {self.cores!r} is not a number of cores above 0")
        if self.memory is not None and (type(self.memory) is not int or self.memory <= 0):
            raise ValueError(f"memory {self.memory!r} is not a number of bytes above 0")
        if self.auth == "shared" and (len(self.user_password or "") < 8 or len(self.admin_password or "") < 32):
            raise ValueError("the shared password needs 8+ characters and the instructor's 32+")


def check_subdomain_host(url: str) -> str:
    """``url`` when it is ``http(s)://NAME[:PORT]`` (written into a configuration root runs); else ValueError."""
    if not SUBDOMAIN_HOST.fullmatch(url):
        raise ValueError(f"subdomain host {url!r} is not https://NAME[:PORT] with NAME a wildcard DNS name "
                         "(e.g. https://hub.example.org for https://learner07.hub.example.org)")
    return url


def check_ip(ip: str) -> str:
    """``ip`` when it is an IPv4 or IPv6 address (it is written into a configuration root runs); else ValueError."""
    try:
        return str(ipaddress.ip_address(ip))
    except ValueError:
        raise ValueError(f"--ip {ip!r} is not an IP address (e.g. 127.0.0.1, or 0.0.0.0 for every interface)") from None


def _auth_lines(s: HubSettings) -> list[str]:
    if s.auth == "shared":
        return ['c.JupyterHub.authenticator_class = "labkit.workshop.hubauth.SharedAuthenticator"',
                f"c.SharedPasswordAuthenticator.user_password = {s.user_password!r}",
                f"c.SharedPasswordAuthenticator.admin_password = {s.admin_password!r}"]
    return ['c.JupyterHub.authenticator_class = "labkit.workshop.hubauth.WorkshopAuthenticator"',
            f"c.WorkshopAuthenticator.password_file = {str(s.logins)!r}"]


def _isolation_lines(s: HubSettings) -> list[str]:
    """JupyterHub's security model: no configuration from the learner's home, kernels over files in the
    learner's home (IPC, not loopback TCP that every user can reach), and one origin per learner when the
    hub has a wildcard name."""
    args = ["--KernelManager.transport=ipc", f"--LabApp.app_settings_dir={s.release / 'jupyter' / 'lab-settings'}"]
    lines = ["c.Spawner.disable_user_config = True", f"c.Spawner.args = {args!r}"]
    if s.subdomain_host:
        lines.append(f"c.JupyterHub.subdomain_host = {s.subdomain_host!r}")
    return lines


def _slurm_lines(s: HubSettings, spawner: str) -> list[str]:
    """Servers as Slurm jobs: batchspawner's API handler replaced (labkit.workshop.slurmspawner.install), the
    servers' addresses on the nodes for the proxy, and a longer start (a job may wait in the queue)."""
    if s.spawner != "slurm":
        return []
    return ["import labkit.workshop.slurmspawner\nlabkit.workshop.slurmspawner.install()",
            f"{spawner}.server_addresses = {s.server_addresses!r}",
            f"{spawner}.req_log_dir = {str(s.state / 'servers')!r}",
            f"{spawner}.slurm_conf = {s.extra_env.get('SLURM_CONF', '')!r}"]


def _local_lines(s: HubSettings, spawner: str) -> list[str]:
    """Servers on this machine: each in a network of its own (when made), its output in a file of its own."""
    if s.spawner != "local":
        return []
    return [f"{spawner}.addresses = {dict(s.addresses)!r}", f"{spawner}.log_dir = {str(s.state / 'servers')!r}"]


def risks(s: HubSettings) -> list[str]:
    """What this configuration leaves open, said plainly in ``workshop up``'s output."""
    return [] if s.subdomain_host else [SHARED_ORIGIN]


def config_text(s: HubSettings) -> str:
    """The whole configuration file."""
    s.check()
    spawner = "c." + SPAWNERS[s.spawner].rsplit(".", 1)[1]
    limits = []
    if s.cores:
        limits.append(f"c.Spawner.cpu_limit = {float(s.cores)!r}")
    if s.memory:
        limits.append(f"c.Spawner.mem_limit = {int(s.memory)!r}")
    if s.pids and s.spawner == "local":  # Slurm's jobs: the nodes' task cap
        limits.append(f"{spawner}.pids_limit = {int(s.pids)!r}")
    service = {"name": SERVICE, "url": f"http://127.0.0.1:{s.service_port}", "display": True,
               "command": [s.python, "-m", "labkit.workshop.service"], "user": s.instructor, "cwd": str(s.class_dir),
               "oauth_no_confirm": True, "environment": {contract.CLASS_DIR: str(s.class_dir),
                                                         contract.WORKSHOP_LEARNERS: ",".join(s.learners),
                                                         "PYTHONPATH": str(s.release)}}
    services = [service]
    queue = s.extra_env.get(contract.CHECK_QUEUE, "")
    if queue.endswith(".sock"):  # the queue server, as the instructor, at the socket every learner's checks use
        services.append({"name": QUEUE_SERVICE, "user": s.instructor, "cwd": str(Path(queue).parent),
                         "command": [s.python, "-m", "labkit.workshop.checkqueue", "--socket", queue,
                                     "--slots", str(int(s.extra_env.get(contract.CHECK_SLOTS) or 1))],
                         "environment": {"PYTHONPATH": str(s.release)}})
    lines = [
        "# Written by `labkit workshop up`; removed by `labkit workshop down`.",
        "c = get_config()  # noqa: F821",
        f"c.JupyterHub.bind_url = 'http://{s.ip}:{s.port}'",
        f"c.JupyterHub.hub_ip = {s.hub_ip!r}\nc.JupyterHub.hub_port = {s.hub_port}",
        f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{s.proxy_api_port}'",
        f"c.ConfigurableHTTPProxy.command = [{s.proxy!r}]",
        f"c.ConfigurableHTTPProxy.pid_file = {str(s.state / 'proxy.pid')!r}",
        f"c.JupyterHub.db_url = {'sqlite:///' + str(s.state / 'jupyterhub.sqlite')!r}",
        f"c.JupyterHub.cookie_secret_file = {str(s.state / 'jupyterhub_cookie_secret')!r}",
        f"c.JupyterHub.pid_file = {str(s.state / 'jupyterhub.pid')!r}",
        "c.JupyterHub.cleanup_servers = True  # the learners' servers stop with the hub",
        *_auth_lines(s),
        f"c.Authenticator.allowed_users = {set(s.learners)!r}",
        f"c.Authenticator.admin_users = {{{s.instructor!r}}}",
        f"c.JupyterHub.spawner_class = {SPAWNERS[s.spawner]!r}",
        *_slurm_lines(s, spawner),
        *_local_lines(s, spawner),
        f"{spawner}.release_dir = {str(s.release)!r}",
        f"{spawner}.class_dir = {str(s.class_dir)!r}",
        f"{spawner}.data_dir = {str(s.data_dir) if s.data_dir else ''!r}",
        "c.Spawner.notebook_dir = '~/course'",
        f"c.Spawner.default_url = {DEFAULT_URL!r}",
        "c.Spawner.start_timeout = 180\nc.Spawner.http_timeout = 180",
        f"c.Spawner.environment = {dict(s.extra_env)!r}",
        *_isolation_lines(s),
        f"c.Spawner.args.append({'--ServerApp.terminado_settings=' + json.dumps({'shell_command': TERMINAL})!r})",
        *limits,
        f"c.JupyterHub.services = {services!r}",
    ]
    return "\n".join(lines) + "\n"


def write(s: HubSettings, path: Path) -> Path:
    """Write the configuration to ``path``, readable by root only (it may hold passwords)."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(config_text(s))
    return path
