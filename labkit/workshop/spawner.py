"""The workshop's spawners: what every learner's server gets (:class:`CourseSpawner`), and JupyterHub's
``LocalProcessSpawner`` with per-learner limits (:class:`WorkshopSpawner`: the hub runs as root and starts each
learner's JupyterLab as that learner's Unix user). The other one runs each server as a Slurm job
(:mod:`labkit.workshop.slurmspawner`).

Before the server starts, the learner's home gets the course (:func:`labkit.workshop.homes.give`: a child
that is the learner does it, killed after :attr:`CourseSpawner.home_timeout` seconds; root writes nothing
in the home). Its environment is the hub's, not the learner's: ``PATH`` starts with the shared
environment, ``PYTHONPATH`` is the workshop's release (root's, read-only: ``labkit`` comes from there, never
from the learner's folder), no user site (``PYTHONNOUSERSITE``), and ``$LABKIT_CLASS_DIR`` names the class
folder where checks append their records.

:class:`WorkshopSpawner` starts the server inside the learner's control groups (:mod:`labkit.workshop.limits`),
joined in the child before it drops root, so nothing it starts escapes them; on a host whose PID 1 is systemd,
in the learner's systemd scope instead (:mod:`labkit.workshop.scopes`: ``systemd-run`` starts the command and
becomes the learner).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Dict, Float, HasTraits, Integer, Unicode

from labkit.core import contract
from labkit.workshop import asuser, homes, limits, readonly, scopes, serverlog, worlds


class CourseSpawner(HasTraits):
    """What every workshop server gets whichever spawner starts it: the course in the home, the hub's environment.
    A mix-in, first among a spawner's bases (JupyterHub wants ``start``, ``stop`` and ``poll`` from the spawner)."""

    release_dir = Unicode("", help="the released course (root's, read-only) each learner copies").tag(config=True)
    data_dir = Unicode("", help="the read-only Fashion-MNIST copy linked into each home").tag(config=True)
    class_dir = Unicode("", help="the class folder checks write their records to").tag(config=True)
    home_timeout = Float(60.0, help="seconds the learner's home preparation may take").tag(config=True)

    def options_from_form(self, form_data, spawner=None) -> dict:  # JupyterHub's signature
        """No server options: a form or a ``/hub/spawn?...`` link's query sets nothing (a crafted link is inert)."""
        return {}

    def options_from_query(self, query_data) -> dict:  # JupyterHub's signature
        return {}

    def drop_user_options(self) -> None:
        """Forget options posted to the REST API (``POST /hub/api/users/NAME/server``) or stored by an earlier
        start: the workshop's servers take none, so nothing a learner sends reaches how root starts them."""
        if self.user_options:
            self.log.warning("%s: server options ignored (a workshop's servers take none): %s", self.user.name,
                             ", ".join(sorted(repr(str(k)[:40]) for k in self.user_options)[:10]))
        self.user_options = {}
        orm = getattr(self, "orm_spawner", None)
        if orm is not None and getattr(orm, "user_options", None):
            orm.user_options = {}

    def home_groups(self, name: str) -> tuple[str, ...]:
        """The control groups the home's preparation starts in (none here: a spawner with limits names them)."""
        return ()

    def home_world(self, learner: asuser.Learner) -> tuple[str, ...]:
        """The command that puts the home's preparation in the learner's world (none here: the hub's machine)."""
        return ()

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        env["PATH"] = f"{readonly.venv() / 'bin'}:/usr/local/bin:/usr/bin:/bin"
        env["PYTHONPATH"] = self.release_dir
        env["PYTHONNOUSERSITE"] = "1"
        if self.class_dir:
            env[contract.CLASS_DIR] = self.class_dir
        return env

    async def give_course(self) -> asuser.Learner:
        """The course into the learner's home (by a child that is the learner), said in the hub's log."""
        learner = asuser.Learner.of(self.user.name)
        data = Path(self.data_dir) if self.data_dir else None
        report = await asyncio.to_thread(homes.give, learner, Path(self.release_dir), data, self.home_timeout,
                                         self.home_groups(learner.name), self.home_world(learner))
        if report.course_written:
            self.log.info("%s: the course is in %s (copied by %s in %.1f s)", learner.name,
                          learner.home / homes.COURSE, learner.name, report.seconds)
        for note in report.notes:
            self.log.warning("%s: %s", learner.name, note)
        return learner


