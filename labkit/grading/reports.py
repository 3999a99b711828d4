"""Grading results in the forms CI systems read: JUnit XML, a Markdown summary, GitHub annotations.

* :func:`junit_xml`: one ``testsuite`` per lab, one ``testcase`` per step, the check's
  message as the failure text; valid against the Apache Ant JUnit schema CI systems read
  (GitHub's test-report actions, GitLab's ``artifacts:reports:junit``, Jenkins).
* :func:`summary_markdown`: a table for the CI job page (``$GITHUB_STEP_SUMMARY``, a GitLab artifact).
* :func:`annotations`: one GitHub Actions ``::error`` line per failing step, at the learner's file and,
  when the check's message shows it, the line; :func:`guarded` wraps text of the learner's (messages
  printed in a GitHub job's log) so that the runner reads no workflow command in it.

GitHub Classroom's result object (``--classroom``) is gone with the service (discontinued 2026-08-28).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from labkit.grading.grade import Result


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


# ----------------------------------------------------------------------------- GitHub annotations


def _escape_data(text: str) -> str:
    """A workflow command's message: ``%``, CR and LF escaped as the runner unescapes them (one line)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """A workflow command's property value: also ``:`` and ``,``, which end a value."""
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _repo_path(file: str, root: Path | None) -> str:
    """``file`` relative to ``root`` (the repository, default the current folder) when it is inside it."""
    path = Path(file)
    if not path.is_absolute():
        return path.as_posix()
    try:
        return path.resolve().relative_to((root or Path.cwd()).resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def annotations(result: Result, root: Path | None = None, limit: int = 4000) -> list[str]:
    """One ``::error file=F,line=L,title=T::MESSAGE`` line per failing case (``line`` only when the check's
    message shows it; no ``file`` for a case about no file): GitHub shows each on the file and in the run's
    summary. The message is the check's, at most ``limit`` characters, escaped to one line."""
    lines = []
    for c in result.cases:
        if c.passed:
            continue
        props = []
        if c.file:
            props.append(f"file={_escape_property(_repo_path(c.file, root))}")
            if c.line:
                props.append(f"line={int(c.line)}")
        props.append(f"title={_escape_property(f'{c.name} ({c.points:g}/{c.max_points:g} points)')}")
        message = _clean(c.message).strip() or "failed"
        message = message if len(message) <= limit else message[: limit - 3] + "..."
        lines.append(f"::error {','.join(props)}::{_escape_data(message)}")
    return lines


def in_github_actions(environ: dict[str, str] | None = None) -> bool:
    """True in a GitHub Actions job (``GITHUB_ACTIONS=true``)."""
    return (os.environ if environ is None else environ).get("GITHUB_ACTIONS") == "true"


def guarded(text: str) -> str:
    """``text`` between ``::stop-commands::TOKEN`` and ``::TOKEN::``: in a GitHub job's log, the runner reads
    no workflow command (``::error``, ``::add-mask``, ``::set-output``...) in it, whatever a learner's script
    made a check's message say. The token is random, so the text cannot end the pause itself."""
    token = secrets.token_hex(16)
    return f"::stop-commands::{token}\n{text}\n::{token}::"
