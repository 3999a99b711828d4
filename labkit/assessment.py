"""The final assessment: reach a validation accuracy within a time budget on N workers.

In the spirit of the original lab's closing exercise. The verdict comes from run
records (:mod:`labkit.runs`), i.e. from what labkit observed the ranks do, never from
what a script prints: the time counts from the job's start (start-up included) to the
end of the first epoch whose validation accuracy reaches the target.

    labkit assess labs/fashion_mnist.py --np 2 --target 0.82 --budget 180 -- --epochs 20
    labkit assess --records runs/runs.jsonl --np 2      # judge runs already recorded

From a notebook: ``assessment.assess(SCRIPT, workers=2, args=[...])`` runs and judges;
``assessment.judge_records(runs.read())`` judges the runs you already made.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from labkit.cliargs import accuracy, positive_float, positive_int

DEFAULT_TARGET = 0.82  # small mode's target accuracy
DEFAULT_BUDGET = 180.0  # seconds; about 2.5x what the Horovod solution needs on 2 CPU workers


@dataclass(frozen=True)
class Goal:
    """What the assessment asks for."""

    workers: int = 2
    target: float = DEFAULT_TARGET
    budget_s: float = DEFAULT_BUDGET

    def __str__(self) -> str:
        return f"{self.target:.0%} validation accuracy within {self.budget_s:.0f} s on {self.workers} workers"


@dataclass(repr=False)
class Verdict:
    """Whether a run met the goal, and why (or how far it got)."""

    passed: bool
    message: str
    goal: Goal
    run_id: str | None = None
    reached_s: float | None = None  # when the target was first reached (from the job's start)
    best_accuracy: float | None = None
    records_judged: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "goal": asdict(self.goal)}

    def _repr_markdown_(self) -> str:
        mark = "✅" if self.passed else "❌"
        return f"**Assessment** ({self.goal}): {mark} {self.message}"

    def __repr__(self) -> str:
        return f"assessment ({self.goal}): {'PASSED' if self.passed else 'FAILED'}: {self.message}"

    __str__ = __repr__


def judge(record: dict[str, Any], goal: Goal) -> Verdict:
    """The verdict on one run record."""
    rid = record.get("run_id")
    workers = int(record.get("workers") or 0)
    epochs = [e for e in record.get("epochs") or [] if e.get("val_accuracy") is not None]
    best = max((float(e["val_accuracy"]) for e in epochs), default=None)
    base = {"run_id": rid, "best_accuracy": best, "records_judged": 1}
    if workers < goal.workers:
        return Verdict(False, f"run {rid} used {workers} worker(s); the assessment asks for {goal.workers}.",
                       goal, **base)
    if record.get("status") not in ("ok", None):
        return Verdict(False, f"run {rid} ended with status {record.get('status')!r}: "
                              f"{(record.get('error') or '').strip()[-300:]}", goal, **base)
    if not epochs:
        return Verdict(False, f"run {rid} recorded no validation accuracy: pass validation_data to fit().",
                       goal, **base)
    hit = next((e for e in epochs if float(e["val_accuracy"]) >= goal.target and e.get("elapsed_s") is not None),
               None)
    if hit is None:
        return Verdict(False, f"run {rid} reached at most {best:.1%} in {len(epochs)} epochs, below the target "
                              f"{goal.target:.0%}: train longer (--epochs), or revisit the learning rate "
                              "(scaled by the workers, with warm-up).", goal, **base)
    t = float(hit["elapsed_s"])
    details = {"epoch": hit.get("epoch"), "images_per_sec": record.get("images_per_sec"),
               "global_batch": record.get("global_batch"), "strategy": record.get("strategy")}
    if t > goal.budget_s:
        return Verdict(False, f"run {rid} reached {float(hit['val_accuracy']):.1%} after {t:.0f} s, over the budget "
                              f"of {goal.budget_s:.0f} s: make each epoch faster (workers, threads, batch size) "
                              "or need fewer of them (learning rate).", goal, reached_s=t, details=details,
                       **base)
    epoch = hit.get("epoch")  # counted from 1
    return Verdict(True, f"run {rid} reached {float(hit['val_accuracy']):.1%} validation accuracy after {t:.0f} s "
                         f"(epoch {epoch}) on {workers} workers, within {goal.budget_s:.0f} s.",
                   goal, reached_s=t, details=details, **base)


def judge_records(records: Iterable[dict[str, Any]], goal: Goal = Goal()) -> Verdict:
    """The best verdict over many runs: a passing one if any, else the run that got closest."""
    records = list(records)
    if not records:
        return Verdict(False, "no run records to judge: run your script through labkit first.", goal)
    verdicts = [judge(r, goal) for r in records if int(r.get("workers") or 0) >= goal.workers]
    if not verdicts:
        return Verdict(False, f"none of the {len(records)} recorded runs used {goal.workers} workers.", goal,
                       records_judged=len(records))
    passed = [v for v in verdicts if v.passed]
    if passed:
        best = min(passed, key=lambda v: v.reached_s or float("inf"))
    else:
        best = max(verdicts, key=lambda v: (v.best_accuracy or -1.0))
    best.records_judged = len(records)
    return best


def assess(script: str | Path, goal: Goal = Goal(), args: Sequence[str] = (), launcher: str = "mpirun",
           threads: int | None = 1, records: str | Path | None = None, timeout: float | None = None,
           quiet: bool = True, cwd: str | Path | None = None) -> Verdict:
    """Run ``script ARGS`` once on ``goal.workers`` workers (recorded) and judge its record; the run's
    files (logs, checkpoints) go to ``cwd`` (default: here)."""
    from labkit import bench, runs

    if not Path(script).is_file():
        raise FileNotFoundError(f"no such script: {script}")
    with tempfile.TemporaryDirectory(prefix="labkit-assess-") as tmp:
        path = Path(records) if records else Path(tmp) / "runs.jsonl"
        sweep = bench.bench(Path(script).resolve(), nps=[goal.workers], args=list(args), launcher=launcher,
                            threads=threads, runs_file=path.resolve(), timeout=timeout or goal.budget_s * 3,
                            quiet=quiet, target=goal.target, echo=False, cwd=cwd)
        mine = [r for r in runs.read(path, warn=False) if r.get("bench") == sweep.conditions["sweep_id"]]
    if not mine:
        return Verdict(False, "the run left no record (did it start? see its logs under runs/logs).", goal)
    return judge(mine[-1], goal)


def from_config(table: dict[str, Any]) -> tuple[Goal, dict[str, Any]]:
    """The goal and run settings of ``[tool.labkit.grading.assessment]`` in a course's pyproject.toml."""
    known = {"script", "workers", "target", "budget", "points", "args", "launcher"}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ValueError(f"[tool.labkit.grading.assessment]: unknown key(s) {unknown}; known: {sorted(known)}")
    goal = Goal(int(table.get("workers", Goal.workers)), float(table.get("target", DEFAULT_TARGET)),
                float(table.get("budget", DEFAULT_BUDGET)))
    if goal.workers < 1 or not 0 < goal.target <= 1 or goal.budget_s <= 0:
        raise ValueError(f"[tool.labkit.grading.assessment]: workers >= 1, 0 < target <= 1, budget > 0; got {goal}")
    args = table.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise ValueError("[tool.labkit.grading.assessment] args: a list of strings, e.g. [\"--epochs\", \"20\"]")
    run = {"script": str(table.get("script", "fashion_mnist.py")), "args": args,
           "launcher": str(table.get("launcher", "mpirun")), "points": float(table.get("points", 1.0))}
    return goal, run


