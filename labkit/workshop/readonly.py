"""What root shares with every learner, read-only, and the permissions that make exactly that reachable.

* :func:`publish`: the course released once (``labkit release --solutions graded``: no solution in it; the
  instructor reveals steps with ``labkit workshop reveal``) into a folder of the workshop's state,
  root's, folders ``rwxr-xr-x`` and files ``rw-r--r--``, its ``labkit`` compiled. Each learner's own
  ``~/course`` is copied from it by the learner (:mod:`labkit.workshop.homes`), and every learner's server
  imports ``labkit`` from it: no code a learner can change runs in their server.
* :func:`share_data`: one read-only copy of Fashion-MNIST.
* :func:`plan_access`: the mode changes that let learners run the shared interpreter and environment, and
  nothing more. A folder on the way to them that others cannot pass (e.g. ``/root`` holding a pyenv
  Python) gets ``o+x`` (passing, no listing), and every other entry directly in it that others could
  otherwise open by name loses its ``o`` bits: what was out of reach before stays out of reach. The
  course source's answers (``solutions/``, ``course/INSTRUCTOR.md``, the tests and the git history) lose
  their ``o`` bits wherever learners could reach them. ``workshop down`` restores every mode.
"""

from __future__ import annotations

import compileall
import os
import shutil
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

from labkit.core import contract
from labkit.course import release, solutions

DATA_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
              "t10k-labels-idx1-ubyte.gz")
KERAS_DATA = Path(".keras") / "datasets" / "fashion-mnist"
ANSWERS = ("solutions", *(str(p) for p in release.KEPT_BACK), "tests", ".git")  # in the course source
OTHERS = 0o007


def venv() -> Path:
    """The environment this labkit runs in (shared by the class)."""
    return Path(sys.prefix)


def data_source() -> Path | None:
    """A folder holding Fashion-MNIST on this machine: ``$LABKIT_DATA``, ``~/.keras``, or the system copy."""
    places = [os.environ.get(contract.DATA), str(Path.home() / KERAS_DATA), "/usr/share/datasets/fashion-mnist"]
    for place in places:
        if place and all((Path(place) / f).is_file() for f in DATA_FILES):
            return Path(place)
    return None


def share_data(into: Path) -> Path | None:
    """Copy the data set to ``into`` (``rwxr-xr-x``, files ``rw-r--r--``); None when there is none here."""
    source = data_source()
    if source is None:
        return None
    into.mkdir(parents=True, exist_ok=True)
    into.chmod(0o755)
    for name in DATA_FILES:
        shutil.copyfile(source / name, into / name)
        (into / name).chmod(0o644)
    return into


def publish(source: Path, into: Path) -> Path:
    """The learners' release of ``source`` in the new folder ``into``, root's and read-only to others."""
    into.mkdir(mode=0o755)
    release.release(into, root=source, mode=solutions.GRADED)  # steps are revealed to the class, on the record
    compileall.compile_dir(into / "labkit", quiet=1)
    for folder, _dirs, files in os.walk(into):
        os.chmod(folder, 0o755)
        for name in files:
            path = os.path.join(folder, name)
            os.chmod(path, 0o755 if os.stat(path).st_mode & 0o100 else 0o644)
    return into


def env_paths() -> list[Path]:
    """What every learner's processes must reach: the interpreter, its standard library, the environment."""
    return [Path(sys.executable), Path(sys.base_prefix) / "lib", venv()]


def _on_the_way(targets: list[Path]) -> list[Path]:
    """Every folder from ``/`` to each target (resolved), the target too when it is a folder."""
    found: dict[Path, None] = {}
    for target in targets:
        real = Path(os.path.realpath(target))
        for folder in [*reversed(real.parents), *([real] if real.is_dir() else [])]:
            found[folder] = None
    return list(found)


def closed_folders(targets: list[Path]) -> list[Path]:
    """Folders on the way to ``targets`` that other users cannot pass (no ``o+x``)."""
    return [f for f in _on_the_way(targets) if f.exists() and not f.stat().st_mode & 0o001]


@dataclass(frozen=True)
class ModeChange:
    path: Path
    mode: int  # the new mode (permission bits)
    why: str


def _reachable(path: Path, passable: set[Path]) -> bool:
    """Others can reach ``path`` by name: every folder above it lets others pass (now or after the plan)."""
    return all(p in passable or p.stat().st_mode & 0o001 for p in path.parents)


def set_mode(path: Path, mode: int) -> int:
    """Set ``path``'s permission bits, never through a symbolic link (opened ``O_NOFOLLOW``, so a link put there
    after the plan is refused, not followed; ``O_NONBLOCK``: a FIFO does not hold root); the mode it had."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        old = stat.S_IMODE(os.fstat(fd).st_mode)
        os.fchmod(fd, mode)
        return old
    finally:
        os.close(fd)


def plan_access(source: Path, targets: list[Path] | None = None) -> list[ModeChange]:
    """The mode changes letting others reach ``targets`` (default :func:`env_paths`) and not ``source``'s answers."""
    targets = env_paths() if targets is None else targets
    way = set(_on_the_way(targets))
    opened = closed_folders(targets)
    changes = [ModeChange(f, stat.S_IMODE(f.stat().st_mode) | 0o001, "on the way to the shared environment")
               for f in opened]
    for folder in opened:
        for entry in sorted(folder.iterdir()):
            st = entry.lstat()
            if entry not in way and not stat.S_ISLNK(st.st_mode) and st.st_mode & OTHERS:
                changes.append(ModeChange(entry, stat.S_IMODE(st.st_mode) & ~OTHERS, f"kept closed in {folder}"))
    passable = set(opened)
    for name in ANSWERS:
        answer = source / name
        try:
            st = answer.lstat()
        except FileNotFoundError:
            continue
        seen = {c.path for c in changes}
        if answer not in seen and not stat.S_ISLNK(st.st_mode) and st.st_mode & OTHERS and _reachable(answer, passable):
            changes.append(ModeChange(answer, stat.S_IMODE(st.st_mode) & ~OTHERS, "an answer of the course"))
    return changes
