"""``labkit workshop down`` against what a hostile learner leaves behind, without a hub.

A workshop for one learner (``lifecycle.up``, the hub replaced by a canary ``sleep`` as in
``test_workshop_hostile_accounts.py``); then, as learner01: a folder 1500 levels deep in ``/tmp`` (with links to a
canary of root's, FIFOs and a folder closed to everyone), a process that forks and exits every millisecond in the
learner's control groups (as their server's children are) and another one outside them, a SysV shared memory
segment, semaphore set and message queue, and files in ``/run/lock`` and ``/dev/shm``. ``down`` must finish and
leave nothing of the learner's uid: no process, IPC object, lock, temporary entry, user, group or control group;
the next ``up`` hands out other uids. Root's canaries (a file the links point to, a process, a shared memory
segment, a lock file) are untouched. Needs root, useradd, ipcmk and control groups; skipped otherwise.
"""

from __future__ import annotations

import grp
import os
import pwd
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.learner import PYTHON, run_as, skip_unless_a_workshop_can_start, without_hub

from labkit.workshop import accounts, leftovers, lifecycle, limits

pytestmark = [pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None or shutil.which("ipcmk") is None,
                                 reason="needs root, useradd and ipcmk"),
              pytest.mark.slow]  # two workshops made and removed

PIDS = 64
MEMORY = "128M"
DEPTH = 1500

# Builds a chain of DEPTH folders at argv[1] (relative opens: no path gets long), a link to argv[2] and a FIFO
# every 100 levels, a folder closed to everyone at the bottom and the bottom folder read-only.
DEEP = """
import os, sys
top, canary, depth = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.mkdir(top)
fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
for level in range(depth):
    if level % 100 == 0:
        os.symlink(canary, "link", dir_fd=fd)
        os.mkfifo("fifo", dir_fd=fd)
    os.mkdir("d", dir_fd=fd)
    down = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    os.close(fd)
    fd = down
os.mkdir("closed", dir_fd=fd)
os.chmod("closed", 0, dir_fd=fd)
os.fchmod(fd, 0o500)
"""

# Forks, and the parent exits, every millisecond: a scan of /proc rarely sees the same pid twice.
FORKER = """
import os, time
while True:
    time.sleep(0.001)
    try:
        if os.fork() > 0:
            os._exit(0)
    except OSError:
        pass
"""

# Root's: reaps what its descendants leave (a subreaper, as the machine's init would), after starting
# argv[5] as uid argv[1] (group argv[2]), first moved into the control groups argv[3] (comma-separated).
REAPER = """
import ctypes, os, sys, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
uid, gid, procs, python, code = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
if os.fork() == 0:
    for path in filter(None, procs.split(",")):
        with open(path, "w") as f:
            f.write(str(os.getpid()))
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    os.execv(python, [python, "-c", code])
while True:
    try:
        os.wait()
    except ChildProcessError:
        time.sleep(0.01)
"""


def _snapshot() -> dict[str, object]:
    return {"users": {p.pw_name for p in pwd.getpwall()}, "groups": {g.gr_name for g in grp.getgrall()},
            "homes": set(os.listdir("/home")), "netns": set(os.listdir("/run/netns")) if os.path.isdir("/run/netns")
            else set(), "links": {line.split(":")[1].strip().split("@")[0] for line in subprocess.run(
                ["ip", "-o", "link"], capture_output=True, text=True).stdout.splitlines()}}


def _alive_as(uid: int) -> bool:
    """Is any process of ``uid`` there (or not yet reaped)? Asked of the kernel, not of /proc (whose scan misses a
    process that forks every millisecond): a child of ``uid`` allowed two processes cannot fork while a third
    one of ``uid`` exists."""
    pid = os.fork()
    if pid == 0:
        code = 2
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            resource.setrlimit(resource.RLIMIT_NPROC, (2, 2))
            try:
                child = os.fork()
                if child == 0:
                    os._exit(0)
                os.waitpid(child, 0)
                code = 1
            except BlockingIOError:
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, 1), code
    return code == 0


def _kill_as(uid: int, rounds: int = 200) -> None:
    """The test's own cleanup: SIGKILL every process of ``uid`` until none is left."""
    for _ in range(rounds):
        if not _alive_as(uid):
            return
        pid = os.fork()
        if pid == 0:
            try:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                os.kill(-1, signal.SIGKILL)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        time.sleep(0.02)


def _ipc(uids: set[int]) -> list[tuple[str, int]]:
    """SysV IPC objects (kind, id) owned or made by ``uids``."""
    found = []
    for kind in ("shm", "sem", "msg"):
        lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        head = lines[0].split()
        for line in lines[1:]:
            row = dict(zip(head, line.split(), strict=False))
            if int(row["uid"]) in uids or int(row["cuid"]) in uids:
                found.append((kind, int(row[head[1]])))
    return found


