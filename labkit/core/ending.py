"""Ending processes for good: every process of a user id, and single processes by pid without signalling a
process that took over a reused pid.

A scan of ``/proc`` that kills what it finds misses a process that forks and exits faster than the scan (each
pid lives a millisecond). :func:`kill_as` does not scan: a child drops to the user id (``setresuid``, no
capability left) and calls ``kill(-1, SIGKILL)``, and the kernel signals every process that user id may signal
(its real or saved uid is the user's) in one pass over the process table, during which no process can fork:
a child forked before the pass is signalled in it, and a parent with SIGKILL pending forks no more.
:func:`any_left` asks the kernel, not ``/proc``, whether the user id still has a process: a child of that uid
with ``RLIMIT_NPROC`` 2 cannot fork while another one exists. :func:`end_uid` kills until none is left, or says
what is.

:func:`signal_pid` signals a pid through a pidfd (``pidfd_open``): the check ``belongs(pid)`` is made while the
process is held, so a pid that was reused in between is never signalled.
"""

from __future__ import annotations

import errno
import os
import resource
import signal
import time
from collections.abc import Callable, Iterable


def _status(pid: str) -> tuple[str, int, set[int]] | None:
    """A process's state letter, parent pid and real, effective and saved uids (None: gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    state, parent, uids = "", 0, set()
    for line in text.splitlines():
        words = line.split()
        if line.startswith("State:") and len(words) > 1:
            state = words[1]
        elif line.startswith("PPid:") and len(words) > 1 and words[1].isdigit():
            parent = int(words[1])
        elif line.startswith("Uid:"):
            uids = {int(v) for v in words[1:4]}
    return state, parent, uids


def _processes(uids: Iterable[int]) -> list[tuple[int, str, int, set[int]]]:
    """``(pid, state, parent, uids found)`` of the processes with one of ``uids`` (real, effective or saved)."""
    wanted = set(uids)
    found = []
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        status = _status(pid)
        if status is not None and status[2] & wanted:
            found.append((int(pid), status[0], status[1], status[2] & wanted))
    return found


def of_uids(uids: Iterable[int], zombies: bool = False) -> dict[int, list[int]]:
    """``{uid: [pid, ...]}`` of the processes whose real, effective or saved uid is one of ``uids`` (zombies
    too when asked: a zombie keeps its uid until its parent reaps it)."""
    found: dict[int, list[int]] = {}
    for pid, state, _, hits in _processes(uids):
        if state != "Z" or zombies:
            for uid in hits:
                found.setdefault(uid, []).append(pid)
    return found


def reap_ours(uids: Iterable[int]) -> None:
    """Reap the dead processes of ``uids`` whose parent is this process (no one else can)."""
    for pid, state, parent, _ in _processes(uids):
        if state == "Z" and parent == os.getpid():
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue


def _capabilities_left() -> bool:
    """Does this process hold any effective or permitted capability? (read without Python's file objects)"""
    fd = os.open("/proc/self/status", os.O_RDONLY | os.O_CLOEXEC)
    try:
        text = b""
        while chunk := os.read(fd, 4096):
            text += chunk
    finally:
        os.close(fd)
    for line in text.splitlines():
        if line.startswith((b"CapEff:", b"CapPrm:", b"CapAmb:")) and int(line.split()[1], 16):
            return True
    return False


def _as_uid(uid: int, gid: int, act: Callable[[], int]) -> int:
    """``act()``'s exit code, run in a child that *is* ``uid`` (and ``gid``, no supplementary group, no capability:
    otherwise it runs nothing and exits 2). Killed before it exits (by a process of ``uid``): -1."""
    if uid <= 0 or gid <= 0:
        raise ValueError(f"refusing to act as uid {uid} (gid {gid})")
    pid = os.fork()
    if pid == 0:  # the child: nothing but system calls until it exits
        code = 2
        try:
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            if os.getresuid() == (uid, uid, uid) and os.getresgid() == (gid, gid, gid) and not os.getgroups() \
                    and not _capabilities_left():
                code = act()
        finally:
            os._exit(code)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else -1


def _kill_all() -> int:
    try:
        os.kill(-1, signal.SIGKILL)  # every process this uid may signal, never this one
    except ProcessLookupError:
        pass
    return 0


def _alone() -> int:
    """0 when no other process has this real uid: with ``RLIMIT_NPROC`` 2 (this one and the child), ``fork``
    fails while a third one exists (the kernel's count of the uid's processes, also those not yet reaped, also in
    other namespaces)."""
    resource.setrlimit(resource.RLIMIT_NPROC, (2, 2))
    try:
        child = os.fork()
    except BlockingIOError:
        return 1
    if child == 0:
        os._exit(0)
    os.waitpid(child, 0)
    return 0


def kill_as(uid: int, gid: int) -> bool:
    """SIGKILL every process of ``uid`` at once, sent by a child that is ``uid``. True when the child sent it;
    False when it could not (a process of ``uid`` killed it first, or it could not drop to ``uid``): try again."""
    return _as_uid(uid, gid, _kill_all) == 0


def any_left(uid: int, gid: int) -> bool:
    """Is any process of ``uid`` there (real uid; one not yet reaped counts)? The kernel's count, not a scan:
    a process that forks every millisecond is never missed."""
    code = _as_uid(uid, gid, _alone)
    if code not in (0, 1):
        raise OSError(errno.EPERM, f"could not ask the kernel as uid {uid} (exit {code})")
    return code == 1


def end_uids(ids: dict[int, int], timeout: float = 10.0) -> dict[int, str]:
    """SIGKILL every process of each uid of ``ids`` (``{uid: gid}``, :func:`kill_as`), all uids together, for up
    to ``timeout`` seconds, until none of the uid is alive: after a SIGKILL that reached them all, ``/proc``
    shows none alive (real, effective or saved uid), and the kernel counts none (:func:`any_left`) or only the
    dead that their parents have not reaped yet (those of this process are reaped here). ``{uid: what is
    left}`` for the uids of which something is (empty: nothing is)."""
    deadline = time.monotonic() + timeout
    left = dict(ids)
    while left:
        sent = {uid: kill_as(uid, gid) for uid, gid in left.items()}
        pause = min(time.monotonic() + 0.3, deadline)  # the dying take a moment
        while left:
            reap_ours(left)
            live, dead = of_uids(left), of_uids(left, zombies=True)
            left = {uid: gid for uid, gid in left.items()
                    if not sent[uid] or uid in live or (any_left(uid, gid) and uid not in dead)}
            if time.monotonic() > pause:
                break
            time.sleep(0.01)
        if left and time.monotonic() > deadline:
            break
    said = {}
    for uid in left:
        live = sorted(of_uids([uid]).get(uid, []))
        said[uid] = (f"{len(live)} processes of uid {uid} alive after SIGKILL (pids {live[:10]})" if live else
                     f"the kernel still counts processes of uid {uid} that /proc does not show")
    return said


def end_uid(uid: int, gid: int, timeout: float = 10.0) -> str | None:
    """:func:`end_uids` for one uid: None when nothing of it is left, else what is."""
    return end_uids({uid: gid}, timeout).get(uid)


def signal_pid(pid: int, belongs: Callable[[int], bool], sig: int = signal.SIGKILL) -> bool:
    """Send ``sig`` to ``pid`` when ``belongs(pid)`` says it is the process meant, checked while a pidfd holds
    the process (a pid reused meanwhile is not signalled). True when it was signalled."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError) as e:  # no pidfd (Linux before 5.3): only a check just before the signal
        if isinstance(e, OSError) and e.errno not in (errno.ENOSYS, errno.EINVAL):
            raise
        if not belongs(pid):
            return False
        try:
            os.kill(pid, sig)
            return True
        except ProcessLookupError:
            return False
    try:
        if not belongs(pid):  # while fd holds the process, pid names it: what belongs() read was about it
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)
