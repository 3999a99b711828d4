"""Reading what processes write: a pipe in chunks, a growing log file followed as it grows."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path


def follow(path: Path, on_output: Callable[[bytes], None] | None, stop: threading.Event,
           on_end: Callable[[], None] | None = None, every: float = 0.2) -> None:
    """Feed what is appended to ``path`` (which may not exist yet) to ``on_output`` until ``stop`` is set."""
    pos = 0
    try:
        while True:
            ending = stop.is_set()
            try:
                with open(path, "rb") as f:
                    f.seek(pos)
                    chunk = f.read()
            except OSError:
                chunk = b""
            if chunk:
                pos += len(chunk)
                if on_output:
                    on_output(chunk)
            if ending:
                return
            stop.wait(every)
    finally:
        if on_end:
            on_end()


def read_chunks(fd: int, size: int = 65536) -> Iterable[bytes]:
    """What a pipe gives until its writers have all closed it (or it breaks)."""
    while True:
        try:
            chunk = os.read(fd, size)
        except InterruptedError:
            continue
        except OSError:
            return
        if not chunk:
            return
        yield chunk
