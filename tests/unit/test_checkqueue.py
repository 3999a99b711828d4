"""labkit.workshop.checkqueue: a check queue no learner can break or stall. Arrival order whatever a client says,
one place per user, a killed holder's slot freed at once, a slot held too long taken back, bad or slow input
dropping only its own client, the expected wait the server's own. Clients of other users are processes run as
those users (root only)."""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from labkit.core import slots
from labkit.workshop import checkqueue, hubconfig, lifecycle

SYSTEM_PYTHON = "/usr/bin/python3"  # other users cannot run this checkout's environment
as_root = pytest.mark.skipif(os.geteuid() != 0 or not Path(SYSTEM_PYTHON).exists(),
                             reason="needs root (and the system's python3) to act as other users")
TAKE = '{"op": "take", "label": "horovod check of fashion_mnist.py"}'
DONE = '{"op": "done"}'

# A client in a process of its own: sends its first line (if any), then every line given on stdin; prints
# every line it gets, and {"event": "closed"} when the server closes the connection.
CLIENT = r"""
import socket, sys, threading
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
def forward():
    for line in sys.stdin:
        try:
            s.sendall(line.encode())
        except OSError:
            return
threading.Thread(target=forward, daemon=True).start()
if sys.argv[2]:
    s.sendall(sys.argv[2].encode() + b"\n")
print('{"event": "connected"}', flush=True)
for line in s.makefile("rb"):
    sys.stdout.write(line.decode(errors="replace"))
    sys.stdout.flush()
print('{"event": "closed"}', flush=True)
"""


class Server:
    """A queue server in a thread of this process, on a socket in a folder every user can pass through."""

    def __init__(self, slots_: int, **kw: float) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="labkit-queue-", dir="/tmp"))
        self.folder.chmod(0o755)
        self.path = self.folder / "checks.sock"
        self.queue = checkqueue.CheckQueue(slots_, **kw)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_event: asyncio.Event | None = None
        self.thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 5
        while not self.path.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert self.path.exists(), "the server did not start"

    async def _serve(self) -> None:
        self.loop, self.stop_event = asyncio.get_running_loop(), asyncio.Event()
        await self.queue.serve(self.path, self.stop_event)

    def status(self) -> dict:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(self._status(), self.loop).result(5)

    async def _status(self) -> dict:
        return self.queue.status()

    def stop(self) -> None:
        if self.loop is not None and self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(5)
        shutil.rmtree(self.folder, ignore_errors=True)


class Peer:
    """A client as user ``uid`` (its own process): the lines it sends and those it gets."""

    def __init__(self, server: Server, uid: int, first: str = TAKE) -> None:
        who = {} if uid == os.geteuid() else {"user": uid, "group": uid, "extra_groups": []}
        self.proc = subprocess.Popen([SYSTEM_PYTHON, "-c", CLIENT, str(server.path), first], cwd="/",
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, **who)
        self.got: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.next()["event"] == "connected"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.got.put(json.loads(line))

    def next(self, timeout: float = 5.0) -> dict:
        try:
            return self.got.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"nothing from the queue within {timeout} s") from None

    def until(self, event: str, timeout: float = 5.0) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            message = self.next(max(0.01, deadline - time.monotonic()))
            if message["event"] == event:
                return message
            assert message["event"] in ("wait", "connected"), f"{message} before {event}"

    def quiet(self, seconds: float) -> list[dict]:
        """What it gets within ``seconds`` (nothing, when its place does not change)."""
        time.sleep(seconds)
        out = []
        while not self.got.empty():
            out.append(self.got.get())
        return out

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)


@pytest.fixture
def serve():
    made: list[Server] = []
    peers: list[Peer] = []

    def start(slots_: int = 1, **kw: float) -> Server:
        made.append(Server(slots_, **kw))
        return made[-1]

    def peer(server: Server, uid: int, first: str = TAKE) -> Peer:
        peers.append(Peer(server, uid, first))
        return peers[-1]

    start.peer = peer  # type: ignore[attr-defined]
    yield start
    for p in peers:
        p.kill()
    for s in made:
        s.stop()


