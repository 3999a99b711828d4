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
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from labkit.core import contract, slots, tfconfig
from labkit.course import sources
from labkit.nodes import net, virtual
from labkit.nodes import slurm as nodes_slurm
from labkit.records import classlog
from labkit.workshop import (
    accounts,
    disks,
    homes,
    hub,
    hubconfig,
    leftovers,
    limits,
    nodeworlds,
    onnodes,
    passwords,
    readonly,
    reveal,
    scopes,
    slurmlimits,
    worlds,
)
from labkit.workshop.state import State, WorkshopError, state_folder

NEEDS_ROOT = ("a workshop needs root: it creates Unix users and groups, runs JupyterHub as root so that each "
              "learner's server runs as that learner, and sets per-learner limits. Run it as root, e.g. "
              "`sudo .venv/bin/labkit workshop up --learners 3`.")


def ask_limits(cores: float | None, memory: str | None, pids: int | None, no_limits: bool) -> limits.Limits:
    """The per-learner limits asked for, checked (:class:`WorkshopError` names a bad one)."""
    try:
        asked = limits.Limits(limits.check_cores(cores) if cores is not None else None,
                              limits.parse_memory(memory) if memory is not None else None,
                              limits.check_pids(pids) if pids is not None else None)
    except limits.LimitError as e:
        raise WorkshopError(str(e)) from e
    if no_limits and (asked.cores or asked.memory):
        raise WorkshopError("--no-limits and --cores/--memory: choose one")
    return limits.Limits() if no_limits else asked


def enforceable(asked: limits.Limits, no_limits: bool) -> str | None:
    """None when the limits hold here (each probed); else :class:`WorkshopError`, or the note for --no-limits."""
    if no_limits:
        return "learners run without core, memory or process limits (--no-limits)"
    problem = (scopes.probe if scopes.available() else limits.probe)(asked)  # systemd's scopes where it is PID 1
    if problem:
        raise WorkshopError(f"the limits per learner ({asked.describe()}) cannot be enforced on this machine: "
                            f"{problem}. Run with --no-limits to hold the workshop without them (a learner can "
                            "then take every core and all memory, or the machine with a fork bomb); on a systemd "
                            "host see docs/workshop.md")
    return None


@dataclass
class Plan:
    """What ``workshop up`` is asked for (its command-line options)."""

    learners: int
    port: int = 8000
    ip: str = "127.0.0.1"
    slurm: bool = False  # learners' jobs go to Slurm on the virtual nodes
    spawner: str = "local"  # "slurm": each learner's server is a Slurm job there too (hubconfig.SPAWNERS)
    auth: str = "hub"
    cores: float | None = None
    memory: str | None = None  # e.g. "2G"
    pids: int | None = limits.DEFAULT_PIDS
    no_limits: bool = False
    job_minutes: int = slurmlimits.DEFAULT_MINUTES
    jobs_per_learner: int = slurmlimits.DEFAULT_RUNNING  # running at once; Slurm's accounting holds them
    nodes_per_learner: int = slurmlimits.DEFAULT_NODES
    subdomain_host: str = ""
    folder: str | None = None  # the state folder ($LABKIT_WORKSHOP_STATE)
    disk: str | None = disks.DEFAULT  # each home's size (a file system of its own); None: homes share the disk


