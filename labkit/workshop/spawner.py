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
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner, set_user_setuid
from traitlets import Float, HasTraits, Integer, Unicode

from labkit.core import contract
from labkit.workshop import asuser, homes, limits, readonly, scopes


class CourseSpawner(HasTraits):
    """What every workshop server gets whichever spawner starts it: the course in the home, the hub's environment.
    A mix-in, first among a spawner's bases (JupyterHub wants ``start``, ``stop`` and ``poll`` from the spawner)."""

    release_dir = Unicode("", help="the released course (root's, read-only) each learner copies").tag(config=True)
    data_dir = Unicode("", help="the read-only Fashion-MNIST copy linked into each home").tag(config=True)
    class_dir = Unicode("", help="the class folder checks write their records to").tag(config=True)
    home_timeout = Float(60.0, help="seconds the learner's home preparation may take").tag(config=True)

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
        report = await asyncio.to_thread(homes.give, learner, Path(self.release_dir), data, self.home_timeout)
        if report.course_written:
            self.log.info("%s: the course is in %s (copied by %s in %.1f s)", learner.name,
                          learner.home / homes.COURSE, learner.name, report.seconds)
        for note in report.notes:
            self.log.warning("%s: %s", learner.name, note)
        return learner


class WorkshopSpawner(CourseSpawner, LocalProcessSpawner):
    """``LocalProcessSpawner`` + the course at first start, ``cpu_limit``/``mem_limit`` enforced, the class folder."""

    pids_limit = Integer(0, help="tasks (processes and threads) per learner, pids.max; 0: none").tag(config=True)

    def _limits(self) -> limits.Limits:
        return limits.Limits(self.cpu_limit or None, int(self.mem_limit) if self.mem_limit else None,
                             self.pids_limit or None)

    def _in_scope(self) -> bool:  # a systemd host: the learner's scope holds the limits (labkit.workshop.scopes)
        return scopes.available() and bool(self._limits().asked())

    def make_preexec_fn(self, name: str):  # JupyterHub's signature
        asked = self._limits()
        if self._in_scope():  # systemd-run (in start's command) becomes the learner; the groups are set here
            return scopes.preexec(name, asked)
        procs, problem = limits.make(name, asked)
        if problem:  # `up` probed these limits: a server that would run without them does not start
            self.log.error("%s: %s", name, problem)
            raise RuntimeError(f"{name}'s server was not started: {problem}")
        drop = set_user_setuid(name)

        def preexec() -> None:
            limits.enter(procs, asked)
            drop()

        return preexec

    async def start(self):
        learner = await self.give_course()
        if not self._in_scope():
            return await super().start()
        await asyncio.to_thread(scopes.end, learner.name)  # what is left of the learner's previous server
        command, self.cmd = self.cmd, [*scopes.argv(learner.name, self._limits()), *self.cmd]
        try:  # LocalProcessSpawner.start reads self.cmd before its first await
            return await super().start()
        finally:
            self.cmd = command
