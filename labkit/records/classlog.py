"""Class records: one JSON line per judged step, in a class folder only the instructors read.

During a workshop every learner's server has ``$LABKIT_CLASS_DIR`` (:data:`labkit.core.contract.CLASS_DIR`)
set to the class folder. Each ``labkit check`` and each assessment then appends one record per step
to the learner's own file in it, ``CLASS_DIR/LEARNER.jsonl``:

    {"learner": "learner01", "lab": "horovod", "step": 2, "passed": false, "message": "...", "time": 1764077000.1}

The folder belongs to root and the instructors' group (``rwxr-x--x``): learners cannot list it; each
learner's file is theirs and the instructors' group's (``rw-r-----``), so a learner appends to their own
file and reads no one else's. Outside a workshop (the variable unset) nothing is written. Writing a
record never fails a check: a problem is returned, not raised.
"""

from __future__ import annotations

import json
import os
import pwd
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from labkit.core import contract

FIELDS = ("learner", "lab", "step", "passed", "message", "time")
MESSAGE_LIMIT = 600  # characters of a check's message kept in a record
ASSESSMENT = "assessment"  # the lab name of the final assessment's records (one step)
SUFFIX = ".jsonl"


def class_dir(environ: dict[str, str] | None = None) -> Path | None:
    """The class folder named by ``$LABKIT_CLASS_DIR``, or None outside a workshop."""
    value = (os.environ if environ is None else environ).get(contract.CLASS_DIR)
    return Path(value) if value else None


def learner_name(uid: int | None = None) -> str:
    """The Unix name of ``uid`` (default: this process's user)."""
    uid = os.getuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def make_record(learner: str, lab: str, step: int, passed: bool, message: str, when: float) -> dict[str, Any]:
    text = message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 3] + "..."
    return {"learner": learner, "lab": lab, "step": int(step), "passed": bool(passed), "message": text,
            "time": round(when, 3)}


def records_of_report(report: dict[str, Any], learner: str, when: float) -> list[dict[str, Any]]:
    """One record per step of a check report (``Report.to_dict()`` or ``labkit check --json``)."""
    return [make_record(learner, str(report.get("lab")), s["step"], s["passed"], str(s.get("message", "")), when)
            for s in report.get("steps", []) if isinstance(s, dict) and isinstance(s.get("step"), int)]


def write(records: Iterable[dict[str, Any]], folder: Path | None = None) -> Path | None:
    """Append ``records`` to their learner's file in ``folder`` (default: the class folder); its path or None."""
    folder = class_dir() if folder is None else folder
    rows = list(records)
    if folder is None or not rows:
        return None
    path = folder / f"{rows[0]['learner']}{SUFFIX}"
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    try:
        os.write(fd, data)  # one write of whole lines: records of two checks never interleave
    finally:
        os.close(fd)
    return path


def record_check(report: Any) -> str | None:
    """Write the records of a check's :class:`~labkit.check.report.Report` when in a workshop.

    Returns None when done (or not in a workshop), else why it could not be written.
    """
    if class_dir() is None:
        return None
    try:
        write(records_of_report(report.to_dict(), learner_name(), time.time()))
    except (OSError, KeyError, TypeError, ValueError) as e:
        return f"the class record was not written: {e}"
    return None


def record_assessment(verdict: Any) -> str | None:
    """Write the final assessment's :class:`~labkit.grading.assessment.Verdict` as one record (step 1)."""
    if class_dir() is None:
        return None
    try:
        write([make_record(learner_name(), ASSESSMENT, 1, verdict.passed, str(verdict.message), time.time())])
    except (OSError, TypeError, ValueError) as e:
        return f"the class record was not written: {e}"
    return None


def prepare(folder: Path, learner: str, uid: int, gid: int) -> Path:
    """The learner's record file, created empty: owned by the learner and the instructors' group ``gid``."""
    path = folder / f"{learner}{SUFFIX}"
    path.touch(mode=0o640, exist_ok=True)
    os.chown(path, uid, gid)
    os.chmod(path, 0o640)
    return path


def read_file(path: Path) -> Iterator[dict[str, Any]]:
    """The well-formed records of one learner's file."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and all(k in row for k in FIELDS) and isinstance(row["step"], int):
            yield row


def read(folder: Path) -> list[dict[str, Any]]:
    """Every well-formed record in ``folder`` (other lines are skipped), oldest first."""
    rows = [r for path in sorted(Path(folder).glob(f"*{SUFFIX}")) for r in read_file(path)]
    return sorted(rows, key=lambda r: (r["time"] if isinstance(r["time"], (int, float)) else 0))
