"""Slurm's accounting for a confined cluster: per-user caps on running jobs, nodes and CPUs.

Slurm holds a user to a number of running jobs, nodes or CPUs only through a QOS, and a QOS lives in its
accounting database: ``slurmdbd`` with MariaDB. A confined cluster (a workshop's, whose users are strangers)
therefore starts both here, next to its controller and private to root:

- MariaDB with its data in ``STATE/slurm/db`` and its socket in a folder only root opens (``rwx------``), no TCP
  port (``--skip-networking``); root reaches it through the socket;
- ``slurmdbd`` (on every address of this machine: Slurm 22.05 listens there whatever ``DbdAddr`` says),
  authenticating its clients with the cluster's munge key, as slurmctld does;
- slurm.conf with ``AccountingStorageEnforce=associations,limits,qos,safe``: a user Slurm has no association for
  cannot submit, and a user's QOS limits hold.

:func:`start` registers the cluster (Slurm then gives root an association of its own). Users are added with the
QOS :data:`QOS` by :func:`add_users`, which a workshop calls for its learners (``labkit.workshop.slurmlimits``).
The command builders return argument lists and read no state.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

CLUSTER = "labkit-nodes"  # slurm.conf's ClusterName
ACCOUNT = "labkit-learners"
QOS = "labkit-learner"
NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")  # a Unix user's name: written into sacctmgr's arguments
ENFORCE = "associations,limits,qos,safe"
DAEMONS = ("mariadb-install-db", "mariadbd", "slurmdbd", "sacctmgr")


class AccountingError(RuntimeError):
    """Slurm's accounting could not be started or changed; the message has the command's output."""


@dataclass(frozen=True)
class Caps:
    """What each user with the QOS may hold at once; None is no cap."""

    running_jobs: int | None = None
    queued_jobs: int | None = None  # running and pending together
    nodes: int | None = None
    cpus: int | None = None

    def qos_fields(self) -> list[str]:
        """The QOS fields that set these caps (``-1`` clears one)."""
        tres = [f"{k}={v}" for k, v in (("node", self.nodes), ("cpu", self.cpus)) if v is not None]
        for value in (self.running_jobs, self.queued_jobs, self.nodes, self.cpus):
            if value is not None and (type(value) is not int or not 1 <= value <= 100_000):
                raise AccountingError(f"a per-user cap of {value!r} is not a whole number from 1 to 100000")
        return [f"MaxJobsPerUser={self.running_jobs if self.running_jobs is not None else -1}",
                f"MaxSubmitJobsPerUser={self.queued_jobs if self.queued_jobs is not None else -1}",
                f"MaxTRESPerUser={','.join(tres) if tres else 'node=-1,cpu=-1'}"]


def find(name: str) -> str | None:
    return shutil.which(name, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))


def missing() -> str | None:
    """Why accounting cannot start here (a tool not installed), or None."""
    absent = [d for d in DAEMONS if not find(d)]
    if absent:
        return (f"{', '.join(absent)} not found: a confined Slurm cluster holds each user to a number of jobs "
                f"through Slurm's accounting (`apt-get install slurmdbd mariadb-server`)")
    return None


# -- what is written and run (pure) ---------------------------------------------------------------
def conf_lines(port: int, munge_socket: Path) -> list[str]:
    """slurm.conf's accounting settings for a confined cluster whose slurmdbd listens on ``port``
    (``AccountingStoragePass`` is, with slurmdbd, the munge socket its clients use)."""
    return ["AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=localhost",
            f"AccountingStoragePort={int(port)}", f"AccountingStoragePass={munge_socket}",
            f"AccountingStorageEnforce={ENFORCE}"]


def dbd_conf(folder: Path, port: int, munge_socket: Path) -> str:
    """``slurmdbd.conf`` (next to slurm.conf, as slurmdbd looks for it; root's, ``rw-------``)."""
    return "\n".join([
        "# Written by labkit: the accounting of a confined Slurm cluster",
        "AuthType=auth/munge", f"AuthInfo=socket={munge_socket}",
        "DbdHost=localhost", "DbdAddr=127.0.0.1", f"DbdPort={int(port)}",
        "SlurmUser=root", f"LogFile={folder / 'slurmdbd.log'}", f"PidFile={folder / 'db' / 'slurmdbd.pid'}",
        "StorageType=accounting_storage/mysql", "StorageHost=localhost", "StorageUser=root",
        "StorageLoc=slurm_acct", "",
    ])


def install_db_argv(folder: Path) -> list[str]:
    """The command that makes the database's first files in ``folder/db/data``."""
    return [find("mariadb-install-db") or "mariadb-install-db", "--no-defaults", f"--datadir={folder / 'db' / 'data'}",
            "--user=root", "--auth-root-authentication-method=socket", "--skip-test-db"]


def mariadb_argv(folder: Path) -> list[str]:
    """MariaDB for one cluster: no TCP port, its socket in root's ``folder/db/run``, a small buffer pool."""
    db = folder / "db"
    return [find("mariadbd") or "mariadbd", "--no-defaults", f"--datadir={db / 'data'}",
            f"--socket={db_socket(folder)}", "--skip-networking", "--user=root",
            f"--pid-file={db / 'run' / 'mariadbd.pid'}", f"--log-error={folder / 'mariadb.log'}",
            "--innodb-buffer-pool-size=32M", "--innodb-lock-wait-timeout=900"]


def db_socket(folder: Path) -> Path:
    return folder / "db" / "run" / "mariadb.sock"


def sacctmgr_argv(*words: str) -> list[str]:
    """``sacctmgr`` without questions (``-i``) and without a header (``-n -P``), for ``words``."""
    return ["sacctmgr", "-i", "-n", "-P", *words]


def register_commands() -> list[list[str]]:
    """Register the cluster, the learners' account and their QOS (no caps until :func:`set_caps`)."""
    return [sacctmgr_argv("add", "cluster", CLUSTER),
            sacctmgr_argv("add", "qos", QOS),
            sacctmgr_argv("add", "account", ACCOUNT, f"cluster={CLUSTER}", "description=labkit learners",
                          "organization=labkit")]


def caps_command(caps: Caps) -> list[str]:
    return sacctmgr_argv("modify", "qos", "where", f"name={QOS}", "set", *caps.qos_fields())


def users_command(verb: str, names: Sequence[str], capped: bool = True) -> list[str]:
    """``add`` (in the learners' account; with their QOS as the only one when ``capped``) or ``delete`` users."""
    bad = [n for n in names if not NAME.fullmatch(n)]
    if bad or not names:
        raise AccountingError(f"user names {bad or list(names)!r} are not Unix names labkit gives its accounts")
    if verb == "delete":
        return sacctmgr_argv("delete", "user", "where", f"name={','.join(names)}", f"cluster={CLUSTER}")
    qos = [f"qos={QOS}", f"defaultqos={QOS}"] if capped else []
    return sacctmgr_argv("add", "user", ",".join(names), f"account={ACCOUNT}", f"cluster={CLUSTER}", *qos)


# -- running them ------------------------------------------------------------------------------
def run(conf: Path, argv: list[str], timeout: float = 30) -> str:
    """Run an accounting command against the cluster of slurm.conf ``conf``; "Nothing new added" is not an error."""
    env = {**os.environ, "SLURM_CONF": str(conf)}
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise AccountingError(f"{' '.join(argv[:4])}: {e}") from e
    said = (out.stdout + out.stderr).strip()
    if out.returncode != 0 and "Nothing new added" not in said and "Nothing deleted" not in said:
        raise AccountingError(f"{' '.join(argv)} failed: {said[-500:]}")
    return said


def prepare(folder: Path, port: int, munge_socket: Path) -> None:
    """Make the database's first files and slurmdbd's config in ``folder`` (slurm.conf's), both root's alone."""
    problem = missing()
    if problem:
        raise AccountingError(problem)
    (folder / "db" / "run").mkdir(mode=0o700, parents=True)
    (folder / "db").chmod(0o700)
    try:
        made = subprocess.run(install_db_argv(folder), capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise AccountingError(f"the accounting database could not be made: {e}") from e
    if made.returncode != 0:
        raise AccountingError(f"the accounting database could not be made: {(made.stdout + made.stderr)[-800:]}")
    conf = folder / "slurmdbd.conf"
    conf.touch(mode=0o600)
    conf.write_text(dbd_conf(folder, port, munge_socket))


def slurmdbd_argv() -> list[str]:
    """slurmdbd in the foreground; it reads ``slurmdbd.conf`` next to ``$SLURM_CONF`` and the database's socket
    from ``MYSQL_UNIX_PORT`` (:func:`slurmdbd_env`)."""
    return [find("slurmdbd") or "slurmdbd", "-D"]


def slurmdbd_env(folder: Path) -> dict[str, str]:
    return {"MYSQL_UNIX_PORT": str(db_socket(folder))}


def answers(port: int) -> bool:
    """True once slurmdbd takes connections on ``127.0.0.1:port``."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def register(conf: Path) -> None:
    """Register the cluster, the learners' account and their QOS (:func:`register_commands`)."""
    for argv in register_commands():
        run(conf, argv)


def add_users(conf: Path, names: Sequence[str], caps: Caps) -> None:
    """Give ``names`` the learners' QOS with ``caps`` (Slurm then holds each of them to it)."""
    run(conf, caps_command(caps))
    run(conf, users_command("add", names))


def delete_users(conf: Path, names: Sequence[str]) -> None:
    run(conf, users_command("delete", names))
