"""Mixed precision on this machine: the course's model trained in float32 and in mixed bfloat16, timed (lab 9).

Each policy runs in a process of its own (:mod:`labkit.instrument.precision_workload`: a Keras policy is global to
its process), one after the other, so that they do not share the cores. :func:`compare` gives their speeds; a
notebook cell shows them beside the course's reference, ``labs/reference/precision.json``, made on an idle machine
by::

    python -m labkit.measure.precision --out labs/reference

which says when, on what machine and at what load it was made.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from labkit.core import files, identity, machineload, proc
from labkit.instrument import precision_workload
from labkit.instrument.precision_workload import POLICIES
from labkit.measure import reference
from labkit.records import typed

BATCH = precision_workload.BATCH  # images per batch
FILE = "precision.json"
BATCHES = 60  # a notebook cell's timing: about 2 s per policy on the 2-core machine, after the start-up
REFERENCE_BATCHES, REPEATS = 100, 3  # the course's reference


class MeasureError(RuntimeError):
    """A timing process that failed or said nothing readable."""


@dataclass(frozen=True)
class Speed:
    """One policy's timed batches."""

    policy: str
    batches: int
    seconds: float
    images_per_sec: float
    compute_dtypes: list[str]


@dataclass(frozen=True)
class Made:
    """When, where and at what load a reference was made, and by which command."""

    date: str
    machine: str
    command: str
    other_work_before: float | None = None
    other_work: float | None = None


@dataclass(frozen=True)
class Reference:
    """``precision.json``: the speeds of every repeat (each repeat times every policy once), and how they were
    made."""

    made: Made
    speeds: list[Speed]

    def of(self, policy: str) -> list[float]:
        """The images/sec of ``policy``, repeat after repeat."""
        return [s.images_per_sec for s in self.speeds if s.policy == policy]

    def median(self, policy: str) -> float:
        return float(statistics.median(self.of(policy)))

    def typical(self, policy: str) -> Speed:
        """``policy``'s speed as the median of the repeats."""
        runs = [s for s in self.speeds if s.policy == policy]
        return Speed(policy, runs[0].batches, float(statistics.median(s.seconds for s in runs)), self.median(policy),
                     runs[0].compute_dtypes)

    def ratios(self) -> list[float]:
        """Mixed bfloat16's images/sec over float32's, in each repeat."""
        return [b / f for f, b in zip(self.of("float32"), self.of("mixed_bfloat16"), strict=True)]

    def ratio(self) -> float:
        """The median of :meth:`ratios`."""
        return float(statistics.median(self.ratios()))


def command(policy: str, batches: int) -> list[str]:
    """The timing process of one policy."""
    return [sys.executable, "-m", "labkit.instrument.precision_workload", "--policy", policy, "--batches", str(batches)]


def measure(policy: str, batches: int = BATCHES, timeout: float = 600.0) -> Speed:
    """Time ``batches`` batches under ``policy`` in a process of its own."""
    with tempfile.TemporaryDirectory(prefix="labkit-precision-") as tmp, proc.Job() as job:
        log = Path(tmp) / "output.log"
        p = job.spawn(command(policy, batches), env={"TF_CPP_MIN_LOG_LEVEL": "2"}, log=log)
        code = p.wait(timeout)
        p.drain()
        text = log.read_text(errors="replace")
    lines = [line for line in text.splitlines() if line.startswith("{")]
    if code != 0 or not lines:
        why = "did not finish in time" if code is None else f"ended with exit status {code}"
        raise MeasureError(f"timing {policy} {why}: {text[-800:].strip()}")
    try:
        return typed.parse(Speed, json.loads(lines[-1]), f"{policy} timing")
    except ValueError as e:
        raise MeasureError(f"timing {policy} printed no readable result: {e}") from None


def compare(batches: int = BATCHES, say: bool = True) -> list[Speed]:
    """Every policy's speed, one after the other."""
    speeds = []
    for policy in POLICIES:
        if say:
            print(f"timing {batches} batches of the course's model in {policy} ...", flush=True)
        speeds.append(measure(policy, batches))
    return speeds


def read(folder: Path | None = None) -> Reference | None:
    """The course's reference (``None`` when it has none)."""
    path = (folder or reference.folder()) / FILE
    if not path.is_file():
        return None
    return typed.parse(Reference, json.loads(path.read_text()), str(path))


def make(out: Path, batches: int = REFERENCE_BATCHES, repeats: int = REPEATS, busy_ok: bool = False) -> Path:
    """Measure on this machine ``repeats`` times and write ``out/precision.json``; refuses a busy machine unless
    ``busy_ok``."""
    before = reference.idle_or_refuse(busy_ok)
    watch = machineload.OtherWork(identity.cpu_count())
    speeds = [speed for _ in range(repeats) for speed in compare(batches)]
    during = watch.share()
    made = Made(time.strftime("%Y-%m-%d"), reference.machine(),
                f"python -m labkit.measure.precision --out {out} --batches {batches} --repeats {repeats}",
                round(before.share, 3) if before else None, round(during.share, 3) if during else None)
    out.mkdir(parents=True, exist_ok=True)
    path = out / FILE
    files.write_json_atomic(path, asdict(Reference(made, speeds)))
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("labs/reference"), help="folder (default: %(default)s)")
    p.add_argument("--batches", type=int, default=REFERENCE_BATCHES,
                   help="timed batches per policy (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=REPEATS, help="times each policy is timed (default: %(default)s)")
    p.add_argument("--busy-ok", action="store_true", help="measure even on a busy machine")
    a = p.parse_args(argv)
    if a.batches < 1 or a.repeats < 1:
        p.error("--batches and --repeats must be at least 1")
    path = make(a.out, a.batches, a.repeats, a.busy_ok)
    ref = read(a.out)
    if ref:
        shown = ", ".join(f"{r:.2f}" for r in ref.ratios())
        print(f"wrote {path}: mixed bfloat16 at {ref.ratio():.2f} x float32's images/sec (the median; each repeat: "
              f"{shown})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
