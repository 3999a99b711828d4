"""A gradebook CSV for an LMS: one row per learner, a column per lab, from the class's records or grade results.

    labkit class gradebook --format canvas|moodle [--from DIR] [--roster CSV] [--course DIR] [-o FILE]

The records are a workshop's class folder (every check's and assessment's result) or, with ``--from DIR``, a
folder of ``labkit grade`` results (:mod:`labkit.workshop.results`). A lab's cell is the points of the steps whose
latest result passes, each step worth its points in the course's ``[tool.labkit.grading]`` (the ``pyproject.toml``
at or above ``--course``; without one, the table ``labkit release`` writes into a course): the same points
``labkit grade`` gives. The final assessment, when the course has one, is a column too.

Who a row is: the learner's name in labkit (a workshop account, or the folder or file of their results), unless a
roster (``--roster``: a CSV with a ``learner`` column and the LMS's own columns) says who they are in the LMS.

* **Canvas** (Grades, Import): ``Student,ID,SIS User ID,SIS Login ID,Section`` then a column per lab, and a
  ``Points Possible`` row under the header. Canvas finds each student by ID (Canvas's user id), else SIS User ID,
  else SIS Login ID, else name; without a roster the learner's name is the Student and the SIS Login ID. A column
  named like an assignment fills it; another creates an assignment with the Points Possible.
* **Moodle** (Grade administration, Import, CSV file): ``username`` (and ``email``, ``idnumber`` when the roster
  has them) then a column per lab; "Map from" one of them to the same user field, and each lab column to a grade
  item. Moodle stops the whole import at a row whose user it does not find.

Names that a spreadsheet would read as a formula (starting with ``=``, ``+``, ``-``, ``@``) or that hold control
characters are left out and named: no LMS login looks like that.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.course import labs
from labkit.course import release as course
from labkit.grading import assessment, grade
from labkit.records import boundedjson, classlog
from labkit.records.classlog import ASSESSMENT, Record
from labkit.workshop import results
from labkit.workshop.state import State, state_folder

FORMATS = ("canvas", "moodle")
CANVAS_IDENTITY = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
CANVAS_POINTS_ROW = "    Points Possible"  # as Canvas's own export writes it; its import reads the points there
MOODLE_IDENTITY = ("username", "email", "idnumber")  # Moodle's user fields a CSV import maps from (and its id)
ROSTER_KEY = "learner"


class GradebookError(Exception):
    """Records or a roster that cannot be read: said in one line."""


@dataclass
class Column:
    """One lab (or the final assessment): its name, and the points of each of its steps."""

    name: str
    steps: list[float]

    @property
    def max_points(self) -> float:
        return sum(self.steps)


@dataclass
class Gradebook:
    columns: list[Column]
    learners: list[str]
    points: dict[str, dict[str, float]]  # learner -> column name -> points
    notes: list[str] = field(default_factory=list)  # what was left out, and why


def course_config(start: Path) -> dict[str, Any]:
    """``[tool.labkit.grading]`` at or above ``start``, else the table ``labkit release`` writes into a course."""
    config = grade.load_config(start)
    if config:
        return config
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads(course.grading_table())["tool"]["labkit"]["grading"]


def columns(config: dict[str, Any]) -> list[Column]:
    """The course's graded labs, in its order, each step with its points; then the assessment, if any."""
    cols = []
    for name in config.get("labs") or list(labs.LABS):
        if name not in labs.LABS:
            raise GradebookError(f"[tool.labkit.grading] labs names {name!r}, which is no lab: "
                                 f"one of {', '.join(labs.LABS)}")
        cols.append(Column(name, grade.step_points(labs.get(name), config)))
    if config.get("assessment"):
        _, run = assessment.from_config(config["assessment"])
        cols.append(Column(ASSESSMENT, [float(run["points"])]))
    return cols


def read_records(from_dir: Path | None) -> tuple[list[Record], list[str], list[str]]:
    """The records (oldest first), the learners known without a record, and what was skipped: from ``from_dir``
    (``labkit grade`` results or a copy of a class folder) or the running workshop's class folder."""
    if from_dir is not None:
        if not from_dir.is_dir():
            raise GradebookError(f"{from_dir} is not a folder")
        rows, problems = results.read_folder(from_dir)
        known = sorted({p.name[: -len(classlog.SUFFIX)] for p in from_dir.rglob("*" + classlog.SUFFIX)})
        return rows, known, problems
    folder = State(state_folder()).class_dir
    if not folder.is_dir():
        raise GradebookError(f"no workshop is up (no {folder}); give --from DIR for `labkit grade` results")
    try:
        known = sorted(n[: -len(classlog.SUFFIX)] for n in os.listdir(folder) if n.endswith(classlog.SUFFIX))
    except PermissionError:
        raise GradebookError(f"{folder} is for the instructors' group and root") from None
    reading = classlog.read(folder, learners=known)  # each record is its file owner's, whatever it says
    return reading.records, known, reading.problems


