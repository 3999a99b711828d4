"""``files.remove_tree``: the one remover of a tree someone else filled. Depth far past Python's recursion limit,
links to canaries outside (which survive), a symbolic link as the top, folders closed to their owner, FIFOs,
sockets, a device, odd names, and a file system mounted inside (not entered, named as left)."""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from labkit.core import files

NOBODY = 65534


def _deep(top: Path, depth: int, every: int = 100) -> int:
    """A chain of ``depth`` folders below ``top`` (made relative to each other: its paths pass PATH_MAX), a file
    and a FIFO every ``every`` levels; how many entries it made."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    made = 0
    try:
        for level in range(depth):
            if level % every == 0:
                os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
                os.mkfifo("p", dir_fd=fd)
                made += 2
            os.mkdir("d", dir_fd=fd)
            made += 1
            down = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = down
    finally:
        os.close(fd)
    return made


def _canaries(tmp_path: Path) -> tuple[Path, Path]:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("canary")
    folder = outside / "folder"
    folder.mkdir()
    (folder / "inner.txt").write_text("canary")
    return outside / "keep.txt", folder


def _intact(canary: Path, folder: Path) -> None:
    assert canary.read_text() == "canary" and (folder / "inner.txt").read_text() == "canary"


def test_a_tree_3000_folders_deep_goes_without_recursion(tmp_path: Path) -> None:
    top = tmp_path / "deep"
    made = _deep(top, 3000)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # far below the depth: any recursion would fail
    start = time.monotonic()
    try:
        files.remove_tree(top)
    finally:
        sys.setrecursionlimit(limit)
    took = time.monotonic() - start
    assert not top.exists() and made > 3000
    print(f"\n3000 folders deep ({made} entries): removed in {took:.2f} s")


def test_links_are_removed_and_never_followed(tmp_path: Path) -> None:
    canary, folder = _canaries(tmp_path)
    top = tmp_path / "tree"
    (top / "sub").mkdir(parents=True)
    (top / "to-file").symlink_to(canary)
    (top / "to-folder").symlink_to(folder)
    (top / "sub" / "to-folder-rel").symlink_to(os.path.relpath(folder, top / "sub"))
    (top / "sub" / "loop").symlink_to("loop")
    (top / "sub" / "dangling").symlink_to(tmp_path / "nothing")
    os.link(canary, top / "hard")  # a second name of the canary: the name goes, the file stays
    files.remove_tree(top)
    assert not top.exists()
    _intact(canary, folder)


def test_a_symbolic_link_at_the_top_is_removed_not_its_target(tmp_path: Path) -> None:
    canary, folder = _canaries(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(folder, target_is_directory=True)
    files.remove_tree(link)
    assert not os.path.lexists(link)
    _intact(canary, folder)
    files.remove_tree(tmp_path / "never-there")  # nothing to do
    with pytest.raises(ValueError):
        files.remove_tree("/")


def _odd_tree(top: Path) -> None:
    """Closed folders (000, read-only, write-only), a FIFO, a socket, odd names."""
    (top / "closed" / "inner").mkdir(parents=True)
    (top / "closed" / "inner" / "f").write_text("x")
    (top / "readonly" / "sub").mkdir(parents=True)
    (top / "readonly" / "sub" / "f").write_text("x")
    (top / "writeonly").mkdir()
    (top / "writeonly" / "f").write_text("x")
    os.mkfifo(top / "fifo")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(top / "sock"))
    odd = os.fsencode(top) + b"/\xff\n-- *?\\ \t.."
    os.mkdir(odd)
    with open(odd + b"/-rf", "w") as f:
        f.write("x")
    (top / "closed" / "inner").chmod(0)
    (top / "closed").chmod(0)
    (top / "readonly" / "sub").chmod(0o500)
    (top / "readonly").chmod(0o555)
    (top / "writeonly").chmod(0o300)
    (top / "fifo").chmod(0)
    top.chmod(0o500)


def test_closed_folders_fifos_sockets_and_odd_names(tmp_path: Path) -> None:
    top = tmp_path / "odd"
    top.mkdir()
    _odd_tree(top)
    if os.geteuid() == 0:
        os.mknod(top / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # unlinked, never opened
    start = time.monotonic()
    files.remove_tree(top)  # a FIFO is never opened: this does not wait for a writer
    assert not top.exists() and time.monotonic() - start < 5


@pytest.mark.skipif(os.geteuid() != 0, reason="as any other user, the test above is this one")
def test_closed_folders_of_their_own_owner_not_root() -> None:
    """Root reads and writes every folder; the owner of a ``chmod 000`` folder, not root, opens it first."""
    home = Path(tempfile.mkdtemp(prefix="labkit-remove-"))
    try:
        os.chown(home, NOBODY, NOBODY)
        pid = os.fork()
        if pid == 0:  # the child: nobody, for good
            code = 70
            try:
                os.setgroups([])
                os.setresgid(NOBODY, NOBODY, NOBODY)
                os.setresuid(NOBODY, NOBODY, NOBODY)
                top = home / "odd"
                top.mkdir()
                _odd_tree(top)
                files.remove_tree(top)
                code = 0 if not os.path.lexists(top) else 71
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        subprocess.run(["rm", "-rf", "--one-file-system", str(home)], check=True, timeout=60)


@contextlib.contextmanager
def _mounted(point: Path, *args: str) -> Iterator[bool]:
    point.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", *args, str(point)], capture_output=True, timeout=30).returncode == 0
    try:
        yield done
    finally:
        if done:
            subprocess.run(["umount", str(point)], capture_output=True, timeout=30, check=True)


def test_another_file_system_below_is_not_entered(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting needs root")
    canary, folder = _canaries(tmp_path)
    top = tmp_path / "tree"
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f").write_text("x")
    (top / "z").write_text("x")
    with _mounted(top / "a" / "tmpfs", "-t", "tmpfs", "none") as tmpfs, \
            _mounted(top / "bind", "--bind", str(folder)) as bind:
        if not (tmpfs and bind):
            pytest.skip("mount is not allowed here")
        (top / "a" / "tmpfs" / "keep").write_text("canary")
        with pytest.raises(OSError) as caught:
            files.remove_tree(top)
        assert caught.value.errno in (errno.EXDEV, errno.ENOTEMPTY, errno.EBUSY), caught.value
        assert "tmpfs" in str(caught.value) and "bind" in str(caught.value)
        assert (top / "a" / "tmpfs" / "keep").read_text() == "canary"
        _intact(canary, folder)
        assert sorted(p.name for p in top.iterdir()) == ["a", "bind"]  # the rest went
        assert [p.name for p in (top / "a").iterdir()] == ["tmpfs"]
        with pytest.raises(OSError, match="mounted"):
            files.remove_tree(top / "bind")  # a mount at the top is not entered either
    files.remove_tree(top)
    assert not top.exists()
    _intact(canary, folder)
