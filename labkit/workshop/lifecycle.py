"""``workshop up``, ``status`` and ``down``: accounts, class folder, data, passwords, hub (and Slurm nodes).

:func:`up` records each thing in the state (:mod:`labkit.workshop.state`) before making it, and on any
failure (or interrupt) removes what it made; :func:`down` removes exactly what the state lists, in
reverse: the hub and its proxy, every process of the workshop's users, their control groups, files in
the temporary folders, users with their homes, groups, the virtual nodes when ``up`` started them, and
the state folder. A second ``down`` finds nothing and does nothing.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from labkit.core import tfconfig
from labkit.course import sources
from labkit.nodes import virtual
from labkit.records import classlog
from labkit.workshop import accounts, homes, hub, hubconfig, limits, passwords
from labkit.workshop.state import State, state_folder

NEEDS_ROOT = ("a workshop needs root: it creates Unix users and groups, runs JupyterHub as root so that each "
              "learner's server runs as that learner, and sets per-learner limits. Run it as root, e.g. "
              "`sudo .venv/bin/labkit workshop up --learners 3`.")


class WorkshopError(RuntimeError):
    """The workshop cannot start or stop; the message says what to do."""


def _slurm(st: State, extra_env: dict[str, str]) -> None:
    """Virtual nodes with Slurm (started unless up already); learners reach their Slurm config by name."""
    cluster = virtual.VirtualNodes.load()
    if cluster is None:
        st.made["nodes"] = True
        st.save()
        cluster = virtual.VirtualNodes(count=2, slots=2, slurm=True).up()
    elif not cluster.slurm:
        raise WorkshopError("virtual nodes without Slurm are up: `labkit nodes down` first, or run without --slurm")
    st.made["nodes_mode"] = cluster.folder.stat().st_mode & 0o777
    st.save()
    cluster.folder.chmod(0o711)  # learners' sbatch reads slurm/slurm.conf and the munge socket below it
    extra_env["SLURM_CONF"] = str(cluster.slurm_conf)


def up(learners: int, port: int = 8000, ip: str = "127.0.0.1", slurm: bool = False, auth: str = "pam",
       cores: float | None = None, memory: str | None = None, folder: str | None = None,
       say: Callable[[str], None] = print) -> tuple[State, dict[str, str]]:
    """Start a workshop for ``learners`` learners; its state and the passwords (to print once)."""
    if os.geteuid() != 0:
        raise WorkshopError(NEEDS_ROOT)
    names = accounts.learner_names(learners)
    source = sources.course_source()
    proxy = hub.find_proxy() or hub.install_proxy(say)
    hub.jupyterhub()
    where = state_folder(folder)
    if State.load(where) is not None:
        raise WorkshopError(f"a workshop is already up (state in {where}): `labkit workshop down` first")
    if where.exists() and any(where.iterdir()):
        raise WorkshopError(f"the state folder {where} is not empty: choose another ($LABKIT_WORKSHOP_STATE)")
    started = time.monotonic()
    st = State(where, names, port=port, ip=ip, auth=auth, slurm=slurm, job_id=uuid.uuid4().hex,
               made={"folder": not where.exists()})
    where.mkdir(parents=True, exist_ok=True)
    where.chmod(0o711)
    st.save()
    try:
        _start(st, source, proxy, cores, memory, say)
    except BaseException:
        down(where)
        raise
    st.phase, st.seconds_up = "up", round(time.monotonic() - started, 2)
    st.save()
    return st, passwords.load(st.passwords)


def _start(st: State, source: Path, proxy: str, cores: float | None, memory: str | None,
           say: Callable[[str], None]) -> None:
    for folder in homes.closed_folders([*homes.shared_paths(source), st.folder]):
        st.made.setdefault("modes", {})[str(folder)] = folder.stat().st_mode & 0o7777
        st.save()
        folder.chmod(folder.stat().st_mode | 0o001)
        st.problems.append(f"{folder} lets others pass now (o+x, no listing) so that learners reach the shared "
                           "environment; `down` restores its mode")
    st.private.mkdir(mode=0o700)
    acc = accounts.Accounts(st.learners, st.instructor)
    accounts.create(acc, st.made, st.save)
    st.made["cgroups"] = list(acc.users)  # the instructor gets a server (and groups) too at login
    instructors = grp.getgrnam(accounts.INSTRUCTOR_GROUP).gr_gid
    st.class_dir.mkdir(mode=0o751)
    os.chown(st.class_dir, 0, instructors)
    st.class_dir.chmod(0o751)
    for name in st.learners:
        info = pwd.getpwnam(name)
        classlog.prepare(st.class_dir, name, info.pw_uid, instructors)
    (st.folder / "data").mkdir(mode=0o755)
    data = homes.share_data(st.data_dir)
    if data is None:
        st.problems.append("no Fashion-MNIST on this machine: learners' scripts will try to download it")
    pw = {n: passwords.generate() for n in acc.users}
    settings = dict(user_password=None, admin_password=None)
    if st.auth == "shared":
        shared = passwords.generate()
        pw = {**{n: shared for n in st.learners}, st.instructor: passwords.generate(32)}
        settings = dict(user_password=shared, admin_password=pw[st.instructor])
    else:
        passwords.set_unix(pw, st.private / "hash.in")
    passwords.save(pw, st.passwords)
    extra_env: dict[str, str] = {}
    if st.slurm:
        _slurm(st, extra_env)
    hub_port, api_port, service_port = tfconfig.free_ports(3)
    hubconfig.write(hubconfig.HubSettings(
        state=st.private, port=st.port, hub_port=hub_port, proxy_api_port=api_port, service_port=service_port,
        learners=st.learners, instructor=st.instructor, course_source=source, class_dir=st.class_dir,
        python=sys.executable, proxy=proxy, ip=st.ip, auth=st.auth, data_dir=data, cores=cores, memory=memory,
        extra_env=extra_env, **settings), st.config)
    procs, problem = limits.make("probe", cores, None) if cores else ([], None)
    if procs:
        limits.remove(["probe"])
    if problem:
        st.problems.append(problem)
    st.hub_pid = hub.start(st.config, st.log, st.job_id)
    st.save()
    hub.wait_ready(st.hub_pid, st.port, st.log)


def down(folder: str | os.PathLike[str] | None = None) -> list[str]:
    """Stop and remove everything the workshop in ``folder`` made; what was removed (empty: nothing was up)."""
    where = state_folder(folder)
    if os.geteuid() != 0 and (where / "state.json").exists():
        raise WorkshopError("labkit workshop down needs root, like labkit workshop up")
    st = State.load(where)
    if st is None:
        return []
    removed = []
    hub.stop(st.hub_pid, st.job_id)
    if st.hub_pid:
        removed.append(f"JupyterHub (pid {st.hub_pid}) and its proxy")
    removed += accounts.remove(st.made, st.save)
    removed += limits.remove(st.made.get("cgroups", []))
    st.made["cgroups"] = []
    if st.made.get("nodes"):
        removed += virtual.down()
        st.made["nodes"] = False
    elif "nodes_mode" in st.made and (cluster := virtual.VirtualNodes.load()) is not None:
        cluster.folder.chmod(st.made["nodes_mode"])
    for folder, mode in st.made.get("modes", {}).items():
        os.chmod(folder, mode)
        removed.append(f"o+x on {folder}")
    if st.made.get("folder", True):
        shutil.rmtree(where, ignore_errors=True)
    else:
        for child in where.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    return removed + [str(where)]


def status(folder: str | os.PathLike[str] | None = None) -> dict:
    """The workshop's state: hub up and answering, each learner's course and running server."""
    where = state_folder(folder)
    st = State.load(where)
    if st is None:
        return {"state": "down", "folder": str(where)}
    answer = hub.api(st.port)
    learners = []
    for name in st.learners:
        home = accounts.Accounts(st.learners, st.instructor).home(name)
        running = bool(accounts.processes_of(accounts.uids_of([name])))
        learners.append({"name": name, "course": (home / homes.COURSE).is_dir(), "processes": running})
    ok = st.phase == "up" and hub.alive(st.hub_pid) and answer is not None
    return {"state": "up" if ok else ("starting" if st.phase == "starting" else "broken"), "folder": str(where),
            "url": st.url, "jupyterhub": (answer or {}).get("version"), "hub_pid": st.hub_pid, "auth": st.auth,
            "instructor": st.instructor, "learners": learners, "class_page": st.url + "services/class/",
            "class_dir": str(st.class_dir), "passwords": str(st.passwords), "slurm": st.slurm,
            "seconds_up": st.seconds_up, "problems": st.problems}
