"""The course's reference profile (lab 9): the finished lab 9 script on 2 workers of this machine with
``--profile-dir``, rank 0's trace kept, for learners whose script is not there yet.

    python -m labkit.measure.profile_reference --out labs/reference

writes ``profile/rank0.xplane.pb`` (the trace as TensorFlow wrote it) and ``profile.json`` (when, on what machine,
at what load and by which command it was made, and how the script was run), and refuses a busy machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from labkit.core import files, identity, machineload
from labkit.course import labs
from labkit.figures import step_profile
from labkit.launching import launch
from labkit.launching.jobspec import JobSpec
from labkit.measure import reference
from labkit.measure.precision import Made
from labkit.records import typed

FILE, TRACE = "profile.json", "profile/rank0.xplane.pb"
WORKERS = 2
ARGS = ("--epochs", "1")  # small mode: batches 3 to 5 of the first epoch are profiled, as the lab's script does


class MeasureError(RuntimeError):
    """A reference run that failed or left no profile."""


@dataclass(frozen=True)
class Reference:
    """``profile.json``: how the trace beside it was made."""

    made: Made
    script: str
    workers: int
    args: list[str]


def run(script: Path, folder: Path, args: tuple[str, ...] = ARGS, timeout: float = 900.0) -> Path:
    """Run ``script`` on :data:`WORKERS` ranks with ``--profile-dir folder``; the trace rank 0 wrote."""
    with tempfile.TemporaryDirectory(prefix="labkit-profile-") as tmp:
        job = launch.run([sys.executable, str(script), *args, "--profile-dir", str(folder)],
                         job=JobSpec(timeout=timeout, threads=1, log_dir=Path(tmp) / "logs", quiet=True,
                                     cwd=tmp, record=False), np=WORKERS, launcher="mpirun")
        if not job.ok:
            raise MeasureError(f"the profiled run failed: {job.summary()}")
    found = step_profile.traces(folder)
    if not found:
        raise MeasureError(f"the profiled run left no trace in {folder}")
    return found[-1]


def make(out: Path, busy_ok: bool = False) -> Path:
    """Profile the finished lab 9 script on this machine; write ``out/profile.json`` and the trace beside it."""
    before = reference.idle_or_refuse(busy_ok)
    script = labs.get("at-scale").solution()
    watch = machineload.OtherWork(identity.cpu_count())
    with tempfile.TemporaryDirectory(prefix="labkit-profile-") as tmp:
        trace = run(script, Path(tmp) / "profile")
        step_profile.read(trace)  # it parses
        target = out / TRACE
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(trace, target)
    during = watch.share()
    made = Made(time.strftime("%Y-%m-%d"), reference.machine(),
                f"python -m labkit.measure.profile_reference --out {out}",
                round(before.share, 3) if before else None, round(during.share, 3) if during else None)
    path = out / FILE
    files.write_json_atomic(path, asdict(Reference(made, script.name, WORKERS, list(ARGS))))
    return path


def read(folder: Path | None = None) -> tuple[Reference, step_profile.Profile] | None:
    """The course's reference profile (``None`` when it has none)."""
    where = folder or reference.folder()
    path, trace = where / FILE, where / TRACE
    if not path.is_file() or not trace.is_file():
        return None
    return typed.parse(Reference, json.loads(path.read_text()), str(path)), step_profile.read(trace)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("labs/reference"), help="folder (default: %(default)s)")
    p.add_argument("--busy-ok", action="store_true", help="measure even on a busy machine")
    a = p.parse_args(argv)
    path = make(a.out, a.busy_ok)
    found = read(a.out)
    if found:
        print(f"wrote {path}\n{found[1].summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