def up(plan: Plan, say: Callable[[str], None] = print) -> tuple[State, dict[str, str]]:
    """Start a workshop for ``plan.learners`` learners; its state and the passwords (to print once: only their
    hashes are kept). Refuses when a limit asked for cannot be enforced here, unless ``no_limits``.
    ``spawner="slurm"`` runs each learner's server as a Slurm job on the virtual nodes (their jobs go there too)."""
    learners, port, ip, spawner, folder = plan.learners, plan.port, plan.ip, plan.spawner, plan.folder
    if os.geteuid() != 0:
        raise WorkshopError(NEEDS_ROOT)
    names = accounts.learner_names(learners)
    try:
        hubconfig.check_ip(ip)
    except ValueError as e:
        raise WorkshopError(str(e)) from e
    if spawner not in hubconfig.SPAWNERS:
        raise WorkshopError(f"--spawner is one of {', '.join(hubconfig.SPAWNERS)}, got {spawner!r}")
    slurm = plan.slurm or spawner == "slurm"
    asked = ask_limits(plan.cores, plan.memory, plan.pids, plan.no_limits)
    if spawner == "slurm":
        onnodes.fits_on_nodes(asked, onnodes.node_count(len(names), spawner))
    note = enforceable(asked, plan.no_limits)
    if plan.disk:
        try:
            disks.check_size(plan.disk)
        except disks.DiskError as e:
            raise WorkshopError(str(e)) from e
        if disks.missing():
            raise WorkshopError(f"each learner's home cannot get a disk of its own here: {disks.missing()}. Run with "
                                "--no-disk-limit to hold the workshop with homes on the machine's disk (a learner "
                                "can then fill it for everyone)")
    source = sources.course_source()
    proxy = hub.find_proxy() or hub.install_proxy(say)
    hub.jupyterhub()
    where = state_folder(folder)
    if any(where == Path(tmp) or Path(tmp) in where.parents for tmp in worlds.TMP_DIRS):
        raise WorkshopError(f"the state folder {where} is in a temporary folder, which each learner's server sees as "
                            "a private one of its own (the check queue would be out of their reach): choose "
                            "another ($LABKIT_WORKSHOP_STATE), e.g. /var/lib/labkit-workshop")
    if State.load(where) is not None:
        raise WorkshopError(f"a workshop is already up (state in {where}): `labkit workshop down` first")
    if where.exists() and any(where.iterdir()):
        raise WorkshopError(f"the state folder {where} is not empty: choose another ($LABKIT_WORKSHOP_STATE)")
    started = time.monotonic()
    st = State(where, names, port=port, ip=ip, auth=plan.auth, slurm=slurm, spawner=spawner, job_id=uuid.uuid4().hex,
               made={"folder": not where.exists()})
    where.mkdir(parents=True, exist_ok=True)
    where.chmod(0o711)
    if note:
        st.problems.append(note)
    if not plan.disk:
        st.problems.append("homes share the machine's disk (--no-disk-limit): a learner can fill it for everyone")
    st.save()
    try:
        pw = _start(st, plan, source, proxy, asked, say)
    except BaseException:
        down(where)
        raise
    st.phase, st.seconds_up = "up", round(time.monotonic() - started, 2)
    st.save()
    return st, pw


def _open_exactly(st: State, changes: list[readonly.ModeChange]) -> None:
    """Apply the mode changes (each old mode recorded first, for `down`) and say what they open."""
    for change in changes:
        st.made.setdefault("modes", {})[str(change.path)] = change.path.lstat().st_mode & 0o7777
        st.save()
        readonly.set_mode(change.path, change.mode)
    opened = [str(c.path) for c in changes if c.mode & 0o001 and c.path.is_dir()]
    if opened:
        st.problems.append(f"learners pass through {', '.join(opened)} to the shared environment (o+x, no listing); "
                           f"{len(changes) - len(opened)} other entries closed to them; `down` restores every mode")


