"""Where a probed process the check had to stop was, typed: the frame of the learner's code its stack was in, what it
was doing there, and where training was.

:func:`labkit.check.ending.still_running` builds a :class:`StillRunning` from the stack the process dumped when it
was stopped (:func:`labkit.core.stacks.where`) and the ``progress.N.json`` its probe wrote; a rank's evidence keeps
it (``running_at_end``) for the judges, which tell the learner why the rank never got where a step needs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from labkit.core import stacks
from labkit.records import typed


@dataclass(frozen=True)
class Frame:
    """One frame of the stack: its file, line and function (and, for the learner's code, the line's source)."""

    file: str = ""
    line: int = 0
    function: str = ""
    code: str | None = field(default=None, metadata=typed.OMIT_NONE)

    def describe(self) -> str:
        """``fashion_mnist.py:42 (main): `while True:```."""
        return stacks.describe(asdict(self))


@dataclass(frozen=True)
class Where:
    """What the stack shows the process doing (``kind``: own, library, importing, tracing, collective, training),
    what made it dump (``trigger``), the innermost frame of the learner's code (``at``) and the innermost frame when
    that is not it (``inside``)."""

    kind: str = ""
    trigger: str = ""
    at: Frame | None = field(default=None, metadata=typed.OMIT_NONE)
    inside: Frame | None = field(default=None, metadata=typed.OMIT_NONE)


@dataclass(frozen=True)
class Progress:
    """``progress.N.json``: where training was (its phase, epoch and batch, written at ``t``), and how long before
    the process was stopped it was written (``age``, seconds)."""

    phase: str = "training"
    epoch: int = 0
    batch: int | None = None
    t: float = 0.0
    age: float = 1e9  # never written: no recent progress


@dataclass(frozen=True)
class StillRunning:
    """A process the check had to stop: where it was, after how many seconds, where training was; ``stopped``
    says how it was stopped when the check knows better than its time running out (a rank's bound on reaching
    ``Model.fit``; never saved)."""

    where: Where = field(default_factory=Where)
    after: float = 0.0
    progress: Progress | None = field(default=None, metadata=typed.OMIT_NONE)
    stopped: str | None = field(default=None, metadata=typed.OMIT_NONE)
