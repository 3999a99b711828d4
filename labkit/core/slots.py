"""A queue of slots for checks and assessments, so that a class that presses "check" at once does not thrash.

On a 2-core machine one check (2 ranks, 1 thread each) has the cores to itself; several at once all slow down
together and may overrun their budgets. With slots, a check takes a slot before it starts its ranks, and its
budget starts then; the others wait in order, each told its place and the expected wait.

Two kinds of queue, chosen by ``LABKIT_CHECK_QUEUE``:

* A **queue server** (:mod:`labkit.workshop.checkqueue`, a workshop's): ``LABKIT_CHECK_QUEUE`` names its Unix
  socket (a socket, or a path ending in ``.sock``). The server orders the checks by arrival, knows each client by
  the kernel's word (its uid and pid), gives each user one place, frees a slot when its check's connection closes
  and takes back one held too long. The protocol is one JSON object per line, at most :data:`LINE_MAX` bytes,
  both ways (:func:`encode`, :func:`decode`). When the server cannot be reached the check runs at once, without
  a slot, and says so.
* A **folder of tickets**, for one user on their own machine (``LABKIT_CHECK_SLOTS=1 labkit check ...``): one
  file per waiting or running check, named by the time it was taken; the first ``slots`` live tickets, in name
  order, run. A ticket is live while the process that took it runs (its pid and that process's start time,
  checked in ``/proc``) and the file is this user's: another user's ticket never counts, and a malformed one is
  ignored. A check that ends removes its ticket and appends its duration to ``durations.jsonl`` (this user's
  only), from which the expected wait is estimated. A process killed outright leaves a ticket that no longer
  counts, and the next waiter removes it.

Enabled by ``LABKIT_CHECK_SLOTS=N`` (the folder: ``LABKIT_CHECK_QUEUE``, default ``$LABKIT_CACHE/check-queue``),
or by ``LABKIT_CHECK_QUEUE`` naming a queue server (which has its own number of slots).
"""

from __future__ import annotations

import json
import os
import stat
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from labkit.core import contract, files
from labkit.core.slotserver import (  # noqa: F401 (the protocol's names, used by the server and the tests)
    LABEL_MAX,
    LINE_MAX,
    ProtocolError,
    ServerQueue,
    Waiting,
    decode,
    encode,
)

SLOTS_VAR, QUEUE_VAR = contract.CHECK_SLOTS, contract.CHECK_QUEUE
DURATIONS = "durations.jsonl"
RECENT = 20  # durations the expected wait is the median of
TICKET_MAX = 4096  # bytes of a ticket read, at most
SOCKET_SUFFIX = ".sock"  # a queue named so is a server's, even before its socket is there




# ---------------------------------------------------------------------------------------------------------------
# One user's folder of tickets


@dataclass(frozen=True)
class Ticket:
    path: Path
    pid: int
    started: str  # the process's start time in /proc/PID/stat: a reused pid does not match
    uid: int


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks since boot), or None when it does not exist."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        return text[text.rindex(")") + 2:].split()[19]
    except (OSError, ValueError, IndexError):
        return None


def _read(path: Path) -> Ticket | None:
    """The ticket at ``path`` when it is this user's, well formed, and its process still runs as this user.
    Anything else is no ticket: never an error."""
    try:
        info = os.lstat(path)
        me = os.geteuid()
        if not stat.S_ISREG(info.st_mode) or info.st_uid != me:
            return None
        data = json.loads(_head(path))
        if not isinstance(data, dict):
            return None
        pid, started = data.get("pid"), data.get("started")
        if type(pid) is not int or not 0 < pid < 1 << 22 or not isinstance(started, str):
            return None
        if os.stat(f"/proc/{pid}").st_uid != me or process_start(pid) != started:
            return None
        return Ticket(path, pid, started, me)
    except Exception:  # noqa: BLE001 - whatever a ticket holds, it must never stop a check
        return None


