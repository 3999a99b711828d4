"""Cores, memory and processes per learner: a control group per learner that the learner's server starts in.

JupyterHub's ``LocalProcessSpawner`` enforces no ``cpu_limit``/``mem_limit``; the workshop's spawner
(:mod:`labkit.workshop.spawner`) puts each single-user server, before it runs, into the learner's group
here, and everything the server starts (kernels, terminals, ``mpirun`` and its ranks) stays in it.
Groups live under this process's own group, in a ``labkit-workshop`` folder: cgroup v2 (``cpu.max``,
``memory.max``, ``pids.max``) or v1 (``cpu.cfs_quota_us``, ``memory.limit_in_bytes``, ``pids.max``).
``pids.max`` (tasks: processes and threads) stops a fork bomb from taking the machine.

:func:`probe` tries every asked limit before the workshop starts: it makes a group, writes each limit,
reads it back and moves a short child process into the group. ``workshop up`` refuses when any fails
(e.g. ``EBUSY`` on a systemd host, whose cgroup v2 tree belongs to systemd) unless it is told
``--no-limits``. Sizes and counts given on the command line are checked here too (:func:`parse_memory`,
:func:`check_cores`, :func:`check_pids`).

:func:`end` ends every process in a learner's groups before ``down`` removes them: cgroup v2's ``cgroup.kill``,
else the group frozen (``cgroup.freeze``, or v1's freezer, where each learner gets a group too) while each of its
processes is killed, so that none forks in between; without a freezer, kills in rounds until the group is empty.
"""

from __future__ import annotations

import errno
import math
import os
import re
import resource
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.core import ending

CGROUP = Path("/sys/fs/cgroup")
FOLDER = "labkit-workshop"
PERIOD = 100_000  # microseconds
DEFAULT_PIDS = 2048  # tasks per learner: a server, kernels and a few multi-threaded TensorFlow ranks fit
MIN_MEMORY = 64 * 2**20  # less does not start a JupyterLab
MAX_CORES = 4096
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT])i?B?\s*$", re.IGNORECASE)
V1 = ("cpu", "memory", "pids")
FREEZER = "freezer"  # v1: a learner's processes are frozen in it before they are killed (no fork in between)
KILL = "cgroup.kill"  # cgroup v2, Linux 5.14 on
ROUNDS = 50  # of freezing and killing (or killing alone) before a group that stays populated is given up


class LimitError(ValueError):
    """A limit given that cannot be a limit (``--cores inf``, ``--memory 0G``); the message says why."""


@dataclass(frozen=True)
class Limits:
    """What each learner gets: None is unlimited."""

    cores: float | None = None
    memory: int | None = None  # bytes
    pids: int | None = None

    def asked(self) -> list[str]:
        return [k for k, v in (("cpu", self.cores), ("memory", self.memory), ("pids", self.pids)) if v]

    def describe(self) -> str:
        parts = [f"{self.cores:g} cores" if self.cores else "", f"{self.memory / 2**30:.3g} GiB" if self.memory else "",
                 f"{self.pids} tasks" if self.pids else ""]
        return ", ".join(p for p in parts if p) or "no limits"


def parse_memory(text: str) -> int:
    """Bytes of ``4G``, ``512M``, ``1.5G`` (K, M, G, T: powers of 1024); :class:`LimitError` otherwise."""
    m = SIZE.match(str(text))
    if not m:
        raise LimitError(f"--memory {text!r}: a number with K, M, G or T, e.g. 4G")
    size = int(float(m.group(1)) * 1024 ** ("KMGT".index(m.group(2).upper()) + 1))
    if size < MIN_MEMORY:
        raise LimitError(f"--memory {text!r}: at least {MIN_MEMORY // 2**20}M, or leave it out for no limit")
    return size


