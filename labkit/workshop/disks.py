"""A disk of its own for each account's home: a file system of fixed size, so that one learner cannot fill the
machine's disk for the class (and the hub, the state folder, the queue).

Machines rarely have user quotas turned on, and turning them on is not the workshop's to do. Instead ``up`` makes
each account's home a file system of its own: a sparse image file in the state folder (``STATE/disks/NAME.img``,
root's, ``rw-------``; it takes on the real disk only what the learner writes), made with ``mkfs.ext4`` with the
account as the owner of its top folder, mounted on the home with ``nosuid,nodev`` over a loop device. A learner
who writes more than ``--disk`` gets ``No space left on device`` in their own home, and nobody else notices. The
private temporary folders (:mod:`labkit.workshop.worlds`) are tmpfs within the learner's memory limit. Each
learner's file in the class folder, where they append their records, is on a small disk of its own too
(:func:`make_records`: ``STATE/disks/records-NAME.img``, mounted on a folder of root's, the file bound onto
``STATE/class/NAME.jsonl``), so that a learner who floods their records fills neither the machine's disk nor
the others' room for theirs. ``down`` detaches each disk (lazily: what still holds it lets go as its processes
are ended) and deletes the image.

Where loop devices cannot be used (a container without them), ``up`` refuses and says so, unless it is told
``--no-disk-limit``. The command builders here read nothing; :func:`make` and :func:`remove` run them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from labkit.records import classlog

SIZE = re.compile(r"[1-9][0-9]{0,5}[MGT]")
DEFAULT = "5G"
MIN_BYTES = 256 * 2**20


class DiskError(RuntimeError):
    """A home's disk cannot be made or removed; the message says which and why."""


def check_size(size: str) -> str:
    """``size`` when it is e.g. ``5G`` and at least 256M; else :class:`DiskError`."""
    if not isinstance(size, str) or not SIZE.fullmatch(size):
        raise DiskError(f"--disk {size!r}: a size such as 5G (M, G or T)")
    if int(size[:-1]) * 1024 ** ("MGT".index(size[-1]) + 2) < MIN_BYTES:
        raise DiskError(f"--disk {size!r}: at least 256M, a course and its runs need room")
    return size


def image(folder: Path, name: str) -> Path:
    return folder / f"{name}.img"


def make_commands(img: Path, size: str, uid: int, gid: int) -> list[list[str]]:
    """Make the image (sparse) and its file system, whose top folder is the account's."""
    return [["truncate", "--size", check_size(size), str(img)],
            ["mkfs.ext4", "-q", "-F", "-m", "0", "-E", f"root_owner={int(uid)}:{int(gid)}", "-L", "labkit-home",
             str(img)]]


def mount_command(img: Path, home: Path) -> list[str]:
    return ["mount", "-o", "loop,nosuid,nodev", str(img), str(home)]


def unmount_command(home: Path) -> list[str]:
    return ["umount", "--lazy", str(home)]


def _run(argv: list[str]) -> None:
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        raise DiskError(f"`{' '.join(argv)}` could not run: {e}") from e
    if done.returncode != 0:
        raise DiskError(f"`{' '.join(argv)}` failed: {(done.stderr or done.stdout).strip()[-300:]}")


def missing() -> str | None:
    """Why homes cannot get disks of their own here, or None."""
    for tool in ("truncate", "mkfs.ext4", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (e2fsprogs, util-linux)"
    if not Path("/dev/loop-control").exists():
        return "there are no loop devices (/dev/loop-control): in a container, run it with --privileged"
    return None


def mounted(home: Path) -> bool:
    """Is a file system mounted on ``home`` (read from /proc/self/mountinfo, never through the home)?"""
    target = str(home)
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4].encode().decode("unicode_escape") == target:
            return True
    return False


def make(folder: Path, name: str, home: Path, size: str) -> None:
    """``name``'s disk, mounted on their fresh ``home`` (made by useradd, not yet touched by the learner)."""
    info = os.stat(home, follow_symlinks=False)
    _mount_new(folder, name, home, make_commands(image(folder, name), size, info.st_uid, info.st_gid))


def _mount_new(folder: Path, name: str, where: Path, commands: list[list[str]]) -> None:
    """Make ``name``'s image in ``folder`` with ``commands`` (root's, ``rw-------``) and mount it on ``where``,
    whose top folder is then ``rwx------`` and without mkfs's ``lost+found``."""
    folder.mkdir(mode=0o700, exist_ok=True)
    for argv in commands:
        _run(argv)
    image(folder, name).chmod(0o600)
    _run(mount_command(image(folder, name), where))
    os.chmod(where, 0o700, follow_symlinks=False)  # the new file system's top folder (a home: the account's)
    lost = where / "lost+found"  # mkfs's, root's: not the learner's to see
    if lost.is_dir() and not lost.is_symlink():
        lost.rmdir()


RECORDS = "records-"  # each learner's class records' disk: STATE/disks/records-NAME.img on STATE/disks/records-NAME
RECORDS_SIZE = "8M"  # room for about 6 MiB of records (the class view reads 2 MiB of each file at most)


def records_commands(img: Path) -> list[list[str]]:
    """Make the records' image (sparse) and its file system, root's."""
    return [["truncate", "--size", RECORDS_SIZE, str(img)],
            ["mkfs.ext4", "-q", "-F", "-m", "0", "-L", "labkit-records", str(img)]]


def make_records(folder: Path, learner: str, target: Path, owner: tuple[int, int]) -> None:
    """``learner``'s class file (``target``, an empty file of theirs in the class folder) on a disk of its own: the
    disk is mounted on a folder of root's (``rwx------``), the file made there is ``owner``'s (uid, gid;
    ``rw-r-----``), and it is bound onto ``target``, the one way anyone reaches it."""
    where = folder / (RECORDS + learner)
    folder.mkdir(mode=0o700, exist_ok=True)
    where.mkdir(mode=0o700)
    _mount_new(folder, RECORDS + learner, where, records_commands(image(folder, RECORDS + learner)))
    source = classlog.prepare(where, learner, *owner)
    _run(["mount", "--bind", str(source), str(target)])


def remove_records(folder: Path, learner: str, target: Path) -> list[str]:
    """Unbind ``learner``'s class file from ``target``, then detach its disk and delete the image."""
    removed = []
    if mounted(target):
        _run(unmount_command(target))
        removed.append(f"{learner}'s class file unbound from {target}")
    removed += remove(folder, RECORDS + learner, folder / (RECORDS + learner))
    try:
        (folder / (RECORDS + learner)).rmdir()
    except OSError:
        pass  # already gone, or still held (lazily detached): the state folder goes last
    return removed


def remove(folder: Path, name: str, home: Path) -> list[str]:
    """Detach ``name``'s disk from their home (lazily) and delete its image; what was removed."""
    removed = []
    if mounted(home):
        _run(unmount_command(home))
        removed.append(f"{name}'s disk unmounted from {home}")
    img = image(folder, name)
    if img.exists():
        img.unlink()
        removed.append(str(img))
    return removed
