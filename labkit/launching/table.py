"""The table of launchers: every launcher class by the name users give (``--launcher NAME``).

A new launcher is a :class:`labkit.launching.launchers.Launcher` subclass in a module of this package, and one
entry here.
"""

from __future__ import annotations

from labkit.launching.launchers import SSH, Elastic, Gloo, HorovodRun, Launcher, LaunchError, MPIRun
from labkit.launching.slurm import Slurm

LAUNCHERS: dict[str, type[Launcher]] = {c.name: c for c in (MPIRun, HorovodRun, Gloo, Elastic, SSH, Slurm)}


def names() -> list[str]:
    """The launchers' names, as ``--launcher`` takes them."""
    return list(LAUNCHERS)


def get(name: str, np: int | None = 2, **kw: object) -> Launcher:
    """The launcher called ``name`` for ``np`` workers."""
    if name not in LAUNCHERS:
        raise LaunchError(f"unknown launcher {name!r}: choose one of {', '.join(LAUNCHERS)}")
    return LAUNCHERS[name](np, **kw)