def _ipcmk(args: list[str], as_learner: str | None = None) -> int:
    argv = ["ipcmk", *args]
    out = (run_as(as_learner, argv) if as_learner else subprocess.run(argv, capture_output=True, text=True, timeout=30))
    assert out.returncode == 0, out
    return int(out.stdout.split()[-1])


def _reaper(uid: int, gid: int, procs: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([PYTHON, "-c", REAPER, str(uid), str(gid), ",".join(procs), PYTHON, FORKER],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)


class Left:
    """What the test made, for its own cleanup when ``down`` fails."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.paths: list[Path] = []
        self.ipc: list[tuple[str, int]] = []
        self.uids: set[int] = set()


def _scrub(left: Left, state: Path) -> None:
    """Remove what ``down`` left (on a ``down`` that fails), only what this test made."""
    for uid in left.uids:
        _kill_as(uid)
    for p in left.procs:
        if p.poll() is None:
            p.kill()
        p.wait()
    for path in left.paths:
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], timeout=120, check=False)
    for kind, ident in left.ipc:
        subprocess.run(["ipcrm", {"shm": "-m", "sem": "-s", "msg": "-q"}[kind], str(ident)], capture_output=True,
                       timeout=30, check=False)
    try:
        lifecycle.down(str(state))
    except Exception as e:  # noqa: BLE001 - the cleanup goes on: what is left is removed below
        print(f"cleanup: down failed again: {e!r}")
    for name in ("learner01", "instructor"):
        if accounts.user_exists(name):
            subprocess.run(["userdel", "--remove", name], capture_output=True, timeout=60, check=False)
    for group in (accounts.LEARNER_GROUP, accounts.INSTRUCTOR_GROUP, "learner01", "instructor"):
        if accounts.group_exists(group):
            subprocess.run(["groupdel", group], capture_output=True, timeout=60, check=False)
    for base in limits.bases().values():
        for folder in (base / "learner01", base / "instructor", base):
            try:
                folder.rmdir()
            except OSError:
                pass
    subprocess.run(["rm", "-rf", "--one-file-system", str(state)], timeout=120, check=False)


@pytest.fixture(scope="module")
def canaries(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    """Root's: a file the learner links to, a process, a shared memory segment, a lock file."""
    folder = tmp_path_factory.mktemp("root-canaries")
    folder.chmod(0o755)
    target = folder / "target.txt"
    target.write_text("canary")
    process = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL, start_new_session=True)
    shm = _ipcmk(["-M", "4096"])
    lock = Path(f"/run/lock/labkit-test-root-{os.getpid()}.lock")
    lock.write_text("canary")
    try:
        yield {"target": target, "process": process, "shm": shm, "lock": lock}
    finally:
        process.kill()
        process.wait()
        subprocess.run(["ipcrm", "-m", str(shm)], capture_output=True, timeout=30, check=False)
        lock.unlink(missing_ok=True)


def _canaries_intact(canaries: dict[str, object]) -> None:
    assert Path(str(canaries["target"])).read_text() == "canary"
    assert canaries["process"].poll() is None  # type: ignore[attr-defined]
    assert ("shm", canaries["shm"]) in _ipc({0})
    assert Path(str(canaries["lock"])).read_text() == "canary"


