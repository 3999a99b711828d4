"""A class pressing "check" at once: the check queue's load test.

``N`` simulated learners, each a process of its own in a folder of its own with a copy of a script, start the
Horovod lab's step-1 check within ``spread`` seconds of each other (fixed random offsets), with the check queue
(``LABKIT_CHECK_SLOTS``) and without. Each learner's wall time counts from the moment it pressed "check" to its
report, its wait for a slot included. Run::

    python -m labkit.measure.checkload [--learners 4,8,16] [--slots 1] [--spread 10] [--out FILE]

It prints one line per run (p50, p95 and max of the learners' times, how many checks failed) and other
programs' share of the cores while it ran (:mod:`labkit.core.machineload`); ``--out`` keeps the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from labkit.core import identity, machineload, slots
from labkit.course import labs

LEARNER = """
import json, sys, time
from labkit import check
pressed = time.monotonic()
report = check.run_check("horovod", sys.argv[1], 1, fresh=True)
waited = [n for n in report.notes if "for a check slot" in n]
print(json.dumps({"seconds": round(time.monotonic() - pressed, 2), "passed": report.passed, "waited": waited,
                  "message": "" if report.passed else report.format()[-400:]}))
"""


@dataclass
class LoadRun:
    """One load: ``learners`` checks pressed within ``spread`` s, with ``slots`` slots (0: no queue)."""

    learners: int
    slots: int
    spread: float
    seconds: list[float]  # each learner's wall time, from pressing "check" to the report
    failed: int
    other_work: float | None  # other programs' share of the cores meanwhile
    failures: list[str]

    def quantile(self, q: float) -> float:
        ordered = sorted(self.seconds)
        return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))] if ordered else float("nan")

    def __str__(self) -> str:
        queue = f"queue of {self.slots} slot(s)" if self.slots else "no queue"
        other = f"; other programs {100 * self.other_work:.0f}% of the cores" if self.other_work is not None else ""
        return (f"{self.learners:3d} learners, {queue:18s}: p50 {statistics.median(self.seconds):6.1f} s, "
                f"p95 {self.quantile(0.95):6.1f} s, max {max(self.seconds):6.1f} s, failed {self.failed}{other}")


def learner_env(queue_slots: int, queue: Path) -> dict[str, str]:
    """A learner's environment: the queue's variables with ``queue_slots`` > 0, none without."""
    env = {k: v for k, v in os.environ.items() if k not in (slots.SLOTS_VAR, slots.QUEUE_VAR)}
    if queue_slots:
        env.update({slots.SLOTS_VAR: str(queue_slots), slots.QUEUE_VAR: str(queue)})
    return env


def load(learners: int, queue_slots: int, spread: float = 10.0, seed: int = 1) -> LoadRun:
    """Run one load and collect each learner's time."""
    script = labs.get("horovod").solution(1)
    offsets = sorted(random.Random(seed).uniform(0, spread) for _ in range(learners))
    work = Path(tempfile.mkdtemp(prefix="labkit-checkload-"))
    procs: list[subprocess.Popen] = []
    watch = machineload.OtherWork(identity.cpu_count())
    try:
        env = learner_env(queue_slots, work / "queue")
        started = time.monotonic()
        for k, at in enumerate(offsets):
            time.sleep(max(0.0, started + at - time.monotonic()))
            home = work / f"learner{k:02d}"
            home.mkdir()
            shutil.copy2(script, home / "fashion_mnist.py")
            procs.append(subprocess.Popen([sys.executable, "-c", LEARNER, "fashion_mnist.py"], cwd=home, env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                          start_new_session=True))
        results = []
        for p in procs:
            out, _ = p.communicate(timeout=1800)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            results.append(json.loads(lines[-1]) if lines else {"seconds": float("nan"), "passed": False,
                                                                  "message": f"exit {p.returncode}, no report"})
        share = watch.share()
        return LoadRun(learners, queue_slots, spread, [r["seconds"] for r in results],
                       sum(1 for r in results if not r["passed"]), share.share if share else None,
                       [r["message"] for r in results if not r["passed"]][:3])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit.measure.checkload", description=__doc__.split("\n\n")[0])
    p.add_argument("--learners", default="4,8,16", help="learner counts (default: %(default)s)")
    p.add_argument("--slots", type=int, default=max(1, identity.cpu_count() // 2),
                   help="the queue's slots (default: one per two cores, %(default)s)")
    p.add_argument("--spread", type=float, default=10.0, help="seconds over which the checks are pressed")
    p.add_argument("--out", default=None, help="write the figures here as JSON")
    a = p.parse_args(argv)
    counts = [int(n) for n in a.learners.split(",") if n.strip()]
    done: list[LoadRun] = []
    for n in counts:
        for queue_slots in (a.slots, 0):
            run = load(n, queue_slots, a.spread)
            print(run, flush=True)
            done.append(run)
    if a.out:
        Path(a.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "cores": identity.cpu_count(),
                                           "runs": [asdict(r) for r in done]}, indent=1) + "\n")
    return 0 if all(r.failed == 0 for r in done if r.slots) else 1


if __name__ == "__main__":
    sys.exit(main())
