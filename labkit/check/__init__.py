"""Behaviour checks of a learner's script, step by step.

From a cell: ``labkit.check.horovod(3, script="fashion_mnist.py")`` shows a
per-step report. From a shell: ``labkit check horovod SCRIPT [--step N] [--json]``.
Each lab's step judges live in ``labkit.check.lab_*`` as plain functions of what the
probe recorded; :mod:`labkit.check.judging` runs them in one loop.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from labkit.check import judging
from labkit.check.report import Report, StepResult
from labkit.core.cliargs import positive_float, positive_int
from labkit.course import labs

__all__ = ["Report", "StepResult", "horovod", "mirrored", "multiworker", "parameter_server", "run_check"]

LABS = labs.LABS  # the registry: names, steps, scripts, timeouts, implementations


# Seconds a whole check may take before every process is stopped (the multi-worker
# check also kills and restarts a worker, so it gets longer).
TIMEOUTS = {name: lab.timeout for name, lab in LABS.items()}


def run_check(
    lab: str, script: str | Path, step: int | None = None, timeout: float | None = None, **kw: Any
) -> Report:
    """Check steps 1..``step`` (default: all) of ``script`` for ``lab``.

    Keywords: ``fresh=True`` runs again even for an unchanged script; ``keep=DIR`` keeps
    the run's folder; ``evidence_out=FILE`` writes what the probe recorded, as JSON.
    """
    spec = labs.get(lab)
    step = spec.n_steps if step is None else step
    if not 1 <= step <= spec.n_steps:
        raise ValueError(f"the {lab} lab has steps 1..{spec.n_steps}, got {step}")
    timeout = spec.timeout if timeout is None else timeout
    return judging.check(lab, Path(script), step, timeout, **kw)


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


def add_cli(sub) -> None:
    """Register ``labkit check LAB SCRIPT [--step N] [--json] [--timeout S]``."""
    p = sub.add_parser("check", help="check a lab script step by step, by running it")
    p.add_argument("lab", choices=sorted(LABS), help="which lab")
    p.add_argument("script", help="the learner's script")
    p.add_argument("--step", type=positive_int, default=None, help="check steps 1..N (default: all)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    defaults = ", ".join(f"{k} {v:.0f}" for k, v in TIMEOUTS.items())
    p.add_argument("--timeout", type=positive_float, default=None,
        help=f"seconds for the whole check (default: {defaults})")
    p.set_defaults(func=_cli)


def _cli(a) -> int:
    try:
        report = run_check(a.lab, a.script, a.step, a.timeout)
    except (ValueError, FileNotFoundError) as e:
        if a.json:
            print(json.dumps({"lab": a.lab, "script": a.script, "passed": False, "error": str(e)}))
        print(f"labkit check: {e}", file=sys.stderr)
        return 2
    print(report.to_json() if a.json else report.format())
    return 0 if report.passed else 1
