"""The project's file helpers: the one atomic writer (files that readers see whole, old or new, never half
written), and the one remover of a tree that someone else filled (:func:`remove_tree`)."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any


def json_safe(value: Any) -> Any:
    """``value`` as JSON can hold it: NaN and infinities as null, numpy scalars as numbers, anything else as text."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [json_safe(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    try:  # numpy scalars
        return json_safe(value.item())
    except (AttributeError, ValueError):
        return str(value)


def write_json_atomic(path: str | os.PathLike, data: dict[str, Any]) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file, never a mix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(json_safe(data)))
    os.replace(tmp, path)


# --- removing a tree that someone else filled ----------------------------------------------------------------

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_RESCANS = 3  # a folder listed again when entries appeared while it was emptied (a process still writing)
_SHOWN = 5  # leftovers named in the error


class _Frame:
    """One folder on the way down: its name in its parent, who it is, what is left to remove in it."""

    __slots__ = ("name", "ident", "names", "skip", "rescans")

    def __init__(self, name: str, ident: tuple[int, int]) -> None:
        self.name, self.ident = name, ident
        self.names: list[str] = []
        self.skip: set[str] = set()  # entries that could not be removed: not tried again
        self.rescans = 0


def _mounted_roots(top: str) -> set[tuple[int, int]]:
    """``(st_dev, st_ino)`` of what is mounted below ``top`` (also a bind mount of the same file system)."""
    found = set()
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    prefix = top.rstrip("/") + "/"
    for line in lines:
        fields = line.split(" ")
        if len(fields) < 5:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        if point.startswith(prefix) or point == top:
            try:
                info = os.stat(point)
            except OSError:
                continue
            found.add((info.st_dev, info.st_ino))
    return found


def _open_dir(name: str, parent: int, expected: os.stat_result) -> int:
    """The folder ``name`` in ``parent`` opened without following a link, checked to be the one ``lstat`` saw.
    A folder closed to its owner (``chmod 000``) is opened to them first (root needs no opening)."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except PermissionError:
        if expected.st_uid != os.geteuid():
            raise
        os.chmod(name, 0o700, dir_fd=parent, follow_symlinks=False)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    try:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != (expected.st_dev, expected.st_ino):
            raise OSError(errno.ESTALE, "replaced while it was removed", name)
        if os.geteuid() != 0 and info.st_uid == os.geteuid() and info.st_mode & 0o700 != 0o700:
            os.fchmod(fd, 0o700)  # a folder of ours we may not write or search: its entries could not go
    except BaseException:
        os.close(fd)
        raise
    return fd


def _listing(fd: int) -> list[str]:
    with os.scandir(fd) as entries:
        return [e.name for e in entries]


def remove_tree(path: str | os.PathLike[str]) -> None:
    """Remove ``path`` and everything below it, whatever it holds: any depth (no recursion: a stack of its own,
    one folder open at a time), folders closed to their owner, FIFOs, sockets, devices (unlinked, never opened),
    any name. A symbolic link is removed, never followed (``path`` itself too: its target stays); nothing on
    another file system or mounted below ``path`` is entered. Every folder is opened relative to its parent
    (``O_NOFOLLOW``) and checked to be the one listed. A missing ``path`` is nothing to do.

    Everything that can go goes; then :class:`OSError` names what is left (and why) when something is."""
    top = os.path.abspath(os.fspath(path))
    parent_path, top_name = os.path.split(top)
    if top_name in ("", ".", ".."):
        raise ValueError(f"refusing to remove {top!r}")
    parent = os.open(parent_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            info = os.stat(top_name, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(info.st_mode):
            os.unlink(top_name, dir_fd=parent)
            return
        mounts = _mounted_roots(top)
        if info.st_dev != os.fstat(parent).st_dev or (info.st_dev, info.st_ino) in mounts:
            raise OSError(errno.EXDEV, "a file system is mounted there: not entered", top)
        left = _empty(parent, top_name, info, mounts, top)
        if not left:
            try:
                os.rmdir(top_name, dir_fd=parent)
            except FileNotFoundError:
                pass
            except OSError as e:
                left.append((e.errno or errno.EIO, f"{top}: {e.strerror}"))
    finally:
        os.close(parent)
    if left:
        shown = "; ".join(text for _, text in left[:_SHOWN])
        more = f" (and {len(left) - _SHOWN} more)" if len(left) > _SHOWN else ""
        raise OSError(left[0][0], f"{len(left)} entries not removed: {shown}{more}", top)


def _empty(parent: int, name: str, info: os.stat_result, mounts: set[tuple[int, int]],
           top: str) -> list[tuple[int, str]]:
    """Remove everything inside the folder ``name`` of ``parent`` (not the folder); what was left and why."""
    device = info.st_dev
    left: list[tuple[int, str]] = []
    fd = _open_dir(name, parent, info)
    frames = [_Frame(name, (info.st_dev, info.st_ino))]

    def where(entry: str = "") -> str:
        return os.path.join(top, *(f.name for f in frames[1:]), entry)

    def failed(frame: _Frame, entry: str, e: OSError) -> None:
        frame.skip.add(entry)
        left.append((e.errno or errno.EIO, f"{where(entry)}: {e.strerror or e}"))

    try:
        frames[0].names = _listing(fd)
        while True:
            frame = frames[-1]
            child = None
            while frame.names and child is None:
                entry = frame.names.pop()
                if entry in frame.skip:
                    continue
                try:
                    st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
                    if not stat.S_ISDIR(st.st_mode):
                        os.unlink(entry, dir_fd=fd)
                    elif st.st_dev != device or (st.st_dev, st.st_ino) in mounts:
                        failed(frame, entry, OSError(errno.EXDEV, "another file system is mounted here: not entered"))
                    else:
                        child = (entry, st, _open_dir(entry, fd, st))
                except FileNotFoundError:
                    continue
                except OSError as e:
                    failed(frame, entry, e)
            if child is not None:  # one level down: only the current folder stays open
                entry, st, down = child
                os.close(fd)
                fd = down
                frames.append(_Frame(entry, (st.st_dev, st.st_ino)))
                try:
                    frames[-1].names = _listing(fd)
                except OSError as e:
                    failed(frames[-1], "", e)
                continue
            if frame.rescans < _RESCANS:  # written to while it was emptied? take what came once more
                frame.rescans += 1
                try:
                    frame.names = [n for n in _listing(fd) if n not in frame.skip]
                except OSError:
                    frame.names = []
                if frame.names:
                    continue
            if len(frames) == 1:
                return left
            frames.pop()
            up = os.open("..", _DIR_FLAGS, dir_fd=fd)
            seen = os.fstat(up)
            if (seen.st_dev, seen.st_ino) != frames[-1].ident:
                os.close(up)
                left.append((errno.ESTALE, f"{where()}: moved while it was removed; run again"))
                return left
            os.close(fd)
            fd = up
            try:
                os.rmdir(frame.name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError as e:
                frames[-1].skip.add(frame.name)
                if not frame.skip:  # else what is left inside was named already
                    left.append((e.errno or errno.EIO, f"{where(frame.name)}: {e.strerror}"))
    finally:
        os.close(fd)
