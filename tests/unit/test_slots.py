"""labkit.core.slots: checks take a slot, in order; dead, forged and linked tickets do not count."""

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


def test_in_a_shared_sticky_folder_a_user_holds_one_place(tmp_path: Path) -> None:
    folder = tmp_path / "q"
    folder.mkdir()
    folder.chmod(0o1777)
    queue = slots.SlotQueue(folder, 2, every=0.05)
    assert queue.shared()
    log: list = []
    first = threading.Thread(target=hold, args=(queue, 0.5, log, "first"))
    first.start()
    time.sleep(0.1)
    hold(queue, 0.0, log, "second")  # two slots, but the same user: after the first
    first.join(5)
    starts = {n: t for n, ev, t, _, _ in log if ev == "start"}
    ends = {n: t for n, ev, t, _, _ in log if ev == "end"}
    assert starts["second"] >= ends["first"] - 0.01


def test_the_setting_is_read_and_checked() -> None:
    assert slots.from_env(environ={}) is None
    q = slots.from_env("/c", environ={slots.SLOTS_VAR: "3"})
    assert q is not None and q.slots == 3 and q.folder == Path("/c/check-queue")
    with pytest.raises(ValueError, match="whole number"):
        slots.from_env(environ={slots.SLOTS_VAR: "many"})
    with pytest.raises(ValueError, match="at least 1"):
        slots.SlotQueue("/x", 0)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_in_a_class_queue_tickets_count_only_as_their_owners_and_none_removes_anothers(tmp_path: Path) -> None:
    import pwd

    from labkit.workshop import lifecycle

    base = Path(tempfile.mkdtemp(prefix="labkit-slots-", dir="/tmp"))  # a folder another user can reach
    base.chmod(0o755)
    env = lifecycle.check_queue(base / "queue", cores=4)
    folder = Path(env[slots.QUEUE_VAR])
    assert env[slots.SLOTS_VAR] == "2" and folder.stat().st_mode & 0o7777 == 0o1777 and folder.stat().st_uid == 0
    nobody = pwd.getpwnam("nobody").pw_uid
    python = "/usr/bin/python3"  # the system's: another user cannot run this checkout's environment
    other = subprocess.Popen(["sleep", "30"], preexec_fn=lambda: os.setuid(nobody))
    try:
        # root's file naming another user's process (a forged place) does not count
        forged = {"pid": other.pid, "started": slots.process_start(other.pid)}
        (folder / "0-forged.ticket").write_text(json.dumps(forged))
        assert slots.SlotQueue(folder, 1).live() == []
        mine = folder / "1-root.ticket"
        mine.write_text(json.dumps({"pid": os.getpid(), "started": slots.process_start(os.getpid())}))
        code = ("import sys; from pathlib import Path\ntry:\n    Path(sys.argv[1]).unlink()\n"
                "except PermissionError:\n    print('refused')\n")
        out = subprocess.run([python, "-c", code, str(mine)], capture_output=True, text=True,
                             preexec_fn=lambda: os.setuid(nobody), timeout=30)
        assert out.stdout.strip() == "refused" and mine.exists()  # sticky: a learner cannot take another's place
        appended = subprocess.run([python, "-c", "import sys\nfrom labkit.core import slots\n"
                                   "slots._append(slots.Path(sys.argv[1]), '{\"seconds\": 5}')\n",
                                   str(folder / slots.DURATIONS)], preexec_fn=lambda: os.setuid(nobody), timeout=30,
                                  env={"PYTHONPATH": str(Path(slots.__file__).parents[2])}, capture_output=True)
        assert appended.returncode == 0 and slots.SlotQueue(folder, 1).expected(1) == 5.0
    finally:
        other.kill()
        other.wait()
        shutil.rmtree(base)
