"""A step's solution offered to the learner whose check of that step keeps failing the same way.

After a check is recorded in the learner's own check record (:mod:`labkit.records.checklog`), :func:`offer`
looks at the first failing step's latest :data:`TIMES` records for this script's name, whatever version of the
script each one checked: when all of them failed with the same first line of message, the check's output ends
with one line offering ``labkit solution LAB STEP`` (and the notebook's ``solutions.show``), or, when this course
shows this learner no solution of the step (graded, or not revealed in a workshop), saying whom to ask.
A pass in between, or another message, starts the count again. Nothing here ever fails a check.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from labkit.check.report import Report
from labkit.course import labs, solutions
from labkit.records import checklog

TIMES = 3  # failures in a row with the same message before the solution is offered


def first_line(message: str) -> str:
    return next((s.strip() for s in message.splitlines() if s.strip()), "")


def repeated(records: list[checklog.CheckRecord], lab: str, step: int, script: str, times: int = TIMES) -> int:
    """How many of the latest records of ``lab``'s ``step`` for ``script`` (a file name) failed in a row with the
    message of the latest one; 0 when the latest passed."""
    mine = [r for r in records if r.lab == lab and r.step == step and r.script == script]
    if not mine or mine[-1].passed:
        return 0
    same = first_line(mine[-1].message)
    count = 0
    for r in reversed(mine):
        if r.passed or first_line(r.message) != same:
            break
        count += 1
    return count


def offer(report: Report, lab: labs.Lab, times: int = TIMES, cwd: Path | None = None) -> str:
    """The line to end ``report`` of ``lab`` with ('' for none)."""
    step = report.first_failing_step
    if step is None:
        return ""
    checked = Path(report.script)
    try:
        count = repeated(checklog.read(checklog.checks_file(checked)), lab.name, step, checked.name, times)
        if count < times:
            return ""
        # the file the step asks for: the checked one, or (a lab with a file per step) the step's, next to it
        script = checked if not lab.step_files else checked.parent / lab.step_file(step)
        here = (cwd or Path.cwd()).resolve()
        default = script.resolve() == here / lab.step_file(step)
        command = f"labkit solution {lab.name} {step}" + ("" if default else f" {shlex.quote(str(script))}")
        cell = f"solutions.show({lab.name!r}, {step}" + ("" if default else f", script={str(script)!r}") + ")"
        stuck = f"Step {step} has failed {count} times in a row with the same message"
        try:
            solutions.find(lab, step, script)
        except solutions.NotAvailable:
            return f"{stuck}: ask your instructor about it (this course shows you no solution of it)."
        return (f"{stuck}: `{command}` shows its solution as the change from your script (in a notebook: "
                f"`from labkit.ui import solutions; {cell}`).")
    except (OSError, ValueError):
        return ""
