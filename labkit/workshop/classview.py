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
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from labkit.course import labs
from labkit.records.classlog import Record, Reveal

TOP_FAILURES = 3
PROBLEMS_SHOWN = 20  # skipped lines listed with the view; the rest are counted


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
        """One line per reveal: which step, by whom, when."""
        return [f"{r.lab}/{r.step} {_title(r.lab, r.step)}: revealed by {r.by} at {when(r.time)}" for r in self.reveals]

    def shown_problems(self) -> list[str]:
        """The skipped records to show: the first :data:`PROBLEMS_SHOWN`, then how many more."""
        extra = len(self.problems) - PROBLEMS_SHOWN
        return self.problems[:PROBLEMS_SHOWN] + ([f"... and {extra} more"] if extra > 0 else [])

    def text(self) -> str:
        skipped = [f"skipped: {p}" for p in self.shown_problems()]
        revealed = ["", "solutions revealed to the class:", *(f"    {x}" for x in self.revealed_lines())] \
            if self.reveals else []
        if not self.columns:
            return "\n".join(["class view: no check has been recorded yet", *revealed, *skipped])
        keys = [c.key for c in self.columns]
        width = max(8, *(len(w) for w in self.learners)) if self.learners else 8
        head = " " * width + "  " + " ".join(f"{k:>13}" for k in keys)
        lines = [head]
        for who in self.learners:
            marks = []
            for c in self.columns:
                x = self.cell(who, c)
                marks.append(f"{'.' if x is None else ('pass' if x.passed else 'FAIL') + f' x{x.attempts}':>13}")
            lines.append(f"{who:<{width}}  " + " ".join(marks))
        rates = " ".join(f"{c.pass_rate:>12.0%} " for c in self.columns)
        lines += [f"{'passed':<{width}}  {rates}", ""]
        for c in self.columns:
            took = "" if c.minutes is None else f", median {c.minutes:.1f} min to pass"
            lines.append(f"{c.key} {c.title}: {c.passed}/{len(self.learners)} pass, {c.tried} tried{took}")
            lines += [f"    {n} x {m}" for m, n in c.failures]
        return "\n".join(lines + revealed + skipped)


def when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))


def first_line(message: str, limit: int = 160) -> str:
    line = next((s.strip() for s in message.splitlines() if s.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _order(lab: str, step: int) -> tuple[int, str, int]:
    names = list(labs.LABS)
    return (names.index(lab) if lab in names else len(names), lab, step)


def _title(lab: str, step: int) -> str:
    spec = labs.LABS.get(lab)
    if spec is not None and 1 <= step <= spec.n_steps:
        return spec.step_title(step)
    return "the final assessment" if lab == "assessment" else ""


def _minutes(rows: list[Record], lab: str, step: int) -> float | None:
    """Median minutes, over learners, from the start of ``step`` (previous step passed, or first check) to passing."""
    spans = []
    for who in {r.learner for r in rows}:
        mine = [(r, r.time) for r in rows if r.learner == who and r.lab == lab and r.time is not None]
        passed = [t for r, t in mine if r.step == step and r.passed]
        if not passed:
            continue
        before = ([t for r, t in mine if r.step == step - 1 and r.passed] if step > 1 else [t for _, t in mine])
        if before:
            spans.append(max(0.0, min(passed) - min(before)) / 60)
    return statistics.median(spans) if spans else None


def build(records: Iterable[Record], learners: Iterable[str] = (), problems: Iterable[str] = (),
          reveals: Iterable[Reveal] = ()) -> View:
    """The view of ``records`` (oldest first); ``learners`` adds rows for learners with no record yet;
    ``problems`` are the records skipped while reading, shown with the view; ``reveals`` the steps revealed."""
    rows = list(records)
    who = sorted({*learners, *(r.learner for r in rows)})
    keys = sorted({(r.lab, r.step) for r in rows}, key=lambda k: _order(*k))
    cells: dict[str, dict[str, Cell]] = {w: {} for w in who}
    for r in rows:
        key = f"{r.lab}/{r.step}"
        old = cells[r.learner].get(key)
        cells[r.learner][key] = Cell(r.passed, (old.attempts if old else 0) + 1, r.message, r.time)
    columns = []
    for lab, step in keys:
        col = Column(lab, step, _title(lab, step))
        latest = [row[col.key] for row in cells.values() if col.key in row]
        col.tried, col.passed = len(latest), sum(x.passed for x in latest)
        col.pass_rate = col.passed / len(who) if who else 0.0
        seen = {(r.learner, first_line(r.message)) for r in rows if r.lab == lab and r.step == step and not r.passed}
        col.failures = sorted(Counter(m for _, m in seen).items(), key=lambda mn: (-mn[1], mn[0]))[:TOP_FAILURES]
        col.minutes = _minutes(rows, lab, step)
        columns.append(col)
    times = [r.time for r in rows if r.time is not None]
    return View(who, columns, cells, max(times) if times else None, list(problems),
                sorted(reveals, key=lambda r: r.time))
