"""Learners' servers as Slurm jobs (``labkit workshop up --spawner slurm``): batchspawner's ``SlurmSpawner``,
held to the workshop's rules.

The hub (root) gives the learner the course (:class:`~labkit.workshop.spawner.CourseSpawner`), then submits
the learner's JupyterLab as root's batch job to the servers' partition
(:data:`labkit.workshop.slurmservers.PARTITION`: root-only, so a learner cannot submit jobs there that escape
the time limit of their own jobs' partition; Slurm refuses a root-only partition to ``sbatch --uid`` jobs). On
its node the job becomes the learner at once (``setpriv``: the learner's uid, groups, no capabilities, no new
privileges) and execs the server, with the hub's environment (``--export`` names exactly the variables of
:meth:`get_env`), inside the job's CPUs and memory. As root the job touches nothing of the learner's: it starts
in ``/`` (the learner's home only once it is the learner) and its output goes to a folder of root's
(:attr:`WorkshopSlurmSpawner.req_log_dir`, through root's bounded copier). The server runs in the learner's own
network on its node (:mod:`labkit.workshop.nodeworlds`), listens on a free port there and tells the hub that port;
the proxy reaches it at the learner's address on that node (:attr:`WorkshopSlurmSpawner.server_addresses`,
written by ``up``), and the server reaches the hub at the bridge's address. Stopping a server cancels its job
(``scancel``, run by root).

batchspawner's own API handler sets *any* attribute a server posts on its spawner in the hub, the commands root
runs (``exec_prefix``, ``batch_cancel_cmd``, ...) included: any learner holding their server's token could run
commands as root. :func:`install` replaces it, from the hub's configuration, by :class:`ServerPortHandler`,
which takes the port and nothing else, once per start; the hub refuses to start when batchspawner's handler is
not where :func:`install` looks for it.

batchspawner also copies the learner's own ``user_options`` (the body of ``POST /hub/api/users/NAME/server``, or
the query of a ``/hub/spawn?...`` link) over the job script's variables, and the script runs as root until it
becomes the learner. This spawner takes no options at all (:class:`~labkit.workshop.spawner.CourseSpawner`
turns any form or query into none, and drops any stored or posted ones at start), and :meth:`_get_batch_script`
renders the script from the hub's own values only, whatever it is handed: each value is checked
(:func:`script_values`) and the server's command is quoted for the shell. The job starts the server in a world of
its own (:mod:`labkit.workshop.worlds`: a private ``/tmp``, ``/var/tmp``, ``/dev/shm`` and IPC namespace).
"""

from __future__ import annotations

import json
import math
import os
import pwd
import re
import shlex
import sys
from dataclasses import dataclass

from batchspawner import SlurmSpawner
from batchspawner import api as batch_api
from jupyterhub import apihandlers
from jupyterhub.apihandlers import APIHandler
from tornado import web
from traitlets import Dict, Unicode, default

from labkit.workshop import nodeworlds, readonly, worlds
from labkit.workshop.slurmservers import NAME, PARTITION
from labkit.workshop.spawner import CourseSpawner

SCRIPT = """#!/bin/bash
#SBATCH --job-name=jupyterlab-{username}
#SBATCH --output=/dev/null
#SBATCH --chdir=/
#SBATCH --export={keepvars}
#SBATCH --partition={partition}
#SBATCH --nodes=1
#SBATCH --cpus-per-task={nprocs}
{memory_line}node="$SLURMD_NODENAME"
case "$node" in
  ''|*[!a-z0-9_-]*) echo "labkit: the node's name is not one labkit gives its nodes" | {sink}; exit 1;;
esac
nsenter --net="{netns_dir}/{prefix}$node-{username}" {command} < /dev/null 2>&1 | {sink}
"""
SAFE_PATH = re.compile(r"/[A-Za-z0-9_./+-]{0,1023}")  # an absolute path without spaces, quotes or newlines
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
MEMORY = re.compile(r"[1-9][0-9]{0,8}M")
LOWEST_PORT = 1024


class HandlerMoved(RuntimeError):
    """batchspawner's API handler is not where :func:`install` replaces it: the hub must not start."""


