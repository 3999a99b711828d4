"""How a probed process ended, told the learner's way: still running (and where), left
something running, killed by a signal, out of memory.

The probes leave, beside their records, the Python stacks of a process that was stopped
(:mod:`labkit.core.stacks`) and where training was (``progress.N.json``); :func:`still_running`
reads them back. Messages never show internal values: a missing exit code is told as
what it means.
"""

from __future__ import annotations

import dataclasses
import signal
import time
from pathlib import Path

from labkit.core import stacks
from labkit.records import boundedjson, typed
from labkit.records.evidence import Evidence
from labkit.records.hvd_probe import FitBound, FitRule
from labkit.records.still_running import Progress, StillRunning, Where

RECENT = 10.0  # seconds: progress this close to the end means training was still going
_OOM_FILES = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")
CRASHES = {"SIGSEGV": "a segmentation fault, usually in a native library", "SIGABRT": "an abort",
           "SIGBUS": "a bus error", "SIGFPE": "an arithmetic error", "SIGILL": "an illegal instruction"}


def oom_kills() -> int:
    """How many processes the kernel's out-of-memory killer has killed in this machine's or container's memory group."""
    for path in _OOM_FILES:
        try:
            for line in Path(path).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and value.strip().isdigit():
                    return int(value)
        except OSError:
            continue
    return 0


def exit_text(code: int | None, oom: bool = False) -> str:
    """What an exit status means: ``code`` as the shell reports it (128 + signal), or negative as Popen does."""
    if code is None:
        why = "by the out-of-memory killer: the machine ran out of memory" if oom else (
            "SIGKILL, e.g. by the out-of-memory killer when memory runs out")
        return f"its process was killed before it could report how it ended ({why})"
    sig = -code if code < 0 else code - 128 if code > 128 else 0
    if not sig:
        return "it exited normally (code 0)" if code == 0 else f"it exited with code {code}"
    try:
        name = signal.Signals(sig).name
    except ValueError:
        return f"it was killed by signal {sig}"
    if name == "SIGKILL":
        return "it was killed with SIGKILL" + (" by the out-of-memory killer: the machine ran out of memory"
                                                if oom else " (the out-of-memory killer sends it when memory runs "
                                                "out; so does a process stopping it by force)")
    if name in ("SIGTERM", "SIGINT", "SIGHUP"):
        return f"it was stopped with {name} (the launcher stops every rank when one fails or time runs out)"
    if name in CRASHES:
        return f"it crashed ({name}: {CRASHES[name]})"
    return f"it was killed by signal {sig} ({name})"


def still_running(out: Path, rank: int | str, runner: str, after: float) -> StillRunning | None:
    """Where a process that had to be stopped was (its stack), and where training was (a progress file cut short or
    of the wrong shape is left out); None without a stack."""
    found = stacks.where(out / f"stack.{rank}", runner)
    if found is None:
        return None
    try:
        where = typed.parse(Where, found, f"stack.{rank}")
    except typed.RecordError:
        return None
    progress = None
    try:
        path = out / f"progress.{rank}.json"
        prog = typed.parse(Progress, boundedjson.read_file(path), path.name)
        progress = dataclasses.replace(prog, age=round(max(0.0, time.time() - prog.t), 1))
    except (OSError, ValueError):  # typed.RecordError is a ValueError
        pass
    return StillRunning(where, round(after, 1), progress)


def left_running(log_dir: Path, rank: int | str) -> list[str]:
    """The command lines a rank left running when it ended (stopped by :mod:`labkit.launching.rank`)."""
    try:
        names = boundedjson.read_file(log_dir / f"rank.{rank}.left")
    except (OSError, ValueError):
        return []
    return [str(n) for n in names if n]


def left_behind(evidence: Evidence) -> list[str]:
    """One line per process a rank left running, in any run of ``evidence``, for the report."""
    lines = [f"rank {rank} left `{short(cmd)}` running when it ended; it was stopped. Stop what the script starts "
             "before it returns (e.g. `proc.terminate()`), or start it outside the script."
             for rank, left in evidence.processes_left() for cmd in left]
    return list(dict.fromkeys(lines))


def short(cmd: str, n: int = 80) -> str:
    return cmd if len(cmd) <= n else cmd[: n - 3] + "..."


