"""labkit.core.slots: checks take a slot, in order; dead, forged, malformed, linked and other users' tickets do not
count; the queue server's client and protocol lines."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from labkit.core import slots

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def hold(queue: slots.SlotQueue, seconds: float, log: list, name: str) -> None:
    waits: list[slots.Waiting] = []
    with queue.slot(name, waits.append) as waited:
        log.append((name, "start", time.monotonic(), waited, waits[:1]))
        time.sleep(seconds)
    log.append((name, "end", time.monotonic(), None, None))


def test_checks_beyond_the_slots_wait_in_order_and_are_told_their_place(tmp_path: Path) -> None:
    queue = slots.SlotQueue(tmp_path / "q", 2, every=0.05)
    log: list = []
    threads = []
    for k, name in enumerate(("a", "b", "c", "d")):
        threads.append(threading.Thread(target=hold, args=(queue, 0.6, log, name)))
        threads[-1].start()
        time.sleep(0.1 if k < 3 else 0.0)  # tickets taken in this order
    for t in threads:
        t.join(10)
    starts = {n: (t, w, first) for n, ev, t, w, first in log if ev == "start"}
    ends = {n: t for n, ev, t, _, _ in log if ev == "end"}
    assert starts["a"][1] < 0.1 and starts["b"][1] < 0.1  # two slots: at once
    assert starts["c"][0] >= min(ends["a"], ends["b"]) - 0.01  # the third when one ended
    assert starts["c"][2] and starts["c"][2][0].place == 1 and starts["d"][2][0].place == 2
    assert starts["c"][2][0].running == 2 and "place 1 in the queue, 2 of 2 slot(s) busy" in str(starts["c"][2][0])
    assert not list((tmp_path / "q").glob("*.ticket"))  # every ticket removed
    assert queue.expected(1) == pytest.approx(0.6, abs=0.2)  # the median of the checks that ended


def test_dead_forged_and_linked_tickets_do_not_count(tmp_path: Path) -> None:
    folder = tmp_path / "q"
    folder.mkdir()
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(done.stdout)
    old = time.time() - 60
    for name, data in (("0-dead.ticket", {"pid": dead, "started": "1"}),  # a process that ended
                       ("1-forged.ticket", {"pid": 1, "started": "12345"}),  # a live pid, not its start time
                       ("2-junk.ticket", "not json"),
                       ("4-huge.ticket", "{" + " " * (1 << 20) + "}")):  # read 4 KB at most: not a ticket
        path = folder / name
        path.write_text(json.dumps(data) if isinstance(data, dict) else data)
        os.utime(path, (old, old))
    me = {"pid": os.getpid(), "started": slots.process_start(os.getpid())}
    (tmp_path / "real.json").write_text(json.dumps(me))
    (folder / "3-link.ticket").symlink_to(tmp_path / "real.json")  # a link to a ticket that would count
    queue = slots.SlotQueue(folder, 1, every=0.05)
    assert queue.live() == []
    started = time.monotonic()
    with queue.slot("mine") as waited:
        assert waited < 0.5 and time.monotonic() - started < 0.5
    assert not (folder / "0-dead.ticket").exists() and not (folder / "2-junk.ticket").exists()


def test_the_folder_and_its_durations_are_the_users_alone(tmp_path: Path) -> None:
    queue = slots.SlotQueue(tmp_path / "q", 1, every=0.05)
    with queue.slot("mine"):
        pass
    assert (tmp_path / "q").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "q" / slots.DURATIONS).stat().st_mode & 0o777 == 0o600


def test_the_setting_is_read_and_checked() -> None:
    assert slots.from_env(environ={}) is None
    q = slots.from_env("/c", environ={slots.SLOTS_VAR: "3"})
    assert q is not None and q.slots == 3 and q.folder == Path("/c/check-queue")
    with pytest.raises(ValueError, match="whole number"):
        slots.from_env(environ={slots.SLOTS_VAR: "many"})
    with pytest.raises(ValueError, match="at least 1"):
        slots.SlotQueue("/x", 0)


def test_a_socket_names_the_queue_server(tmp_path: Path) -> None:
    import socket

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(tmp_path / "queue"))
    try:
        q = slots.from_env(environ={slots.QUEUE_VAR: str(tmp_path / "queue")})  # the server has its own slots
        assert isinstance(q, slots.ServerQueue) and q.path == tmp_path / "queue"
    finally:
        server.close()
    q = slots.from_env(environ={slots.SLOTS_VAR: "2", slots.QUEUE_VAR: str(tmp_path / "gone.sock")})
    assert isinstance(q, slots.ServerQueue)  # named so: a server's, even while it is not there
    assert isinstance(slots.from_env(environ={slots.SLOTS_VAR: "2", slots.QUEUE_VAR: str(tmp_path)}), slots.SlotQueue)


def test_an_unreachable_server_runs_the_check_at_once_and_says_so(tmp_path: Path) -> None:
    said: list[str] = []
    started = time.monotonic()
    with slots.ServerQueue(tmp_path / "gone.sock").slot("horovod check", None, said.append) as waited:
        assert waited < 1 and time.monotonic() - started < 1
    assert len(said) == 1 and "cannot be reached" in said[0] and "runs now, without a slot" in said[0]
    assert not (tmp_path / "gone.sock").exists()


@pytest.mark.parametrize("line", [b"[" * 5000 + b"\n", b'{"a": 1e400}\n', b'{"a": NaN}\n',
                                  b'{"a": 1' + b"0" * 40 + b"}\n", b"\xff\xfe\n",
                                  b"[1]\n", b'{"a": "' + b"x" * 5000 + b'"}\n', b'{"a": [[[1]]]}\n'])
def test_a_protocol_line_is_decoded_bounded(line: bytes) -> None:
    with pytest.raises(slots.ProtocolError):
        slots.decode(line)
    assert slots.decode(b'{"op": "take", "label": "a [b] {c}", "n": [1]}\n')["label"] == "a [b] {c}"


@pytest.mark.parametrize("content", [
    "[" * 4096,  # deeper than the JSON parser's recursion limit
    '{"pid": 1e400, "started": "1"}',  # int(inf)
    '{"pid": -1, "started": "1"}',
    '{"pid": true, "started": null}',
    '{"pid": "1' + "0" * 5000 + '", "started": "1"}',  # cut at 4 KB
    "\xff\xfe not text",
    '[1, 2]',
])
def test_a_malformed_ticket_is_ignored_and_never_raises(tmp_path: Path, content: str) -> None:
    folder = tmp_path / "q"
    folder.mkdir()
    (folder / "0-bad.ticket").write_text(content, errors="surrogateescape")
    queue = slots.SlotQueue(folder, 1, every=0.05)
    assert queue.live() == []
    with queue.slot("mine") as waited:
        assert waited < 0.5


def test_a_malformed_duration_is_ignored(tmp_path: Path) -> None:
    folder = tmp_path / "q"
    folder.mkdir()
    lines = ["[" * 4096, '{"seconds": 1e400}', '{"seconds": -3}', '{"seconds": NaN}', '{"seconds": "x"}', "junk"]
    (folder / slots.DURATIONS).write_text("\n".join(lines) + "\n")
    queue = slots.SlotQueue(folder, 1, every=0.05)
    assert queue.expected(1) is None
    with queue.slot("mine"):
        time.sleep(0.2)
    assert queue.expected(1) == pytest.approx(0.2, abs=0.15)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_another_users_ticket_that_sorts_first_does_not_hold_the_slot() -> None:
    import pwd

    nobody = pwd.getpwnam("nobody")
    base = Path(tempfile.mkdtemp(prefix="labkit-slots-", dir="/tmp"))
    base.chmod(0o755)
    folder = base / "queue"
    folder.mkdir()
    folder.chmod(0o1777)  # as a class's shared folder was
    idle = subprocess.Popen(["sleep", "60"], user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[])
    try:
        first = folder / "0000-first.ticket"  # sorts before any ticket named by the time
        first.write_text(json.dumps({"pid": idle.pid, "started": slots.process_start(idle.pid)}))
        os.chown(first, nobody.pw_uid, nobody.pw_gid)
        queue = slots.SlotQueue(folder, 1, every=0.05)
        got: list[float] = []

        def take() -> None:
            with queue.slot("mine") as waited:
                got.append(waited)

        taker = threading.Thread(target=take, daemon=True)
        taker.start()
        taker.join(3)
        assert got and got[0] < 1, "another user's idle process held the only slot"
    finally:
        idle.kill()
        idle.wait()
        shutil.rmtree(base)
