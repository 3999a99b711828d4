"""Work done as a learner, never as root: a child process with the learner's user, group and groups.

The hub runs as root, and a learner's home is the learner's: whatever is there (a symbolic link to a file
of root's, a FIFO, a folder renamed half-way) was put there by the learner. So root does nothing in it;
:func:`run` starts a new Python (``-I``: no ``PYTHON*`` variable, no user site, no current folder on the
import path) whose process drops root before it runs any Python: ``setgroups`` to the learner's groups,
then the group id, then the user id (real, effective and saved: the child cannot become root again).
:func:`verify_dropped` checks in the child, before it touches anything, the ids, that no capability is
left and that root cannot be taken back. The child runs in a session of its own, from ``/``, with a small
environment; at ``timeout`` its whole process group is killed, so a learner's FIFO or a huge tree cannot
hold a thread of the hub.
"""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


class StillPrivileged(RuntimeError):
    """The child still holds (or can take back) a privilege it was meant to drop."""


@dataclass(frozen=True)
class Learner:
    """A Unix user as the child becomes it."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: Path

    @classmethod
    def of(cls, name: str) -> Learner:
        """The user ``name`` from the user database (KeyError when there is none)."""
        info = pwd.getpwnam(name)
        groups = tuple(sorted(set(os.getgrouplist(name, info.pw_gid))))
        return cls(name, info.pw_uid, info.pw_gid, groups, Path(info.pw_dir))


@dataclass(frozen=True)
class Outcome:
    """How a child ended: exit code (None: killed at its timeout), its output, its seconds."""

    code: int | None
    out: str
    err: str
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.code is None


def child_env(learner: Learner) -> dict[str, str]:
    return {"HOME": str(learner.home), "USER": learner.name, "LOGNAME": learner.name, "LANG": "C.UTF-8",
            "PATH": "/usr/local/bin:/usr/bin:/bin"}


# Run by root before the child becomes the learner: join each control group named (their cgroup.procs files, up
# to "--"), then exec what follows. The files are the hub's (labkit.workshop.limits.make), never the learner's.
JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 1; shift; done; shift; exec "$@"'
NOT_DUMPABLE = "import ctypes; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)"  # PR_SET_DUMPABLE 0: no ptrace of the child


def joined_argv(learner: Learner, args: list[str], groups_files: tuple[str, ...],
                become: tuple[str, ...] = ()) -> list[str]:
    """The child's command when it must start in the learner's control groups (or world): ``sh`` (root) joins the
    groups, then ``become`` (the learner's world, :func:`labkit.workshop.worlds.argv`; default ``setpriv``: the
    learner's groups, group id, user id, no new privileges) drops root and execs ``python -I``."""
    groups = ["--groups=" + ",".join(map(str, learner.groups))] if learner.groups else ["--clear-groups"]
    become = become or ("setpriv", f"--reuid={learner.uid}", f"--regid={learner.gid}", *groups, "--no-new-privs",
                        "--")
    return ["/bin/sh", "-c", JOIN, "labkit-join", *groups_files, "--", *become, sys.executable, "-I", *args]


def run(learner: Learner, args: list[str], timeout: float, groups_files: tuple[str, ...] = (),
        become: tuple[str, ...] = ()) -> Outcome:
    """Run ``python -I ARGS`` as ``learner`` (in their control groups when ``groups_files`` name them, in their
    world when ``become`` is its command); killed (with everything it started) after ``timeout`` s."""
    if learner.uid == 0 or learner.gid == 0:
        raise ValueError(f"{learner.name} is root: a learner's work never runs as root")
    start = time.monotonic()
    if groups_files or become:  # root's sh joins the groups, then setpriv drops root: no Python runs as root
        p = subprocess.Popen(joined_argv(learner, args, groups_files, become), cwd="/", env=child_env(learner),
                             start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    else:  # CPython's child sets the groups, then the group ids, then the user ids (setgroups, setregid,
        # setreuid), after fork and before exec: no Python runs in the child with root's rights.
        p = subprocess.Popen([sys.executable, "-I", *args], user=learner.uid, group=learner.gid,
                             extra_groups=list(learner.groups), cwd="/", env=child_env(learner),
                             start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return Outcome(p.returncode, out, err, time.monotonic() - start)
    except subprocess.TimeoutExpired:
        _kill_group(p.pid)
        p.wait()
        out, err = _drain(p)
        return Outcome(None, out, err, time.monotonic() - start)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _drain(p: subprocess.Popen) -> tuple[str, str]:
    """What a killed child wrote (a grandchild that left the group may hold the pipes: do not wait for it)."""
    try:
        return p.communicate(timeout=1)
    except subprocess.TimeoutExpired:
        for pipe in (p.stdout, p.stderr):
            if pipe is not None:
                pipe.close()
        return "", ""


def verify_dropped(uid: int, gid: int, groups: tuple[int, ...]) -> None:
    """In the child: exactly the learner's ids, and no way back to root; :class:`StillPrivileged` otherwise."""
    if uid == 0 or gid == 0:
        raise StillPrivileged("asked to run as root")
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise StillPrivileged(f"ids are {os.getresuid()}/{os.getresgid()}, not {uid}/{gid}")
    if set(os.getgroups()) - set(groups) or 0 in os.getgroups():
        raise StillPrivileged(f"groups are {os.getgroups()}, not {list(groups)}")
    if any(capabilities()):
        raise StillPrivileged(f"capabilities kept: {capabilities()}")
    for regain in (lambda: os.setuid(0), lambda: os.setgid(0), lambda: os.setgroups([0])):
        try:
            regain()
        except PermissionError:
            continue
        raise StillPrivileged("root could be taken back")


def capabilities() -> tuple[int, int, int]:
    """This process's effective, permitted and ambient capability sets (``/proc/self/status``), as numbers."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    eff, prm, amb = (int(fields.get(name, "0").strip(), 16) for name in ("CapEff", "CapPrm", "CapAmb"))
    return eff, prm, amb
