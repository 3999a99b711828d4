"""``jupyterhub_config.py`` for a workshop, written from :class:`HubSettings` (no secret in the text but
the passwords of the shared-password mode; the file is ``rw-------``, root's).

Authentication, one of two:

* ``pam`` (default): each learner and the instructor log in with their own Unix password, made by
  ``workshop up`` and printed once. Nobody can log in as another learner.
* ``shared``: JupyterHub's ``SharedPasswordAuthenticator`` (5.3+): one workshop password for every
  learner, a separate one (32+ characters) for the instructor. JupyterHub warns that anyone holding the
  shared password can log in as any learner: for short events where that is acceptable.

Either way only the workshop's learners (and the instructor, the hub's only admin) may log in; each
server is a JupyterLab in ``~/course`` started by :class:`labkit.workshop.spawner.WorkshopSpawner`;
the class view is a hub-managed service (``/services/class/``) run as the instructor's Unix user,
open to holders of ``access:services!service=class``, which only the admin role has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from labkit.core import contract

SERVICE = "class"  # the class view's service name: /services/class/
DEFAULT_URL = "/lab/tree/labs/00_start_here.ipynb"


@dataclass
class HubSettings:
    state: Path  # the hub's private folder: database, cookie secret, pid files
    port: int
    hub_port: int
    proxy_api_port: int
    service_port: int
    learners: list[str]
    instructor: str
    course_source: Path
    class_dir: Path
    python: str  # the shared environment's interpreter (runs the class view service)
    proxy: str  # configurable-http-proxy
    ip: str = "127.0.0.1"
    auth: str = "pam"  # or "shared"
    user_password: str | None = None  # shared mode
    admin_password: str | None = None  # shared mode
    data_dir: Path | None = None
    cores: float | None = None
    memory: str | None = None  # e.g. "2G"
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. SLURM_CONF for every learner

    def check(self) -> None:
        if self.auth not in ("pam", "shared"):
            raise ValueError(f"auth is pam or shared, got {self.auth!r}")
        if self.auth == "shared" and (len(self.user_password or "") < 8 or len(self.admin_password or "") < 32):
            raise ValueError("the shared password needs 8+ characters and the instructor's 32+")


def _auth_lines(s: HubSettings) -> list[str]:
    if s.auth == "shared":
        return ['c.JupyterHub.authenticator_class = "shared-password"',
                f"c.SharedPasswordAuthenticator.user_password = {s.user_password!r}",
                f"c.SharedPasswordAuthenticator.admin_password = {s.admin_password!r}"]
    return ['c.JupyterHub.authenticator_class = "pam"',
            "c.PAMAuthenticator.open_sessions = False  # no login session manager needed",
            "c.PAMAuthenticator.check_account = True"]


def config_text(s: HubSettings) -> str:
    """The whole configuration file."""
    s.check()
    spawner = "c.WorkshopSpawner"
    limits = []
    if s.cores:
        limits.append(f"c.Spawner.cpu_limit = {float(s.cores)!r}")
    if s.memory:
        limits.append(f"c.Spawner.mem_limit = {s.memory!r}")
    service = {"name": SERVICE, "url": f"http://127.0.0.1:{s.service_port}", "display": True,
               "command": [s.python, "-m", "labkit.workshop.service"], "user": s.instructor, "cwd": str(s.class_dir),
               "oauth_no_confirm": True, "environment": {contract.CLASS_DIR: str(s.class_dir),
                                                         contract.WORKSHOP_LEARNERS: ",".join(s.learners)}}
    lines = [
        "# Written by `labkit workshop up`; removed by `labkit workshop down`.",
        "c = get_config()  # noqa: F821",
        f"c.JupyterHub.bind_url = 'http://{s.ip}:{s.port}'",
        f"c.JupyterHub.hub_ip = '127.0.0.1'\nc.JupyterHub.hub_port = {s.hub_port}",
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
        "c.JupyterHub.spawner_class = 'labkit.workshop.spawner.WorkshopSpawner'",
        f"{spawner}.course_source = {str(s.course_source)!r}",
        f"{spawner}.class_dir = {str(s.class_dir)!r}",
        f"{spawner}.data_dir = {str(s.data_dir) if s.data_dir else ''!r}",
        "c.Spawner.notebook_dir = '~/course'",
        f"c.Spawner.default_url = {DEFAULT_URL!r}",
        "c.Spawner.start_timeout = 180\nc.Spawner.http_timeout = 180",
        f"c.Spawner.environment = {dict(s.extra_env)!r}",
        *limits,
        f"c.JupyterHub.services = [{service!r}]",
    ]
    return "\n".join(lines) + "\n"


def write(s: HubSettings, path: Path) -> Path:
    """Write the configuration to ``path``, readable by root only (it may hold passwords)."""
    path.touch(mode=0o600, exist_ok=True)
    path.chmod(0o600)
    path.write_text(config_text(s))
    return path