class WorkshopSlurmSpawner(CourseSpawner, SlurmSpawner):
    """batchspawner's ``SlurmSpawner``: root's job that becomes the learner; submitted, queried, cancelled by root."""

    server_addresses = Dict(Dict(Unicode()), help="each node's name, then each account's address on it: where "
                            "the proxy reaches that account's server (nodeworlds.addresses)").tag(config=True)
    req_log_dir = Unicode(help="root's folder for the servers' job output").tag(config=True)
    slurm_conf = Unicode(help="the cluster's slurm.conf, for the hub's sbatch, squeue and scancel").tag(config=True)
    req_uid = Unicode(help="the learner's user id (the server's)")
    req_gid = Unicode(help="the learner's primary group id (the server's)")

    @default("req_uid")
    def _req_uid_default(self) -> str:
        return str(pwd.getpwnam(self.user.name).pw_uid)

    @default("req_gid")
    def _req_gid_default(self) -> str:
        return str(pwd.getpwnam(self.user.name).pw_gid)

    @default("req_nprocs")
    def _req_nprocs_default(self) -> str:
        return str(max(1, math.ceil(self.cpu_limit))) if self.cpu_limit else "1"

    @default("req_memory")
    def _req_memory_default(self) -> str:
        return f"{max(1, int(self.mem_limit) // 2**20)}M" if self.mem_limit else ""

    @default("exec_prefix")
    def _exec_prefix_default(self) -> str:
        return ""  # root runs sbatch, squeue and scancel; the job's script becomes the learner (setpriv)

    @default("batch_submit_cmd")
    def _batch_submit_cmd_default(self) -> str:
        return "sbatch --parsable"

    @default("batch_script")
    def _batch_script_default(self) -> str:
        return SCRIPT

    async def _get_batch_script(self, **subvars) -> str:  # batchspawner's hook; ``subvars`` hold user_options
        """The job script from the hub's own values only: ``subvars`` (which batchspawner updates with the
        learner's ``user_options``) are not read."""
        return script(script_values(self))

    @default("req_partition")
    def _req_partition_default(self) -> str:
        return PARTITION

    @default("req_srun")
    def _req_srun_default(self) -> str:
        return ""  # the script execs the server: scancel's signal reaches it

    async def run_command(self, cmd, input=None, env=None):  # noqa: A002 (batchspawner's signature)
        """batchspawner's command (sbatch, squeue, scancel), run by the hub with the cluster's ``SLURM_CONF``."""
        base = os.environ if env is None else env
        return await super().run_command(cmd, input=input, env={**base, "SLURM_CONF": self.slurm_conf})

    def state_gethost(self) -> str:
        """The address the proxy reaches the server at: the learner's own network on the job's node."""
        node = super().state_gethost()
        if self.user.name not in self.server_addresses.get(node, {}):
            raise RuntimeError(f"{self.user.name}'s server runs on {node!r}, where the workshop made no network "
                               f"for them (nodes: {', '.join(sorted(self.server_addresses))})")
        return self.server_addresses[node][self.user.name]

    async def start(self):
        if not NAME.fullmatch(self.user.name) or not self.req_log_dir:
            raise RuntimeError(f"{self.user.name!r} is not a user name the workshop made, or no folder for the log")
        self.drop_user_options()
        script_values(self)  # refuses before the course is given when a value is not one the hub makes
        await self.give_course()
        return await super().start()


@dataclass(frozen=True)
class ScriptValues:
    """What the job script is made of, each checked (:func:`script_values`)."""

    username: str
    log_dir: str
    keepvars: str
    partition: str
    nprocs: int
    memory: str  # "" or e.g. "3072M"
    uid: int
    gid: int
    home: str
    command: list[str]  # the server's command line
    python: str = sys.executable  # the shared environment's interpreter: root's copier of the server's output
    keep: tuple[str, ...] = ()  # the shared environment, when it lies in a temporary folder (worlds.kept)


