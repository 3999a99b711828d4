"""The learner's own check record: one JSON line per judged step, by the script's content.

Every ``labkit check`` (the command and the notebooks' check cells) appends one line per step it judged
to ``runs/checks.jsonl`` in the checked script's folder, the folder the learner works in:

    {"lab": "horovod", "step": 5, "passed": false, "message": "...", "sha256": "9f2c...", "script": "fashion_mnist.py",
     "time": 1764077000.123}

``sha256`` is the digest of the script's bytes as they were checked, so a record vouches for that exact
version of the script: an edit after the check makes it a new script that has passed nothing yet. The
notebooks' cells that run the learner's script read this file (:func:`standing`) and run it only when its
current content has passed the steps they need.

Lines are appended whole under a lock (:func:`labkit.records.jsonlines.append_line`); reading skips any line that is
not a record. Writing never fails a check: a problem is returned, not raised.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from labkit.records import jsonlines

FILE = Path("runs") / "checks.jsonl"  # relative to the checked script's folder
MESSAGE_LIMIT = 600  # characters of a step's message kept in a record
SHA256 = 64  # hex digits
NOT_CHECKED = "not checked"  # how a check's message begins for a step it did not judge


@dataclass(frozen=True)
class CheckRecord:
    """One judged step of one version of a script."""

    lab: str
    step: int
    passed: bool
    message: str
    sha256: str  # of the script's bytes as checked
    script: str  # the script's file name, for a person reading the file
    time: float  # seconds since the epoch

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def parse(cls, row: object) -> CheckRecord:
        """The record of one decoded line; ValueError says what is wrong with it."""
        if not isinstance(row, dict):
            raise ValueError("not a JSON object")
        missing = [k for k in ("lab", "step", "passed", "message", "sha256", "time") if k not in row]
        if missing:
            raise ValueError("missing " + ", ".join(missing))
        lab, step, passed, message, sha, when = (row[k] for k in ("lab", "step", "passed", "message", "sha256", "time"))
        if not isinstance(lab, str) or not lab:
            raise ValueError("lab is not a lab's name")
        if type(step) is not int or step < 1:
            raise ValueError("step is not a whole number from 1")
        if type(passed) is not bool:
            raise ValueError("passed is not true or false")
        if not isinstance(message, str):
            raise ValueError("message is not text")
        if not isinstance(sha, str) or len(sha) != SHA256:
            raise ValueError("sha256 is not a digest")
        if type(when) not in (int, float) or not math.isfinite(when):
            raise ValueError("time is not a time")
        return cls(lab, step, passed, message, sha, str(row.get("script", "")), float(when))


@dataclass(frozen=True)
class Standing:
    """How far one version of a script has got: ready for ``steps`` steps, or the first step that holds it up."""

    lab: str
    steps: int
    step: int | None = None  # the first step not passed (None: ready)
    failed: CheckRecord | None = None  # that step's latest failing record (None: never checked)

    @property
    def ready(self) -> bool:
        return self.step is None


def checks_file(script: str | Path) -> Path:
    """Where the checks of ``script`` are recorded: ``runs/checks.jsonl`` in its folder."""
    return Path(script).resolve().parent / FILE


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def records_of_report(report: dict[str, Any], sha256: str, when: float) -> list[CheckRecord]:
    """One record per judged step of a check report (``Report.to_dict()``); a step it did not judge (after a
    failing one) has none."""
    name = Path(str(report.get("script", ""))).name
    out = []
    for s in report.get("steps", []):
        message = str(s.get("message", "")) if isinstance(s, dict) else ""
        if isinstance(s, dict) and isinstance(s.get("step"), int) and not message.startswith(NOT_CHECKED):
            if len(message) > MESSAGE_LIMIT:
                message = message[: MESSAGE_LIMIT - 3] + "..."
            out.append(CheckRecord(str(report.get("lab")), s["step"], bool(s["passed"]), message, sha256, name,
                                   round(when, 3)))
    return out


def record_check(report: Any, data: bytes) -> str | None:
    """Append the steps of a check's :class:`~labkit.check.report.Report` of a script whose bytes were ``data``.

    Returns None when written, else why not (a check never fails for its record)."""
    rows = records_of_report(report.to_dict(), digest(data), time.time())
    try:
        path = checks_file(report.script)
        for row in rows:
            jsonlines.append_line(row.to_dict(), path)
    except (OSError, TypeError, ValueError) as e:
        return f"your check record was not written ({e}): the notebooks' cells will not count this check"
    return None


def read(path: str | Path) -> list[CheckRecord]:
    """The records in ``path``, oldest first as written; a line that is not a record is skipped."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(CheckRecord.parse(json.loads(line)))
        except ValueError:  # json.JSONDecodeError is one
            continue
    return out


def standing(script: str | Path, lab: str, steps: int, records: list[CheckRecord] | None = None) -> Standing:
    """Whether ``script`` as it is now has passed steps 1..``steps`` of ``lab`` in its checks.

    For each step the latest record of this content counts; the first step whose latest record failed, or
    that has none, holds the script up."""
    path = Path(script)
    sha = digest(path.read_bytes()) if path.is_file() else ""
    rows = read(checks_file(path)) if records is None else records
    latest: dict[int, CheckRecord] = {}
    for r in rows:
        if r.lab == lab and r.sha256 == sha and 1 <= r.step <= steps:
            latest[r.step] = r
    for k in range(1, steps + 1):
        r = latest.get(k)
        if r is None or not r.passed:
            return Standing(lab, steps, k, r)
    return Standing(lab, steps)
