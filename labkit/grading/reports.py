"""Grading results in the forms CI systems read: JUnit XML, GitHub Classroom, a Markdown summary.

* :func:`junit_xml`: one ``testsuite`` per lab, one ``testcase`` per step, the check's
  message as the failure text; valid against the Apache Ant JUnit schema CI systems read.
* :func:`classroom`: the result object of GitHub Classroom's autograding reporter
  (``{version, status, max_score, tests: [{name, status, score, max_score, message}]}``);
  :func:`classroom_b64` is the form its ``<RUNNER>_RESULTS`` variable takes.
* :func:`summary_markdown`: a table for the CI job page (``$GITHUB_STEP_SUMMARY``).
"""

from __future__ import annotations

import base64
import json
import socket
import time
import xml.etree.ElementTree as ET
from typing import Any

from labkit.grading.grade import Case, Result


def _first_line(text: str, limit: int = 200) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _clean(text: str) -> str:
    """Text without the control characters XML 1.0 cannot hold."""
    return "".join(ch for ch in text if ch in "\t\n\r" or ord(ch) >= 0x20)


def junit_xml(result: Result) -> str:
    """The result as a JUnit XML document."""
    root = ET.Element("testsuites")  # the schema gives the aggregate no attributes; each testsuite has its counts
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    host = socket.gethostname() or "localhost"
    for index, lab in enumerate(result.labs()):
        cases = [c for c in result.cases if c.lab == lab]
        suite = ET.SubElement(root, "testsuite", name=lab, package="labkit", id=str(index), timestamp=stamp,
                              hostname=host, tests=str(len(cases)), failures=str(sum(not c.passed for c in cases)),
                              errors="0", skipped="0", time=f"{sum(c.seconds for c in cases):.3f}")
        props = ET.SubElement(suite, "properties")
        score = sum(c.points for c in cases)
        ET.SubElement(props, "property", name="score", value=f"{score:g}/{sum(c.max_points for c in cases):g}")
        for c in cases:
            case = ET.SubElement(suite, "testcase", name=_clean(f"step {c.step}: {c.title}"),
                                 classname=f"labkit.{lab}", time=f"{c.seconds:.3f}")
            if not c.passed:
                failure = ET.SubElement(case, "failure", message=_clean(_first_line(c.message)), type="StepFailed")
                failure.text = _clean(c.message)
        ET.SubElement(suite, "system-out").text = f"{lab}: {score:g} points"
        ET.SubElement(suite, "system-err").text = ""
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _classroom_test(c: Case) -> dict[str, Any]:
    return {"name": c.name, "status": "pass" if c.passed else "fail", "score": c.points, "max_score": c.max_points,
            "message": c.message, "test_code": f"labkit check {c.lab} --step {c.step}", "filename": "",
            "line_no": 0, "execution_time": f"{c.seconds:.1f}s"}


def classroom(result: Result) -> dict[str, Any]:
    """The GitHub Classroom autograding reporter's result object."""
    return {"version": 1, "status": "pass" if result.passed else "fail", "max_score": result.max_score,
            "tests": [_classroom_test(c) for c in result.cases]}


def classroom_b64(result: Result) -> str:
    """:func:`classroom` as base64 of its JSON, as the reporter reads it from ``<RUNNER>_RESULTS``."""
    return base64.b64encode(json.dumps(classroom(result)).encode()).decode()


def summary_markdown(result: Result) -> str:
    """A Markdown summary: the score, then one row per step."""
    lines = [f"## labkit grade: {result.score:g} / {result.max_score:g} points",
             "", f"`{result.path}`, graded in {result.seconds:.0f} s.", "",
             "| lab | step | result | points | message |", "| --- | --- | --- | --- | --- |"]
    for c in result.cases:
        message = _first_line(c.message, 120).replace("|", "\\|")
        mark = "pass" if c.passed else "**fail**"
        lines.append(f"| {c.lab} | {c.step}: {c.title} | {mark} | {c.points:g}/{c.max_points:g} | {message} |")
    return "\n".join(lines) + "\n"


def text(result: Result) -> str:
    """A plain-text table for a terminal."""
    rows = [f"{'PASS' if c.passed else 'FAIL'}  {c.points:>5g}/{c.max_points:<5g} {c.name}" +
            ("" if c.passed else f"\n              {_first_line(c.message, 150)}") for c in result.cases]
    return "\n".join(rows + [f"score: {result.score:g} / {result.max_score:g} ({result.seconds:.0f} s)"])
