"""``labkit workshop reveal LAB STEP``: the instructor gives one step's solution to the whole class, on the record.

The workshop's release holds no solutions (:func:`labkit.workshop.readonly.publish` makes it graded). A reveal
writes the solution after the step, made from the course source's template exactly as ``labkit solution`` shows
it, into the state's ``revealed/`` folder: root's, ``rwxr-xr-x``, its files ``rw-r--r--``. The folder is opened
without following a link (``O_NOFOLLOW | O_DIRECTORY``) and must be this user's; the file is created in it under a
temporary name (``O_EXCL | O_NOFOLLOW``) and renamed into place within the folder, so a learner sees the whole
file or none and nothing a learner could name is followed. Every learner's server has ``$LABKIT_SOLUTIONS_DIR``
naming the folder (set by ``workshop up`` in the spawner's environment), and ``labkit solution`` there shows the
revealed steps and only those, whatever the release holds.

Each reveal appends one record to the class folder (:func:`labkit.records.classlog.write_reveal`: what, by whom,
when), which the class view and ``labkit class status`` list.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from labkit.course import labs, solutions, sources
from labkit.records import classlog
from labkit.workshop.state import State

FOLDER_MODE, FILE_MODE = 0o755, 0o644


class RevealError(RuntimeError):
    """The step cannot be revealed; the message says why."""


def prepare(folder: Path) -> Path:
    """The revealed solutions' folder, made (``rwxr-xr-x``) if missing; it must be this user's, not a link."""
    try:
        folder.mkdir(mode=FOLDER_MODE)
    except FileExistsError:
        pass
    fd = _open_folder(folder)
    os.close(fd)
    return folder


def _open_folder(folder: Path) -> int:
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise RevealError(f"{folder} is not a folder (or is a link): {e.strerror}; nothing revealed") from e
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        os.close(fd)
        raise RevealError(f"{folder} is not root's alone (owner {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}): "
                          "nothing revealed")
    os.fchmod(fd, FOLDER_MODE)
    return fd


def publish(folder: Path, name: str, text: str) -> Path:
    """``text`` as ``folder/name``, read-only to others, replaced whole (see the module's docstring)."""
    if "/" in name or name.startswith("."):
        raise RevealError(f"{name!r} is not a file name")
    fd = _open_folder(prepare(folder))
    try:
        temp = f".{name}.{os.getpid()}.tmp"
        out = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE,
                      dir_fd=fd)
        try:
            os.fchmod(out, FILE_MODE)
            os.write(out, text.encode())
            os.fsync(out)
        finally:
            os.close(out)
        os.rename(temp, name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)
    return folder / name


def reveal(st: State, lab: str, step: int, by: str, source: Path | None = None) -> classlog.Reveal:
    """Publish the solution after ``step`` of ``lab`` to the class of ``st`` and record it; the record."""
    spec = labs.get(lab)
    name = solutions.file_name(spec, step)  # ValueError for a step the lab does not have
    if not st.class_dir.is_dir():
        raise RevealError(f"no workshop class folder {st.class_dir}: is a workshop up?")
    text = solutions.source_text(spec, step, source or sources.course_source())
    publish(st.revealed_dir, name, text)
    record = classlog.Reveal(spec.name, step, by, round(time.time(), 3))
    classlog.write_reveal(record, st.class_dir)
    return record


def revealed(st: State) -> list[str]:
    """The step solutions the class can see now, by file name."""
    try:
        return sorted(n for n in os.listdir(st.revealed_dir) if not n.startswith("."))
    except OSError:
        return []
