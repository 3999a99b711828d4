"""Horovod's communication knobs measured: tensor fusion, cycle time and fp16 compression, one sweep each.

    result = sweep("compression", hostfile="/run/labkit-nodes/hostfile")   # fp32 against fp16 on the nodes' link
    print(result)                                                         # median all-reduce time per step, each

Every variant runs the same small synchronous job (:mod:`labkit.instrument.timeline_job`: a fixed amount of
compute, then ``tensors`` gradients of ``kib`` KiB all-reduced in one graph) on the same workers, with the knob's
environment or flag; the result is each variant's median time in the all-reduce per step and median step time,
leaving out the first steps. Fusion matters when a step has many small tensors (each all-reduce pays a latency);
compression when the link's bandwidth is the limit (half the bytes); the cycle time sets how long Horovod waits to
gather tensors into one fusion buffer. ``backward_passes_per_step`` is an option of ``DistributedOptimizer``, not
of the all-reduce: it is not swept here.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from labkit.core import proc
from labkit.instrument import timeline_job
from labkit.launching import hosts, launch
from labkit.launching.jobspec import JobSpec
from labkit.measure import allreduce, timeline_straggler

# knob -> [(label, environment, extra arguments)]; the first variant is Horovod 0.28.1's default (its docs still
# give the older 64 MiB and 5 ms).
KNOBS: dict[str, list[tuple[str, dict[str, str], list[str]]]] = {
    "fusion": [("fusion 128 MiB (default)", {"HOROVOD_FUSION_THRESHOLD": str(128 << 20)}, []),
               ("fusion off", {"HOROVOD_FUSION_THRESHOLD": "0"}, [])],
    "cycle": [("cycle 1 ms (default)", {"HOROVOD_CYCLE_TIME": "1"}, []),
              ("cycle 5 ms", {"HOROVOD_CYCLE_TIME": "5"}, []),
              ("cycle 25 ms", {"HOROVOD_CYCLE_TIME": "25"}, [])],
    "compression": [("fp32 (default)", {}, []), ("fp16", {}, ["--fp16"])],
}
# The job's shape per knob: many small tensors for fusion and cycle time, a few large ones for compression.
SHAPES = {"fusion": (256, 4), "cycle": (64, 16), "compression": (4, 2048)}  # (tensors, KiB each)


@dataclass
class Variant:
    label: str
    env: dict[str, str]
    args: list[str]
    comm_s: float  # median seconds in the all-reduce per step
    step_s: float  # median seconds per step (compute and all-reduce)


@dataclass
class KnobResult:
    knob: str
    np: int
    hosts: list[str]
    rate: str | None
    tensors: int
    kib: int
    steps: int
    variants: list[Variant] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def __str__(self) -> str:
        where = f"{self.np} workers on {', '.join(self.hosts) or 'this machine'}" + (
            f", link {self.rate}" if self.rate else "")
        lines = [f"{self.knob}: {self.tensors} tensors x {self.kib} KiB per step, {self.steps} steps, {where}",
                 f"{'variant':<26}{'all-reduce/step':>17}{'step':>10}{'vs first':>10}"]
        first = self.variants[0].comm_s if self.variants else None
        for v in self.variants:
            ratio = f"{v.comm_s / first:.2f}x" if first else "-"
            lines.append(f"{v.label:<26}{v.comm_s * 1000:>14.1f} ms{v.step_s * 1000:>7.1f} ms{ratio:>10}")
        return "\n".join(lines)


def command(tensors: int, kib: int, steps: int, compute_ms: float, extra: list[str]) -> list[str]:
    """The job every variant runs (argument list; nothing is started)."""
    return ["python", str(Path(timeline_job.__file__).resolve()), "--steps", str(steps), "--tensors", str(tensors),
            "--kib", str(kib), "--compute-ms", f"{compute_ms:g}", *extra]


def medians(log_text: str, skip: int = 3) -> tuple[float, float]:
    """Median all-reduce and step seconds from a rank's ``STEP`` lines, the first ``skip`` left out."""
    lines = timeline_straggler.step_lines(log_text)
    kept = lines[skip:] if len(lines) > skip else lines
    if not kept:
        raise RuntimeError("the job printed no steps")
    return (statistics.median(s["comm_s"] for s in kept),
            statistics.median(s["comm_s"] + s["compute_s"] for s in kept))


@dataclass(frozen=True)
class Workload:
    """What each variant's job does a step: ``tensors`` all-reduces of ``kib`` KiB (default: the knob's shape,
    :data:`SHAPES`) after ``compute_ms`` of computing, ``steps`` times."""

    steps: int = 20
    tensors: int | None = None
    kib: int | None = None
    compute_ms: float = 20.0


QUIET = JobSpec(timeout=600, quiet=True)  # each variant's job: at most 10 minutes, no output of its own


def sweep(knob: str, hostfile: str | Path | None = None, np: int | None = None, work: Workload = Workload(),
          launcher: str = "mpirun", rate: str | None = None, job: JobSpec = QUIET) -> KnobResult:
    """Run every variant of ``knob`` on the same workers (default: every slot of ``hostfile``, else 2 here), each
    as a job given ``job`` (its timeout, output, environment added to the variant's)."""
    if knob not in KNOBS:
        raise ValueError(f"unknown knob {knob!r}: choose one of {', '.join(KNOBS)}")
    steps = work.steps
    if steps < 5:
        raise ValueError("give at least 5 steps (the first 3 are left out)")
    host_list = hosts.parse_hostfile(hostfile) if hostfile else []
    np = np or (sum(hosts.slots(h) for h in host_list) if host_list else 2)
    t, k = SHAPES[knob]
    tensors, kib = work.tensors or t, work.kib or k
    out = KnobResult(knob, np, [h.name for h in host_list], allreduce.link_rate(rate), tensors, kib, steps)
    for label, env, extra in KNOBS[knob]:
        variant = job.but(env={**(job.env or {}), **env}, log_dir=proc.new_log_dir(), record=False, threads=1)
        job_run = launch.run(command(tensors, kib, steps, work.compute_ms, extra), job=variant, np=np,
                             launcher=launcher, hostfile=hostfile)
        if not job_run.ok:
            raise RuntimeError(f"{knob}: the variant {label!r} failed:\n{job_run.summary()}")
        comm, step = medians(job_run.log(0))
        out.variants.append(Variant(label, env, extra, comm, step))
    return out