def raw(server: Server, data: bytes, read_s: float = 3.0) -> list[bytes]:
    """Send ``data`` as it is, then the lines got until the server closes the connection (within ``read_s``)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(str(server.path))
        s.settimeout(read_s)
        if data:
            s.sendall(data)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    return got.splitlines()


@as_root
def test_waiters_are_served_in_order_of_arrival_whatever_they_send(serve) -> None:
    server = serve(1)
    holder = serve.peer(server, 60001)
    holder.until("granted")
    late_by_name = serve.peer(server, 60002, '{"op": "take", "label": "zzz"}')
    assert late_by_name.until("wait")["place"] == 1
    first_by_name = serve.peer(server, 60003, '{"op": "take", "label": "0000 first"}')
    assert first_by_name.until("wait")["place"] == 2
    jumper = serve.peer(server, 60004, '{"op": "take", "label": "0", "place": 0}')  # no such thing as asking
    refused = jumper.until("refused")
    assert refused["retry"] is False and jumper.next()["event"] == "closed"
    holder.send(DONE)
    assert holder.until("done")["held_s"] > 0
    assert late_by_name.until("granted")["waited_s"] > 0
    assert first_by_name.until("wait")["place"] == 1
    late_by_name.send(DONE)
    first_by_name.until("granted")
    assert server.status()["holding"] == [f"uid 60003 pid {first_by_name.proc.pid} (0000 first)"]


@as_root
def test_a_user_holds_one_place_and_a_second_check_of_theirs_waits_for_the_first(serve) -> None:
    nobody = pwd.getpwnam("nobody").pw_uid
    server = serve(2)
    first = serve.peer(server, nobody)
    first.until("granted")
    second = serve.peer(server, nobody)  # two slots, one free: still refused, one place per user
    refused = second.until("refused")
    assert refused["retry"] is True and "already has a place" in refused["reason"]
    assert second.next()["event"] == "closed"
    serve.peer(server, 60005).until("granted")  # the free slot was there for another user
    first.send(DONE)
    first.until("done")
    # a user's second check, through labkit's client, waits for their first and then takes its turn
    root = serve.peer(server, os.geteuid())
    root.until("granted")
    said: list[str] = []
    got: list[float] = []

    def second_check() -> None:
        with slots.ServerQueue(server.path, retry_s=0.1).slot("second", None, said.append) as waited:
            got.append(waited)

    waiter = threading.Thread(target=second_check, daemon=True)
    waiter.start()
    time.sleep(0.5)
    assert not got and said == ["second: another check of this user's already has a place in the queue; "
                                "this check waits for it"]
    root.send(DONE)
    root.until("done")
    waiter.join(5)
    assert got and got[0] >= 0.4


@as_root
def test_a_killed_holder_frees_its_slot_at_once(serve) -> None:
    server = serve(1)
    holder = serve.peer(server, 60001)
    holder.until("granted")
    waiter = serve.peer(server, 60002)
    waiter.until("wait")
    killed = time.monotonic()
    holder.kill()
    waiter.until("granted", timeout=2)
    assert time.monotonic() - killed < 1
    assert server.status()["durations"] == []  # a killed check's hold says nothing of a check's length


@as_root
def test_a_slot_held_past_the_longest_hold_is_taken_back(serve) -> None:
    server = serve(1, max_hold=0.5)
    idle = serve.peer(server, 60001)  # takes the slot, then does nothing
    idle.until("granted")
    granted = time.monotonic()
    waiter = serve.peer(server, 60002)
    waiter.until("wait")
    revoked = idle.until("revoked", timeout=3)
    assert revoked["held_s"] >= 0.5 and revoked["max_hold_s"] == 0.5
    assert idle.next()["event"] == "closed"
    waiter.until("granted", timeout=2)
    assert 0.45 < time.monotonic() - granted < 2
    assert server.status()["durations"] == []


def test_labkits_client_is_told_when_its_slot_is_taken_back(serve) -> None:
    server = serve(1, max_hold=0.3)
    said: list[str] = []
    with slots.ServerQueue(server.path).slot("horovod check", None, said.append):
        time.sleep(0.8)
    assert len(said) == 1 and "taken back after 0 s" in said[0] and "goes on without it" in said[0]
    assert server.status()["holding"] == [] and server.status()["durations"] == []


BAD = {
    "deeply nested": b"[" * 4000 + b"\n",
    "nested in a field": b'{"op": "take", "label": [[[["x"]]]]}\n',
    "a line over 4 KiB": b'{"op": "take", "label": "' + b"x" * 10000 + b'"}\n',
    "no newline, ever longer": b"{" + b" " * 20000,
    "an infinite number": b'{"op": "take", "label": 1e400}\n',
    "NaN": b'{"op": "take", "label": NaN}\n',
    "a huge whole number": b'{"op": "take", "label": ' + b"9" * 4000 + b"}\n",
    "not UTF-8": b"\xff\xfe\xfd\n",
    "not JSON": b"take me first\n",
    "not an object": b'["take"]\n',
    "a place asked for": b'{"op": "take", "label": "x", "place": 0}\n',
    "an unknown op": b'{"op": "jump"}\n',
    "done before take": b'{"op": "done"}\n',
    "two takes": b'{"op": "take"}\n{"op": "take"}\n',
    "a long label": b'{"op": "take", "label": "' + b"x" * 300 + b'"}\n',
    "a label not text": b'{"op": "take", "label": {"a": 1}}\n',
}


@as_root
def test_bad_input_drops_only_its_own_client(serve) -> None:
    server = serve(1)
    holder = serve.peer(server, 60001)
    holder.until("granted")
    held = [f"uid 60001 pid {holder.proc.pid} (horovod check of fashion_mnist.py)"]
    for name, data in BAD.items():
        got = raw(server, data)  # as root: another user than the holder
        assert got, f"{name}: closed without a word"
        last = json.loads(got[-1])
        assert last["event"] == "refused" and last["retry"] is False and "not a request" in last["reason"], name
        assert server.thread.is_alive() and server.status()["holding"] == held, name
        assert server.status()["waiting"] == [], name
    holder.send(DONE)
    holder.until("done")
    serve.peer(server, 60002).until("granted")


def test_a_slow_or_silent_client_is_dropped_and_the_next_is_served(serve) -> None:
    server = serve(1, request_s=0.3)
    started = time.monotonic()
    assert json.loads(raw(server, b'{"op": "ta')[-1])["reason"].startswith("no request within")  # half a line
    assert json.loads(raw(server, b"")[-1])["event"] == "refused"  # nothing at all
    assert time.monotonic() - started < 2.5
    with slots.ServerQueue(server.path).slot("next") as waited:
        assert waited < 0.5


def test_connections_are_capped_per_user_and_in_all(serve) -> None:
    server = serve(1, per_user=2, connections=3, request_s=5.0)
    idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
    try:
        for s in idle:
            s.connect(str(server.path))
        time.sleep(0.2)
        refused = json.loads(raw(server, b"", read_s=2)[-1])
        assert refused["event"] == "refused" and "connections" in refused["reason"] and refused["retry"] is True
    finally:
        for s in idle:
            s.close()
    with slots.ServerQueue(server.path).slot("after them") as waited:  # closed ones no longer count
        assert waited < 0.5


@as_root
def test_the_expected_wait_comes_only_from_checks_that_ended_each_user_once(serve) -> None:
    server = serve(1)
    for uid in (60001, 60002):  # two checks of about 0.4 s, ended normally
        p = serve.peer(server, uid)
        p.until("granted")
        time.sleep(0.4)
        p.send(DONE)
        p.until("done")
    forger = serve.peer(server, 60003)
    forger.until("granted")
    forger.send('{"op": "done", "seconds": 0.001}')  # a client has no say in a duration
    assert forger.until("refused")["retry"] is False
    killed = serve.peer(server, 60004)
    killed.until("granted")
    killed.kill()
    for _ in range(5):  # one user's many quick checks count once
        quick = serve.peer(server, 60005)
        quick.until("granted")
        quick.send(DONE)
        quick.until("done")
        quick.kill()
    durations = server.status()["durations"]
    assert len(durations) == 3 and sorted(durations)[1] == pytest.approx(0.4, abs=0.15)
    assert all(0 < d <= checkqueue.default_max_hold() for d in durations)


@as_root
def test_a_waiter_is_shown_its_place_the_slots_busy_and_the_expected_wait(serve, capsys) -> None:
    server = serve(1)
    p = serve.peer(server, 60001)
    p.until("granted")
    time.sleep(0.6)
    p.send(DONE)
    p.until("done")
    holder = serve.peer(server, 60002)
    holder.until("granted")
    second = serve.peer(server, 60003)
    second.until("wait")

    def both_end() -> None:
        time.sleep(0.5)
        holder.send(DONE)
        second.until("granted")
        second.send(DONE)

    threading.Thread(target=both_end, daemon=True).start()
    with slots.queued("horovod check", slots.ServerQueue(server.path)) as waited:
        assert waited >= 0.2
        status = server.status()
        assert status["waiting"] == [] and status["holding"] == [f"uid 0 pid {os.getpid()} (horovod check)"]
    err = capsys.readouterr().err
    assert "horovod check: waiting for a check slot: place 2 in the queue, 1 of 1 slot(s) busy, about 1 s" in err
    assert "horovod check: got a check slot after" in err


def test_the_server_runs_alone_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    path = tmp_path / "checks.sock"
    cmd = [sys.executable, "-m", "labkit.workshop.checkqueue", "--socket", str(path), "--slots", "1"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 15
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert path.exists() and path.stat().st_mode & 0o777 == 0o666
        again = subprocess.run(cmd, capture_output=True, text=True, timeout=15)
        assert again.returncode != 0 and "already listens" in again.stderr  # a second server never steals it
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(path))
            s.sendall(TAKE.encode() + b"\n")
            s.settimeout(5)
            assert b'"granted"' in s.recv(4096)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(5) == 0
            assert s.recv(4096) == b""  # its holder sees the end
        assert not path.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "stopped" in proc.stderr.read()


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        checkqueue.CheckQueue(0)
    with pytest.raises(ValueError, match="above 0"):
        checkqueue.CheckQueue(1, max_hold=float("inf"))
    assert checkqueue.default_max_hold() == 420 + checkqueue.SLACK_S  # lab 9's check budget, the longest


def test_the_hub_runs_the_queue_as_the_instructor(tmp_path: Path) -> None:
    from helpers import hubconf

    env = {slots.SLOTS_VAR: "2", slots.QUEUE_VAR: str(tmp_path / "queue" / "checks.sock")}
    c = hubconf.load(hubconfig.config_text(hubconf.settings(tmp_path, extra_env=env)))
    names = [s["name"] for s in c.JupyterHub.services]
    assert names == [hubconfig.SERVICE, hubconfig.QUEUE_SERVICE]
    service = c.JupyterHub.services[1]
    assert service["user"] == "instructor" and "url" not in service
    assert service["command"][1:] == ["-m", "labkit.workshop.checkqueue", "--socket", env[slots.QUEUE_VAR],
                                      "--slots", "2"]
    assert c.Spawner.environment == env
    c = hubconf.load(hubconfig.config_text(hubconf.settings(tmp_path)))
    assert [s["name"] for s in c.JupyterHub.services] == [hubconfig.SERVICE]


@as_root
def test_a_workshops_queue_folder_is_the_instructors_and_its_server_theirs_alone() -> None:
    nobody = pwd.getpwnam("nobody")  # stands for the instructor
    base = Path(tempfile.mkdtemp(prefix="labkit-queue-", dir="/tmp"))
    base.chmod(0o755)
    server = None
    waits: list[slots.Waiting] = []
    try:
        env = lifecycle.check_queue(base / "queue", "nobody", cores=3)
        sock = Path(env[slots.QUEUE_VAR])
        folder = sock.parent
        assert env[slots.SLOTS_VAR] == "1" and sock.name == "checks.sock"
        assert folder.stat().st_uid == nobody.pw_uid and folder.stat().st_mode & 0o7777 == 0o755
        assert isinstance(slots.from_env(environ=env), slots.ServerQueue)
        server = subprocess.Popen([SYSTEM_PYTHON, "-m", "labkit.workshop.checkqueue", "--socket", str(sock),
                                   "--slots", env[slots.SLOTS_VAR]], cwd="/", user=nobody.pw_uid,
                                  group=nobody.pw_gid, extra_groups=[], stderr=subprocess.DEVNULL,
                                  env={"PYTHONPATH": str(Path(checkqueue.__file__).parents[2])})
        deadline = time.monotonic() + 15
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sock.exists() and sock.stat().st_uid == nobody.pw_uid
        write = ("import sys\ntry:\n    open(sys.argv[1], 'w')\nexcept PermissionError:\n    print('refused')\n")
        out = subprocess.run([SYSTEM_PYTHON, "-c", write, str(folder / slots.DURATIONS)], user=60001, group=60001,
                             extra_groups=[], capture_output=True, text=True, timeout=30, cwd="/")
        assert out.stdout.strip() == "refused"  # a learner writes nothing there
        learner = Peer(SimpleNamespace(path=sock), 60001)  # type: ignore[arg-type]
        try:
            learner.until("granted")
            threading.Timer(0.3, learner.send, args=(DONE,)).start()
            with slots.ServerQueue(sock).slot("another learner's check", waits.append) as waited:
                assert waits[0].place == 1 and waited > 0.2
        finally:
            learner.kill()
    finally:
        if server is not None:
            server.terminate()
            server.wait(5)
        shutil.rmtree(base)
