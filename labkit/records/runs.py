"""Run records: one JSON line per training run, in ``runs/runs.jsonl``.

Every run that labkit starts (``labkit run``/``bench``/``cluster``, the same from a
cell) adds one record, although the script carries no labkit code: the processes
are observed from outside (:mod:`labkit.instrument.observe`) and the launcher writes the
record when the job ends (:mod:`labkit.records.jobrecord`): what ran, on how many workers
and threads, how fast it trained (images/sec timed on training steps only,
validation excluded), the validation accuracy of each epoch, the time to the
target accuracy, and how it ended.

Records are appended with one ``write`` of a whole line to a file opened in append
mode under an exclusive lock, so a record is never half-written and concurrent
runs do not interleave; :func:`read` skips (and counts) any damaged line.

While training, the chief process also keeps ``runs/live/RUN_ID.json`` up to date (the
progress of the current run, replaced atomically each epoch) for
:mod:`labkit.ui.dashboard`.

Where records go: the ``path`` argument, else ``$LABKIT_RUNS_FILE``, else
``runs/runs.jsonl`` under the current directory.
"""

from __future__ import annotations

import json
import os
import statistics
import time
import uuid
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from labkit.core import contract, files
from labkit.course import labs

DEFAULT_FILE = "runs/runs.jsonl"
FILE_VAR = contract.RUNS_FILE
RUN_ID_VAR = contract.RUN_ID
LAUNCHER_VAR = contract.LAUNCHER
SCHEMA = 2


def runs_file(path: str | os.PathLike | None = None) -> Path:
    """The records file: ``path``, else ``$LABKIT_RUNS_FILE``, else ``runs/runs.jsonl``."""
    return Path(path or os.environ.get(FILE_VAR) or DEFAULT_FILE)


def live_file(run_id: str, path: str | os.PathLike | None = None) -> Path:
    """Where the progress of a running job is kept: ``<records folder>/live/RUN_ID.json``."""
    return runs_file(path).parent / "live" / f"{run_id}.json"


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def append(record: dict[str, Any], path: str | os.PathLike | None = None) -> Path:
    """Append ``record`` as one line, atomically with respect to other writers and readers."""
    target = runs_file(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(files.json_safe(record), separators=(",", ":"), allow_nan=False) + "\n").encode()
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


class Records(list):
    """The records of a file (a list of dicts) plus ``skipped``, the damaged lines left out."""

    skipped: int = 0


def read(path: str | os.PathLike | None = None, warn: bool = True) -> Records:
    """Every well-formed record of the file, oldest first; damaged lines are skipped."""
    out = Records()
    target = runs_file(path)
    if not target.exists():
        return out
    with open(target, "rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                out.skipped += 1
                continue
            if isinstance(rec, dict):
                out.append(rec)
            else:
                out.skipped += 1
    if out.skipped and warn:
        warnings.warn(f"{target}: skipped {out.skipped} damaged line(s)", stacklevel=2)
    return out


def select(records: Iterable[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    """Records whose fields equal every ``key=value`` given (``run_id=...``, ``workers=2``...)."""
    return [r for r in records if all(r.get(k) == v for k, v in match.items())]


def lab_and_step(script: str) -> tuple[str | None, str | None]:
    """The lab (its name) and step a lab script's name tells (``fashion_mnist_after_step_03.py`` -> horovod, "3")."""
    lab, step = labs.by_file_name(script)
    return (lab.name if lab else None), step


def summarize(epochs: list[dict[str, Any]], key: str = "images_per_sec") -> float | None:
    """Steady state of ``key``: the median over epochs, leaving out the first (graph tracing) if there are more."""
    rates = [e[key] for e in epochs if e.get(key)]
    if len(rates) >= 2:
        rates = rates[1:]
    return statistics.median(rates) if rates else None


# ----------------------------------------------------------------------------- jobs