class SlotQueue:
    """``slots`` checks at a time through the tickets in ``folder`` (one user's)."""

    def __init__(self, folder: str | os.PathLike, slots: int, every: float = 0.5) -> None:
        if slots < 1:
            raise ValueError(f"check slots must be at least 1, got {slots}")
        self.folder, self.slots, self.every = Path(folder), slots, every

    def live(self) -> list[Ticket]:
        """The tickets that count, oldest first: this user's, of processes that still run."""
        out = []
        for path in sorted(self.folder.glob("*.ticket")):
            t = _read(path)
            if t is None:
                self._drop(path)
            else:
                out.append(t)
        return out

    def _drop(self, path: Path) -> None:
        """Remove a ticket of this user's that no longer counts (another user's is left alone)."""
        try:
            info = os.lstat(path)
            if info.st_uid == os.geteuid() and time.time() - info.st_mtime > 2:  # not one being written right now
                path.unlink()
        except OSError:
            pass

    def expected(self, place: int) -> float | None:
        """Seconds a check at ``place`` should wait: one median check per round of ``slots``."""
        took = []
        for line in _tail(self.folder / DURATIONS).splitlines()[-RECENT:]:
            try:
                value = decode(line.encode())["seconds"]
            except (ProtocolError, KeyError):
                continue  # a line cut by the tail, or one written by hand
            if type(value) in (int, float) and 0 < value < 1e7:
                took.append(float(value))
        return -(-place // self.slots) * statistics.median(took) if took else None

    @contextmanager
    def slot(self, label: str, on_wait: Callable[[Waiting], None] | None = None,
             say: Callable[[str], None] | None = None) -> Iterator[float]:
        """Hold a slot while the block runs; yields the seconds waited for it."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        me = os.getpid()
        name = f"{time.time_ns():020d}-{me}-{uuid.uuid4().hex[:6]}.ticket"
        path = self.folder / name
        files.write_json_atomic(path, {"pid": me, "started": process_start(me), "label": label})
        waited_from = time.monotonic()
        try:
            while True:
                live = self.live()
                mine = next((i for i, t in enumerate(live) if t.path == path), None)
                if mine is not None and mine < self.slots:
                    break
                if on_wait:
                    place = max(1, (len(live) if mine is None else mine) - self.slots + 1)
                    on_wait(Waiting(place, min(self.slots, len(live)), self.slots, self.expected(place)))
                time.sleep(self.every)
            waited = time.monotonic() - waited_from
            began = time.monotonic()
            yield waited
            took = max(0.01, round(time.monotonic() - began, 2))
            _append(self.folder / DURATIONS, json.dumps({"seconds": took, "label": label[:LABEL_MAX]}))
        finally:
            try:
                path.unlink()
            except OSError:
                pass


@contextmanager
def queued(label: str, queue: SlotQueue | ServerQueue | None = None) -> Iterator[float]:
    """A slot of ``queue`` (default: the one ``LABKIT_CHECK_SLOTS``/``LABKIT_CHECK_QUEUE`` ask for; none: at
    once), with the wait shown live (in a notebook, one line updated in place; in a terminal, on stderr).
    Yields the seconds waited."""
    from labkit.core import output, progress

    queue = queue if queue is not None else from_env(contract.settings().cache)
    if queue is None:
        yield 0.0
        return
    sink = progress.default_sink() if output.in_notebook() else output.ConsoleSink(sys.stderr)
    shown: list[Waiting] = []

    def on_wait(w: Waiting) -> None:
        if not shown:
            sink.line(f"{label}: {w}")
        elif w != shown[-1]:
            sink.progress(f"{label}: {w}")
        shown.append(w)

    with queue.slot(label, on_wait, sink.line) as waited:
        if shown:
            sink.line(f"{label}: got a check slot after {waited:.0f} s; it starts now")
        yield waited


def _head(path: Path, size: int = TICKET_MAX) -> str:
    """The first ``size`` bytes of a ticket (never through a link, never blocking on a pipe)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        return os.read(fd, size).decode(errors="replace") if stat.S_ISREG(os.fstat(fd).st_mode) else ""
    finally:
        os.close(fd)


def _tail(path: Path, size: int = 4096) -> str:
    """The last ``size`` bytes of ``path`` (never through a link)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        os.lseek(fd, max(0, os.fstat(fd).st_size - size), os.SEEK_SET)
        return os.read(fd, size).decode(errors="replace")
    except OSError:
        return ""
    finally:
        os.close(fd)


def _append(path: Path, line: str) -> None:
    """One line appended in one write (never through a link); the file is this user's alone."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    except OSError:
        return  # the estimate is best effort
    try:
        os.write(fd, (line + "\n").encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def is_server(queue: str | os.PathLike) -> bool:
    """Whether ``queue`` names a queue server: a Unix socket, or a path ending in ``.sock`` (its server may be
    starting, or stopped: a folder is never made there)."""
    if str(queue).endswith(SOCKET_SUFFIX):
        return True
    try:
        return stat.S_ISSOCK(os.stat(queue).st_mode)
    except OSError:
        return False


def from_env(cache: str | os.PathLike | None = None,
             environ: dict[str, str] | None = None) -> SlotQueue | ServerQueue | None:
    """The queue ``LABKIT_CHECK_SLOTS`` and ``LABKIT_CHECK_QUEUE`` ask for, or None (checks then start at once)."""
    settings = contract.Settings.from_env(os.environ if environ is None else environ)
    raw = (settings.check_slots or "").strip()
    try:
        slots = int(raw) if raw else None
    except ValueError:
        raise ValueError(f"{SLOTS_VAR}={raw!r}: give a whole number of slots, e.g. {SLOTS_VAR}=1") from None
    if settings.check_queue and is_server(settings.check_queue):
        return ServerQueue(settings.check_queue)  # the server has its own number of slots
    if slots is None:
        return None
    folder = settings.check_queue or Path(cache or Path.home() / ".cache" / "labkit") / "check-queue"
    return SlotQueue(folder, slots)
