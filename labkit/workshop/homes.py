"""A learner's home at first login: their own released course, the shared environment and data set.

:func:`prepare` writes ``labkit release`` of the course source into ``HOME/course`` (owned by the learner),
links ``HOME/course/.venv`` to the project's environment (one Horovod build for the class, read-only to
learners: it belongs to root) and ``HOME/.keras/datasets/fashion-mnist`` to the workshop's read-only copy
of Fashion-MNIST, where ``tf.keras.datasets.fashion_mnist.load_data()`` finds it offline. A home already
holding the course is left alone: a learner's work survives a restart of their server.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from labkit.core import contract
from labkit.course import release

COURSE = "course"  # HOME/course: the learner's copy
DATA_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
              "t10k-labels-idx1-ubyte.gz")
KERAS_DATA = Path(".keras") / "datasets" / "fashion-mnist"
PROFILE_MARK = "# labkit workshop: the class's shared environment first"


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


def chown_tree(top: Path, uid: int, gid: int) -> None:
    os.lchown(top, uid, gid)
    for folder, dirs, files in os.walk(top):
        for name in (*dirs, *files):
            os.lchown(os.path.join(folder, name), uid, gid)


def add_to_profile(profile: Path, uid: int, gid: int) -> None:
    """A login shell (JupyterLab's terminals run ``bash -l``, whose ``/etc/profile`` resets ``PATH``) finds
    ``labkit``, ``mpirun`` and the environment's Python first, as the learner's server does."""
    text = profile.read_text() if profile.is_file() and not profile.is_symlink() else ""
    if PROFILE_MARK not in text:
        profile.write_text(text + f'\n{PROFILE_MARK}\nexport PATH="{venv() / "bin"}:$PATH"\n')
        os.lchown(profile, uid, gid)


def prepare(home: Path, uid: int, gid: int, source: Path, data: Path | None) -> bool:
    """Give the learner in ``home`` the course (once); True when it was written now."""
    course = home / COURSE
    fresh = not course.exists()
    if fresh:
        release.release(course, root=source)
        (course / ".venv").symlink_to(venv(), target_is_directory=True)
        chown_tree(course, uid, gid)
        add_to_profile(home / ".profile", uid, gid)
    link = home / KERAS_DATA
    if data is not None and not link.exists() and not link.is_symlink():
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(data, target_is_directory=True)
        chown_tree(home / ".keras", uid, gid)
    return fresh


def closed_folders(targets: list[Path]) -> list[Path]:
    """Folders on the way to ``targets`` that other users cannot pass (no ``o+x``): learners could not run
    the shared environment (e.g. a Python built under ``/root``)."""
    closed: dict[Path, None] = {}
    for target in targets:
        real = Path(os.path.realpath(target))
        for folder in [*reversed(real.parents), *([real] if real.is_dir() else [])]:
            try:
                if not folder.stat().st_mode & 0o001:
                    closed[folder] = None
            except OSError:
                continue
    return list(closed)


def shared_paths(source: Path) -> list[Path]:
    """What every learner's processes must reach: the interpreter, its standard library, the environment, the course."""
    return [Path(sys.executable), Path(sys.base_prefix) / "lib", venv(), source]
