"""Run records: one JSON line per training run, in ``runs/runs.jsonl``.

Every run that labkit starts (``labkit run``/``bench``/``cluster``, the same from a
cell) adds one record, although the script carries no labkit code: the processes
are observed from outside (:mod:`labkit.instrument.observe`) and the launcher writes the
record when the job ends (:mod:`labkit.records.jobrecord`): what ran, on how many workers
and threads, how fast it trained (images/sec timed on training steps only,
validation excluded), the validation accuracy of each epoch, the time to the
target accuracy, and how it ended.

A record is a :class:`labkit.records.runrecord.RunRecord`. It is appended with one ``write``
of a whole line to a file opened in append mode under an exclusive lock
(:mod:`labkit.records.jsonlines`), so a record is never half-written and concurrent runs do
not interleave; :func:`read` parses every line once, every field checked, and skips (and
counts) a line that is no JSON or no run record, naming the file.

While training, the chief process also keeps ``runs/live/RUN_ID.json`` up to date (the
progress of the current run, the same record partly filled in, replaced atomically each
epoch: :func:`write_live`) for :mod:`labkit.ui.dashboard` (:func:`read_live`).

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
from labkit.records import boundedjson, jsonlines, runrecord, typed
from labkit.records.runrecord import RunRecord

DEFAULT_FILE = "runs/runs.jsonl"
FILE_VAR = contract.RUNS_FILE
RUN_ID_VAR = contract.RUN_ID
LAUNCHER_VAR = contract.LAUNCHER
SCHEMA = runrecord.SCHEMA


def runs_file(path: str | os.PathLike | None = None) -> Path:
    """The records file: ``path``, else ``$LABKIT_RUNS_FILE``, else ``runs/runs.jsonl``."""
    return Path(path or os.environ.get(FILE_VAR) or DEFAULT_FILE)


def live_file(run_id: str, path: str | os.PathLike | None = None) -> Path:
    """Where the progress of a running job is kept: ``<records folder>/live/RUN_ID.json``."""
    return runs_file(path).parent / "live" / f"{run_id}.json"


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def append(record: RunRecord, path: str | os.PathLike | None = None) -> Path:
    """Append ``record`` as one line, atomically with respect to other writers and readers."""
    return jsonlines.append_line(typed.dump(record), runs_file(path))


class Records(list[RunRecord]):
    """The records of a file, oldest first, plus ``skipped``, the damaged lines left out, and why the first was."""

    skipped: int = 0
    first_problem: str | None = None

    def _skip(self, why: str) -> None:
        self.skipped += 1
        self.first_problem = self.first_problem or why


def read(path: str | os.PathLike | None = None, warn: bool = True) -> Records:
    """Every record of the file that parses as a :class:`RunRecord`, oldest first; a line that is no JSON or
    does not fit the type is skipped and counted (a warning names the file and the first such line)."""
    out = Records()
    target = runs_file(path)
    if not target.exists():
        return out
    with open(target, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                out.append(runrecord.parse(json.loads(raw), f"line {n}: record"))
            except (ValueError, UnicodeDecodeError) as e:  # typed.RecordError is a ValueError
                out._skip(f"line {n}: not JSON" if not isinstance(e, typed.RecordError) else str(e))
    if out.skipped and warn:
        warnings.warn(f"{target}: skipped {out.skipped} damaged line(s) (the first: {out.first_problem})",
                      stacklevel=2)
    return out


def select(records: Iterable[RunRecord], **match: Any) -> list[RunRecord]:
    """Records whose fields (or extra keys) equal every ``key=value`` given (``run_id=...``, ``workers=2``,
    ``label=...``)."""
    return [r for r in records if all(r.lookup(k) == v for k, v in match.items())]


def write_live(record: RunRecord, path: str | os.PathLike | None = None) -> Path:
    """Replace the live progress file of ``record``'s run (:func:`live_file`) with it, stamped ``updated``."""
    live = live_file(record.run_id, path)
    files.write_json_atomic(live, typed.dump(record.with_extra(updated=time.time())))
    return live


def read_live(path: str | os.PathLike) -> RunRecord | None:
    """The live progress file ``path`` (written by the running job, read bounded), or None when it does not exist
    (yet) or is no run record."""
    try:
        return runrecord.parse(boundedjson.read_file(path), Path(path).name)
    except (OSError, ValueError):  # typed.RecordError is a ValueError
        return None


def lab_and_step(script: str) -> tuple[str | None, str | None]:
    """The lab (its name) and step a lab script's name tells (``fashion_mnist_after_step_03.py`` -> horovod, "3")."""
    lab, step = labs.by_file_name(script)
    return (lab.name if lab else None), step


def summarize(values: Iterable[float | None]) -> float | None:
    """Steady state of a per-epoch measurement: the median over epochs, leaving out the first (graph tracing) if
    there are more; epochs without one do not count."""
    rates = [v for v in values if v]
    if len(rates) >= 2:
        rates = rates[1:]
    return statistics.median(rates) if rates else None


