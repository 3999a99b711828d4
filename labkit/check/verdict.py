"""What a step's judge is and how it says no: the one vocabulary every lab's judges share.

A judge is a plain function of a run's evidence: it returns what passed, or raises :class:`Failed` with what the
learner should change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Judge = Callable[[dict[str, Any]], str]


class Failed(Exception):
    """A step failed; the message says what to change."""