def default_memory(accounts: int, total: int | None = None) -> str:
    """A share of this machine's memory for each of ``accounts`` servers when none is asked for (``--memory``):
    80 % of it divided among them (the rest for the hub and the system), in MiB, at least the least that starts a
    JupyterLab. ``total``: the machine's bytes (default: read from ``/proc/meminfo``)."""
    if total is None:
        fields = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines() if ":" in line)
        total = int(fields["MemTotal"].split()[0]) * 1024
    share = int(total * 0.8) // max(1, accounts) // 2**20
    return f"{max(MIN_MEMORY // 2**20, share)}M"


def check_cores(cores: float) -> float:
    if not isinstance(cores, (int, float)) or isinstance(cores, bool) or not math.isfinite(cores) or cores <= 0:
        raise LimitError(f"--cores {cores!r}: a number of cores above 0, e.g. 1.5")
    if cores > MAX_CORES or int(cores * PERIOD) < 1000:
        raise LimitError(f"--cores {cores!r}: from 0.01 to {MAX_CORES}")
    return float(cores)


def check_pids(pids: int) -> int:
    if not isinstance(pids, int) or isinstance(pids, bool) or not 16 <= pids <= 4_194_304:
        raise LimitError(f"--pids {pids!r}: a whole number of tasks from 16 up")
    return pids


def _own(controller: str | None) -> str:
    """This process's group path in the v1 ``controller`` hierarchy (or v2's when None)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if (controller is None and names == "") or (controller and controller in names.split(",")):
            return path.lstrip("/")
    return ""


def bases() -> dict[str, Path]:
    """Where the learners' groups go: ``{"v2": path}`` or ``{"cpu": .., "memory": .., "pids": .., "freezer": ..}``
    (v1; the freezer where it is mounted), or {}."""
    if (CGROUP / "cgroup.controllers").is_file():
        return {"v2": CGROUP / _own(None) / FOLDER}
    found = {}
    for c in (*V1, FREEZER):
        if (CGROUP / c / "cgroup.procs").is_file():
            found[c] = CGROUP / c / _own(c) / FOLDER
    return found


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _settings(kind: str, limits: Limits) -> list[tuple[str, str]]:
    """``(file, value)`` to write in a learner's group of ``kind`` (``v2`` or a v1 controller)."""
    quota = str(int(limits.cores * PERIOD)) if limits.cores else None
    if kind == "v2":
        return [*([("cpu.max", f"{quota} {PERIOD}")] if quota else []),
                *([("memory.max", str(limits.memory))] if limits.memory else []),
                *([("pids.max", str(limits.pids))] if limits.pids else [])]
    return {"cpu": [("cpu.cfs_period_us", str(PERIOD)), ("cpu.cfs_quota_us", quota)] if quota else [],
            "memory": [("memory.limit_in_bytes", str(limits.memory))] if limits.memory else [],
            "pids": [("pids.max", str(limits.pids))] if limits.pids else []}.get(kind, [])


def _make(name: str, limits: Limits) -> list[Path]:
    """Make the groups ``name`` with ``limits`` (OSError as it comes); their folders. On v1, a group in the freezer
    hierarchy too where one can be made (no limit: ``down`` freezes the learner's processes there before it
    kills them)."""
    where = bases()
    folders = []
    for kind, base in where.items():
        if kind not in ("v2", FREEZER) and kind not in limits.asked():
            continue
        folder = base / name
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            if kind == FREEZER:
                continue  # down kills in rounds instead
            raise
        folders.append(folder)
        if kind == "v2":
            enable = " ".join(f"+{c}" for c in limits.asked())
            if enable:
                _write(base.parent / "cgroup.subtree_control", enable)
                _write(base / "cgroup.subtree_control", enable)
        for file, value in _settings(kind, limits):
            _write(folder / file, value)
    return folders


def make(learner: str, limits: Limits) -> tuple[list[str], str | None]:
    """Make ``learner``'s groups with ``limits``; their ``cgroup.procs`` files, and a problem (or None)."""
    if not limits.asked():
        return [], None
    if not bases():
        return [], "no writable control groups for the core, memory or process limits"
    try:
        folders = _make(learner, limits)
    except OSError as e:
        return [], f"control groups could not be set up ({e})"
    return [str(f / "cgroup.procs") for f in folders], None


