"""Probed 2-rank Horovod runs: how the Horovod lab's check starts one, and how its evidence is read.

:func:`run` launches the learner's script on 2 ranks under :mod:`labkit.instrument.probe` and returns what
each rank recorded (its milestones, calls, weights as random projections, how it ended) as a typed
:class:`~labkit.records.hvd_evidence.Run`; the other helpers read that evidence for the step judges of
:mod:`labkit.check.lab_horovod`, :mod:`labkit.check.lab_communication` and :mod:`labkit.check.lab_at_scale`.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import zipfile
from functools import lru_cache
from pathlib import Path

import numpy as np

from labkit.check import ending
from labkit.check.verdict import Failed
from labkit.instrument import start
from labkit.launching import launch
from labkit.launching.jobspec import JobSpec
from labkit.records import evidence
from labkit.records.hvd_evidence import RankEnd, Run
from labkit.records.hvd_probe import RankRecord

NP = 2
BATCH = 16
# Horovod aborts a collective that some ranks never join, so a deadlock ends fast.
PROBE_ENV = {
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "5",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "60",  # 20 s stopped sound runs on a busy machine (a rank tracing slowly)
    "CUDA_VISIBLE_DEVICES": "",  # the probe simulates GPUs; real ones would only slow it down
}
STAGE_TEXT = {
    "fit_start": "model.fit",
    "batch1_end": "the second training batch",
    "train_end": "the end of training",
    "epoch0_end": "the end of the first epoch",
}
# A rank must call Model.fit within FIT_FACTOR x the time it took to import TensorFlow (+ the probe's floor):
# measured on the idle 2-core machine, the solution gets there in about SOLUTION_FIT of those import times.
FIT_FACTOR = 3.0
WEIGHTS_LIMIT = 256 * 1024 * 1024  # bytes of a rank's weight snapshots (the probe's narrowed model: a few MB)
PROJECTION = 64  # weight snapshots are kept as random projections: distances survive, size does not


@lru_cache(maxsize=2)
def _projection(n: int) -> tuple[np.ndarray, np.ndarray]:
    """A sparse random projection of ``n`` values (each to one of PROJECTION sums, with a random sign): distances
    survive as with a dense one, in linear time."""
    rng = np.random.default_rng(n)
    return rng.integers(0, PROJECTION, n), rng.choice((-1.0, 1.0), n)


def _project(w: np.ndarray) -> list[float]:
    where, sign = _projection(w.size)
    return [float(v) for v in np.bincount(where, weights=sign * w.astype(np.float64), minlength=PROJECTION)]


def _weights(path: Path) -> dict[str, list[float]] | None:
    """A rank's weight snapshots, projected; None for a file that is missing, larger than :data:`WEIGHTS_LIMIT` (on
    disk or decompressed) or no NumPy archive of arrays (the learner's script runs in the process that writes it, and
    may have written it)."""
    try:
        if path.stat().st_size > WEIGHTS_LIMIT:
            return None
        with zipfile.ZipFile(path) as archive:  # what the arrays would take once decompressed
            if sum(member.file_size for member in archive.infolist()) > WEIGHTS_LIMIT:
                return None
        with np.load(path, allow_pickle=False) as z:
            return {k: _project(np.asarray(z[k], dtype=np.float64).ravel()) for k in z.files}
    except (OSError, ValueError, TypeError, EOFError, zipfile.BadZipFile):
        return None


def reached(run: Run, milestone: str) -> bool:
    return len(run.states) == run.np and all(s.reached(milestone) for s in run.states.values())


def run(script: Path, args: list[str], out: Path, cwd: Path, timeout: float,
         own_folders: bool = False, epochs: int = 1, tolerate: tuple[str, ...] = ()) -> Run:
    """One probed 2-rank run (fit runs ``epochs`` epochs at most; 0: the ranks end at the call of fit): what
    each rank recorded, how it ended.

    ``tolerate`` names options of ``args`` a script that lacks them runs without (the probe records which).
    """
    cwd.mkdir(parents=True, exist_ok=True)
    flags = (["--own-folders"] if own_folders else []) + (["--epochs", str(epochs)] if epochs != 1 else [])
    flags += [f for option in tolerate for f in ("--tolerate", option)]
    flags += ["--budget", f"{max(5.0, timeout - 10):.0f}"]  # stacks are dumped then, if the rank still runs
    flags += ["--fit-bound", str(FIT_FACTOR)]  # a rank that never gets to fit is stopped and told then
    oom = ending.oom_kills()
    # Probe runs are not the learner's runs: not recorded.
    cmd = start.command("horovod", str(out), [sys.executable, str(script), *args], flags)
    job = launch.run(cmd,
                     job=JobSpec(timeout=timeout, threads=1, log_dir=out.with_name(out.name + "-logs"),
                                 env=dict(PROBE_ENV), quiet=True, cwd=cwd, record=False), np=NP, launcher="mpirun")
    states: dict[int, RankRecord] = {}
    weights: dict[int, dict[str, list[float]]] = {}
    ranks: dict[int, RankEnd] = {}
    unreadable: list[str] = []
    for r in range(NP):
        st = evidence.record(RankRecord, out / f"probe.{r}.json", unreadable)
        if st is not None:
            states[r] = st
        projected = _weights(out / f"weights.{r}.npz")
        if projected is not None:
            weights[r] = projected
        log = job.log(r)
        ranks[r] = _how_it_ended(RankEnd(exit=job.rank_exit.get(r), error=job.rank_errors.get(r, ""),
                                         log_tail=log[-600:], stalled="stall" in log.lower()), st, out, r, job)
    return Run(np=NP, batch=BATCH, lab="horovod", states=states, weights=weights, ranks=ranks,
               timed_out=job.timed_out, interrupted=job.interrupted, returncode=job.returncode,
               start_error=job.summary() if not states and job.returncode else None,
               oom_kills=max(0, ending.oom_kills() - oom), unreadable=unreadable[0] if unreadable else None)


def _how_it_ended(info: RankEnd, st: RankRecord | None, out: Path, r: int, job: launch.JobResult) -> RankEnd:
    """``info`` with the optional evidence: where a rank that had to be stopped was; what it left running."""
    running = None
    if st is not None and not st.reached("end"):
        running = ending.still_running(out, r, "labkit/instrument/start.py", job.duration)
    return dataclasses.replace(info, running_at_end=running, left_running=ending.left_running(job.log_dir, r))


def ignored(run: Run, option: str) -> bool:
    """Whether a rank of the run ran without ``option`` because the script does not define it."""
    return any(option in (s.ignored_args or []) for s in run.states.values())


def script_frames(tb: str) -> str:
    """The last traceback line that points into the learner's code, if any."""
    lines = [m for m in re.findall(r'File "([^"]+)", line (\d+)', tb) if "site-packages" not in m[0]
             and "/labkit/" not in m[0] and "runpy" not in m[0]]
    if not lines:
        return ""
    path, line = lines[-1]
    return f" (at {Path(path).name}:{line})"


