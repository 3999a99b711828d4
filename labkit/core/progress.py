"""Progress of a launch in a notebook: ipywidgets bars for the epochs and the steps of the shown rank.

Keras prints ``Epoch 3/10`` and redraws ``12/47 [====>....] - ETA: 4s - loss: ...``;
:class:`WidgetSink` turns them into two progress bars and a line of metrics, and
prints each finished line as text, so the cell keeps a readable log. Where widgets
cannot render (a terminal, a notebook executed headless, ``LABKIT_DASHBOARD=text``)
:func:`default_sink` gives the plain-text sinks of :mod:`labkit.core.output`.
"""

from __future__ import annotations

import re
from typing import Any

from labkit.core import contract
from labkit.core.output import ConsoleSink, NotebookSink, in_notebook

EPOCH = re.compile(r"^Epoch (\d+)/(\d+)")
STEP = re.compile(r"^\s*(\d+)/(\d+) \[[=>.]*\](.*)$")


def widgets_work() -> bool:
    """True in a Jupyter kernel with ipywidgets installed, unless text is asked for."""
    if not in_notebook() or contract.settings().dashboard == "text":
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


class WidgetSink(NotebookSink):
    """Finished lines as text; Keras' epoch and step progress as two bars with the latest metrics."""

    def __init__(self) -> None:
        super().__init__()
        self.box: Any = None

    def _widgets(self) -> Any:
        if self.box is None:
            import ipywidgets as w

            self.epochs = w.IntProgress(value=0, min=0, max=1, description="epoch", bar_style="info")
            self.steps = w.IntProgress(value=0, min=0, max=1, description="step")
            self.label = w.Label(value="")
            self.box = w.VBox([w.HBox([self.epochs, self.steps]), self.label])
            self._display(self.box)
        return self.box

    def line(self, text: str) -> None:
        m = EPOCH.match(text)
        if m:
            self._widgets()
            done, total = int(m.group(1)) - 1, int(m.group(2))
            self.epochs.max, self.epochs.value = total, done
            self.epochs.description = f"epoch {done + 1}/{total}"
            self.steps.value = 0
        elif self.box is not None and STEP.match(text):  # the step line of a finished epoch
            self.progress(text)
            self.epochs.value = min(self.epochs.max, self.epochs.value + 1)
        super().line(text)

    def progress(self, text: str) -> None:
        m = STEP.match(text)
        if not m:
            super().progress(text)
            return
        self._widgets()
        self.steps.max, self.steps.value = int(m.group(2)), int(m.group(1))
        self.steps.description = f"step {m.group(1)}/{m.group(2)}"
        self.label.value = m.group(3).strip(" -")[:200]


def default_sink() -> ConsoleSink | NotebookSink:
    """Where a launch shows rank 0: widgets in a notebook that can draw them, else text."""
    if widgets_work():
        return WidgetSink()
    return NotebookSink() if in_notebook() else ConsoleSink()
