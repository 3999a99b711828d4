"""A step's solution in a notebook cell: the same as ``labkit solution LAB STEP``, as a coloured diff.

    from labkit.ui import solutions
    solutions.show("horovod", 5)                                  # against fashion_mnist.py in this folder
    solutions.show("horovod", 5, script="fashion_mnist.py", write=True)   # also save it next to the script

The cell shows one header line and the unified diff from your script to the solution after the step (red: your
lines, green: the solution's), or one line saying why this course does not show it and whom to ask.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

from labkit.course import labs, solutions

COLOURS = {"+": "#1a7f37", "-": "#cf222e", "@": "#8250df"}
BACKGROUNDS = {"+": "#dafbe1", "-": "#ffebe9"}


@dataclass(frozen=True)
class SolutionView:
    """What the cell shows: the header and the diff, or why there is none."""

    header: str
    diff: str = ""
    problem: str = ""
    saved: str = ""  # the new file, with write=True

    def text(self) -> str:
        lines = [self.problem] if self.problem else [self.header, self.diff.rstrip("\n") or "(no change)"]
        return "\n".join(lines + ([f"saved the whole solution as {self.saved}"] if self.saved else []))

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:  # plain text in consoles and text-only front ends
        return self.text()

    def _repr_html_(self) -> str:
        if self.problem:
            return f"<div><b style='color:#9a6700'>No solution shown.</b> {html.escape(self.problem)}</div>"
        rows = []
        for line in self.diff.splitlines():
            mark = line[:1] if not line.startswith(("---", "+++")) else ""
            style = f"color:{COLOURS[mark]};" if mark in COLOURS else ""
            style += f"background:{BACKGROUNDS[mark]};" if mark in BACKGROUNDS else ""
            rows.append(f"<span style='{style}display:block'>{html.escape(line) or '&nbsp;'}</span>")
        body = "".join(rows) or "<span>(no change: your script is already this solution)</span>"
        saved = f"<p>Saved the whole solution as <code>{html.escape(self.saved)}</code>.</p>" if self.saved else ""
        return (f"<div><p><b>{html.escape(self.header)}</b></p>"
                "<pre style='font-size:90%;line-height:1.3;max-height:40em;overflow:auto;border:1px solid #d0d7de;"
                f"padding:4px 0'>{body}</pre>{saved}</div>")


def show(lab: str, step: int, script: str | Path | None = None, write: bool = False) -> SolutionView:
    """The solution after ``step`` of ``lab`` as the change from ``script`` (default: the lab's script here)."""
    try:
        spec = labs.get(lab)
        path = Path(script) if script is not None else solutions.default_script(spec, step=step)
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: give your script, e.g. show({lab!r}, {step}, "
                                    f"script={spec.step_file(step)!r})")
        found = solutions.find(spec, step, path)
    except (solutions.NotAvailable, ValueError, FileNotFoundError) as e:
        return SolutionView("", problem=str(e))
    saved = str(solutions.write_next_to(found, path)) if write else ""
    return SolutionView(solutions.header(found, path), solutions.diff(found, path), saved=saved)
