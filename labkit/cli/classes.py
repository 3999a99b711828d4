"""``labkit class status|gradebook``: a workshop's class view (learners x steps) and its marks for an LMS gradebook,
from the workshop's class records or from a folder of ``labkit grade`` results."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from labkit.records import boundedjson, classlog
from labkit.workshop import accounts, classpage, classview, results
from labkit.workshop import gradebook as gradebooks
from labkit.workshop.state import State, state_folder

CLASS_HELP = """\
The class view: a grid of learners x steps from the records every check and assessment of a workshop writes,
each step's pass rate, commonest failure messages and median minutes to pass, and the steps whose solutions were
revealed to the class (by whom, when). --from DIR reads `labkit grade` results instead (JSON, GitHub Classroom
JSON or JUnit XML; the learner is the first folder below DIR or the file's name)."""
GRADEBOOK_HELP = """\
Writes the class's points as a CSV that Canvas's or Moodle's gradebook import reads: one row per learner, a column
per lab the course grades (its [tool.labkit.grading]: the labs and each step's points, as `labkit grade` counts
them), a lab's cell the points of the steps whose latest result passes. From the workshop's class records, or
--from DIR (`labkit grade` results: JSON, JUnit XML, old GitHub Classroom JSON; the learner is the first folder
below DIR or the file's name). --roster CSV maps each learner (a `learner` column) to the LMS's own columns:
Canvas's Student, ID, SIS User ID, SIS Login ID, Section; Moodle's username, email, idnumber. Without it the
learner's name is Canvas's Student and SIS Login ID, and Moodle's username. docs/grading.md has the import steps."""


def add_cli(sub) -> None:  # noqa: ANN001
    """Register ``labkit class`` and its two actions."""
    c = sub.add_parser("class", help="the class view: learners x steps", description=CLASS_HELP)
    cacts = c.add_subparsers(dest="action", required=True)
    cs = cacts.add_parser("status", help="show the class view", description=CLASS_HELP)
    cs.add_argument("--json", action="store_true", help="print one JSON object")
    cs.add_argument("--html", metavar="OUT", default=None, help="also write the view as one HTML page")
    cs.add_argument("--from", dest="from_dir", metavar="DIR", default=None,
                    help="read `labkit grade` results (JSON/JUnit) below DIR instead of the workshop's records")
    gb = cacts.add_parser("gradebook", help="write the class's points per lab as a CSV for Canvas or Moodle",
                          description=GRADEBOOK_HELP)
    gb.add_argument("--format", choices=gradebooks.FORMATS, required=True, help="the LMS whose import reads it")
    gb.add_argument("--from", dest="from_dir", metavar="DIR", default=None,
                    help="read `labkit grade` results (JSON/JUnit) below DIR instead of the workshop's records")
    gb.add_argument("--roster", metavar="CSV", default=None,
                    help="who each learner is in the LMS: a `learner` column and the LMS's identity columns")
    gb.add_argument("--course", metavar="DIR", default=".",
                    help="the course whose [tool.labkit.grading] gives the labs and points (default: this folder)")
    gb.add_argument("-o", "--output", metavar="FILE", default=None, help="write here (default: standard output)")
    gb.add_argument("--self-reported", action="store_true",
                    help="without --from: export the workshop's class records, which learners can forge")
    gb.set_defaults(func=_gradebook)
    cs.set_defaults(func=_class)


def _class(a: argparse.Namespace) -> int:
    learners: list[str] = []
    if a.from_dir:
        folder = Path(a.from_dir)
        if not folder.is_dir():
            print(f"labkit class: {folder} is not a folder", file=sys.stderr)
            return 2
        rows, problems = results.read_folder(folder)
        learners = sorted({p.name[: -len(classlog.SUFFIX)] for p in folder.rglob("*" + classlog.SUFFIX)})
        copied = classlog.read_reveals(folder, check_owner=False)  # a copy of a class folder keeps its reveals
        revealed, problems = copied.reveals, problems + copied.problems
    else:
        folder = State(state_folder()).class_dir
        if not folder.is_dir():
            print(f"labkit class: no workshop is up (no {folder}); give --from DIR for `labkit grade` results",
                  file=sys.stderr)
            return 2
        try:
            learners = sorted(n[: -len(classlog.SUFFIX)] for n in os.listdir(folder) if n.endswith(classlog.SUFFIX))
        except PermissionError:
            print(f"labkit class: {folder} is for the instructors' group ({accounts.INSTRUCTOR_GROUP}) and root",
                  file=sys.stderr)
            return 2
        reading = classlog.read(folder, learners=learners)  # each record is its file owner's, whatever it says
        rows, problems, revealed = reading.records, reading.problems, reading.reveals
    for problem in problems:  # learners' text (a line, a file's name): shown, never obeyed by the terminal
        print(f"labkit class: skipped {boundedjson.for_terminal(problem)}", file=sys.stderr)
    view = classview.build(rows, learners, problems, revealed)
    if a.html:
        Path(a.html).write_text(classpage.html_page(view), encoding="utf-8")
    # text() shows learners' text through boundedjson.for_terminal; JSON escapes non-ASCII and controls (DEL is inert)
    print(json.dumps(view.to_dict(), indent=1) if a.json else view.text())
    return 0


def _gradebook(a: argparse.Namespace) -> int:
    """``labkit class gradebook``: the CSV of :mod:`labkit.workshop.gradebook`; notes on stderr."""
    if not a.from_dir and not a.self_reported:
        print("labkit class gradebook: the workshop's class records are written by the learners' own checks, and a "
              "learner can forge their own: marks for a gradebook come from `labkit grade` results (--from DIR). "
              "Give --self-reported to export the class records anyway", file=sys.stderr)
        return 2
    try:
        cols = gradebooks.columns(gradebooks.course_config(Path(a.course)))
        rows, learners, problems = gradebooks.read_records(Path(a.from_dir) if a.from_dir else None)
        roster = gradebooks.read_roster(Path(a.roster), a.format) if a.roster else None
        book = gradebooks.build(rows, cols, learners)
        text = gradebooks.to_csv(gradebooks.rows(book, a.format, roster))
    except (gradebooks.GradebookError, ValueError) as e:
        print(f"labkit class gradebook: {e}", file=sys.stderr)
        return 2
    for note in [*(f"skipped {p}" for p in problems), *book.notes]:  # learners' text: shown, never obeyed
        print(f"labkit class gradebook: {boundedjson.for_terminal(note)}", file=sys.stderr)
    if a.output:
        Path(a.output).write_text(text, encoding="utf-8", newline="")
        print(f"wrote {a.output}: {len(book.learners)} learners x {len(cols)} labs ({a.format})", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
