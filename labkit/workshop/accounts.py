"""The workshop's Unix accounts: learners ``learner01``..., one instructor, their groups and home folders.

Every learner is a Unix user of their own (home ``rwx------``), so one learner cannot read or stop
another's work. The instructor is in the instructors' group, which alone reads the class folder. No account
can log in to the machine itself: the password is locked (``!`` in ``/etc/shadow``) and the shell is
``nologin``, so ``ssh`` and ``su`` fail; the hub's own login (:mod:`labkit.workshop.hubauth`) is the only way
in, and JupyterLab's terminals run ``bash`` (set in the hub's configuration, not by the account).
:func:`plan_up` and :func:`plan_down` build the commands (``groupadd``, ``useradd``, ``userdel``,
``groupdel``) without running them; :func:`create` runs them, writing each name into ``made`` *before*
making it, so :func:`remove` deletes exactly what was made, also after a failed start, and does
nothing the second time. Names that exist already are refused, never taken over.

Each account gets a user id no workshop handed out before (:func:`fresh_uids`, above the highest one recorded
beside the state folder, :func:`labkit.workshop.state.uid_record`), and none that is in use. Removing an account
first ends every process of its uid (:func:`labkit.core.ending.end_uid`: SIGKILL sent as the uid, repeated until
none is left), then removes their crontab and ``at`` jobs (files they own in the spool folders), their entries in
the temporary and lock folders (:func:`labkit.core.files.remove_tree`), their SysV IPC objects and POSIX message
queues, their home, and then the account. An account of which anything could not be removed is kept (its uid is
not freed for another) and said; a second ``down`` tries again.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from labkit.core import ending, files, proc
from labkit.workshop import state
from labkit.workshop.leftovers import JOB_SPOOLS, KINDS, ipc_objects, remove_ipc, scheduled_jobs, temp_files

LEARNER_GROUP = "labkit-learners"
INSTRUCTOR_GROUP = "labkit-instructors"
INSTRUCTOR = "instructor"
LOGIN_DEFS = Path("/etc/login.defs")
UIDS = (1000, 60000)  # UID_MIN and UID_MAX where login.defs does not say
# where cron and at keep users' jobs (Debian: crontabs/, atjobs/; Red Hat: /var/spool/cron itself, /var/spool/at)
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


def uid_range(defs: Path = LOGIN_DEFS) -> tuple[int, int]:
    """``UID_MIN`` and ``UID_MAX`` of the system (``/etc/login.defs``), the range ``useradd`` hands out."""
    low, high = UIDS
    try:
        lines = defs.read_text(errors="replace").splitlines()
    except OSError:
        return low, high
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[1].isdigit():
            if words[0] == "UID_MIN":
                low = int(words[1])
            elif words[0] == "UID_MAX":
                high = int(words[1])
    return low, high


def uids_in_use() -> set[int]:
    """User ids of an account, of a group (``useradd --user-group`` gives the new group the same number) or of a
    process (real, effective or saved; also one not yet reaped)."""
    return {p.pw_uid for p in pwd.getpwall()} | {g.gr_gid for g in grp.getgrall()} | _process_uids()


def _process_uids() -> set[int]:
    uids = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        uids.update(int(v) for v in line.split()[1:5])
                        break
        except (OSError, ValueError):
            continue
    return uids


def fresh_uids(names: list[str], after: int, in_use: set[int], low: int, high: int) -> dict[str, int]:
    """A user id for each of ``names``: above ``after`` (the highest any workshop handed out) and ``low``, none of
    ``in_use``, at most ``high``; :class:`AccountsError` when they do not fit."""
    uids: dict[str, int] = {}
    uid = max(after + 1, low)
    for name in names:
        while uid in in_use:
            uid += 1
        if uid > high:
            raise AccountsError(f"no user id is left for {name}: workshops handed out ids up to {after}, and the "
                                f"system's range ends at UID_MAX {high} ({LOGIN_DEFS}). Ids are never handed out "
                                "twice; raise UID_MAX, or remove the record of the ids (beside the state folder) "
                                "once no file or process of the old ids is left")
        uids[name] = uid
        uid += 1
    return uids


def plan_up(acc: Accounts, uids: dict[str, int] | None = None) -> list[tuple[str, str, list[str]]]:
    """``(kind, name, argv)`` for every group and user to make, in order: no password, no login shell; each user
    with its id from ``uids`` (``--uid``) when given."""
    steps = [("group", g, ["groupadd", g]) for g in (LEARNER_GROUP, INSTRUCTOR_GROUP)]
    for u in acc.users:
        group = INSTRUCTOR_GROUP if u == acc.instructor else LEARNER_GROUP
        uid = ["--uid", str(uids[u])] if uids and u in uids else []
        steps.append(("user", u, ["useradd", "--create-home", "--home-dir", str(acc.home(u)), *uid, "--shell",
                                  nologin(), "--password", LOCKED, "--user-group", "--groups", group,
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


def create(acc: Accounts, made: dict[str, list[str]], save: Callable[[], None], runner=run,
           record: Path | None = None) -> None:
    """Make the groups and users of ``acc``; each name goes into ``made`` (and ``save()``) before it is made. With
    ``record`` (:func:`labkit.workshop.state.uid_record`), each user gets a uid no workshop handed out before,
    recorded there before any account is made."""
    clash = taken(acc)
    if clash:
        raise AccountsError("already on this machine: " + ", ".join(clash) +
                            " (a workshop that is still up? `labkit workshop down`; else choose other names)")
    uids = None
    if record is not None:
        try:
            uids = fresh_uids(acc.users, state.last_uid(record), uids_in_use(), *uid_range())
            state.note_uid(record, max(uids.values()))
        except OSError as e:
            raise AccountsError(f"the record of the user ids workshops handed out, {record}: {e.strerror}") from e
    for kind, name, argv in plan_up(acc, uids):
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


def _empty_home(home: str) -> None:
    """Remove everything in a user's home, not the folder (``userdel --remove`` takes it, and the mail spool)."""
    try:
        info = os.lstat(home)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        for name in os.listdir(home):
            files.remove_tree(os.path.join(home, name))