def add_cli(sub) -> None:  # noqa: ANN001
    """Register ``labkit assess [SCRIPT] [options] [-- ARGS]``."""
    p = sub.add_parser("assess", help="the final assessment: target accuracy within a time budget on N workers",
                       description="Run SCRIPT on N workers (recorded) and judge its record, or judge the runs "
                                   "already in --records. Example: labkit assess labs/fashion_mnist.py --np 2 "
                                   "-- --epochs 20")
    p.add_argument("script", nargs="?", help="the training script to run (omit with --records)")
    p.add_argument("args", nargs="*", help="the script's arguments, after --")
    p.add_argument("--np", type=positive_int, default=Goal.workers, help="workers (default: %(default)s)")
    p.add_argument("--target", type=accuracy, default=DEFAULT_TARGET,
                   help="validation accuracy to reach (default: %(default)s)")
    p.add_argument("--budget", type=positive_float, default=DEFAULT_BUDGET,
                   help="seconds from the job's start (default: %(default)s)")
    p.add_argument("--launcher", default="mpirun", help="mpirun, horovodrun, gloo or cluster (tf.distribute)")
    p.add_argument("--threads", type=positive_int, default=1, help="threads per worker (default: %(default)s)")
    p.add_argument("--records", help="judge the runs recorded in this file instead of running SCRIPT")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.set_defaults(func=_cli)


def _cli(a) -> int:  # noqa: ANN001
    from labkit import runs

    goal = Goal(a.np, a.target, a.budget)
    if a.records:
        if a.script:
            raise SystemExit("labkit assess: give SCRIPT or --records, not both")
        if not Path(a.records).is_file():
            raise SystemExit(f"labkit assess: no such records file: {a.records}")
        verdict = judge_records(runs.read(a.records), goal)
    elif a.script:
        verdict = assess(a.script, goal, a.args, a.launcher, a.threads, quiet=a.json)
    else:
        raise SystemExit("labkit assess: give a SCRIPT to run, or --records FILE to judge")
    print(json.dumps(verdict.to_json(), indent=2) if a.json else str(verdict), file=sys.stdout)
    return 0 if verdict.passed else 1
