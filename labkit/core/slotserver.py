"""The check queue's server side as its clients see it: the protocol (one JSON object per line, at most
:data:`LINE_MAX` bytes, both ways: :func:`encode`, :func:`decode`, each message checked bounded) and
:class:`ServerQueue`, the client of a queue server (:mod:`labkit.workshop.checkqueue`) that a check holds a slot
of. :mod:`labkit.core.slots` chooses between this and a folder of tickets.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
