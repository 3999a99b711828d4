"""Each learner's server writes its output (and its kernels') to a file of its own, bounded, never to the hub's log.

JupyterHub's ``LocalProcessSpawner`` lets a server inherit the hub's output: a learner's kernel could grow the
hub's log without bound and plant lines in it that look like the hub's. Here the server writes into a pipe; a
thread of the hub copies it into ``FOLDER/NAME.log`` (root's, ``rw-------``) until the file holds ``limit`` bytes
(over all the learner's starts), then one line per start saying how much more was dropped, and keeps reading (so
the server never blocks) until the pipe closes. A server that is a Slurm job writes through :func:`main`, run by
root on its node.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

LIMIT = 8 * 2**20  # bytes of a learner's servers' output kept, over all their starts
CHUNK = 65536


def _copy(read_fd: int, path: Path, limit: int) -> None:
    dropped = 0
    out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    kept = os.fstat(out).st_size  # the file's cap holds over every start, not each
    try:
        while chunk := os.read(read_fd, CHUNK):
            room = max(0, limit - kept)
            if room:
                os.write(out, chunk[:room])
                kept += min(room, len(chunk))
            dropped += max(0, len(chunk) - room)
        if dropped:
            os.write(out, f"\n[labkit workshop: {dropped} more bytes of output dropped after {limit}]\n".encode())
    finally:
        os.close(out)
        os.close(read_fd)


def open_log(folder: Path, name: str, limit: int = LIMIT) -> int:
    """A pipe whose write end (returned: give it to the server as stdout and stderr, then close it) ends in
    ``folder/name.log``, at most ``limit`` bytes of it."""
    folder.mkdir(mode=0o700, exist_ok=True)
    read_fd, write_fd = os.pipe()
    threading.Thread(target=_copy, args=(read_fd, folder / f"{name}.log", limit), daemon=True,
                     name=f"log of {name}'s server").start()
    return write_fd


def main(argv: list[str] | None = None) -> int:
    """``python -I -m labkit.workshop.serverlog FILE``: standard input into ``FILE``, bounded as above. Root's job
    script on a node pipes a server's output here (``--spawner slurm``), so that it lands in root's folder."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m labkit.workshop.serverlog FILE", file=sys.stderr)
        return 2
    _copy(os.dup(0), Path(args[0]), LIMIT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
