"""Cores and memory per learner: a control group per learner that the learner's server starts in.

JupyterHub's ``LocalProcessSpawner`` enforces no ``cpu_limit``/``mem_limit``; the workshop's spawner
(:mod:`labkit.workshop.spawner`) puts each single-user server, before it runs, into the learner's group
here, and everything the server starts (kernels, terminals, ``mpirun`` and its ranks) stays in it.
Groups live under this process's own group, in a ``labkit-workshop`` folder: cgroup v2 (``cpu.max``,
``memory.max``) or v1 (``cpu.cfs_quota_us``, ``memory.limit_in_bytes``). Where neither can be written,
:func:`make` says so and learners run unlimited.
"""

from __future__ import annotations

import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
FOLDER = "labkit-workshop"
PERIOD = 100_000  # microseconds


def _own(controller: str | None) -> str:
    """This process's group path in the v1 ``controller`` hierarchy (or v2's when None)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, names, path = line.split(":", 2)
        if (controller is None and names == "") or (controller and controller in names.split(",")):
            return path.lstrip("/")
    return ""


def bases() -> dict[str, Path]:
    """Where the learners' groups go: ``{"v2": path}`` or ``{"cpu": path, "memory": path}`` (v1), or {}."""
    if (CGROUP / "cgroup.controllers").is_file():
        return {"v2": CGROUP / _own(None) / FOLDER}
    found = {}
    for c in ("cpu", "memory"):
        if (CGROUP / c / "cgroup.procs").is_file():
            found[c] = CGROUP / c / _own(c) / FOLDER
    return found


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def make(learner: str, cores: float | None, memory: int | None) -> tuple[list[str], str | None]:
    """Make ``learner``'s groups with the limits; their ``cgroup.procs`` files, and a problem (or None)."""
    where = bases()
    if not where:
        return [], "no writable control groups: learners run without core or memory limits"
    files = []
    try:
        for kind, base in where.items():
            folder = base / learner
            folder.mkdir(parents=True, exist_ok=True)
            if kind == "v2":
                _write(base.parent / "cgroup.subtree_control", "+cpu +memory")
                _write(base / "cgroup.subtree_control", "+cpu +memory")
                if cores:
                    _write(folder / "cpu.max", f"{int(cores * PERIOD)} {PERIOD}")
                if memory:
                    _write(folder / "memory.max", str(memory))
            elif kind == "cpu" and cores:
                _write(folder / "cpu.cfs_period_us", str(PERIOD))
                _write(folder / "cpu.cfs_quota_us", str(int(cores * PERIOD)))
            elif kind == "memory" and memory:
                _write(folder / "memory.limit_in_bytes", str(memory))
            files.append(str(folder / "cgroup.procs"))
    except OSError as e:
        return files, f"control groups could not be set up ({e}): learners run without some limits"
    return files, None


def join(procs_files: list[str]) -> None:
    """In a child before exec: move this process into the groups (errors end up in the server's log)."""
    for path in procs_files:
        try:
            with open(path, "w") as f:
                f.write(str(os.getpid()))
        except OSError as e:
            os.write(2, f"labkit workshop: could not join {path}: {e}\n".encode())


def remove(learners: list[str]) -> list[str]:
    """Remove the learners' groups (their processes must have ended) and the ``labkit-workshop`` folders."""
    removed = []
    for base in bases().values():
        for learner in learners:
            if (base / learner).is_dir():
                try:
                    (base / learner).rmdir()
                    removed.append(str(base / learner))
                except OSError:
                    continue
        try:
            base.rmdir()
            removed.append(str(base))
        except OSError:
            continue
    return removed
