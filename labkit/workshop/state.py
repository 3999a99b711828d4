"""What a running workshop is made of, kept in its state folder (``$LABKIT_WORKSHOP_STATE``, default
``/var/lib/labkit-workshop``, which outlives a reboot) so that ``labkit workshop down`` removes exactly what
``up`` made, also after the machine restarted (accounts, homes, permission changes).

The folder (root's, ``rwx--x--x``) holds ``state.json`` (no secret in it) and ``hub/`` (``rwx------``: the
hub's configuration, database, cookie secret, log and the learners' password hashes), plus four folders learners
reach: ``release/`` (the released course and its ``labkit``, root's and read-only, which each learner's own child
copies into their home and their server imports; it holds no solutions), ``revealed/`` (the step solutions the
instructor revealed to the class, ``labkit workshop reveal``, root's and read-only), ``data/`` (the read-only data
set) and ``class/`` (the class records and the record of reveals, ``rwxr-x--x``, root's and the instructors'
group's).

Beside the folder, not in it (``down`` removes the folder), ``labkit-workshop-uids`` records the highest user id
any workshop handed out (:func:`uid_record`): the next workshop's accounts get higher ones, so a uid whose files or
processes could outlive its account is never handed to another learner.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from labkit.core import contract, files
from labkit.workshop.started import Started

DEFAULT_STATE = Path("/var/lib/labkit-workshop")
UID_RECORD = "labkit-workshop-uids"  # beside the state folder: /var/lib/labkit-workshop-uids
RECORD_BYTES = 64


class WorkshopError(RuntimeError):
    """The workshop cannot start or stop; the message says what to do."""


def state_folder(folder: str | os.PathLike[str] | None = None) -> Path:
    return Path(folder or os.environ.get(contract.WORKSHOP_STATE) or DEFAULT_STATE)


def uid_record(folder: str | os.PathLike[str] | None = None) -> Path:
    """Where the highest uid handed out is kept: beside the state folder (in its parent), so it outlives ``down``."""
    return state_folder(folder).parent / UID_RECORD


def last_uid(record: Path) -> int:
    """The highest uid workshops handed out (0: none yet). Only a regular file of root's that no one else may write
    is read (opened without following a link); OSError for anything else there, or an unreadable number."""
    try:
        fd = os.open(record, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
            raise OSError(errno.EPERM, "not a file of root's that only root writes: remove it (or choose another "
                                       "state folder)", str(record))
        text = os.read(fd, RECORD_BYTES).decode(errors="replace").strip()
    finally:
        os.close(fd)
    if not text.isdigit():
        raise OSError(errno.EINVAL, f"holds {text[:20]!r}, not a uid: remove it", str(record))
    return int(text)


def note_uid(record: Path, uid: int) -> None:
    """Record ``uid`` as handed out (kept when it is higher than what is recorded): a new file of root's
    (``rw-r--r--``) replaces the record whole."""
    highest = max(last_uid(record), uid)
    tmp = record.with_name(f".{record.name}.{os.getpid()}.{time.monotonic_ns()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, f"{highest}\n".encode())
        os.fchmod(fd, 0o644)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, record)


@dataclass
class State:
    folder: Path
    learners: list[str] = field(default_factory=list)
    instructor: str = "instructor"
    port: int = 0
    ip: str = "127.0.0.1"
    auth: str = "hub"  # the hub's own password store (hubauth), or "shared"
    slurm: bool = False  # learners' jobs go to Slurm on the virtual nodes
    spawner: str = "local"  # "slurm": the learners' servers themselves are Slurm jobs (hubconfig.SPAWNERS)
    job_id: str = ""
    hub: Started | None = None  # the hub process: signalled only while it is still this one
    phase: str = "starting"  # starting, up
    seconds_up: float | None = None
    problems: list[str] = field(default_factory=list)  # what works less than asked (e.g. no limits)
    made: dict = field(default_factory=dict)  # folder: bool, users: [...], groups: [...], cgroups: [...], nodes: bool

    private = property(lambda self: self.folder / "hub")
    config = property(lambda self: self.private / "jupyterhub_config.py")
    log = property(lambda self: self.private / "jupyterhub.log")
    class_dir = property(lambda self: self.folder / "class")
    revealed_dir = property(lambda self: self.folder / "revealed")  # labkit workshop reveal
    data_dir = property(lambda self: self.folder / "data" / "fashion-mnist")
    logins = property(lambda self: self.private / "logins")  # name and scrypt hash per line, root's only
    file = property(lambda self: self.folder / "state.json")
    uid_file = property(lambda self: uid_record(self.folder))  # beside the folder: it outlives `down`

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.ip in ("", "0.0.0.0") else self.ip
        return f"http://{host}:{self.port}/"

    def save(self) -> None:
        data = {k: v for k, v in asdict(self).items() if k not in ("folder", "hub")}
        files.write_json_atomic(self.file, {**data, "hub": self.hub.to_dict() if self.hub else None})

    def remove_folder(self, whole: bool = True) -> None:
        """Remove everything in the state folder, ``state.json`` last (what could not go keeps it, for the next
        ``down``), then the folder itself when ``whole``. Learners wrote in some of it (the queue, their class
        records): :func:`labkit.core.files.remove_tree` takes any depth, link or mode. OSError names what is left."""
        problems = []
        for name in sorted(os.listdir(self.folder)):
            if name != self.file.name:
                try:
                    files.remove_tree(self.folder / name)
                except OSError as e:
                    problems.append(e)
        if problems:
            raise problems[0]
        self.file.unlink(missing_ok=True)
        if whole:
            self.folder.rmdir()

    @classmethod
    def load(cls, folder: str | os.PathLike[str] | None = None) -> State | None:
        """The workshop whose state is in ``folder``, or None when there is none."""
        path = state_folder(folder)
        try:
            data = json.loads((path / "state.json").read_text())
            return cls(folder=path, **{**data, "hub": Started.from_dict(data.get("hub"))})
        except (OSError, ValueError, TypeError):
            return None
