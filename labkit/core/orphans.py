"""Linux process flags for a job's processes: die with the parent that started them, adopt the orphans of
the processes they start (so nothing is left re-parented to init when a job is stopped)."""

from __future__ import annotations

import ctypes
import signal

_PRCTL: list = []  # libc's prctl, looked up in the parent: the child only calls it


def look_up() -> object | None:
    """libc's prctl (None where there is none), looked up once."""
    if not _PRCTL:
        try:
            _PRCTL.append(ctypes.CDLL("libc.so.6", use_errno=True).prctl)
        except OSError:
            _PRCTL.append(None)
    return _PRCTL[0]


def die_with_parent() -> None:
    """In a child, before exec: get SIGKILL when the parent dies, whatever killed it."""
    prctl = _PRCTL[0] if _PRCTL else look_up()
    if prctl is not None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def adopt_orphans() -> bool:
    """Become the *subreaper* of this process's descendants: what they leave running becomes our child.

    Then ``psutil.Process().children(recursive=True)`` finds processes whose parent has ended
    (a server or a ``sleep`` a script started and left behind), so they can be named and stopped.
    """
    prctl = look_up()
    return prctl is not None and prctl(36, 1) == 0  # PR_SET_CHILD_SUBREAPER