def why_not(run: Run, rank: int, milestone: str) -> str:
    """Why ``rank`` never reached ``milestone``: its crash, or a hang."""
    st = run.states.get(rank)
    info = run.end(rank)
    where = STAGE_TEXT.get(milestone, milestone)
    if st and st.error:
        err = st.error
        shut = ("\nHorovod shut down because a rank waited too long for the others in a collective operation: "
                "a deadlock (the ranks did not make the same Horovod calls in the same order), or a machine too "
                "busy for the check." if "has been shut down" in err.message else "")
        return (f"rank {rank} crashed before {where}: {err.type}: {err.message[:300]}"
                f"{script_frames(err.traceback)}{shut}")
    if st is None:
        tail = (info.error or info.log_tail).strip()[-600:]
        return f"rank {rank} failed before the script started: " + (
            tail if tail else ending.exit_text(info.exit, bool(run.oom_kills)) + ".")
    if st.exit_code is not None or (info.exit is not None and st.reached("end")):
        return f"rank {rank} ended without reaching {where} (did the script call model.fit?)"
    last = st.milestones[-1] if st.milestones else "start"
    stopped, per_epoch = info.running_at_end, -(-st.data.train // run.batch)
    if stopped is not None and st.fit_bound:
        stopped = dataclasses.replace(stopped, stopped=ending.bound_text(st.fit_bound, st.fit_rule))
    told = ending.busy(rank, stopped, where, last, per_epoch) if stopped is not None else None
    if told:
        return told
    if run.timed_out or info.stalled:
        return (
            f"rank {rank} never reached {where}: it was stuck after '{last}', waiting in a collective "
            "operation the other rank did not join (a deadlock). Every rank must make the same Horovod "
            "calls (init, broadcast, allreduce via the optimizer and callbacks) in the same order."
        )
    return f"rank {rank} stopped after '{last}' before {where}: {ending.exit_text(info.exit, bool(run.oom_kills))}."


def need(run: Run, milestone: str) -> None:
    """Fail unless every rank got as far as ``milestone``; a crashed rank explains the others."""
    if run.start_error:
        raise Failed(f"the job could not start:\n{run.start_error}")
    missing = [r for r in range(run.np) if r not in run.states or not run.states[r].reached(milestone)]
    if missing:
        raise Failed(why_not(run, _culprit(run, missing), milestone))


def _culprit(run: Run, missing: list[int]) -> int:
    """The rank whose fate explains the others': a crash of its own, then one busy in its own code (the
    others wait for it), then a crash caused by another rank (Horovod shut down), then the first missing."""
    def error(r: int) -> str:
        st = run.states.get(r)
        return st.error.message if st and st.error else ""

    def busy(r: int) -> bool:
        stopped = run.end(r).running_at_end
        return stopped is not None and stopped.where.kind in ("own", "library")

    def bounded(r: int) -> bool:
        st = run.states.get(r)
        return bool(st and st.fit_bound)

    for pick in (lambda r: error(r) and "has been shut down" not in error(r), bounded, busy, error):
        found = [r for r in missing if pick(r)]
        if found:
            return found[0]
    return missing[0]


def rel(a: np.ndarray, b: np.ndarray) -> float:
    denom = float(np.linalg.norm(a) + np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / denom if denom else 0.0


def weights(run: Run, rank: int) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in run.weights.get(rank, {}).items()}
