"""The class's check queue: a small server on a Unix socket that hands out check slots, in order of arrival.

Every learner's check (and assessment) asks it for a slot before it starts its ranks (:mod:`labkit.core.slots`,
through ``LABKIT_CHECK_QUEUE``); its budget starts when the slot is granted. Run by the hub as a service of its
own, as the workshop's instructor (never root)::

    python -m labkit.workshop.checkqueue --socket PATH --slots N [--max-hold SECONDS]

What a learner can and cannot do to it:

* **Who** asks is the kernel's word: each connection's uid and pid (``SO_PEERCRED``), never what it sends.
* **Order** is the order in which requests arrived, kept in memory: no name, number or label a client sends
  moves it.
* **One place per user**: a second request from a uid that is already waiting or holding a slot is refused
  (its client waits and asks again).
* **A slot is held only by a live check, and not for long**: it is freed when the holder's connection closes (a
  killed check frees it at once), and taken back, the holder told, after ``--max-hold`` seconds (default
  :func:`default_max_hold`: the longest check's budget plus slack).
* **The expected wait is the server's**: the durations of recent checks that ended normally, measured by the
  server, each clamped to ``(0, max hold]``, the latest of each user only.
* **Bounded input**: one line of at most :data:`labkit.core.slotserver.LINE_MAX` bytes, nested at most
  :data:`labkit.core.slotserver.DEPTH_MAX` deep, finite numbers; anything else closes that client only. A client
  must ask within :data:`REQUEST_S` seconds; a user may keep :data:`PER_USER` connections and all together
  :data:`CONNECTIONS`.

The queue is cooperative: a learner who unsets the variables runs at once, within their own limits.

Protocol (one JSON object per line). A client sends ``{"op": "take", "label": "..."}``; then, when its check
ended, ``{"op": "done"}`` (before its grant: it leaves the queue). The server answers ``{"event": "wait", "place",
"running", "slots", "expected_s"}`` whenever that changes (and every :data:`HEARTBEAT_S` s), ``{"event":
"granted", "waited_s", "max_hold_s"}``, ``{"event": "revoked", "held_s", "max_hold_s"}``, ``{"event": "done",
"held_s"}``, or ``{"event": "refused", "reason", "retry"}`` before it closes a connection.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import os
import signal
import socket
import stat
import statistics
import struct
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.core import slots, slotserver
from labkit.core.slotserver import ProtocolError
from labkit.course import labs

SLACK_S = 60.0  # beyond a check's own budget: its start-up, its ranks' stack dumps and their ending
def default_max_hold() -> float:
    """Seconds a slot may be held by default: the longest check's budget of the lab registry, plus slack."""
    return max(lab.timeout for lab in labs.LABS.values()) + SLACK_S
REQUEST_S = 5.0  # a client asks within this many seconds of connecting, or is dropped
HEARTBEAT_S = 15.0  # each waiter hears where it stands at least this often (its client gives up after 60 s)
PER_USER = 4  # connections one uid may keep open
CONNECTIONS = 256  # connections all together
BUFFERED_MAX = 64 * 1024  # bytes waiting to be sent to a client that does not read: it is dropped

log = logging.getLogger("labkit.checkqueue")


def peer(sock: socket.socket) -> tuple[int, int]:
    """The (uid, pid) of the process at the other end of the Unix socket ``sock``, as the kernel knows it."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", raw)
    return uid, pid


def request(line: bytes) -> tuple[str, str]:
    """The (op, label) of a client's line, checked: :class:`ProtocolError` for anything else."""
    message = slotserver.decode(line)
    if set(message) - {"op", "label"}:
        raise ProtocolError("unknown keys")
    op, label = message.get("op"), message.get("label", "")
    if op not in ("take", "done"):
        raise ProtocolError("op is take or done")
    if not isinstance(label, str) or len(label) > slotserver.LABEL_MAX:
        raise ProtocolError(f"label is text of at most {slotserver.LABEL_MAX} characters")
    return op, "".join(ch if ch.isprintable() else "?" for ch in label)


@dataclass(eq=False)
class Client:
    """One connection: who it is (the kernel's word) and where it stands."""

    uid: int
    pid: int
    writer: asyncio.StreamWriter
    label: str = ""
    state: str = "new"  # new, waiting, holding, gone
    arrived: float = 0.0
    granted: float = 0.0
    shown: slotserver.Waiting | None = None
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)

    def __str__(self) -> str:
        return f"uid {self.uid} pid {self.pid}" + (f" ({self.label})" if self.label else "")


