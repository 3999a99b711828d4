"""What a workshop account's uid leaves behind on the machine, found and removed for ``down``: its processes, its
entries in the temporary and lock folders, its SysV IPC objects and POSIX message queues, its cron and ``at``
jobs. Entries are found without following links and removed by :func:`labkit.core.files.remove_tree`.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import stat
from collections.abc import Iterable
from pathlib import Path

import psutil

from labkit.core import proc


class LeftoverError(RuntimeError):
    """A process of a uid still runs after SIGKILL."""


TEMP_DIRS = (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))  # where learners' processes leave files
LOCK_DIRS = (Path("/run/lock"), Path("/var/lock"))  # the second is often a link to the first
MQUEUE = Path("/dev/mqueue")  # POSIX message queues, where that file system is mounted
SYSVIPC = Path("/proc/sysvipc")
IPC_RMID = 0
KINDS = {"shm": "shared memory segment", "sem": "semaphore set", "msg": "message queue"}
JOB_SPOOLS = (Path("/var/spool/cron/crontabs"), Path("/var/spool/cron/atjobs"), Path("/var/spool/cron"),
              Path("/var/spool/at"))


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
        raise LeftoverError("still running after SIGKILL: " + ", ".join(str(p.pid) for p in left))


def places() -> list[Path]:
    """The temporary and lock folders and the POSIX message queues' (each once: ``/var/lock`` is often a link)."""
    seen, found = set(), []
    for place in (*TEMP_DIRS, *LOCK_DIRS, MQUEUE):
        try:
            info = place.stat()
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and (info.st_dev, info.st_ino) not in seen:
            seen.add((info.st_dev, info.st_ino))
            found.append(place)
    return found


def _entries(folder: Path) -> list[tuple[Path, os.stat_result]]:
    try:
        names = os.listdir(folder)
    except OSError:
        return []
    found = []
    for name in names:
        try:
            found.append((folder / name, os.lstat(folder / name)))
        except OSError:
            continue
    return found


def temp_files(uids: set[int], places_: Iterable[Path] | None = None) -> list[Path]:
    """Entries owned by ``uids`` directly in the temporary, lock and message queue folders (:func:`places`), or
    in a sticky folder of root's that everyone writes directly in one of them (``/tmp/.X11-unix``)."""
    found = []
    for place in places() if places_ is None else places_:
        for entry, info in _entries(place):
            if info.st_uid in uids:
                found.append(entry)
            elif (info.st_uid == 0 and stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX
                  and info.st_mode & 0o002):
                found += [inner for inner, got in _entries(entry) if got.st_uid in uids]
    return found


def ipc_objects(uids: set[int], folder: Path = SYSVIPC) -> list[tuple[str, int, int]]:
    """SysV shared memory segments, semaphore sets and message queues (``shm``, ``sem``, ``msg``) that one of
    ``uids`` owns or made: ``(kind, id, uid)``, read from ``/proc/sysvipc`` by its header line."""
    found = []
    for kind in ("shm", "sem", "msg"):
        try:
            lines = (folder / kind).read_text().splitlines()
        except OSError:
            continue
        head = lines[0].split() if lines else []
        if len(head) < 2 or "uid" not in head:
            continue
        for line in lines[1:]:
            row = dict(zip(head, line.split(), strict=False))
            try:
                owners = {int(row["uid"]), int(row.get("cuid", row["uid"]))} & uids
                ident = int(row[head[1]])
            except (KeyError, ValueError):
                continue
            if owners:
                found.append((kind, ident, min(owners)))
    return found


def remove_ipc(kind: str, ident: int) -> None:
    """Remove a SysV IPC object (``IPC_RMID``); one already gone is nothing to do."""
    libc = ctypes.CDLL(None, use_errno=True)
    if kind == "shm":
        done = libc.shmctl(ctypes.c_int(ident), ctypes.c_int(IPC_RMID), None)
    elif kind == "sem":
        done = libc.semctl(ctypes.c_int(ident), ctypes.c_int(0), ctypes.c_int(IPC_RMID))
    elif kind == "msg":
        done = libc.msgctl(ctypes.c_int(ident), ctypes.c_int(IPC_RMID), None)
    else:
        raise ValueError(f"no SysV IPC kind {kind!r}")
    err = ctypes.get_errno()
    if done != 0 and err not in (errno.EINVAL, errno.EIDRM):
        raise OSError(err, os.strerror(err), f"{kind} {ident}")


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
