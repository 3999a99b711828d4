"""Which rank makes the others wait: a Horovod job with its timeline, one rank optionally slowed down.

    report = run(np=2, slow=1, share=0.3)     # rank 1 gets 30% of the time (faults.Throttle)
    print(report)                             # names the rank the others wait for, and how long they wait
    report.figure()                           # the timeline, one lane per rank

The job is :mod:`labkit.instrument.timeline_job` (compute, then an all-reduce of a few gradients, per step), run
with ``HOROVOD_TIMELINE`` and the response cache off (``HOROVOD_CACHE_CAPACITY=0``) so that every
negotiation shows when each rank was ready. Two views must agree: per-rank step times (a straggler
computes longer; the others spend that difference waiting in the all-reduce) and the timeline (the
straggler is the last rank ready in the negotiations).
"""

from __future__ import annotations

import json
import statistics
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from matplotlib.figure import Figure

from labkit.core import proc
from labkit.figures import timeline
from labkit.instrument import timeline_job
from labkit.launching import launch
from labkit.launching.jobspec import JobSpec
from labkit.tfdist import faults

JOB = JobSpec(timeout=600, quiet=True)  # each run's default: its time limit, and no output of its own


@dataclass
class RankSteps:
    rank: int
    compute_s: float  # medians over the steps
    comm_s: float
    steps: int


@dataclass
class Diagnosis:
    """Who the others wait for, from per-rank step times and from the timeline."""

    ranks: list[RankSteps]
    timeline: timeline.Timeline | None = None
    slowed: int | None = None
    log_dir: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def straggler(self) -> int | None:
        """The rank with the longest compute per step (the one the all-reduce waits for)."""
        return max(self.ranks, key=lambda r: r.compute_s).rank if self.ranks else None

    @property
    def wait_s(self) -> float:
        """Median seconds per step the other ranks spend waiting for the straggler in the all-reduce."""
        slow = next(r for r in self.ranks if r.rank == self.straggler)
        others = [r.comm_s - slow.comm_s for r in self.ranks if r.rank != slow.rank]
        return max(0.0, statistics.median(others)) if others else 0.0

    def __str__(self) -> str:
        lines = [f"{'rank':>4}  {'compute ms':>10}  {'all-reduce ms':>13}  steps"]
        lines += [f"{r.rank:>4}  {1000 * r.compute_s:10.1f}  {1000 * r.comm_s:13.1f}  {r.steps}" for r in self.ranks]
        if self.straggler is not None:
            lines.append(f"straggler: rank {self.straggler}; the others wait {1000 * self.wait_s:.1f} ms per step "
                         f"for it (their all-reduce takes that much longer than its own)")
        seen = self.timeline.straggler() if self.timeline else None
        if seen:
            lines.append(f"timeline: rank {seen[0]} is the last ready in {self.timeline.last_ready[seen[0]]} of "
                         f"{self.timeline.judged} negotiations, {1000 * seen[1]:.1f} ms after the first (median)")
        if self.slowed is not None:
            lines.append(f"rank {self.slowed} was slowed down on purpose: "
                         + ("diagnosed" if self.straggler == self.slowed else "NOT what the step times say"))
        return "\n".join(lines + self.notes)

    def figure(self, last: float | None = 2.0) -> Figure:
        if self.timeline is None:
            raise ValueError("no timeline was read")
        return timeline.figure(self.timeline, last=last, ranks=len(self.ranks) or None)


def step_lines(text: str) -> list[dict]:
    """The job's ``STEP {...}`` lines."""
    mark = timeline_job.MARK
    out = []
    for line in text.splitlines():
        if line.startswith(mark):
            try:
                out.append(json.loads(line[len(mark):]))
            except ValueError:
                continue
    return out


def rank_steps(lines_by_rank: dict[int, list[dict]], skip: int = 3) -> list[RankSteps]:
    """Per-rank medians, leaving out the first ``skip`` steps (warm-up, and before any slowing began)."""
    out = []
    for rank, lines in sorted(lines_by_rank.items()):
        kept = lines[skip:] if len(lines) > skip else lines
        if kept:
            out.append(RankSteps(rank, statistics.median(s["compute_s"] for s in kept),
                                 statistics.median(s["comm_s"] for s in kept), len(lines)))
    return out


