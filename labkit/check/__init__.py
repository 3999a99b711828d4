"""Behaviour checks of a learner's script, step by step.

From a cell: ``labkit.check.horovod(3, script="fashion_mnist.py")`` shows a
per-step report. From a shell: ``labkit check horovod SCRIPT [--step N] [--json]``.
Each lab's step judges live in ``labkit.check.lab_*`` as plain functions of what the
probe recorded; :mod:`labkit.check.judging` runs them in one loop.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from labkit.check import judging, offer
from labkit.check.report import Report, StepResult
from labkit.course import labs
from labkit.records import checklog, classlog

__all__ = ["Report", "StepResult", "communication", "horovod", "mirrored", "multiworker", "parameter_server",
           "run_check", "scale_out"]

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
    report = judging.check(lab, Path(script), step, timeout, **kw)
    if _content(script) != checked:
        report.notes.append(f"{Path(script).name} changed while it was checked: this check is not recorded "
                            "for it; check it again")
    elif (problem := checklog.record_check(report, checked or b"")) is not None:  # the learner's own record
        report.notes.append(problem)
    if (problem := classlog.record_check(report)) is not None:  # a workshop's class record; nothing outside one
        report.notes.append(problem)
    report.offer = offer.offer(report)  # the step's solution, after it failed the same way a few times
    return report


def _content(script: str | Path) -> bytes | None:
    path = Path(script)
    return path.read_bytes() if path.is_file() else None


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


def communication(
    step: int | None = None, script: str | Path = "fashion_mnist.py", timeout: float | None = None
) -> Report:
    """Check lab 8's exercise: with ``--fp16-allreduce`` the Horovod script all-reduces its gradients as float16."""
    return run_check("communication", script, step, timeout)


def scale_out(
    step: int | None = None, script: str | Path = "cluster.sbatch", timeout: float | None = None
) -> Report:
    """Check lab 7's exercise by dry runs: step 1 the hostfile ``cluster_hostfile`` next to ``script`` (OpenMPI's
    mapper), step 2 the batch script (its allocation on the lab's cluster, its body run with launchers that record
    instead of starting). Nothing starts; no root, no cluster."""
    return run_check("scale-out", script, step, timeout)