def read_back(folder: Path, kind: str, limits: Limits) -> list[str]:
    """What of ``limits`` does not read back from ``folder`` as written (memory is rounded to pages)."""
    wrong = []
    if kind == "v2":
        enabled = (folder / "cgroup.controllers").read_text().split()
        wrong += [f"the {c} controller is not enabled for the group" for c in limits.asked() if c not in enabled]
    page = os.sysconf("SC_PAGE_SIZE")
    for file, value in _settings(kind, limits):
        got = (folder / file).read_text().strip()
        close = file.startswith("memory") and got.isdigit() and abs(int(got) - int(value)) < page
        if got != value and not close:
            wrong.append(f"{file} reads {got!r} after writing {value!r}")
    return wrong


def probe(limits: Limits) -> str | None:
    """None when every limit of ``limits`` holds on this machine, else why not (all groups removed again)."""
    if not limits.asked():
        return None
    where = bases()
    if not where:
        return "no control groups are mounted at /sys/fs/cgroup"
    missing = [c for c in limits.asked() if "v2" not in where and c not in where]
    if missing:
        return f"cgroup v1 without the {', '.join(missing)} controller"
    name = f"probe-{os.getpid()}"
    child = None
    try:
        folders = _make(name, limits)
        wrong = []
        for folder in folders:
            kind = "v2" if "v2" in where else next(k for k, b in where.items() if folder.parent == b)
            wrong += read_back(folder, kind, limits)
        child = subprocess.Popen(["sleep", "30"], stdin=subprocess.DEVNULL)
        for folder in folders:
            _write(folder / "cgroup.procs", str(child.pid))
        inside = Path(f"/proc/{child.pid}/cgroup").read_text().count(f"/{FOLDER}/{name}")
        if inside < (1 if "v2" in where else len(folders)):
            wrong.append("a process moved into the group is not in it")
        return "; ".join(wrong) or None
    except OSError as e:
        return f"a control group with these limits cannot be made here ({e})"
    finally:
        if child is not None:
            child.kill()
            child.wait()
        remove([name])


def join(procs_files: list[str]) -> None:
    """In a child before exec: move this process into the groups (errors end up in the server's log)."""
    for path in procs_files:
        try:
            with open(path, "w") as f:
                f.write(str(os.getpid()))
        except OSError as e:
            os.write(2, f"labkit workshop: could not join {path}: {e}\n".encode())


def enter(procs_files: list[str], limits: Limits) -> None:
    """In a child before it becomes the learner: join the learner's groups, and cap the learner's tasks with
    ``RLIMIT_NPROC`` too (soft and hard: the learner cannot raise it). The cap counts the learner's tasks
    everywhere on the machine, and Slurm hands it on to the learner's jobs (``PropagateResourceLimits``), whose
    control groups hold CPUs and memory but not tasks."""
    join(procs_files)
    if limits.pids:
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.pids, limits.pids))


def _pids(folder: Path) -> set[int]:
    """The processes in the group ``folder`` and in any group below it."""
    pids = set()
    for procs in (folder / "cgroup.procs", *folder.glob("**/cgroup.procs")):
        try:
            pids.update(int(p) for p in procs.read_text().split())
        except (OSError, ValueError):
            continue
    return pids


def _populated(folders: dict[str, Path]) -> bool:
    """Does any of a learner's groups hold a process? (v2: ``cgroup.events``, which counts the groups below)"""
    for kind, folder in folders.items():
        if kind == "v2" and (folder / "cgroup.events").is_file():
            if "populated 1" in (folder / "cgroup.events").read_text():
                return True
        elif _pids(folder):
            return True
    return False