def diagnose(log_dir: str | Path, np: int, timeline_file: str | Path | None = None, slowed: int | None = None,
             skip: int = 3) -> Diagnosis:
    """Read a finished job's per-rank logs (``rank.N.log``) and its timeline."""
    logs = Path(log_dir)
    by_rank = {r: step_lines((logs / f"rank.{r}.log").read_text(errors="replace"))
               for r in range(np) if (logs / f"rank.{r}.log").exists()}
    tl = timeline.read(timeline_file) if timeline_file and Path(timeline_file).exists() else None
    return Diagnosis(rank_steps(by_rank, skip), tl, slowed, str(logs))


class _Rank:
    """What :class:`labkit.tfdist.faults.Throttle` needs of one rank's process."""

    def __init__(self, p: psutil.Process) -> None:
        self.p = p

    def alive(self) -> bool:
        try:
            return self.p.is_running() and self.p.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def signal(self, sig: int) -> None:
        try:
            self.p.send_signal(sig)
        except psutil.Error:
            pass


def _find_rank(tag: str, rank: int) -> psutil.Process | None:
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if tag in cmd and len(cmd) > 1 and cmd[1].endswith("timeline_job.py"):
            try:
                if p.environ().get("OMPI_COMM_WORLD_RANK", p.environ().get("HOROVOD_RANK")) == str(rank):
                    return p
            except psutil.Error:
                continue
    return None


def _slow_down(tag: str, rank: int, share: float, log: Path, done: threading.Event, period: float) -> None:
    """Once ``rank`` prints its first step, run it ``share`` of the time until ``done``, stopped and continued
    every ``period`` seconds: a fraction of a step, so that every step is slowed alike (as on a slower machine),
    not a few steps stopped whole while the median step runs at full speed."""
    found = None
    while not done.is_set() and found is None:  # found while it starts: the search is slow on a busy machine
        found = _find_rank(tag, rank)
        done.wait(0.2)
    while not done.is_set() and not (log.exists() and timeline_job.MARK in log.read_text(errors="replace")):
        done.wait(0.05)
    if found is not None and not done.is_set():
        with faults.Throttle(_Rank(found), share, period):
            done.wait()


def run(np: int = 2, steps: int = 40, slow: int | None = None, share: float = 0.3, compute_ms: float = 40.0,
        launcher: str = "mpirun", hostfile: str | Path | None = None,
        job: JobSpec = JOB) -> Diagnosis:
    """Run the job (rank ``slow`` throttled to ``share`` of the time once it computes) and diagnose it; ``job``
    gives its time limit, output and log folder (one thread per rank, not recorded)."""
    logs = Path(job.log_dir) if job.log_dir else proc.new_log_dir()
    logs.mkdir(parents=True, exist_ok=True)
    trace = logs.resolve() / "timeline.json"
    tag = uuid.uuid4().hex
    command = ["python", str(Path(timeline_job.__file__).resolve()), "--steps", str(steps),
               "--compute-ms", str(compute_ms), "--tag", tag]
    env = {"HOROVOD_TIMELINE": str(trace), "HOROVOD_CACHE_CAPACITY": "0"}
    done = threading.Event()
    slower = None
    if slow is not None:
        period = compute_ms / 4000  # a quarter of a step's compute
        slower = threading.Thread(target=_slow_down, daemon=True,
                                  args=(tag, slow, share, logs / f"rank.{slow}.log", done, period))
        slower.start()
    try:
        result = launch.run(command, np, launcher, job.but(env=env, log_dir=logs, record=False, threads=1),
                            hostfile=hostfile)
    finally:
        done.set()
        if slower:
            slower.join(10)
    if not result.ok:
        raise RuntimeError(result.summary())
    return diagnose(logs, np, trace, slow)
