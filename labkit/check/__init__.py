"""Behaviour checks of a learner's script, step by step.

From a cell: ``labkit.check.horovod(3, script="fashion_mnist.py")`` shows a
per-step report. From a shell: ``labkit check horovod SCRIPT [--step N] [--json]``.
Each lab's implementation lives in a private module and returns a :class:`Report`.
"""

from __future__ import annotations

import html
import importlib
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from labkit import labs

LABS = labs.LABS  # the registry: names, steps, scripts, timeouts, implementations


@dataclass
class StepResult:
    step: int
    passed: bool
    message: str


@dataclass
class Report:
    lab: str
    script: str
    steps: list[StepResult] = field(default_factory=list)
    seconds: float | None = None

    @property
    def passed(self) -> bool:
        return bool(self.steps) and all(s.passed for s in self.steps)

    @property
    def first_failing_step(self) -> int | None:
        return next((s.step for s in self.steps if not s.passed), None)

    def step(self, k: int) -> StepResult | None:
        """The result of step ``k`` (None when it was not judged)."""
        return next((s for s in self.steps if s.step == k), None)

    def assert_passed(self, step: int | None = None) -> None:
        """Raise AssertionError with the check's message unless steps 1..``step`` (default: all) pass.

        For other graders: an otter-grader test or an nbgrader hidden test cell can
        ``check.horovod(3).assert_passed(3)``.
        """
        upto = [s for s in self.steps if step is None or s.step <= step]
        if step is not None and len(upto) < step:
            raise AssertionError(f"step {step} of the {self.lab} lab was not checked")
        failed = next((s for s in upto if not s.passed), None)
        if failed is not None:
            raise AssertionError(f"{self.lab} step {failed.step}: {failed.message}")
        if not upto:
            raise AssertionError(f"no step of the {self.lab} lab was checked")

    def to_dict(self) -> dict[str, Any]:
        return {
            "lab": self.lab,
            "script": self.script,
            "passed": self.passed,
            "first_failing_step": self.first_failing_step,
            "steps": [asdict(s) for s in self.steps],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def format(self) -> str:
        lines = [f"{self.lab} check of {self.script}"]
        for s in self.steps:
            mark = "PASS" if s.passed else "FAIL"
            body = s.message.replace("\n", "\n         ")
            lines.append(f"  step {s.step}  {mark}  {body}")
        verdict = "all steps pass" if self.passed else f"fix step {self.first_failing_step} first"
        took = f" ({self.seconds:.0f} s)" if self.seconds is not None else ""
        return "\n".join(lines + [verdict + took])

    def __str__(self) -> str:
        return self.format()

    def __repr__(self) -> str:  # plain-text display in notebooks and consoles
        return self.format()

    def _repr_html_(self) -> str:
        rows = []
        for s in self.steps:
            color, mark = ("#1a7f37", "&#10004;") if s.passed else ("#cf222e", "&#10008;")
            msg = html.escape(s.message).replace("\n", "<br>")
            rows.append(
                f"<tr><td style='color:{color};font-weight:bold'>{mark} step {s.step}</td>"
                f"<td style='text-align:left'>{msg}</td></tr>"
            )
        verdict = (
            "<b style='color:#1a7f37'>All steps pass.</b>" if self.passed
            else f"<b style='color:#cf222e'>Fix step {self.first_failing_step} first.</b>"
        )
        title = f"<b>{html.escape(self.lab)}</b> check of <code>{html.escape(self.script)}</code>"
        return f"<div>{title}<table>{''.join(rows)}</table>{verdict}</div>"


# Seconds a whole check may take before every process is stopped (the multi-worker
# check also kills and restarts a worker, so it gets longer).
TIMEOUTS = {name: lab.timeout for name, lab in LABS.items()}


def run_check(
    lab: str, script: str | Path, step: int | None = None, timeout: float | None = None, **kw: Any
) -> Report:
    """Check steps 1..``step`` (default: all) of ``script`` for ``lab``."""
    spec = labs.get(lab)
    module_name, n_steps = spec.module, spec.n_steps
    step = n_steps if step is None else step
    if not 1 <= step <= n_steps:
        raise ValueError(f"the {lab} lab has steps 1..{n_steps}, got {step}")
    module = importlib.import_module(module_name)
    timeout = TIMEOUTS[lab] if timeout is None else timeout
    return module.check(lab=lab, script=Path(script), step=step, timeout=timeout, **kw)


def horovod(
    step: int | None = None, script: str | Path = "fashion_mnist.py", timeout: float | None = None
) -> Report:
    """Check steps 1..``step`` of the Horovod lab."""
    return run_check("horovod", script, step, timeout)


def mirrored(
    step: int | None = None, script: str | Path = "fashion_mnist_mirrored.py", timeout: float | None = None
) -> Report:
    """Check steps 1..``step`` of the MirroredStrategy lab."""
    return run_check("mirrored", script, step, timeout)


def multiworker(
    step: int | None = None, script: str | Path = "fashion_mnist_multiworker.py", timeout: float | None = None
) -> Report:
    """Check steps 1..``step`` of the MultiWorkerMirroredStrategy lab."""
    return run_check("multiworker", script, step, timeout)


def parameter_server(
    step: int | None = None, script: str | Path = "fashion_mnist_ps.py", timeout: float | None = None
) -> Report:
    """Check steps 1..``step`` of the ParameterServerStrategy lab."""
    return run_check("parameter-server", script, step, timeout)


def add_cli(sub) -> None:  # noqa: ANN001
    """Register ``labkit check LAB SCRIPT [--step N] [--json] [--timeout S]``."""
    p = sub.add_parser("check", help="check a lab script step by step, by running it")
    p.add_argument("lab", choices=sorted(LABS), help="which lab")
    p.add_argument("script", help="the learner's script")
    p.add_argument("--step", type=int, default=None, help="check steps 1..N (default: all)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    defaults = ", ".join(f"{k} {v:.0f}" for k, v in TIMEOUTS.items())
    p.add_argument("--timeout", type=float, default=None, help=f"seconds for the whole check (default: {defaults})")
    p.set_defaults(func=_cli)


def _cli(a) -> int:  # noqa: ANN001
    try:
        report = run_check(a.lab, a.script, a.step, a.timeout)
    except (ValueError, FileNotFoundError) as e:
        if a.json:
            print(json.dumps({"lab": a.lab, "script": a.script, "passed": False, "error": str(e)}))
        print(f"labkit check: {e}", file=sys.stderr)
        return 2
    print(report.to_json() if a.json else report.format())
    return 0 if report.passed else 1
