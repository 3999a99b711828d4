"""The workshop's Unix accounts: learners ``learner01``..., one instructor, their groups and home folders.

Every learner is a Unix user of their own (home ``rwx------``), so one learner cannot read or stop
another's work. The instructor is in the instructors' group, which alone reads the class folder. No account
can log in to the machine itself: the password is locked (``!`` in ``/etc/shadow``) and the shell is
``nologin``, so ``ssh`` and ``su`` fail; the hub's own login (:mod:`labkit.workshop.hubauth`) is the only way
in, and JupyterLab's terminals run ``bash`` (set in the hub's configuration, not by the account).
:func:`plan_up` and :func:`plan_down` build the commands (``groupadd``, ``useradd``, ``userdel``,
``groupdel``) without running them; :func:`create` runs them, writing each name into ``made`` *before*
making it, so :func:`remove` deletes exactly what was made, also after a failed start, and does
nothing the second time. Names that exist already are refused, never taken over. Removing a user also
removes their crontab and ``at`` jobs (files they own in the spool folders) after their processes end.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from labkit.core import proc

LEARNER_GROUP = "labkit-learners"
INSTRUCTOR_GROUP = "labkit-instructors"
INSTRUCTOR = "instructor"
TEMP_DIRS = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))  # where learners' processes leave files
# where cron and at keep users' jobs (Debian: crontabs/, atjobs/; Red Hat: /var/spool/cron itself, /var/spool/at)
JOB_SPOOLS = (Path("/var/spool/cron/crontabs"), Path("/var/spool/cron/atjobs"), Path("/var/spool/cron"),
              Path("/var/spool/at"))
NOLOGIN = ("/usr/sbin/nologin", "/sbin/nologin")
LOCKED = "!"  # the shadow password field of an account no password opens


class AccountsError(RuntimeError):
    """An account cannot be made or removed; the message says which and why."""


def learner_names(count: int) -> list[str]:
    """``learner01`` ... (three digits from 100 learners on)."""
    if not isinstance(count, int) or not 1 <= count <= 999:
        raise ValueError(f"learners must be a whole number from 1 to 999, got {count!r}")
    width = 2 if count < 100 else 3
    return [f"learner{k:0{width}d}" for k in range(1, count + 1)]


@dataclass
class Accounts:
    learners: list[str]
    instructor: str = INSTRUCTOR
    home_root: Path = Path("/home")

    @property
    def users(self) -> list[str]:
        return [*self.learners, self.instructor]

    def home(self, name: str) -> Path:
        return self.home_root / name


def user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def group_exists(name: str) -> bool:
    try:
        grp.getgrnam(name)
        return True
    except KeyError:
        return False


def taken(acc: Accounts) -> list[str]:
    """Users, groups or home folders of the plan that exist already."""
    found = [f"user {u}" for u in acc.users if user_exists(u)]
    found += [f"group {g}" for g in (LEARNER_GROUP, INSTRUCTOR_GROUP, *acc.users) if group_exists(g)]
    return found + [f"folder {acc.home(u)}" for u in acc.users if acc.home(u).exists()]


def nologin() -> str:
    """The shell that refuses a login (``nologin``)."""
    return next((s for s in NOLOGIN if os.path.exists(s)), NOLOGIN[0])


def plan_up(acc: Accounts) -> list[tuple[str, str, list[str]]]:
    """``(kind, name, argv)`` for every group and user to make, in order: no password, no login shell."""
    steps = [("group", g, ["groupadd", g]) for g in (LEARNER_GROUP, INSTRUCTOR_GROUP)]
    for u in acc.users:
        group = INSTRUCTOR_GROUP if u == acc.instructor else LEARNER_GROUP
        steps.append(("user", u, ["useradd", "--create-home", "--home-dir", str(acc.home(u)), "--shell", nologin(),
                                  "--password", LOCKED, "--user-group", "--groups", group,
                                  "--comment", "labkit workshop", u]))
    return steps


def plan_down(made: dict[str, list[str]]) -> list[tuple[str, str, list[str]]]:
    """``(kind, name, argv)`` removing the users (with their homes) then the groups in ``made``."""
    steps = [("user", u, ["userdel", "--remove", u]) for u in made.get("users", [])]
    return steps + [("group", g, ["groupdel", g]) for g in reversed(made.get("groups", []))]


def run(argv: list[str], timeout: float = 60) -> str:
    """Run one administration command; its output, or :class:`AccountsError` with it."""
    out: list[bytes] = []
    with proc.Job() as job:
        p = job.spawn(argv, on_output=out.append)
        code = p.wait(timeout)
    text = b"".join(out).decode(errors="replace").strip()
    if code != 0:
        raise AccountsError(f"`{' '.join(argv)}` failed ({'timed out' if code is None else f'exit {code}'}): {text}")
    return text


def create(acc: Accounts, made: dict[str, list[str]], save: Callable[[], None], runner=run) -> None:
    """Make the groups and users of ``acc``; each name goes into ``made`` (and ``save()``) before it is made."""
    clash = taken(acc)
    if clash:
        raise AccountsError("already on this machine: " + ", ".join(clash) +
                            " (a workshop that is still up? `labkit workshop down`; else choose other names)")
    for kind, name, argv in plan_up(acc):
        made.setdefault(f"{kind}s", []).append(name)
        save()
        runner(argv)
        if kind == "user":
            os.chmod(acc.home(name), 0o700)


def uids_of(names: Iterable[str]) -> set[int]:
    uids = set()
    for name in names:
        try:
            uids.add(pwd.getpwnam(name).pw_uid)
        except KeyError:
            continue
    return uids


def processes_of(uids: set[int]) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["uids"]):
        try:
            if p.info["uids"] and p.info["uids"].real in uids and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except psutil.Error:
            continue
    return found


def stop_processes(uids: set[int], grace: float = 3.0) -> None:
    """SIGTERM every process of ``uids``, then SIGKILL what is left (a few rounds: servers start kernels)."""
    if not uids:
        return
    proc.kill_all(processes_of(uids), signal.SIGTERM)
    psutil.wait_procs(processes_of(uids), timeout=grace)
    for _ in range(5):
        left = processes_of(uids)
        if not left:
            return
        proc.kill_all(left)
        psutil.wait_procs(left, timeout=1.0)
    left = processes_of(uids)
    if left:
        raise AccountsError("still running after SIGKILL: " + ", ".join(str(p.pid) for p in left))


def temp_files(uids: set[int], places: Iterable[Path] = TEMP_DIRS) -> list[Path]:
    """Entries directly in the temporary folders owned by ``uids``."""
    found = []
    for place in places:
        try:
            entries = list(place.iterdir())
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.lstat().st_uid in uids:
                    found.append(entry)
            except OSError:
                continue
    return found


def scheduled_jobs(uids: set[int], spools: Iterable[Path] = JOB_SPOOLS) -> list[Path]:
    """Crontabs and ``at`` jobs of ``uids``: regular files they own directly in the spool folders."""
    found = []
    for spool in spools:
        try:
            entries = list(spool.iterdir())
        except OSError:
            continue
        for entry in entries:
            try:
                info = entry.lstat()
            except OSError:
                continue
            if info.st_uid in uids and stat.S_ISREG(info.st_mode):
                found.append(entry)
    return found


def remove(made: dict[str, list[str]], save: Callable[[], None], runner=run,
           spools: Iterable[Path] | None = None) -> list[str]:
    """Stop the users' processes, delete their cron and at jobs, temporary files, users, homes and groups;
    what was removed."""
    uids = uids_of(made.get("users", []))
    stop_processes(uids)
    removed = []
    for job in scheduled_jobs(uids, JOB_SPOOLS if spools is None else spools):
        job.unlink(missing_ok=True)
        removed.append(str(job))
    for entry in temp_files(uids):
        shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() and not entry.is_symlink() else entry.unlink(
            missing_ok=True)
        removed.append(str(entry))
    for kind, name, argv in plan_down(made):
        if (user_exists if kind == "user" else group_exists)(name):
            runner(argv)
            removed.append(f"{kind} {name}")
        made[f"{kind}s"].remove(name)
        save()
    return removed
