"""What fp16 gradient compression does to a Horovod script's accuracy and speed: the same script trained twice on
the same workers, with ``compression=none`` and ``compression=fp16`` given to its ``DistributedOptimizer`` from
outside (``labkit bench --optimizer``), the script unchanged.

    result = compare("fashion_mnist.py", args=["--epochs", "6"])
    print(result)      # validation accuracy per epoch and images/sec of each

float32 runs twice: the difference between those two runs is run-to-run noise (data order, summation order), the
yardstick for the difference float16 makes.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from labkit.launching.jobspec import JobSpec
from labkit.measure import bench

# float32 twice: how far two runs of the same setting differ is the yardstick for float16's difference
VARIANTS = {"float32 (none)": "compression=none", "float16 (fp16)": "compression=fp16",
            "float32 again": "compression=none"}


@dataclass
class Variant:
    label: str
    val_accuracy: list[float | None]
    images_per_sec: float | None
    applied: dict[str, Any] | None  # what the optimizer really received (from the run's record)
    run_id: str | None = None


@dataclass
class Comparison:
    script: str
    np: int
    args: list[str]
    variants: list[Variant] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def curves(self) -> dict[str, list[float | None]]:
        return {v.label: v.val_accuracy for v in self.variants}

    def __str__(self) -> str:
        lines = [f"{self.script} {' '.join(self.args)} on {self.np} workers (1 thread each):"]
        for v in self.variants:
            accs = " ".join("-" if a is None else f"{a:.3f}" for a in v.val_accuracy)
            speed = "-" if v.images_per_sec is None else f"{v.images_per_sec:.1f}"
            lines.append(f"  {v.label:<15} val accuracy by epoch: {accs}   images/sec: {speed}"
                         + ("" if v.applied else "   (the optimizer did not take the knob: is it Horovod's?)"))
        return "\n".join(lines)


def compare(script: str | Path, args: Sequence[str] = (), np: int = 2, launcher: str = "mpirun",
            timeout: float | None = 1800, runs_file: str | Path | None = None, quiet: bool = True,
            say: Callable[[str], Any] = print) -> Comparison:
    """Train ``script ARGS`` once per variant of :data:`VARIANTS` on ``np`` workers of this machine."""
    out = Comparison(str(script), np, list(args))
    for label, spec in VARIANTS.items():
        say(f"{label}: {script} on {np} workers")
        plan = bench.SweepPlan([np], args=list(args), launcher=launcher, runs_file=runs_file, echo=False,
                               optimizer=spec)
        run = bench.bench(script, plan, JobSpec(threads=1, timeout=timeout, quiet=quiet))
        rec = run.records[-1] if run.records else None
        out.variants.append(Variant(label, list(rec.val_accuracy) if rec else [], run.points[0].images_per_sec,
                                    rec.optimizer_knobs if rec else None, rec.run_id if rec else None))
    return out