def busy(rank: int | str, run: StillRunning, where: str, last: str, train_batches: int | None = None) -> str | None:
    """Why a rank that had to be stopped never got to ``where``, from its stack; None when the stack cannot tell."""
    w = run.where
    kind, at, after = w.kind, w.at, run.after
    stopped = run.stopped or (f"when the check stopped it after {after:.0f} s" if after
                              else "when the check stopped it")
    prog = run.progress
    if kind in ("training", "collective") and prog is not None and prog.age <= RECENT:
        phase = prog.phase
        expected = f" (the check's data makes about {train_batches})" if train_batches and phase == "training" else ""
        steps = "steps_per_epoch=" if phase == "training" else "validation_steps="
        return (f"rank {rank} never reached {where}: {stopped} it was still in epoch {prog.epoch + 1}, "
                f"{prog.batch} {phase} batches in{expected}: the epoch never ends. A dataset that repeats "
                f"(`.repeat()`) is endless: pass fit `{steps}<batches per epoch>`.")
    if not at:  # not yet in the script: still importing or setting up
        inside = w.inside
        place = f" (in {Path(inside.file).name}, {inside.function})" if inside and inside.file else ""
        return (f"rank {rank} never reached {where}: {stopped} it had not yet reached the script's own code"
                f"{place}: the check's time ran out while it was starting. The machine was too busy or too slow "
                "for the check's time: check again when it is less busy, or give the check more time (`--timeout`).")
    if kind == "importing":
        return (f"rank {rank} never reached {where}: {stopped} it was still importing modules (at "
                f"{at.describe()}): the check's time ran out. The machine was too busy or too slow for the "
                "check's time: check again when it is less busy, or give the check more time (`--timeout`).")
    if kind == "tracing":
        place = f" for {at.describe()}" if at else ""
        return (f"rank {rank} never reached {where}: {stopped} (after '{last}') TensorFlow was still building its "
                f"graph{place}. That is slow work, not a hang: the machine was too busy or too slow for the "
                "check's time. Check again when it is less busy, or give the check more time (`--timeout`).")
    if kind in ("own", "library") and at:
        inside = w.inside
        deeper = f", inside {inside.function}()" if kind == "library" and inside and inside.function else ""
        return (f"rank {rank} never reached {where}: {stopped} (after '{last}') it was busy in its own code at "
                f"{at.describe()}{deeper}. That code never finished: make sure every loop ends and nothing "
                "waits forever (a `while True` without a break, a long sleep, a wait for a process or file that "
                "never comes).")
    if kind == "collective" or kind == "training":
        place = f" (called at {at.describe()})" if at else ""
        return (f"rank {rank} never reached {where}: {stopped} (after '{last}') it was waiting in a collective "
                f"operation{place} that the other rank did not join (a deadlock). Every rank must make the same "
                "Horovod calls (init, broadcast, allreduce via the optimizer and callbacks) in the same order.")
    return None


def bound_text(bound: FitBound | None, rule: FitRule | None) -> str:
    """How a rank stopped by its bound on reaching ``Model.fit`` was stopped (:mod:`labkit.instrument.probe`)."""
    base = f"when the check stopped it {bound.after_s if bound else 0:.0f} s after it started"
    if bound is None or bound.patched_s is None or rule is None:
        return f"{base} (a correct script calls model.fit sooner)"
    return (f"{base} (a correct script calls model.fit within {bound.bound_s:.0f} s here: {rule.factor:g} times "
            f"the {bound.patched_s:.1f} s this rank took to import TensorFlow, plus {rule.floor_s:.0f} s)")


WHAT = {"own": "busy in its own code", "library": "busy in its own code", "importing": "still importing modules",
        "tracing": "still building a TensorFlow graph (slow, not stuck)", "training": "still in Model.fit",
        "collective": "waiting in a collective operation, for another process that did not join it"}


def where_text(run: StillRunning | None) -> str:
    """One clause for any probed process that had to be stopped: what it was doing, and at which line."""
    if run is None:
        return "it was stopped; it left no record of where it was"
    at = run.where.at
    place = f" at {at.describe()}" if at else " before reaching the script's own code"
    return f"when it was stopped after {run.after:.0f} s it was {WHAT.get(run.where.kind, 'running')}{place}"