def unsafe_name(name: str) -> bool:
    """True for a name a spreadsheet would run as a formula, or holding control characters."""
    return not name or name[0] in "=+-@\t\r" or any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in name)


def build(records: list[Record], cols: list[Column], learners: Iterable[str] = ()) -> Gradebook:
    """Each learner's points per column: a step counts when the learner's latest result for it passes."""
    latest: dict[tuple[str, str, int], bool] = {}
    for r in records:  # oldest first: a later result replaces an earlier one
        latest[(r.learner, r.lab, r.step)] = r.passed
    names = sorted({*learners, *(r.learner for r in records)})
    book = Gradebook(cols, [], {})
    for who in names:
        if unsafe_name(who):
            book.notes.append(f"left out {boundedjson.for_terminal(who)!r}: not a name an LMS login can have")
            continue
        book.learners.append(who)
        book.points[who] = {c.name: sum(p for k, p in enumerate(c.steps, 1) if latest.get((who, c.name, k)))
                            for c in cols}
    shown = {c.name for c in cols}
    other = sorted({r.lab for r in records} - shown)
    if other:
        book.notes.append(f"records of labs the course does not grade were left out: {', '.join(other)}")
    return book


def read_roster(path: Path, fmt: str) -> dict[str, dict[str, str]]:
    """``path``'s rows by learner: a CSV with a ``learner`` column and any of the format's identity columns
    (Canvas's export with a ``learner`` column added will do); other columns are ignored."""
    wanted = CANVAS_IDENTITY if fmt == "canvas" else MOODLE_IDENTITY
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.DictReader(f)
            header = [h.strip() for h in reader.fieldnames or []]
            if ROSTER_KEY not in header:
                raise GradebookError(f"{path}: no {ROSTER_KEY!r} column (the learner's name in labkit), "
                                     f"beside any of: {', '.join(wanted)}")
            roster: dict[str, dict[str, str]] = {}
            for row in reader:
                row = {(k or "").strip(): (v or "").strip() for k, v in row.items() if isinstance(v, str)}
                who = row.get(ROSTER_KEY, "")
                if who:
                    roster[who] = {k: row[k] for k in wanted if row.get(k)}
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise GradebookError(f"{path}: {e}") from None
    return roster


def _number(points: float) -> str:
    return f"{round(points, 2):g}"


def rows(book: Gradebook, fmt: str, roster: dict[str, dict[str, str]] | None = None) -> list[list[str]]:
    """The CSV's rows for ``fmt``, the header first; notes for learners the roster does not name, and roster
    entries without records, go to ``book.notes``."""
    if fmt not in FORMATS:
        raise GradebookError(f"format {fmt!r}: one of {', '.join(FORMATS)}")
    roster = roster or {}
    if roster:
        missing = [w for w in book.learners if w not in roster]
        if missing:
            book.notes.append(f"not in the roster (written under their labkit name): {', '.join(missing)}")
        unseen = sorted(set(roster) - set(book.learners))
        if unseen:
            book.notes.append(f"in the roster without any result (no row): {', '.join(unseen)}")
    labs_row = [c.name for c in book.columns]
    out: list[list[str]] = []
    if fmt == "canvas":
        out.append([*CANVAS_IDENTITY, *labs_row])
        blanks = [""] * (len(CANVAS_IDENTITY) - 1)
        out.append([CANVAS_POINTS_ROW, *blanks, *[_number(c.max_points) for c in book.columns]])
        for who in book.learners:
            given = roster.get(who, {})
            ident = [given.get("Student", who), given.get("ID", ""), given.get("SIS User ID", ""),
                     given.get("SIS Login ID", "" if given.get("ID") or given.get("SIS User ID") else who),
                     given.get("Section", "")]
            out.append([*ident, *[_number(book.points[who][c.name]) for c in book.columns]])
        return out
    extra = [k for k in MOODLE_IDENTITY[1:] if any(k in v for v in roster.values())]
    out.append(["username", *extra, *labs_row])
    for who in book.learners:
        given = roster.get(who, {})
        out.append([given.get("username", who), *[given.get(k, "") for k in extra],
                    *[_number(book.points[who][c.name]) for c in book.columns]])
    return out


def to_csv(table: list[list[str]]) -> str:
    """RFC 4180 CSV (quoted where needed, CRLF line ends), as both LMSs read it; UTF-8 when written."""
    buffer = io.StringIO()
    csv.writer(buffer).writerows(table)
    return buffer.getvalue()