class WorkshopSpawner(CourseSpawner, LocalProcessSpawner):
    """``LocalProcessSpawner`` + the course at first start, ``cpu_limit``/``mem_limit`` enforced, the class folder,
    and each server in a world of its own (:mod:`labkit.workshop.worlds`) with its output in a file of its own."""

    pids_limit = Integer(0, help="tasks (processes and threads) per learner, pids.max; 0: none").tag(config=True)
    addresses = Dict(Unicode(), help="each account's address in its own network namespace "
                                     "(labkit.workshop.worlds); empty: servers share the machine's").tag(config=True)
    log_dir = Unicode("", help="root's folder for each server's output (bounded; not the hub's log)").tag(config=True)

    def _limits(self) -> limits.Limits:
        return limits.Limits(self.cpu_limit or None, int(self.mem_limit) if self.mem_limit else None,
                             self.pids_limit or None)

    def _in_scope(self) -> bool:  # a systemd host: the learner's scope holds the limits (labkit.workshop.scopes)
        return scopes.available() and bool(self._limits().asked())

    def world(self, learner: asuser.Learner) -> worlds.World:
        """Where the learner's server runs: their own temporary folders and IPC, and their network when the
        workshop made one for them."""
        netns = None
        if self.addresses:
            if learner.name not in self.addresses:
                raise RuntimeError(f"{learner.name} has no network of their own in this workshop")
            netns = worlds.Network(learner.name, 0, self.addresses[learner.name]).path
        keep = worlds.kept(readonly.venv(), self.release_dir, self.data_dir)
        return worlds.World(learner.uid, learner.gid, str(learner.home), netns, keep=keep)

    def home_groups(self, name: str) -> tuple[str, ...]:
        """The learner's own control groups: the home's preparation runs in the learner's limits, not the hub's."""
        if self._in_scope():
            return ()
        procs, problem = limits.make(name, self._limits())
        if problem:
            raise RuntimeError(f"{name}'s server was not started: {problem}")
        return tuple(procs)

    def home_world(self, learner: asuser.Learner) -> tuple[str, ...]:
        """The learner's own world, as their server's: a process of theirs that catches the preparation between its
        start and its making itself untraceable finds itself in the learner's own network and folders."""
        return tuple(worlds.argv(self.world(learner)))

    def make_preexec_fn(self, name: str):  # JupyterHub's signature
        asked = self._limits()
        if self._in_scope():  # systemd-run (in start's command) holds the limits
            return scopes.preexec(name, asked)
        procs, problem = limits.make(name, asked)
        if problem:  # `up` probed these limits: a server that would run without them does not start
            self.log.error("%s: %s", name, problem)
            raise RuntimeError(f"{name}'s server was not started: {problem}")

        def preexec() -> None:  # still root: the world's setpriv (in start's command) becomes the learner
            limits.enter(procs, asked)
            os.chdir("/")

        return preexec

    async def start(self):
        if not self._in_scope() and self._limits().asked():  # what is left of the learner's previous server
            await asyncio.to_thread(limits.end, [self.user.name])
        learner = await self.give_course()
        self.drop_user_options()
        world = self.world(learner)
        if self.addresses:
            self.ip = self.addresses[learner.name]
        prefix = worlds.argv(world)
        if self._in_scope():
            await asyncio.to_thread(scopes.end, learner.name)  # what is left of the learner's previous server
            prefix = [*scopes.argv(learner.name, self._limits(), as_learner=False), *prefix]
        out = serverlog.open_log(Path(self.log_dir), learner.name) if self.log_dir else None
        command, kwargs = self.cmd, self.popen_kwargs
        self.cmd = [*prefix, *self.cmd]
        if out is not None:
            self.popen_kwargs = {**kwargs, "stdout": out, "stderr": out}
        try:  # LocalProcessSpawner.start reads self.cmd before its first await
            return await super().start()
        finally:
            self.cmd, self.popen_kwargs = command, kwargs
            if out is not None:
                os.close(out)
