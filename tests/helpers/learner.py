"""Acting as a workshop's learner in tests: run a command as the learner (in their limits), a fork bomb and a
memory hog to run there. Needs root to become the learner."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Callable

import pytest

from labkit.workshop import hub, limits
from labkit.workshop.started import Started

PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable  # the system's, which learners can run

# Forks children that sleep until the kernel refuses; prints how many were born.
BOMB = """
import os, sys, time
born = 0
for _ in range(1000):
    try:
        if os.fork() == 0:
            os.close(1)
            os.close(2)
            time.sleep(60)
            os._exit(0)
        born += 1
    except OSError:
        break
print(born, flush=True)
"""

# Takes memory 16 MiB at a time, up to 1 GiB; prints NOT STOPPED if nothing ended it.
HOG = """
chunks = []
for _ in range(64):  # up to 1 GiB, a page touched at a time
    chunks.append(bytearray(16 * 2**20))
print("NOT STOPPED", flush=True)
"""


def becomes(name: str, procs: list[str] | None = None, asked: limits.Limits | None = None) -> Callable[[], None]:
    """A preexec_fn: as the workshop's spawner does, enter the learner's limits (``procs``: their control groups'
    files; ``asked``: the task cap too) as root, then become ``name`` for good."""
    info = pwd.getpwnam(name)

    def drop() -> None:
        limits.enter(procs or [], asked or limits.Limits())
        os.setgroups(os.getgrouplist(name, info.pw_gid))
        os.setgid(info.pw_gid)
        os.setuid(info.pw_uid)

    return drop


def run_as(name: str, argv: list[str], timeout: float = 30, procs: list[str] | None = None,
           asked: limits.Limits | None = None, env: dict[str, str] | None = None,
           **kw: object) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as the learner ``name`` from ``/`` with a plain environment (plus ``env``)."""
    base = {"PATH": "/usr/bin:/bin", "HOME": pwd.getpwnam(name).pw_dir, "LANG": "C.UTF-8", **(env or {})}
    return subprocess.run(argv, preexec_fn=becomes(name, procs, asked), env=base,  # noqa: PLW1509
                          capture_output=True, text=True, timeout=timeout, cwd="/", **kw)


def without_hub(mp: pytest.MonkeyPatch, canary_pid: int) -> None:
    """Make ``lifecycle.up`` start no JupyterHub: a canary process (``canary_pid``) stands for it, for tests of
    what needs no hub (accounts, records, limits, Slurm jobs)."""
    mp.setattr(hub, "find_proxy", lambda: "/bin/true")
    mp.setattr(hub, "jupyterhub", lambda: "/bin/true")
    mp.setattr(hub, "start", lambda *args: Started.of(canary_pid))
    mp.setattr(hub, "wait_ready", lambda *args, **kw: 0.0)


def skip_unless_a_workshop_can_start(asked: limits.Limits, learner: str = "learner01") -> None:
    """Skip the test when a workshop is up already (its accounts would clash) or ``asked`` cannot be held here."""
    from labkit.workshop import accounts, lifecycle

    if lifecycle.State.load() is not None or accounts.user_exists(learner):
        pytest.skip("a workshop is up on this machine already")
    problem = limits.probe(asked)
    if problem is not None:
        pytest.skip(f"control groups cannot hold limits here: {problem}")
