"""The check package's table of lab judges: each lab of :data:`labkit.course.labs.LABS` has one module here.

A lab's judge module provides ``EVIDENCE`` (the class of its typed evidence, :mod:`labkit.records.evidence`),
``collect(script, upto, timeout, work) -> EVIDENCE`` (a probed run's evidence), ``STEPS`` (one judge per step,
:mod:`labkit.check.verdict`) and, optionally, ``upto(step)`` and ``syntax_error(script)``
(:mod:`labkit.check.judging` says what each does). A new lab adds its module to
:data:`JUDGES` under the name its declaration gives it; ``tests/unit/test_lab_declaration.py`` fails for a lab
without one.
"""

from __future__ import annotations

from types import ModuleType

from labkit.check import (
    lab_at_scale,
    lab_communication,
    lab_horovod,
    lab_mirrored,
    lab_multiworker,
    lab_parameter_server,
    lab_scale_out,
)
from labkit.course import labs

JUDGES: dict[str, ModuleType] = {
    "horovod": lab_horovod,
    "mirrored": lab_mirrored,
    "multiworker": lab_multiworker,
    "parameter-server": lab_parameter_server,
    "communication": lab_communication,
    "scale-out": lab_scale_out,
    "at-scale": lab_at_scale,
}


def of(lab: str) -> ModuleType:
    """The judge module of ``lab`` (a clear error for a lab the course does not declare)."""
    labs.get(lab)
    if lab not in JUDGES:
        raise ValueError(f"the {lab} lab is declared but has no judges in labkit.check.judges.JUDGES")
    return JUDGES[lab]
