"""One JSON object appended as one line of a JSON Lines file, atomically with respect to other writers and readers.

The run records (:mod:`labkit.records.runs`) and the learner's check record (:mod:`labkit.records.checklog`) are
appended here: the whole line is written with one ``write`` to a file opened in append mode, under an exclusive
lock, so a line is never half-written and concurrent writers do not interleave. Values JSON cannot hold (NaN,
infinities) are written as null (:func:`labkit.core.files.json_safe`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from labkit.core import files


def append_line(row: dict[str, Any], path: str | os.PathLike) -> Path:
    """Append ``row`` as one line of ``path`` (its folder made if needed); return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(files.json_safe(row), separators=(",", ":"), allow_nan=False) + "\n").encode()
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
        except (ImportError, OSError):  # pragma: no cover - no locking on this platform/file system
            pass
        written = os.write(fd, line)
        while written < len(line):  # pragma: no cover - regular files take it in one write
            written += os.write(fd, line[written:])
    finally:
        os.close(fd)  # closing releases the lock
    return target