def remove(made: dict[str, list[str]], save: Callable[[], None], runner=run,
           spools: Iterable[Path] | None = None) -> list[str]:
    """End every process of the users (SIGKILL as their uid until none is left), delete their cron and at jobs,
    their entries in the temporary and lock folders, their SysV IPC objects and message queues, homes, then the
    users and the groups; what was removed. A user of whom something is left (a process above all) is kept and
    said, with the groups: their uid is not freed, and a second call finishes."""
    said: list[str] = []
    users: dict[str, pwd.struct_passwd] = {}
    for name in made.get("users", []):
        try:
            users[name] = pwd.getpwnam(name)
        except KeyError:
            continue
    names = {u.pw_uid: n for n, u in users.items()}
    kept: dict[str, str] = {}  # user: why

    def attempt(owner: int, what: str, action: Callable[[], object]) -> None:
        try:
            action()
            said.append(what)
        except OSError as e:
            said.append(f"{what} not removed: {e.strerror or e}")
            kept.setdefault(names.get(owner, ""), f"{what} is left")

    try:
        for uid, left in ending.end_uids({u.pw_uid: u.pw_gid for u in users.values()}).items():
            kept[names[uid]] = left
    except (OSError, ValueError) as e:
        kept.update({name: f"its processes could not be ended ({e})" for name in users})
    uids = set(names)
    for job in scheduled_jobs(uids, JOB_SPOOLS if spools is None else spools):
        attempt(_owner(job), str(job), lambda job=job: job.unlink(missing_ok=True))
    for entry in temp_files(uids):
        attempt(_owner(entry), str(entry), lambda entry=entry: files.remove_tree(entry))
    for kind, ident, owner in ipc_objects(uids):
        attempt(owner, f"the SysV IPC {KINDS[kind]} {ident} of uid {owner}", lambda k=kind, i=ident: remove_ipc(k, i))
    for name, user in users.items():
        if name not in kept:
            attempt(user.pw_uid, f"the files in {user.pw_dir}", lambda home=user.pw_dir: _empty_home(home))
    kept.pop("", None)
    for kind, name, argv in plan_down(made):
        if kind == "user" and name in kept:
            said.append(f"user {name} kept, so that its uid {users[name].pw_uid} goes to no one else: {kept[name]}; "
                        "run `labkit workshop down` again")
            continue
        if kind == "group" and kept:
            continue  # with the users kept, for the next `down`
        if (user_exists if kind == "user" else group_exists)(name):
            try:
                runner(argv)
            except AccountsError as e:
                said.append(f"{kind} {name} kept: {e}")
                kept.setdefault(name, str(e))
                continue
            said.append(f"{kind} {name}")
        made[f"{kind}s"].remove(name)
        save()
    return said


def _owner(path: Path) -> int:
    try:
        return os.lstat(path).st_uid
    except OSError:
        return -1
