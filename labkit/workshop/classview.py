"""The class view: learners x steps from class records, with pass rates, common failures and time per step.

    reading = classlog.read(folder)                   # or results.read_folder(DIR) for grade results
    view = classview.build(reading.records, learners, reading.problems)
    print(view.text()); view.to_dict(); classpage.html(view)

The steps whose solutions the instructor revealed to the class (``labkit workshop reveal``) are listed
with who revealed them and when (:attr:`View.reveals`).

A cell is a learner's latest result for one step (``pass``/``fail``, with how many times it was judged);
a step's pass rate is the share of the class whose latest result passes; its common failures count each
learner once per message (first line); its time is the median, over the learners who passed it, of the
minutes from passing the step before (or from their first check of the lab) to first passing it.
The lines skipped while reading the records are kept in :attr:`View.problems` and shown with the view.

Building the view takes time linear in the number of records (they are grouped by step and by learner once).
Its columns are the course's steps judged so far and, up to :data:`MAX_COLUMNS` in all, any other step a
record names (a learner writes their own record file): the records of further steps are counted in
:attr:`View.problems`, not shown. :meth:`View.text` is for a terminal: every learner's text in it (names,
messages, steps of grade results, skipped lines) goes through :func:`~labkit.records.boundedjson.for_terminal`.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from labkit.course import labs
from labkit.records.boundedjson import for_terminal
from labkit.records.classlog import ASSESSMENT, Record, Reveal

TOP_FAILURES = 3
PROBLEMS_SHOWN = 20  # skipped lines listed with the view; the rest are counted
MAX_COLUMNS = 100  # the course's steps always; other steps named by records up to this many columns in all


@dataclass
class Cell:
    passed: bool
    attempts: int
    message: str
    time: float | None


@dataclass
class Column:
    lab: str
    step: int
    title: str
    pass_rate: float = 0.0
    passed: int = 0
    tried: int = 0
    failures: list[tuple[str, int]] = field(default_factory=list)  # (message, learners), commonest first
    minutes: float | None = None  # median minutes to pass

    @property
    def key(self) -> str:
        return f"{self.lab}/{self.step}"


@dataclass
class View:
    learners: list[str]
    columns: list[Column]
    cells: dict[str, dict[str, Cell]]  # learner -> column key -> cell
    updated: float | None = None  # time of the newest record
    problems: list[str] = field(default_factory=list)  # records skipped while reading (file, line, why)
    reveals: list[Reveal] = field(default_factory=list)  # steps revealed to the class, oldest first

    def cell(self, learner: str, column: Column) -> Cell | None:
        return self.cells.get(learner, {}).get(column.key)

    def stuck_at(self, learner: str) -> Column | None:
        """The first step whose latest result fails for ``learner``."""
        return next((c for c in self.columns if (x := self.cell(learner, c)) is not None and not x.passed), None)

    def to_dict(self) -> dict[str, Any]:
        cols = [{"lab": c.lab, "step": c.step, "title": c.title, "pass_rate": round(c.pass_rate, 3),
                 "passed": c.passed, "tried": c.tried, "median_minutes": None if c.minutes is None else
                 round(c.minutes, 2), "common_failures": [{"message": m, "learners": n} for m, n in c.failures]}
                for c in self.columns]
        grid = {who: {k: {"passed": x.passed, "attempts": x.attempts, "message": x.message}
                      for k, x in row.items()} for who, row in self.cells.items()}
        stuck = {who: (s.key if (s := self.stuck_at(who)) else None) for who in self.learners}
        return {"learners": self.learners, "steps": cols, "grid": grid, "stuck_at": stuck, "updated": self.updated,
                "skipped": self.problems, "revealed": [r.to_dict() for r in self.reveals]}

    def revealed_lines(self) -> list[str]:
        """One line per reveal: which step, by whom, when (for a terminal: see :meth:`text`)."""
        return [for_terminal(f"{r.lab}/{r.step} {_title(r.lab, r.step)}: revealed by {r.by} at {when(r.time)}")
                for r in self.reveals]

    def shown_problems(self) -> list[str]:
        """The skipped records to show: the first :data:`PROBLEMS_SHOWN`, then how many more."""
        extra = len(self.problems) - PROBLEMS_SHOWN
        return self.problems[:PROBLEMS_SHOWN] + ([f"... and {extra} more"] if extra > 0 else [])

    def text(self) -> str:
        """The view for a terminal: learners' text in it is shown, never obeyed (no escape sequence, control or
        bidi character of theirs reaches the terminal: :func:`~labkit.records.boundedjson.for_terminal`)."""
        skipped = [for_terminal(f"skipped: {p}") for p in self.shown_problems()]
        revealed = ["", "solutions revealed to the class:", *(f"    {x}" for x in self.revealed_lines())] \
            if self.reveals else []
        if not self.columns:
            return "\n".join(["class view: no check has been recorded yet", *revealed, *skipped])
        names = {who: for_terminal(who) for who in self.learners}
        keys = [for_terminal(c.key) for c in self.columns]
        width = max(8, *(len(w) for w in names.values())) if names else 8
        head = " " * width + "  " + " ".join(f"{k:>13}" for k in keys)
        lines = [head]
        for who in self.learners:
            marks = []
            row = self.cells.get(who, {})
            for c in self.columns:
                x = row.get(c.key)
                marks.append(f"{'.' if x is None else ('pass' if x.passed else 'FAIL') + f' x{x.attempts}':>13}")
            lines.append(f"{names[who]:<{width}}  " + " ".join(marks))
        rates = " ".join(f"{c.pass_rate:>12.0%} " for c in self.columns)
        lines += [f"{'passed':<{width}}  {rates}", ""]
        for c, key in zip(self.columns, keys, strict=True):
            took = "" if c.minutes is None else f", median {c.minutes:.1f} min to pass"
            lines.append(f"{key} {for_terminal(c.title)}: {c.passed}/{len(self.learners)} pass, {c.tried} tried{took}")
            lines += [f"    {n} x {for_terminal(m)}" for m, n in c.failures]
        return "\n".join(lines + revealed + skipped)


def when(seconds: float, form: str = "%Y-%m-%d %H:%M") -> str:
    """``seconds`` since the epoch as local time; a time the platform cannot show is said, never raised."""
    try:
        return time.strftime(form, time.localtime(seconds))
    except (OverflowError, OSError, ValueError, TypeError):
        return "an unknown time"


def first_line(message: str, limit: int = 160) -> str:
    line = next((s.strip() for s in message.splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _title(lab: str, step: int) -> str:
    spec = labs.LABS.get(lab)
    if spec is not None and 1 <= step <= spec.n_steps:
        return spec.step_title(step)
    return "the final assessment" if lab == ASSESSMENT else ""


def _in_course(lab: str, step: int) -> bool:
    spec = labs.LABS.get(lab)
    return (spec is not None and 1 <= step <= spec.n_steps) or (lab == ASSESSMENT and step == 1)


def _columns(keys: Iterable[tuple[str, int]]) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The steps shown, in the course's order (all the course's steps, then others up to :data:`MAX_COLUMNS`
    columns in all), and the steps not shown."""
    index = {name: k for k, name in enumerate(labs.LABS)}
    ordered = sorted(keys, key=lambda k: (index.get(k[0], len(index)), k[0], k[1]))
    course = [k for k in ordered if _in_course(*k)]
    others = [k for k in ordered if not _in_course(*k)]
    room = max(0, MAX_COLUMNS - len(course))
    shown = set(course + others[:room])
    return [k for k in ordered if k in shown], others[room:]