def check_queue(folder: Path, owner: str, cores: int | None = None) -> dict[str, str]:
    """The class's check queue: the folder of its server's socket, made ``owner``'s (the instructor's, who runs
    the server as a hub service: :mod:`labkit.workshop.checkqueue`), and the variables that make every
    learner's checks and assessments ask that server for a slot. Nothing in the folder is writable by a learner.
    One slot per two cores: a check's 2 ranks of 1 thread then have their cores to themselves. The queue is
    cooperative (a learner who unsets the variables runs at once); what a learner's processes may use is bounded
    by their limits, not by the queue."""
    info = pwd.getpwnam(owner)
    folder.mkdir(mode=0o755)
    os.chown(folder, info.pw_uid, info.pw_gid)
    folder.chmod(0o755)  # the server's alone to write; every learner passes through to the socket (mode 0666)
    n = max(1, (cores or os.cpu_count() or 2) // 2)
    return {slots.SLOTS_VAR: str(n), slots.QUEUE_VAR: str(folder / "checks.sock")}


def _start(st: State, plan: Plan, source: Path, proxy: str, asked: limits.Limits,
           say: Callable[[str], None]) -> dict[str, str]:
    subdomain_host = plan.subdomain_host
    jobs = slurmlimits.JobLimits(plan.job_minutes, plan.jobs_per_learner, plan.nodes_per_learner)
    _open_exactly(st, readonly.plan_access(source, [*readonly.env_paths(), st.folder]))
    st.private.mkdir(mode=0o700)
    if st.spawner == "slurm":
        (st.private / "servers").mkdir(mode=0o700)  # the servers' job output, written by root's jobs
    acc = accounts.Accounts(st.learners, st.instructor)
    accounts.create(acc, st.made, st.save, record=st.uid_file)  # uids no workshop handed out before
    if plan.disk:
        for name in acc.users:  # each home a file system of its own, before the learner has touched it
            st.made.setdefault("disks", []).append(name)
            st.save()
            disks.make(st.folder / "disks", name, acc.home(name), plan.disk)
    st.made["cgroups"] = list(acc.users)  # the instructor gets a server (and groups) too at login
    instructors = grp.getgrnam(accounts.INSTRUCTOR_GROUP).gr_gid
    st.class_dir.mkdir(mode=0o751)
    os.chown(st.class_dir, 0, instructors)
    st.class_dir.chmod(0o751)
    for name in st.learners:
        info = pwd.getpwnam(name)
        mine = classlog.prepare(st.class_dir, name, info.pw_uid, instructors)
        if plan.disk:  # the learner appends to it: a disk of its own, so that a flood fills nobody else's room
            st.made.setdefault("disks", []).append(disks.RECORDS + name)
            st.save()
            disks.make_records(st.folder / "disks", name, mine, (info.pw_uid, instructors))
    (st.folder / "data").mkdir(mode=0o755)
    data = readonly.share_data(st.data_dir)
    if data is None:
        st.problems.append("no Fashion-MNIST on this machine: learners' scripts will try to download it")
    pw = {n: passwords.generate() for n in acc.users}
    settings = dict(user_password=None, admin_password=None)
    if st.auth == "shared":
        shared = passwords.generate()
        pw = {**{n: shared for n in st.learners}, st.instructor: passwords.generate(32)}
        settings = dict(user_password=shared, admin_password=pw[st.instructor])
    else:
        passwords.save_hashes(pw, st.logins)  # the hub's own login; the Unix accounts have none
    extra_env = {contract.SOLUTIONS_DIR: str(reveal.prepare(st.revealed_dir))}  # `labkit solution`: revealed steps
    extra_env.update(check_queue(st.folder / "queue", st.instructor))
    nodes = onnodes.start(st, extra_env, jobs, asked) if st.slurm else None
    on_nodes: dict[str, object] = {}
    hub_port, api_port, service_port = tfconfig.free_ports(3)
    if nodes is not None and (st.spawner == "slurm" or nodes.confined):  # servers, or batch jobs, run there
        on_nodes = onnodes.seat_networks(st, acc.users, nodes, hub_port)
    if st.spawner == "local":
        controller = ((net.gateway(), nodes_slurm.controller_port(nodes.slurm_conf)),) if nodes is not None else ()
        on_nodes = _own_networks(st, acc.users, hub_port, controller)
    hub_settings = hubconfig.HubSettings(
        state=st.private, port=st.port, hub_port=hub_port, proxy_api_port=api_port, service_port=service_port,
        learners=st.learners, instructor=st.instructor, release=readonly.publish(source, st.folder / "release"),
        class_dir=st.class_dir, python=sys.executable, proxy=proxy, ip=st.ip, auth=st.auth, data_dir=data,
        cores=asked.cores, memory=asked.memory, pids=asked.pids, extra_env=extra_env, logins=st.logins,
        subdomain_host=subdomain_host, **settings, **on_nodes)
    hubconfig.write(hub_settings, st.config)
    st.problems.extend(hubconfig.risks(hub_settings))  # said in `up`'s output
    st.hub = hub.start(st.config, st.log, st.job_id)
    st.save()
    hub.wait_ready(st.hub, st.port, st.log)
    return pw


def _own_networks(st: State, names: list[str], hub_port: int,
                  also_reach: tuple[tuple[str, int], ...]) -> dict[str, object]:
    """A network namespace per account (:mod:`labkit.workshop.worlds`), recorded before it is made; the hub's
    settings that put each server in its own."""
    problem = worlds.taken()
    if problem:
        raise WorkshopError(f"the learners' own networks cannot be made: {problem}")
    st.made["worlds"] = list(names)
    st.save()
    networks = worlds.plan(names)
    try:
        worlds.make(networks, hub_port, also_reach)
    except OSError as e:
        raise WorkshopError(f"the learners' own networks cannot be made here ({e}). A workshop needs root with "
                            "CAP_NET_ADMIN and iproute2 (`ip`): in a container, run it with "
                            "--cap-add NET_ADMIN,SYS_ADMIN or --privileged") from e
    return {"hub_ip": worlds.HUB, "addresses": {n.name: n.address for n in networks}}


def down(folder: str | os.PathLike[str] | None = None) -> list[str]:
    """Stop and remove everything the workshop in ``folder`` made; what was removed (empty: nothing was up).

    Each step runs even when one before it failed (the failure is said in the list). Processes end before their
    accounts go: those in the learners' control groups (or systemd scopes) through the groups, then every other
    process of each user id, killed as that uid (:func:`labkit.workshop.accounts.remove`). A user of whom
    anything is left is kept, so that its uid goes to no one else, and so is the state: a second ``down``
    finishes the job."""
    where = state_folder(folder)
    if os.geteuid() != 0 and (where / "state.json").exists():
        raise WorkshopError("labkit workshop down needs root, like labkit workshop up")
    st = State.load(where)
    if st is None:
        return []
    removed: list[str] = []

    def step(what: str, action: Callable[[], list[str] | None]) -> None:
        try:
            removed.extend(action() or [])
        except Exception as e:  # noqa: BLE001 - said in the list; the next steps still run, a second down retries
            removed.append(f"{what} failed ({type(e).__name__}: {e}); run `labkit workshop down` again")

    def scope_ends() -> None:
        for name in groups:
            scopes.kill(name)

    def control_groups() -> list[str]:
        said = limits.remove(groups)
        st.made["cgroups"] = limits.left(groups)
        st.save()
        return said

    def home_disks() -> list[str]:  # lazily: what still holds a disk lets go as the accounts' processes end
        said, folder, acc = [], st.folder / "disks", accounts.Accounts(st.learners, st.instructor)
        for name in list(st.made["disks"]):
            if name.startswith(disks.RECORDS):
                learner = name[len(disks.RECORDS):]
                said += disks.remove_records(folder, learner, st.class_dir / f"{learner}{classlog.SUFFIX}")
            else:
                said += disks.remove(folder, name, acc.home(name))
            st.made["disks"].remove(name)
            st.save()
        return said

    def networks() -> list[str]:  # after the processes: a namespace no process holds goes with its link
        said = worlds.remove(worlds.plan(st.made["worlds"]))
        st.made["worlds"] = []
        st.save()
        return said

    def server_networks() -> list[str]:  # after the jobs: a namespace no process holds goes with its link
        said = nodeworlds.remove(onnodes.server_seats(st.made)) + onnodes.remove_seat_hosts(st.made)
        st.made["server_networks"] = None
        st.save()
        return said

    def nodes() -> list[str]:
        if st.made.get("nodes"):
            said = virtual.down()
            st.made["nodes"] = False
            st.save()
            return said
        if "nodes_mode" in st.made and (cluster := virtual.VirtualNodes.load()) is not None:
            cluster.folder.chmod(st.made["nodes_mode"])
            if st.made.get("slurm_partition"):
                slurmlimits.apply(cluster.slurm_conf, st.made["slurm_partition"])
        return []

    if hub.alive(st.hub):
        removed.append(f"JupyterHub (pid {st.hub.pid}) and its proxy")
    step("stopping JupyterHub", lambda: hub.stop(st.hub, st.job_id))
    step("ending the Slurm jobs", lambda: onnodes.end_jobs(st))
    groups = list(st.made.get("cgroups", []))
    if groups and scopes.available():
        step("ending the learners' systemd scopes", scope_ends)
    step("ending the processes in the learners' control groups", lambda: limits.end(groups))
    if st.made.get("disks"):
        step("detaching the homes' disks", home_disks)
    step("removing the accounts", lambda: accounts.remove(st.made, st.save))
    step("removing the control groups", control_groups)
    if st.made.get("worlds"):
        step("removing the learners' networks", networks)
    if st.made.get("server_networks"):
        step("removing the servers' networks on the nodes", server_networks)
    step("the virtual nodes", nodes)
    for folder, mode in st.made.get("modes", {}).items():
        try:
            readonly.set_mode(Path(folder), mode)  # the path itself, never a link's target
            removed.append(f"the mode of {folder} restored")
        except OSError as e:
            removed.append(f"the mode of {folder} not restored ({e.strerror}): it is gone or no longer what up changed")
    kinds = ("users", "groups", "cgroups", "worlds", "server_networks", "disks")
    left = [kind for kind in kinds if st.made.get(kind)]
    if left:
        step("saving the state", st.save)
        removed.append(f"the state in {where} is kept for the next `labkit workshop down`, which removes what is "
                       f"left of the workshop's {', '.join(left)}")
        return removed
    try:
        st.remove_folder(whole=st.made.get("folder", True))
        removed.append(str(where))
    except OSError as e:
        removed.append(f"{where} not all removed ({e.strerror}: {e.filename}); run `labkit workshop down` again")
    return removed


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
        running = bool(leftovers.processes_of(accounts.uids_of([name])))
        learners.append({"name": name, "course": (home / homes.COURSE).is_dir(), "processes": running})
    ok = st.phase == "up" and hub.alive(st.hub) and answer is not None
    return {"state": "up" if ok else ("starting" if st.phase == "starting" else "broken"), "folder": str(where),
            "url": st.url, "jupyterhub": (answer or {}).get("version"), "hub_pid": st.hub.pid if st.hub else None,
            "auth": st.auth,
            "instructor": st.instructor, "learners": learners, "class_page": st.url + "services/class/",
            "class_dir": str(st.class_dir), "logins": str(st.logins), "slurm": st.slurm, "spawner": st.spawner,
            "seconds_up": st.seconds_up, "problems": st.problems}
