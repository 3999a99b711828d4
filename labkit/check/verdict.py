"""What a step's judge is and how it says no: the one vocabulary every lab's judges share.

A judge is a plain function of a run's evidence (its lab's typed record, :mod:`labkit.records.evidence`): it
returns what passed, or raises :class:`Failed` with what the learner should change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from labkit.records.evidence import Evidence

E = TypeVar("E", bound=Evidence)
Judge = Callable[[E], str]  # a judge of one lab's evidence: Judge[HorovodEvidence]


class Failed(Exception):
    """A step failed; the message says what to change."""
