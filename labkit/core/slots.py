"""A queue of slots for checks and assessments, so that a class that presses "check" at once does not thrash.

On a 2-core machine one check (2 ranks, 1 thread each) has the cores to itself; several at once all slow down
together and may overrun their budgets. With slots, a check takes a slot before it starts its ranks, and its
budget starts then; the others wait in order, each told its place and the expected wait.

The queue is a folder of *tickets*, one file per waiting or running check, named by the time it was taken.
The first ``slots`` live tickets, in name order, run; the rest wait. A ticket is live while the process
that took it runs (its pid and that process's start time, checked in ``/proc``) and the file belongs to that
process's user. In a shared folder, sticky like ``/tmp`` (a workshop's: each user can remove only their own
tickets), only the oldest live ticket of each user counts, so a learner holds at most one place. A
check that ends removes its ticket and appends its duration to ``durations.jsonl``, from which the expected
wait is estimated. A process killed outright leaves a ticket that no longer counts, and the next waiter
removes it when it may.

Enabled by ``LABKIT_CHECK_SLOTS=N`` (the folder: ``LABKIT_CHECK_QUEUE``, default ``$LABKIT_CACHE/check-queue``).
"""

from __future__ import annotations

import json
import os
import stat
import statistics
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from labkit.core import contract, files

SLOTS_VAR, QUEUE_VAR = contract.CHECK_SLOTS, contract.CHECK_QUEUE
DURATIONS = "durations.jsonl"
RECENT = 20  # durations the expected wait is the median of


@dataclass(frozen=True)
class Waiting:
    """Where a waiting check stands."""

    place: int  # 1: the next to run
    running: int
    slots: int
    expected_s: float | None  # the expected wait, from recent checks' durations; None before any ended

    def __str__(self) -> str:
        wait = f", about {self.expected_s:.0f} s" if self.expected_s is not None else ""
        return (f"waiting for a check slot: place {self.place} in the queue, {self.running} of {self.slots} "
                f"slot(s) busy{wait}")


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
    except OSError:
        return None
    return text[text.rindex(")") + 2:].split()[19]


def _read(path: Path) -> Ticket | None:
    """The ticket at ``path`` when it is well formed and its process still runs as its owner."""
    try:
        info = os.lstat(path)
        data = json.loads(_head(path)) if path.is_file() and not path.is_symlink() else None
        pid, started = int(data["pid"]), str(data["started"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    try:
        owner = os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    if owner != info.st_uid or process_start(pid) != started:
        return None
    return Ticket(path, pid, started, info.st_uid)


class SlotQueue:
    """``slots`` checks at a time through the tickets in ``folder``."""

    def __init__(self, folder: str | os.PathLike, slots: int, every: float = 0.5) -> None:
        if slots < 1:
            raise ValueError(f"check slots must be at least 1, got {slots}")
        self.folder, self.slots, self.every = Path(folder), slots, every

    def shared(self) -> bool:
        """A sticky folder is shared by several users: one place each."""
        try:
            return bool(self.folder.stat().st_mode & stat.S_ISVTX)
        except OSError:
            return False

    def live(self) -> list[Ticket]:
        """The tickets that count, oldest first, of processes that still run (one per user in a shared folder)."""
        one_each = self.shared()
        seen: set[int] = set()
        out = []
        for path in sorted(self.folder.glob("*.ticket")):
            t = _read(path)
            if t is None:
                self._drop(path)
                continue
            if one_each and t.uid in seen:
                continue
            seen.add(t.uid)
            out.append(t)
        return out

    def _drop(self, path: Path) -> None:
        """Remove a ticket that no longer counts, when this user may (a sticky folder refuses others')."""
        try:
            if time.time() - os.lstat(path).st_mtime > 2:  # not one being written right now
                path.unlink()
        except OSError:
            pass

    def expected(self, place: int) -> float | None:
        """Seconds a check at ``place`` should wait: one median check per round of ``slots``."""
        took = []
        for line in _tail(self.folder / DURATIONS).splitlines()[-RECENT:]:
            try:
                took.append(float(json.loads(line)["seconds"]))
            except (ValueError, KeyError, TypeError):
                continue  # a line cut by the tail, or one a learner wrote by hand
        return -(-place // self.slots) * statistics.median(took) if took else None

    @contextmanager
    def slot(self, label: str, on_wait: Callable[[Waiting], None] | None = None) -> Iterator[float]:
        """Hold a slot while the block runs; yields the seconds waited for it."""
        self.folder.mkdir(parents=True, exist_ok=True)
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
                if on_wait:  # (not counted yet: an older ticket of this user's, in a shared queue, goes first)
                    place = max(1, (len(live) if mine is None else mine) - self.slots + 1)
                    on_wait(Waiting(place, min(self.slots, len(live)), self.slots, self.expected(place)))
                time.sleep(self.every)
            waited = time.monotonic() - waited_from
            began = time.monotonic()
            yield waited
            _append(self.folder / DURATIONS, json.dumps({"seconds": round(time.monotonic() - began, 2),
                                                         "label": label}))
        finally:
            try:
                path.unlink()
            except OSError:
                pass


@contextmanager
def queued(label: str, queue: SlotQueue | None = None) -> Iterator[float]:
    """A slot of ``queue`` (default: the one ``LABKIT_CHECK_SLOTS`` asks for; none: at once), with the wait shown
    live (in a notebook, one line updated in place; in a terminal, on stderr). Yields the seconds waited."""
    import sys

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

    with queue.slot(label, on_wait) as waited:
        if shown:
            sink.line(f"{label}: got a check slot after {waited:.0f} s; it starts now")
        yield waited


def _head(path: Path, size: int = 4096) -> str:
    """The first ``size`` bytes of a ticket (another user's may be huge; never through a link)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        return os.read(fd, size).decode(errors="replace") if stat.S_ISREG(os.fstat(fd).st_mode) else ""
    finally:
        os.close(fd)


def _tail(path: Path, size: int = 4096) -> str:
    """The last ``size`` bytes of ``path`` (never through a link; a shared file may have been made huge)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        os.lseek(fd, max(0, os.fstat(fd).st_size - size), os.SEEK_SET)
        return os.read(fd, size).decode(errors="replace")
    finally:
        os.close(fd)


def _append(path: Path, line: str) -> None:
    """One line appended in one write (never through a link: the folder may be shared)."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW
    try:  # O_CREAT only for a file that is not there: a sticky folder refuses it on another user's file
        fd = os.open(path, flags)
    except FileNotFoundError:
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError:
            return
    except OSError:
        return  # the estimate is best effort
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def from_env(cache: str | os.PathLike | None = None, environ: dict[str, str] | None = None) -> SlotQueue | None:
    """The queue ``LABKIT_CHECK_SLOTS`` asks for, or None (checks then start at once)."""
    settings = contract.Settings.from_env(os.environ if environ is None else environ)
    raw = (settings.check_slots or "").strip()
    if not raw:
        return None
    try:
        slots = int(raw)
    except ValueError:
        raise ValueError(f"{SLOTS_VAR}={raw!r}: give a whole number of slots, e.g. {SLOTS_VAR}=1") from None
    folder = settings.check_queue or Path(cache or Path.home() / ".cache" / "labkit") / "check-queue"
    return SlotQueue(folder, slots)
