"""Behaviour checks of a learner's script, step by step.

From a cell: ``labkit.check.horovod(3, script="fashion_mnist.py")`` shows a per-step report (one such
function per lab of :data:`labkit.course.labs.LABS`, named after it). From a shell:
``labkit check horovod SCRIPT [--step N] [--json]``.
Each lab's step judges live in ``labkit.check.lab_*`` (the table :data:`labkit.check.judges.JUDGES`) as plain
functions of what the probe recorded; :mod:`labkit.check.judging` runs them in one loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from labkit.check import judging, offer
from labkit.check.report import Report
from labkit.check.report import StepResult as StepResult  # public: __all__
from labkit.course import labs
from labkit.records import checklog, classlog

LABS = labs.LABS  # the registry: names, steps, files, timeouts, points (each lab's check timeout: Lab.timeout)


def run_check(
    lab: str, script: str | Path, step: int | None = None, timeout: float | None = None, **kw: Any
) -> Report:
    """Check steps 1..``step`` (default: all) of ``script`` for ``lab``.

    Keywords: ``fresh=True`` runs again even for an unchanged script; ``keep=DIR`` keeps
    the run's folder; ``evidence_out=FILE`` writes what the probe recorded, as JSON.
    Each judged step goes to the learner's check record (:mod:`labkit.records.checklog`), by
    the script's content, and in a workshop to the class record. A step that failed the same way
    :data:`labkit.check.offer.TIMES` times in a row ends the report with its solution offered.
    """
    spec = labs.get(lab)
    step = spec.n_steps if step is None else step
    if not 1 <= step <= spec.n_steps:
        raise ValueError(f"the {lab} lab has steps 1..{spec.n_steps}, got {step}")
    timeout = spec.timeout if timeout is None else timeout
    checked = _content(script)
    report = judging.check(spec, Path(script), step, timeout, **kw)
    if _content(script) != checked:
        report.notes.append(f"{Path(script).name} changed while it was checked: this check is not recorded "
                            "for it; check it again")
    elif (problem := checklog.record_check(report, checked or b"")) is not None:  # the learner's own record
        report.notes.append(problem)
    if (problem := classlog.record_check(report)) is not None:  # a workshop's class record; nothing outside one
        report.notes.append(problem)
    report.offer = offer.offer(report, spec)  # the step's solution, after it failed the same way a few times
    return report


def _content(script: str | Path) -> bytes | None:
    path = Path(script)
    return path.read_bytes() if path.is_file() else None


def _public() -> list[str]:
    """What ``from labkit.check import *`` gives: the report's types, :func:`run_check` and one function per lab of
    the registry as it is when asked (a lab declared later has one too)."""
    return ["Report", "StepResult", "run_check", *(name.replace("-", "_") for name in labs.LABS)]


def __getattr__(name: str) -> Any:
    """``labkit.check.LAB(step=None, script=STARTER, timeout=None)`` for every lab of the registry, its name with
    ``_`` for ``-`` (``labkit.check.parameter_server(3)``): check steps 1..``step`` of the lab's script. Also
    ``__all__``, read from the registry when asked."""
    if name == "__all__":
        return _public()
    lab = labs.LABS.get(name.replace("_", "-"))
    if lab is None or name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

    def checker(step: int | None = None, script: str | Path = lab.starter, timeout: float | None = None) -> Report:
        return run_check(lab.name, script, step, timeout)

    checker.__name__ = checker.__qualname__ = name
    checker.__doc__ = (f"Check steps 1..``step`` of the {lab.name} lab ({lab.notebook}: {lab.title}); "
                       f"the script: {lab.starter}.")
    return checker


def __dir__() -> list[str]:
    return sorted({*globals(), *_public()})
