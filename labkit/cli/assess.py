"""``labkit assess``: the command line of :mod:`labkit.grading.assessment` and :mod:`labkit.grading.calibration`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from labkit.core.cliargs import UsageError, accuracy, add_script, positive_float, positive_int
from labkit.grading import assessment, calibration
from labkit.launching.jobspec import JobSpec
from labkit.records import runs

EXAMPLES = """\
examples:
  labkit assess labs/fashion_mnist.py --np 2 -- --epochs 20
  labkit assess --launcher cluster labs/fashion_mnist_multiworker.py -- --epochs 20
  labkit assess labs/fashion_mnist.py --records labs/runs/scaling.jsonl
  labkit assess --calibrate --np 2

The budget is {multiple:g} x this machine's reference time: a fixed workload that ships with
labkit (the course's small model, one epoch of one worker's share of the data, as many copies at
once as workers, one thread each; no solution), measured once and cached in
{cache}. The reference solution needed 2.1-4.0 of those times
(median 2.6) in the measurements behind the default 6 (see labkit/grading/calibration.py), so a slow
laptop and a fast CI runner judge alike."""


def add_cli(sub) -> None:
    """Register ``labkit assess SCRIPT [options] [-- ARGS]`` and ``labkit assess --calibrate``."""
    p = sub.add_parser(
        "assess", help="the final assessment: your script reaches the target accuracy within this machine's budget",
        description="Run SCRIPT on N workers, one thread each (recorded), and judge its record; or judge the runs "
                    "of SCRIPT already in --records. Only runs of SCRIPT count, in small mode, on the full "
                    "small-mode test set, with the goal's target accuracy.",
        epilog=EXAMPLES.format(multiple=calibration.MULTIPLE, cache=calibration.cache_file()))
    add_script(p, required=False, what="your training script (the one judged)")
    p.add_argument("--np", type=positive_int, default=2, help="workers (default: %(default)s)")
    p.add_argument("--target", type=accuracy, default=assessment.DEFAULT_TARGET,
                   help="validation accuracy to reach (default: %(default)s)")
    p.add_argument("--multiple", type=positive_float, default=calibration.MULTIPLE,
                   help="the budget in times this machine's reference time (default: %(default)s)")
    p.add_argument("--launcher", default="mpirun", choices=("mpirun", "horovodrun", "gloo", "cluster"),
                   help="mpirun, horovodrun or gloo for Horovod scripts, cluster for tf.distribute (default: mpirun)")
    p.add_argument("--records", help="judge the runs of SCRIPT recorded in this file instead of running it")
    p.add_argument("--calibrate", action="store_true",
                   help="measure this machine's reference time again (and cache it); no SCRIPT")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.set_defaults(func=_cli)


def _say(text: str) -> None:
    print(f"labkit assess: {text}", file=sys.stderr, flush=True)


def _cli(a) -> int:
    if a.calibrate:
        if a.script or a.records:
            raise UsageError("--calibrate measures this machine: give no SCRIPT and no --records")
        cal = calibration.measure(a.np, say=_say)
        budget = cal.budget(a.multiple)
        print(json.dumps({**vars(cal), "budget_s": budget, "multiple": a.multiple}, indent=2) if a.json else
              f"{cal}\nbudget: {a.multiple:g} x {cal.seconds:.1f} s = {budget:.0f} s; cached in "
              f"{calibration.cache_file()}")
        return 0
    if not a.script:
        raise UsageError("give the SCRIPT to judge, e.g. labkit assess labs/fashion_mnist.py --np 2 -- --epochs 20")
    if a.records and a.args:
        raise UsageError("--records judges runs already made: nothing goes after --")
    if a.records and not Path(a.records).is_file():
        raise UsageError(f"{a.records} not found")
    goal = assessment.machine_goal(a.np, a.target, a.multiple, say=_say)
    if a.records:
        verdict = assessment.judge_records(runs.read(a.records), goal, a.script)
    else:
        verdict = assessment.assess(a.script, goal, a.args, a.launcher, job=JobSpec(quiet=a.json), say=_say)
    print(json.dumps(verdict.to_json(), indent=2) if a.json else str(verdict))
    return 0 if verdict.passed else 1