def _minutes(rows: Iterable[Record]) -> dict[tuple[str, int], float]:
    """Per step, the median minutes, over learners, from its start (previous step passed, or their first check of
    the lab) to first passing it; one pass over the records."""
    first_seen: dict[tuple[str, str], float] = {}  # (learner, lab) -> time of their first record of it
    first_pass: dict[tuple[str, str, int], float] = {}  # (learner, lab, step) -> time they first passed it
    for r in rows:
        if r.time is None:
            continue
        seen = (r.learner, r.lab)
        if r.time < first_seen.get(seen, float("inf")):
            first_seen[seen] = r.time
        if r.passed:
            key = (r.learner, r.lab, r.step)
            if r.time < first_pass.get(key, float("inf")):
                first_pass[key] = r.time
    spans: dict[tuple[str, int], list[float]] = defaultdict(list)
    for (who, lab, step), passed in first_pass.items():
        before = first_pass.get((who, lab, step - 1)) if step > 1 else first_seen.get((who, lab))
        if before is not None:
            spans[(lab, step)].append(max(0.0, passed - before) / 60)
    return {key: statistics.median(mins) for key, mins in spans.items()}


def build(records: Iterable[Record], learners: Iterable[str] = (), problems: Iterable[str] = (),
          reveals: Iterable[Reveal] = ()) -> View:
    """The view of ``records`` (oldest first); ``learners`` adds rows for learners with no record yet;
    ``problems`` are the records skipped while reading, shown with the view; ``reveals`` the steps revealed.

    Linear in the number of records: they are grouped by step once, and each step's figures come from its group."""
    rows = list(records)
    who = sorted({*learners, *(r.learner for r in rows)})
    by_step: dict[tuple[str, int], list[Record]] = defaultdict(list)
    for r in rows:
        by_step[(r.lab, r.step)].append(r)
    keys, hidden = _columns(by_step)
    skipped = list(problems)
    if hidden:
        count = sum(len(by_step[k]) for k in hidden)
        skipped.append(f"{count} records of {len(hidden)} steps not in the course not shown (at most {MAX_COLUMNS} "
                       f"columns; the first: {hidden[0][0]}/{hidden[0][1]})")
        shown = set(keys)
        rows = [r for r in rows if (r.lab, r.step) in shown]
    cells: dict[str, dict[str, Cell]] = {w: {} for w in who}
    for r in rows:
        key = f"{r.lab}/{r.step}"
        old = cells[r.learner].get(key)
        cells[r.learner][key] = Cell(r.passed, (old.attempts if old else 0) + 1, r.message, r.time)
    latest: dict[str, list[Cell]] = defaultdict(list)
    for row in cells.values():
        for key, cell in row.items():
            latest[key].append(cell)
    minutes = _minutes(rows)
    columns = []
    for lab, step in keys:
        col = Column(lab, step, _title(lab, step))
        mine = latest[col.key]
        col.tried, col.passed = len(mine), sum(x.passed for x in mine)
        col.pass_rate = col.passed / len(who) if who else 0.0
        seen = {(r.learner, first_line(r.message)) for r in by_step[(lab, step)] if not r.passed}
        col.failures = sorted(Counter(m for _, m in seen).items(), key=lambda mn: (-mn[1], mn[0]))[:TOP_FAILURES]
        col.minutes = minutes.get((lab, step))
        columns.append(col)
    times = [r.time for r in rows if r.time is not None]
    return View(who, columns, cells, max(times) if times else None, skipped,
                sorted(reveals, key=lambda r: r.time))
