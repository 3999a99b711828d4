"""A check's result: one :class:`StepResult` per step, shown as text, HTML or JSON."""

from __future__ import annotations

import html
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from labkit.records.evidence import Evidence


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
    evidence: Evidence | None = field(default=None, repr=False, compare=False)  # what the probe recorded, typed
    notes: list[str] = field(default_factory=list)  # what the run did besides the steps (e.g. processes left running)
    offer: str = ""  # the last line: the step's solution, offered after it failed the same way a few times

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
            **({"notes": list(self.notes)} if self.notes else {}),
            **({"offer": self.offer} if self.offer else {}),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    def format(self) -> str:
        lines = [f"{self.lab} check of {self.script}"]
        for s in self.steps:
            mark = "PASS" if s.passed else "FAIL"
            body = s.message.replace("\n", "\n         ")
            lines.append(f"  step {s.step}  {mark}  {body}")
        lines += [f"  note: {n}" for n in self.notes]
        verdict = "all steps pass" if self.passed else f"fix step {self.first_failing_step} first"
        took = f" ({self.seconds:.0f} s)" if self.seconds is not None else ""
        return "\n".join(lines + [verdict + took] + ([self.offer] if self.offer else []))

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
        notes = "".join(f"<p>Note: {html.escape(n)}</p>" for n in self.notes)
        title = f"<b>{html.escape(self.lab)}</b> check of <code>{html.escape(self.script)}</code>"
        offer = f"<p>{html.escape(self.offer)}</p>" if self.offer else ""
        return f"<div>{title}<table>{''.join(rows)}</table>{notes}{verdict}{offer}</div>"
