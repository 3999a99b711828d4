"""The workshop's spawner: JupyterHub's ``LocalProcessSpawner`` (the hub runs as root and starts each
learner's JupyterLab as that learner's Unix user), plus the course at first login and per-learner limits.

Before the server starts, the learner's home gets the course (:func:`labkit.workshop.homes.prepare`);
the server starts inside the learner's control groups (:mod:`labkit.workshop.limits`), joined in the
child before it drops root, so nothing it starts escapes them. The server's environment puts the shared
environment first on ``PATH``, the learner's released ``labkit`` first on ``PYTHONPATH``, and names the
class folder (``$LABKIT_CLASS_DIR``) where checks append their records.
"""

from __future__ import annotations

import asyncio
import pwd
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner, set_user_setuid
from traitlets import Unicode

from labkit.core import contract
from labkit.workshop import homes, limits


class WorkshopSpawner(LocalProcessSpawner):
    """``LocalProcessSpawner`` + the course at first login, ``cpu_limit``/``mem_limit`` enforced, the class folder."""

    course_source = Unicode("", help="the course source released into each learner's home").tag(config=True)
    data_dir = Unicode("", help="the read-only Fashion-MNIST copy linked into each home").tag(config=True)
    class_dir = Unicode("", help="the class folder checks write their records to").tag(config=True)

    def _home(self) -> Path:
        return Path(pwd.getpwnam(self.user.name).pw_dir)

    def make_preexec_fn(self, name: str):  # JupyterHub's signature
        procs, problem = limits.make(name, self.cpu_limit or None, int(self.mem_limit) if self.mem_limit else None)
        if problem:
            self.log.warning("%s: %s", name, problem)
        drop = set_user_setuid(name)

        def preexec() -> None:
            limits.join(procs)
            drop()

        return preexec

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        home = self._home()
        env["PATH"] = f"{homes.venv() / 'bin'}:/usr/local/bin:/usr/bin:/bin"
        env["PYTHONPATH"] = str(home / homes.COURSE)
        if self.class_dir:
            env[contract.CLASS_DIR] = self.class_dir
        return env

    def get_args(self) -> list[str]:
        settings = self._home() / homes.COURSE / "jupyter" / "lab-settings"
        return [*super().get_args(), f"--LabApp.app_settings_dir={settings}"]

    async def start(self):
        info = pwd.getpwnam(self.user.name)
        data = Path(self.data_dir) if self.data_dir else None
        home = Path(info.pw_dir)
        if await asyncio.to_thread(homes.prepare, home, info.pw_uid, info.pw_gid, Path(self.course_source), data):
            self.log.info("%s: released the course into %s", self.user.name, home / homes.COURSE)
        return await super().start()
