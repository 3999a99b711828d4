"""The large-batch experiment (lab 9): the global batch pushed up, for the same number of epochs, until the
accuracy breaks, with the learning rate set three ways.

Each run is the learner's Horovod script (or the course's finished one) on :data:`WORKERS` workers, small mode,
for a fixed number of epochs (the target accuracy never stops it), with ``--batch-size B`` per worker, so a global
batch of ``WORKERS * B`` and ``WORKERS * B`` times fewer updates per epoch than one image at a time. The script
itself multiplies ``--base-lr`` by the number of workers (lab 2, step 8); the experiment passes the base rate each
rule asks for:

* **linear rule, warm-up**: the rate grows with the global batch, ``BASE_LR * global / BASE_BATCH``, reached after
  the script's warm-up epochs (Horovod's warm-up ramps it up from its value divided by the workers);
* **linear rule, no warm-up**: the same rate from the first step;
* **not scaled**: the rate of one worker's batch of ``BASE_BATCH``, whatever the global batch.

The course's reference is made on an idle machine by::

    python -m labkit.measure.large_batch --out labs/reference

and written to ``large_batch.json`` (when, on what machine, at what load, by which command; each run's
accuracy after every epoch). :mod:`labkit.ui.scale_lab` shows it, or runs the learner's own script the same way.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from labkit.core import contract, files, identity, machineload
from labkit.course import labs
from labkit.figures import large_batch as drawn
from labkit.figures.large_batch import Point
from labkit.launching import launch
from labkit.launching.jobspec import JobSpec
from labkit.measure import reference
from labkit.measure.precision import Made
from labkit.records import boundedjson, typed

FILE = "large_batch.json"
WORKERS = 2
BASE_LR, BASE_BATCH = 0.05, 32  # small mode's rate for one worker's batch of 32 (the script's own default)
TRAIN_IMAGES = 6000  # small mode's training set
NEVER = "1.01"  # a target accuracy no run reaches: every run trains all its epochs


@dataclass(frozen=True)
class Rule:
    """One way to set the learning rate for a global batch."""

    name: str
    scaled: bool  # the linear scaling rule (else the rate of a batch of BASE_BATCH)
    warmup_epochs: int

    def lr(self, global_batch: int) -> float:
        """The rate the script trains with after its warm-up."""
        return BASE_LR * global_batch / BASE_BATCH if self.scaled else BASE_LR


RULES = (Rule("linear rule, warm-up", True, 3), Rule("linear rule, no warm-up", True, 0),
         Rule("not scaled", False, 0))


@dataclass(frozen=True)
class Plan:
    """What the experiment runs: every rule at every batch per worker, for ``epochs`` epochs."""

    batches: tuple[int, ...] = (16, 64, 256, 1024)  # per worker: global batches of 32 to 2048 on 2 workers
    epochs: int = 8
    workers: int = WORKERS
    timeout: float = 900.0  # seconds per run

    def size(self) -> int:
        return len(self.batches) * len(RULES)


@dataclass(frozen=True)
class Reference:
    """``large_batch.json``: how the runs were made, and what each gave."""

    made: Made
    script: str
    workers: int
    epochs: int
    points: list[Point]


def arguments(rule: Rule, batch: int, plan: Plan) -> list[str]:
    """The script's arguments for ``rule`` at ``batch`` images per worker (the script scales ``--base-lr`` by the
    number of workers itself)."""
    return ["--mode", "small", "--epochs", str(plan.epochs), "--batch-size", str(batch),
            "--base-lr", f"{rule.lr(batch * plan.workers) / plan.workers:g}",
            "--warmup-epochs", str(rule.warmup_epochs), "--target-accuracy", NEVER]


def updates_per_epoch(batch: int, workers: int, images: int = TRAIN_IMAGES) -> int:
    """Updates in one epoch, as the lab's script counts them (its batches, split over the workers)."""
    return max(1, -(-images // batch) // workers)


def run_point(script: Path, rule: Rule, batch: int, plan: Plan, extra: Sequence[str] = ()) -> Point:
    """Train ``script`` once with ``rule`` at ``batch`` images per worker; what it gave (the run has a folder of its
    own: a relative ``script`` is taken from here)."""
    script = Path(script).resolve()
    with tempfile.TemporaryDirectory(prefix="labkit-large-batch-") as tmp:
        job = launch.run([sys.executable, str(script), *arguments(rule, batch, plan), *extra],
                         job=JobSpec(timeout=plan.timeout, threads=1, log_dir=Path(tmp) / "logs", quiet=True,
                                     cwd=tmp, env={contract.RUNS_FILE: str(Path(tmp) / "runs.jsonl")}),
                         np=plan.workers, launcher="mpirun")
    rec = job.record
    status = "ok" if job.ok else ("timed out" if job.timed_out else f"failed ({job.returncode})")
    steps = rec.epochs[0].steps if rec and rec.epochs and rec.epochs[0].steps else None
    return Point(rule.name, batch, batch * plan.workers, rule.lr(batch * plan.workers), rule.warmup_epochs,
                 steps or updates_per_epoch(batch, plan.workers), list(rec.val_accuracy) if rec else [],
                 round(job.duration, 1), status)


def sweep(script: Path, plan: Plan, extra: Sequence[str] = (),
          told: Callable[[str], None] = print) -> list[Point]:
    """Every rule at every batch of ``plan``, smallest batch first; each run told as it ends."""
    points: list[Point] = []
    for batch in plan.batches:
        for rule in RULES:
            p = run_point(script, rule, batch, plan, extra)
            points.append(p)
            acc = "-" if p.final is None else f"{100 * p.final:.1f}%"
            told(f"[{len(points)}/{plan.size()}] global batch {p.global_batch}, {rule.name} (lr {p.lr:g}): "
                 f"validation accuracy {acc} after {len(p.val_accuracy)} epoch(s), {p.seconds:.0f} s, {p.status}")
    return points


def make(out: Path, plan: Plan = Plan(), busy_ok: bool = False) -> Path:
    """The experiment on the course's finished lab 9 script; write ``out/large_batch.json``."""
    before = reference.idle_or_refuse(busy_ok)
    script = labs.get("at-scale").solution()
    watch = machineload.OtherWork(identity.cpu_count())
    points = sweep(script, plan, told=lambda line: print(line, flush=True))
    during = watch.share()
    made = Made(time.strftime("%Y-%m-%d"), reference.machine(), f"python -m labkit.measure.large_batch{_options(plan)}",
                round(before.share, 3) if before else None, round(during.share, 3) if during else None)
    path = out / FILE
    files.write_json_atomic(path, asdict(Reference(made, script.name, plan.workers, plan.epochs, points)))
    return path


def _options(plan: Plan) -> str:
    """The command line's options that made ``plan`` (none for the default one; where it was written aside)."""
    return "" if plan.epochs == Plan().epochs else f" --epochs {plan.epochs}"


def read(folder: Path | None = None) -> Reference | None:
    """The course's reference experiment (``None`` when it has none)."""
    path = (folder or reference.folder()) / FILE
    if not path.is_file():
        return None
    return typed.parse(Reference, boundedjson.read_file(path), str(path))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("labs/reference"), help="folder (default: %(default)s)")
    p.add_argument("--epochs", type=int, default=Plan().epochs, help="epochs of every run (default: %(default)s)")
    p.add_argument("--busy-ok", action="store_true", help="measure even on a busy machine")
    a = p.parse_args(argv)
    try:
        path = make(a.out, Plan(epochs=a.epochs), a.busy_ok)
    except reference.BusyMachine as e:
        print(f"python -m labkit.measure.large_batch: {e}", file=sys.stderr)
        return 1
    found = read(a.out)
    if found:
        print(f"wrote {path}\n{drawn.table(found.points)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