def _wait(done, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _kill_in(folders: dict[str, Path]) -> None:
    """SIGKILL every process listed in the groups, each only while it is still in one of them."""
    marks = {f"/{FOLDER}/{folder.name}" for folder in folders.values()}

    def inside(pid: int) -> bool:
        try:
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        except OSError:
            return False
        return any(line.rstrip("/").endswith(mark) or f"{mark}/" in line for line in lines for mark in marks)

    for pid in set().union(*(_pids(f) for f in folders.values())):
        ending.signal_pid(pid, inside)


def _frozen(kind: str, folder: Path, freeze: bool) -> bool:
    """Freeze (or thaw) the group; True once the kernel says it is frozen (thawed at once)."""
    if kind == "v2":
        _write(folder / "cgroup.freeze", "1" if freeze else "0")
        return not freeze or _wait(lambda: "frozen 1" in (folder / "cgroup.events").read_text(), 1.0)
    _write(folder / "freezer.state", "FROZEN" if freeze else "THAWED")
    return not freeze or _wait(lambda: (folder / "freezer.state").read_text().strip() == "FROZEN", 1.0)


def _end_group(folders: dict[str, Path]) -> int:
    """End every process in one learner's groups; rounds it took (0: there was none). OSError when the groups
    still hold processes after :data:`ROUNDS` rounds."""
    for rounds in range(ROUNDS):
        if not _populated(folders):
            return rounds
        v2 = folders.get("v2")
        if v2 is not None and (v2 / KILL).is_file():  # the kernel kills the whole group, forks and all
            _write(v2 / KILL, "1")
        else:
            kind, cold = ("v2", v2) if v2 is not None else (FREEZER, folders.get(FREEZER))
            if cold is not None and (cold / ("cgroup.freeze" if kind == "v2" else "freezer.state")).is_file():
                try:  # frozen, nothing in it forks or exits: every pid listed is killed
                    _frozen(kind, cold, True)
                    _kill_in(folders)
                finally:
                    _frozen(kind, cold, False)
            else:  # no freezer: kill what is listed, again and again
                _kill_in(folders)
        _wait(lambda: not _populated(folders), 0.5)
    if _populated(folders):
        pids = sorted(set().union(*(_pids(f) for f in folders.values())))
        raise OSError(errno.EBUSY, f"still holds processes after {ROUNDS} rounds of SIGKILL: {pids[:10]}")
    return ROUNDS


def end(learners: list[str]) -> list[str]:
    """End every process in the learners' groups: cgroup v2's ``cgroup.kill`` where the kernel has it, else the
    group frozen (v2's ``cgroup.freeze``, v1's freezer), each of its processes killed, and the group thawed;
    without a freezer, its processes killed in rounds until none is left. What was ended, and what was not."""
    said = []
    where = bases()
    for learner in learners:
        folders = {kind: base / learner for kind, base in where.items() if (base / learner).is_dir()}
        if not folders:
            continue
        try:
            if _end_group(folders):
                said.append(f"the processes in {learner}'s control group ended")
        except OSError as e:
            said.append(f"{learner}'s control group {next(iter(folders.values()))}: {e.strerror or e}; "
                        "it is kept (run `labkit workshop down` again)")
    return said


def left(learners: list[str]) -> list[str]:
    """The learners whose groups are still there."""
    where = bases()
    return [n for n in learners if any((base / n).is_dir() for base in where.values())]


def remove(learners: list[str]) -> list[str]:
    """Remove the learners' groups once no process is in them (a group that still holds one is kept and said),
    then the ``labkit-workshop`` folders when they are empty."""
    removed = []
    for kind, base in bases().items():
        for learner in learners:
            folder = base / learner
            if not folder.is_dir():
                continue
            if _populated({kind: folder}):
                removed.append(f"{folder} kept: processes are still in it")
                continue
            try:
                folder.rmdir()
                removed.append(str(folder))
            except OSError as e:
                removed.append(f"{folder} not removed ({e.strerror})")
        try:
            base.rmdir()
            removed.append(str(base))
        except OSError:
            continue
    return removed
