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
import math
import os
import socket
import stat
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.core import contract, files

SLOTS_VAR, QUEUE_VAR = contract.CHECK_SLOTS, contract.CHECK_QUEUE
DURATIONS = "durations.jsonl"
RECENT = 20  # durations the expected wait is the median of
TICKET_MAX = 4096  # bytes of a ticket read, at most
SOCKET_SUFFIX = ".sock"  # a queue named so is a server's, even before its socket is there

# The queue server's protocol: one JSON object per line, both ways.
LINE_MAX = 4096  # bytes of one line, its newline included
DEPTH_MAX = 2  # nesting of objects and lists in a line (the messages themselves are flat)
LABEL_MAX = 200  # characters of a check's label
INT_DIGITS = 15  # digits of a whole number, at most


class ProtocolError(ValueError):
    """A line of the queue's protocol that is not one: too long, too deep, not JSON, or not an object."""


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


def encode(message: dict[str, Any]) -> bytes:
    """One protocol line: ``message`` as compact JSON (ASCII, finite numbers only) and a newline."""
    line = json.dumps(message, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode() + b"\n"
    if len(line) > LINE_MAX:
        raise ProtocolError(f"a message of {len(line)} bytes: at most {LINE_MAX}")
    return line


def _depth(text: str) -> int:
    """How deeply the objects and lists of the JSON ``text`` nest (brackets inside strings not counted)."""
    deepest = depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > INT_DIGITS:
        raise ProtocolError("a number with too many digits")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ProtocolError("a number out of range")
    return value


def _no_constant(name: str) -> Any:
    raise ProtocolError(f"{name} is not a number")


def decode(line: bytes) -> dict[str, Any]:
    """The message in one protocol line, or :class:`ProtocolError`: at most :data:`LINE_MAX` bytes of UTF-8,
    nested at most :data:`DEPTH_MAX` deep, a JSON object of finite numbers. Never anything else raised."""
    if len(line) > LINE_MAX:
        raise ProtocolError(f"a line longer than {LINE_MAX} bytes")
    try:
        text = line.decode("utf-8")
        if _depth(text) > DEPTH_MAX:
            raise ProtocolError("nested too deeply")
        value = json.loads(text, parse_int=_bounded_int, parse_float=_finite_float, parse_constant=_no_constant)
    except ProtocolError:
        raise
    except (ValueError, RecursionError, MemoryError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ProtocolError(f"not a JSON line ({type(e).__name__})") from None
    if not isinstance(value, dict):
        raise ProtocolError("not a JSON object")
    return value


def whole(message: dict[str, Any], key: str, low: int, high: int) -> int:
    """``message[key]`` when it is a whole number (not a bool) in ``[low, high]``; else :class:`ProtocolError`."""
    value = message.get(key)
    if type(value) is not int or not low <= value <= high:
        raise ProtocolError(f"{key} is not a whole number in [{low}, {high}]")
    return value


def seconds(message: dict[str, Any], key: str, high: float = 1e7) -> float | None:
    """``message[key]`` when it is None or a number of seconds in ``[0, high]``; else :class:`ProtocolError`."""
    value = message.get(key)
    if value is None:
        return None
    if type(value) not in (int, float) or not 0 <= value <= high:
        raise ProtocolError(f"{key} is not a number of seconds")
    return float(value)


def waiting(message: dict[str, Any]) -> Waiting:
    """The :class:`Waiting` of a server's ``wait`` message (checked)."""
    return Waiting(whole(message, "place", 1, 1 << 20), whole(message, "running", 0, 1 << 20),
                   whole(message, "slots", 1, 1 << 20), seconds(message, "expected_s"))


def waiting_message(w: Waiting) -> dict[str, Any]:
    return {"event": "wait", "place": w.place, "running": w.running, "slots": w.slots,
            "expected_s": None if w.expected_s is None else round(w.expected_s, 1)}


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------------------
# The queue server's client


class _Lines:
    """Protocol lines read from a socket, each bounded."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buffer = sock, b""

    def next(self) -> dict[str, Any] | None:
        """The next message, None when the server closed the connection."""
        while b"\n" not in self.buffer:
            if len(self.buffer) >= LINE_MAX:
                raise ProtocolError(f"a line longer than {LINE_MAX} bytes")
            chunk = self.sock.recv(LINE_MAX)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return decode(line + b"\n")


class ServerQueue:
    """Slots from the queue server at the Unix socket ``path`` (:mod:`labkit.workshop.checkqueue`)."""

    def __init__(self, path: str | os.PathLike, connect_s: float = 5.0, silent_s: float = 60.0,
                 retry_s: float = 2.0, give_up_s: float = 1800.0) -> None:
        self.path = Path(path)
        self.connect_s, self.silent_s, self.retry_s, self.give_up_s = connect_s, silent_s, retry_s, give_up_s

    def _without(self, label: str, why: str, say: Callable[[str], None]) -> None:
        say(f"{label}: {why}; the check runs now, without a slot")

    def _take(self, label: str, on_wait: Callable[[Waiting], None] | None,
              say: Callable[[str], None]) -> tuple[socket.socket, _Lines, dict[str, Any]] | None:
        """A connection holding a slot, with the server's grant; None when the check runs without one (said)."""
        told = False
        until = time.monotonic() + self.give_up_s
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.settimeout(self.connect_s)
                sock.connect(str(self.path))
            except OSError as e:
                sock.close()
                self._without(label, f"the class's check queue at {self.path} cannot be reached "
                                     f"({e.strerror or e})", say)
                return None
            retry = False
            try:
                sock.sendall(encode({"op": "take", "label": label[:LABEL_MAX]}))
                sock.settimeout(self.silent_s)  # the server tells each waiter where it stands at least this often
                lines = _Lines(sock)
                while True:
                    message = lines.next()
                    if message is None:
                        raise ConnectionError("it closed the connection")
                    event = message.get("event")
                    if event == "wait":
                        if on_wait:
                            on_wait(waiting(message))
                    elif event == "granted":
                        return sock, lines, message
                    elif event == "refused":
                        reason = str(message.get("reason", ""))[:LABEL_MAX]
                        if message.get("retry") is not True or time.monotonic() > until:
                            sock.close()
                            self._without(label, f"the class's check queue refused it ({reason})", say)
                            return None
                        if not told:
                            say(f"{label}: {reason}; this check waits for it")
                            told = True
                        retry = True
                        break
            except (OSError, ProtocolError) as e:
                sock.close()
                self._without(label, f"the class's check queue stopped answering ({e})", say)
                return None
            except BaseException:
                sock.close()
                raise
            sock.close()
            if retry:
                time.sleep(self.retry_s)

    @contextmanager
    def slot(self, label: str, on_wait: Callable[[Waiting], None] | None = None,
             say: Callable[[str], None] | None = None) -> Iterator[float]:
        """Hold a slot of the server's while the block runs; yields the seconds waited for it. The slot is freed
        when the block ends (or the process does); a slot held past the server's longest hold is taken back,
        and the check goes on without it (said). Unreachable, the server is no reason to fail: the block runs."""
        say = say or _say
        began = time.monotonic()
        held = self._take(label, on_wait, say)
        waited = time.monotonic() - began
        if held is None:
            yield waited
            return
        sock, lines, grant = held
        sock.settimeout(None)
        watcher = threading.Thread(target=self._watch, args=(lines, label, say), daemon=True)
        watcher.start()
        ok = False
        try:
            yield waited
            ok = True
        finally:
            try:
                if ok:  # a check that ended normally: its duration counts towards the expected wait
                    sock.sendall(encode({"op": "done"}))
                    watcher.join(2.0)
            except OSError:
                pass
            finally:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                watcher.join(1.0)
                sock.close()

    @staticmethod
    def _watch(lines: _Lines, label: str, say: Callable[[str], None]) -> None:
        """While a slot is held: say when the server takes it back."""
        try:
            while (message := lines.next()) is not None:
                if message.get("event") == "revoked":
                    held, most = seconds(message, "held_s"), seconds(message, "max_hold_s")
                    say(f"{label}: the check slot was taken back after {held or 0:.0f} s (the queue's longest hold is "
                        f"{most or 0:.0f} s); the check goes on without it")
                    return
                if message.get("event") == "done":
                    return
        except (OSError, ProtocolError):
            return


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
