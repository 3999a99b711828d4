"""Class records from ``labkit grade`` results: a folder of JSON or JUnit files from many course repositories.

``labkit class status --from DIR`` (and ``labkit class gradebook --from DIR``) reads every ``*.json`` and ``*.xml``
below ``DIR``: ``labkit grade --json`` or ``--save`` output, JUnit XML (``--junit``), the GitHub Classroom result
object older labkits wrote (``--classroom``, retired with the service on 2026-08-28); and class records
(``*.jsonl``, a copy of a workshop's class folder), which keep their times. The learner is the first folder
below ``DIR`` (``DIR/alice/grade.xml``) or, for a file directly in ``DIR``, its name without the suffix
(``DIR/alice.json``, ``DIR/learner01.jsonl``), never a field inside the file: a class record naming another
learner is skipped and named. Results carry no times: their records have ``time`` None.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from labkit.records.classlog import SUFFIX, Record, make_record, read_file

STEP_NAME = re.compile(r"^(?:(?P<lab>[\w.-]+) )?step (?P<step>\d+)\b")


def learner_of(path: Path, root: Path) -> str:
    rel = path.relative_to(root)
    return rel.parts[0] if len(rel.parts) > 1 else path.stem


def _record(learner: str, lab: str, step: int, passed: bool, message: str) -> Record:
    return make_record(learner, lab, step, passed, message, None)


def from_grade_json(data: dict[str, Any], learner: str) -> list[Record]:
    """``labkit grade --json``: ``{"cases": [{lab, step, passed, message, ...}]}``."""
    return [_record(learner, str(c["lab"]), int(c["step"]), bool(c["passed"]), str(c.get("message", "")))
            for c in data.get("cases", []) if isinstance(c, dict) and {"lab", "step", "passed"} <= c.keys()]


def from_classroom(data: dict[str, Any], learner: str) -> list[Record]:
    """GitHub Classroom's result object (files from before its retirement): tests named ``LAB step K: TITLE``
    with ``status`` pass/fail."""
    rows = []
    for t in data.get("tests", []):
        m = STEP_NAME.match(str(t.get("name", ""))) if isinstance(t, dict) else None
        if m and m.group("lab"):
            rows.append(_record(learner, m.group("lab"), int(m.group("step")), t.get("status") == "pass",
                                str(t.get("message", ""))))
    return rows


def from_junit(text: str, learner: str) -> list[Record]:
    """JUnit XML of ``labkit grade --junit``: a testsuite per lab, a testcase ``step K: TITLE`` per step."""
    root = ET.fromstring(text)
    rows = []
    for suite in root.iter("testsuite"):
        lab = suite.get("name", "")
        for case in suite.iter("testcase"):
            m = STEP_NAME.match(case.get("name", ""))
            if not m:
                continue
            failed = case.find("failure")
            if failed is None:
                failed = case.find("error")
            message = "" if failed is None else (failed.text or failed.get("message") or "")
            rows.append(_record(learner, lab, int(m.group("step")), failed is None, message))
    return rows


def read_folder(folder: Path) -> tuple[list[Record], list[str]]:
    """Records from every result file below ``folder``, and the files (or lines) that could not be read, with why."""
    folder = Path(folder)
    rows: list[Record] = []
    problems: list[str] = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in (".json", ".xml", SUFFIX)):
        learner = learner_of(path, folder)
        if path.suffix == SUFFIX:
            got = read_file(path, learner)
            rows += got.records
            problems += got.problems
            continue
        try:
            text = path.read_text()
            if path.suffix == ".xml":
                found = from_junit(text, learner)
            else:
                data = json.loads(text)
                found = from_grade_json(data, learner) if "cases" in data else from_classroom(data, learner)
        except (OSError, ValueError, ET.ParseError, AttributeError, TypeError) as e:
            problems.append(f"{path}: {e}")
            continue
        if not found:
            problems.append(f"{path}: no labkit grade result in it")
        rows += found
    unique = {r: r for r in rows}
    ordered = sorted(unique.values(), key=lambda r: r.time or 0.0)
    return ordered, problems  # the same result as JSON and as JUnit counts once