def _checked(value: str, pattern: re.Pattern[str], what: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValueError(f"the server's job script was not written: {what} {str(value)[:60]!r} is not one the "
                         "hub makes")
    return value


def script_values(s: WorkshopSlurmSpawner) -> ScriptValues:
    """The job's values from the spawner's own traits (never ``user_options``), each checked; ValueError otherwise."""
    uid, gid = int(_checked(str(s.req_uid), re.compile(r"[1-9][0-9]{0,9}"), "uid")), int(
        _checked(str(s.req_gid), re.compile(r"[1-9][0-9]{0,9}"), "gid"))
    keepvars = [_checked(v, VARIABLE, "variable") for v in str(s.req_keepvars).split(",") if v]
    return ScriptValues(
        username=_checked(s.user.name, NAME, "user name"), log_dir=_checked(s.req_log_dir, SAFE_PATH, "log folder"),
        keepvars=",".join(keepvars) or "NONE", partition=_checked(s.req_partition, NAME, "partition"),
        nprocs=int(_checked(str(s.req_nprocs), re.compile(r"[1-9][0-9]{0,3}"), "CPUs")),
        memory=_checked(s.req_memory, MEMORY, "memory") if s.req_memory else "", uid=uid, gid=gid,
        home=_checked(s.req_homedir, SAFE_PATH, "home"),
        command=[s.batchspawner_singleuser_cmd, *s.cmd, *s.get_args()],
        keep=worlds.kept(readonly.venv(), s.release_dir, s.data_dir),
        python=_checked(sys.executable, SAFE_PATH, "interpreter"))


def script(v: ScriptValues) -> str:
    """The job script: root's on the node until the learner's world (:func:`labkit.workshop.worlds.argv`) drops it.
    The server runs in the learner's network on the job's node (:mod:`labkit.workshop.nodeworlds`); its output goes
    through root's copier into root's folder, bounded (:mod:`labkit.workshop.serverlog`)."""
    world = worlds.World(uid=v.uid, gid=v.gid, home=v.home, keep=v.keep)
    sink = shlex.join([v.python, "-I", "-m", "labkit.workshop.serverlog", f"{v.log_dir}/{v.username}.log"])
    return SCRIPT.format(username=v.username, keepvars=v.keepvars, partition=v.partition, nprocs=v.nprocs,
                         memory_line=f"#SBATCH --mem={v.memory}\n" if v.memory else "", sink=sink,
                         netns_dir=nodeworlds.NETNS_DIR, prefix=nodeworlds.PREFIX,
                         command=shlex.join([*worlds.argv(world), *v.command]))


class ServerPortHandler(APIHandler):
    """``POST /hub/api/batchspawner`` from a starting server: its port, nothing else, set once per start."""

    @web.authenticated
    def post(self) -> None:
        token = self.get_auth_token()
        spawner = next((s for s in self.current_user.spawners.values() if s.api_token == token), None)
        if not isinstance(spawner, WorkshopSlurmSpawner):
            raise web.HTTPError(403, "only a starting server of this workshop may say its port")
        port = check_port(self.get_json_body())
        if spawner.port:
            raise web.HTTPError(409, "the server's port is already set")
        spawner.port = port
        self.set_status(201)
        self.finish(json.dumps({"message": f"port {port} recorded"}))


def check_port(body: object) -> int:
    """The port in ``{"port": N}``; HTTP 400 for anything else (another key, a string, a privileged port)."""
    port = body.get("port") if isinstance(body, dict) and set(body) == {"port"} else None
    if type(port) is not int or not LOWEST_PORT <= port <= 65535:
        raise web.HTTPError(400, f'a server says only {{"port": N}} with N from {LOWEST_PORT} to 65535')
    return port


def install(handlers: list | None = None) -> None:
    """Put :class:`ServerPortHandler` where batchspawner registered its handler (JupyterHub's API handlers)."""
    handlers = apihandlers.default_handlers if handlers is None else handlers
    theirs = [h for h in handlers if h[1] is batch_api.BatchSpawnerAPIHandler]
    if not theirs:
        raise HandlerMoved("batchspawner's API handler is not in JupyterHub's API handlers: this batchspawner "
                           "version registers it elsewhere, and its handler would let a learner's server set the "
                           "commands the hub runs as root. Pin the batchspawner version pyproject.toml names.")
    for handler in theirs:
        handlers.remove(handler)
    handlers.append((theirs[0][0], ServerPortHandler))