class CheckQueue:
    """``slots`` slots, waiters in order of arrival, one place per uid, slots held at most ``max_hold`` s."""

    def __init__(self, slots_: int, max_hold: float | None = None, request_s: float = REQUEST_S,
                 per_user: int = PER_USER, connections: int = CONNECTIONS, heartbeat_s: float = HEARTBEAT_S) -> None:
        if type(slots_) is not int or slots_ < 1:
            raise ValueError(f"slots must be a whole number of at least 1, got {slots_!r}")
        max_hold = default_max_hold() if max_hold is None else max_hold
        if not (math.isfinite(max_hold) and max_hold > 0):
            raise ValueError(f"the longest hold must be a number of seconds above 0, got {max_hold!r}")
        self.slots, self.max_hold, self.request_s = slots_, float(max_hold), request_s
        self.per_user, self.connections, self.heartbeat_s = per_user, connections, heartbeat_s
        self.waiting: list[Client] = []  # in order of arrival
        self.holding: list[Client] = []
        self.places: dict[int, Client] = {}  # uid -> its one place, waiting or holding
        self.open: dict[int, int] = {}  # uid -> its connections
        self.durations: OrderedDict[int, float] = OrderedDict()  # uid -> its latest finished check's hold
        self.clients: set[Client] = set()  # every open connection
        self.stopping = False

    # what the queue knows -------------------------------------------------------------------------------------

    def expected(self, place: int) -> float | None:
        """Seconds a waiter at ``place`` should wait: one median check per round of slots."""
        if not self.durations:
            return None
        return -(-place // self.slots) * statistics.median(self.durations.values())

    def status(self) -> dict[str, Any]:
        return {"slots": self.slots, "holding": [str(c) for c in self.holding],
                "waiting": [str(c) for c in self.waiting], "durations": list(self.durations.values())}

    # sending ------------------------------------------------------------------------------------------------

    def _send(self, client: Client, message: dict[str, Any]) -> None:
        transport = client.writer.transport
        if transport.is_closing():
            return
        if transport.get_write_buffer_size() > BUFFERED_MAX:
            log.info("dropped %s: it does not read what it is sent", client)
            transport.abort()
            return
        client.writer.write(slotserver.encode(message))

    def _refuse(self, writer: asyncio.StreamWriter, reason: str, retry: bool) -> None:
        if not writer.transport.is_closing():
            with contextlib.suppress(OSError, RuntimeError):
                writer.write(slotserver.encode({"event": "refused", "reason": reason, "retry": retry}))
        writer.close()

    def _tell_waiters(self, always: bool = False) -> None:
        for k, client in enumerate(self.waiting, 1):
            w = slotserver.Waiting(k, len(self.holding), self.slots, self.expected(k))
            if always or w != client.shown:
                client.shown = w
                self._send(client, slotserver.waiting_message(w))

    # the queue's changes ------------------------------------------------------------------------------------

    def _arrive(self, client: Client, label: str) -> None:
        client.label, client.state, client.arrived = label, "waiting", time.monotonic()
        self.places[client.uid] = client
        self.waiting.append(client)
        self._advance()

    def _advance(self) -> None:
        """Grant free slots to the first waiters, then tell every waiter where it stands."""
        while self.waiting and len(self.holding) < self.slots and not self.stopping:
            client = self.waiting.pop(0)
            client.state, client.granted = "holding", time.monotonic()
            self.holding.append(client)
            client.timer = asyncio.get_running_loop().call_later(self.max_hold, self._revoke, client)
            log.info("granted a slot to %s after %.0f s", client, client.granted - client.arrived)
            self._send(client, {"event": "granted", "waited_s": round(client.granted - client.arrived, 2),
                                "max_hold_s": self.max_hold})
        self._tell_waiters()

    def _leave(self, client: Client, finished: bool = False) -> None:
        """``client`` leaves its place (its check ended, was killed, or was dropped); a finished check's hold
        counts towards the expected wait."""
        if client.state == "gone":
            return
        held = time.monotonic() - client.granted
        if client.state == "holding":
            self.holding.remove(client)
            if finished:
                self.durations.pop(client.uid, None)
                self.durations[client.uid] = min(max(held, 0.01), self.max_hold)
                while len(self.durations) > slots.RECENT:
                    self.durations.popitem(last=False)
            log.info("%s freed its slot after %.0f s%s", client, held, "" if finished else " (connection closed)")
        elif client.state == "waiting":
            self.waiting.remove(client)
        if client.timer is not None:
            client.timer.cancel()
        if self.places.get(client.uid) is client:
            del self.places[client.uid]
        client.state = "gone"
        self._advance()

    def _revoke(self, client: Client) -> None:
        """A slot held past the longest hold is taken back, its holder told; the next waiter gets it."""
        if client.state != "holding":
            return
        held = time.monotonic() - client.granted
        log.info("took back the slot of %s after %.0f s (the longest hold is %.0f s)", client, held, self.max_hold)
        self._send(client, {"event": "revoked", "held_s": round(held, 2), "max_hold_s": self.max_hold})
        client.writer.close()
        self._leave(client)

    # one connection -----------------------------------------------------------------------------------------

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            uid, pid = peer(writer.get_extra_info("socket"))
        except (OSError, struct.error, TypeError):
            writer.close()
            return
        if sum(self.open.values()) >= self.connections:
            self._refuse(writer, "the check queue is full: try again soon", retry=True)
            return
        if self.open.get(uid, 0) >= self.per_user:
            self._refuse(writer, f"uid {uid} has {self.per_user} connections to the check queue open already",
                         retry=True)
            return
        self.open[uid] = self.open.get(uid, 0) + 1
        client = Client(uid, pid, writer)
        self.clients.add(client)
        try:
            await self._converse(client, reader)
        except (ProtocolError, ValueError) as e:  # a line over the limit is a ValueError of the reader's
            log.info("dropped %s: %s", client, e)
            self._refuse(writer, f"not a request of the check queue's: {e}", retry=False)
        except asyncio.TimeoutError:
            log.info("dropped %s: no request within %.0f s", client, self.request_s)
            self._refuse(writer, f"no request within {self.request_s:.0f} s", retry=False)
        except (OSError, asyncio.IncompleteReadError):
            pass
        except Exception:  # noqa: BLE001 - one client's trouble never stops the queue
            log.exception("dropped %s after an unexpected error", client)
        finally:
            self.clients.discard(client)
            self._leave(client)
            self.open[uid] -= 1
            if not self.open[uid]:
                del self.open[uid]
            writer.close()

    async def _converse(self, client: Client, reader: asyncio.StreamReader) -> None:
        line = await asyncio.wait_for(reader.readline(), self.request_s)
        if not line.endswith(b"\n"):
            return  # closed before it asked
        op, label = request(line)
        if op != "take":
            raise ProtocolError("the first request is take")
        if client.uid in self.places:
            self._refuse(client.writer, "another check of this user's already has a place in the queue",
                         retry=True)
            return
        self._arrive(client, label)
        while True:
            line = await reader.readline()
            if not line.endswith(b"\n"):
                return  # closed: the check ended or was killed (a revoked holder's too)
            op, _ = request(line)
            if op != "done":
                raise ProtocolError("one take per connection")
            held = time.monotonic() - client.granted if client.state == "holding" else 0.0
            self._leave(client, finished=client.state == "holding")  # a waiter's done: it leaves the queue
            self._send(client, {"event": "done", "held_s": round(held, 2)})
            return

    # the server ---------------------------------------------------------------------------------------------

    async def serve(self, path: Path, stop: asyncio.Event) -> None:
        """Listen at ``path`` (mode 0666: its folder decides who reaches it) until ``stop`` is set; then close
        every connection and remove the socket."""
        _clear(path)
        server = await asyncio.start_unix_server(self.handle, path=str(path), limit=slotserver.LINE_MAX, backlog=64)
        made = os.stat(path)
        os.chmod(path, 0o666)
        log.info("listening at %s: %d slot(s), the longest hold %.0f s", path, self.slots, self.max_hold)
        beat = asyncio.get_running_loop().create_task(self._heartbeat())
        try:
            await stop.wait()
        finally:
            self.stopping = True
            beat.cancel()
            server.close()
            for client in list(self.clients):
                client.writer.transport.abort()
            with contextlib.suppress(OSError):
                now = os.stat(path)
                if (now.st_dev, now.st_ino) == (made.st_dev, made.st_ino):
                    os.unlink(path)
            await asyncio.sleep(0)
            log.info("stopped")

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            self._tell_waiters(always=True)

    async def run(self, path: Path) -> None:
        """:meth:`serve` until SIGTERM or SIGINT."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.serve(path, stop)


def _clear(path: Path) -> None:
    """Make way for the socket at ``path``: remove one no server listens at; refuse anything else."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise SystemExit(f"{path} exists and is not a socket: choose another --socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(2)
        probe.connect(str(path))
    except OSError:
        os.unlink(path)  # left by a server that ended
        return
    finally:
        probe.close()
    raise SystemExit(f"a check queue already listens at {path}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit.workshop.checkqueue", description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True, help="the Unix socket to listen at (its folder: the server's user's)")
    p.add_argument("--slots", type=int, required=True, help="checks that run at once")
    p.add_argument("--max-hold", type=float, default=None,
                   help="seconds a check may hold its slot before it is taken back (default: the longest check's "
                        f"budget plus slack, {default_max_hold():.0f})")
    a = p.parse_args(argv)
    if a.slots < 1:
        p.error("--slots must be at least 1")
    if a.max_hold is not None and not (math.isfinite(a.max_hold) and a.max_hold > 0):
        p.error("--max-hold must be a number of seconds above 0")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s check queue: %(message)s")
    if os.geteuid() == 0:
        log.warning("running as root: the workshop runs it as the instructor")
    asyncio.run(CheckQueue(a.slots, a.max_hold).run(Path(a.socket)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