def test_down_ends_and_removes_everything_a_hostile_learner_leaves(canaries: dict[str, object]) -> None:
    asked = limits.Limits(None, limits.parse_memory(MEMORY), PIDS)
    skip_unless_a_workshop_can_start(asked)
    state = Path(f"/run/labkit-workshop-down-hostile-{os.getpid()}")
    before = _snapshot()
    left = Left()
    fake_hub = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL, start_new_session=True)
    left.procs.append(fake_hub)
    timings: dict[str, float] = {}
    try:
        with pytest.MonkeyPatch.context() as mp:
            without_hub(mp, fake_hub.pid)
            start = time.monotonic()
            st, _ = lifecycle.up(lifecycle.Plan(1, port=1, folder=str(state), memory=MEMORY, pids=PIDS), say=print)
            timings["up"] = time.monotonic() - start
            old = accounts.uids_of(st.made["users"])
            left.uids = set(old)
            learner = pwd.getpwnam("learner01")
            procs, problem = limits.make("learner01", asked)  # the groups the learner's server starts in
            assert problem is None and procs

            deep = Path(f"/tmp/labkit-test-deep-{os.getpid()}")
            left.paths.append(deep)
            made = run_as("learner01", [PYTHON, "-c", DEEP, str(deep), str(canaries["target"]), str(DEPTH)])
            assert made.returncode == 0, made
            shm = Path(f"/dev/shm/labkit-test-{os.getpid()}")
            lock = Path(f"/run/lock/labkit-test-learner-{os.getpid()}.lock")
            left.paths += [shm, lock]
            for path in (shm, lock):
                assert run_as("learner01", ["touch", str(path)]).returncode == 0
            for args in (["-M", "65536"], ["-S", "2"], ["-Q"]):
                left.ipc.append((("shm", "sem", "msg")[["-M", "-S", "-Q"].index(args[0])],
                                 _ipcmk(args, as_learner="learner01")))
            assert sorted(_ipc(old)) == sorted(left.ipc)

            inside = _reaper(learner.pw_uid, learner.pw_gid, procs)  # in the learner's groups
            outside = _reaper(learner.pw_uid, learner.pw_gid, [])  # a plain setuid child: in none
            left.procs += [inside, outside]
            time.sleep(0.3)
            assert _alive_as(learner.pw_uid) and inside.poll() is None and outside.poll() is None
            in_group = Path(procs[0]).read_text().split()
            assert in_group, "the forker is not in the learner's group"

            start = time.monotonic()
            removed = lifecycle.down(str(state))
            timings["down"] = time.monotonic() - start
            print("\n" + "\n".join(removed))
            assert lifecycle.down(str(state)) == []

            assert not any(_alive_as(uid) for uid in old), removed
            assert leftovers.processes_of(old) == []
            assert _ipc(old) == [], removed
            assert not os.path.lexists(deep) and not shm.exists() and not lock.exists()
            assert leftovers.temp_files(old) == [] and leftovers.temp_files(old, [Path("/run/lock")]) == []
            assert _snapshot() == before and not state.exists()
            assert [b for b in limits.bases().values() if b.exists()] == []
            assert inside.poll() is None and outside.poll() is None  # root's reapers: not the learner's
            _canaries_intact(canaries)

            second_hub = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL, start_new_session=True)
            left.procs.append(second_hub)
            without_hub(mp, second_hub.pid)
            start = time.monotonic()
            st, _ = lifecycle.up(lifecycle.Plan(1, port=1, folder=str(state), memory=MEMORY, pids=PIDS), say=print)
            timings["second up"] = time.monotonic() - start
            new = accounts.uids_of(st.made["users"])
            left.uids |= new
            assert len(new) == 2 and not new & old, (old, new)
            lifecycle.down(str(state))
            assert _snapshot() == before and not state.exists()
    finally:
        _scrub(left, state)
    _canaries_intact(canaries)
    print("; ".join(f"{k}: {v:.1f} s" for k, v in timings.items()))


def _free_uid() -> int:
    used = accounts.uids_in_use()
    return next(u for u in range(64999, 61000, -1) if u not in used)


@pytest.mark.parametrize("way", ["v1 freezer", "v1 kill rounds", "v2 cgroup.kill", "v2 freeze"])
def test_each_way_of_ending_a_control_group_ends_a_forker(way: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``limits.end`` on a group holding a process that forks every millisecond: frozen then killed (v1's freezer,
    v2's ``cgroup.freeze``), killed by the kernel (v2's ``cgroup.kill``), or killed in rounds (v1 without a
    freezer). On a v1 machine, v2 is tried on its ``unified`` hierarchy where one is mounted."""
    v2_root = limits.CGROUP if (limits.CGROUP / "cgroup.controllers").is_file() else limits.CGROUP / "unified"
    if way.startswith("v2"):
        if not (v2_root / "cgroup.procs").is_file():
            pytest.skip("no cgroup v2 hierarchy here")
        monkeypatch.setattr(limits, "CGROUP", v2_root)
        if way == "v2 freeze":
            monkeypatch.setattr(limits, "KILL", "no-such-file")  # as before Linux 5.14
    kinds = {"v1 freezer": ["pids", limits.FREEZER], "v1 kill rounds": ["pids"]}.get(way, ["v2"])
    bases = limits.bases()
    if not set(kinds) <= set(bases):
        pytest.skip(f"no {', '.join(kinds)} control group hierarchy here")
    name, uid = f"forker-{os.getpid()}", _free_uid()
    folders = [bases[k] / name for k in kinds]
    for folder in folders:
        folder.mkdir(parents=True)
    reaper = _reaper(uid, uid, [str(f / "cgroup.procs") for f in folders])
    try:
        if way == "v2 cgroup.kill" and not (folders[0] / "cgroup.kill").is_file():
            pytest.skip("no cgroup.kill here (Linux before 5.14)")
        deadline = time.monotonic() + 5
        while not all((f / "cgroup.procs").read_text().strip() for f in folders) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _alive_as(uid)
        said = limits.end([name])
        assert said == [f"the processes in {name}'s control group ended"], said
        deadline = time.monotonic() + 5
        while _alive_as(uid) and time.monotonic() < deadline:  # the reaper reaps the killed
            time.sleep(0.01)
        assert not _alive_as(uid) and reaper.poll() is None
        assert limits.remove([name]) and limits.left([name]) == []
    finally:
        _kill_as(uid)
        reaper.kill()
        reaper.wait()
        for folder in folders:
            for path in (folder, folder.parent):
                try:
                    path.rmdir()
                except OSError:
                    pass
