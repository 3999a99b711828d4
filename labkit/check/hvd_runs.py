"""Probed 2-rank Horovod runs: how the Horovod lab's check starts one, and how its evidence is read.

:func:`run` launches the learner's script on 2 ranks under :mod:`labkit.instrument.probe` and returns what
each rank recorded (its milestones, calls, weights as random projections, how it ended);
the other helpers read that evidence for the step judges of :mod:`labkit.check.lab_horovod`.
"""

from __future__ import annotations

import json
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from labkit.check import ending
from labkit.check.verdict import Failed
from labkit.launching import launch
from labkit.launching.jobspec import JobSpec

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


def reached(ev: dict[str, Any], milestone: str) -> bool:
    return len(ev["states"]) == ev["np"] and all(milestone in s.get("milestones", []) for s in ev["states"].values())


def run(script: Path, args: list[str], out: Path, cwd: Path, timeout: float,
         own_folders: bool = False, epochs: int = 1, tolerate: tuple[str, ...] = ()) -> dict[str, Any]:
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
    job = launch.run([sys.executable, "-m", "labkit.instrument.probe", str(out), *flags, "--", str(script), *args],
                     job=JobSpec(timeout=timeout, threads=1, log_dir=out.with_name(out.name + "-logs"),
                                 env=dict(PROBE_ENV), quiet=True, cwd=cwd, record=False), np=NP, launcher="mpirun")
    ev: dict[str, Any] = {"lab": "horovod", "np": NP, "batch": BATCH, "states": {}, "weights": {}, "ranks": {},
                          "timed_out": job.timed_out, "interrupted": job.interrupted,
                          "returncode": job.returncode, "start_error": None}
    for r in range(NP):
        f = out / f"probe.{r}.json"
        if f.exists():
            try:
                ev["states"][str(r)] = json.loads(f.read_text())
            except json.JSONDecodeError:
                pass
        w = out / f"weights.{r}.npz"
        if w.exists():
            with np.load(w) as z:
                ev["weights"][str(r)] = {k: _project(z[k]) for k in z.files}
        log = job.log(r)
        ev["ranks"][str(r)] = info = {"exit": job.rank_exit.get(r), "error": job.rank_errors.get(r, ""),
                                      "log_tail": log[-600:], "stalled": "stall" in log.lower()}
        _how_it_ended(info, ev["states"].get(str(r)), out, r, job)
    if ending.oom_kills() > oom:
        ev["oom_kills"] = ending.oom_kills() - oom
    if not ev["states"] and job.returncode:
        ev["start_error"] = job.summary()
    return ev


def _how_it_ended(info: dict[str, Any], st: dict[str, Any] | None, out: Path, r: int, job: launch.JobResult) -> None:
    """Optional evidence: where a rank that had to be stopped was; what it left running."""
    if st is not None and "end" not in st.get("milestones", []):
        running = ending.still_running(out, r, "labkit/instrument/probe.py", job.duration)
        if running:
            info["running_at_end"] = running
    left = ending.left_running(job.log_dir, r)
    if left:
        info["left_running"] = left


def ignored(ev: dict[str, Any], option: str) -> bool:
    """Whether a rank of the run ran without ``option`` because the script does not define it."""
    return any(option in (s.get("ignored_args") or []) for s in ev["states"].values())


def state(ev: dict[str, Any], rank: int) -> dict[str, Any]:
    return ev["states"][str(rank)]


def script_frames(tb: str) -> str:
    """The last traceback line that points into the learner's code, if any."""
    lines = [m for m in re.findall(r'File "([^"]+)", line (\d+)', tb) if "site-packages" not in m[0]
             and "/labkit/" not in m[0] and "runpy" not in m[0]]
    if not lines:
        return ""
    path, line = lines[-1]
    return f" (at {Path(path).name}:{line})"


def why_not(ev: dict[str, Any], rank: int, milestone: str) -> str:
    """Why ``rank`` never reached ``milestone``: its crash, or a hang."""
    st = ev["states"].get(str(rank))
    info = ev["ranks"].get(str(rank), {})
    where = STAGE_TEXT.get(milestone, milestone)
    if st and st.get("error"):
        err = st["error"]
        shut = ("\nHorovod shut down because a rank waited too long for the others in a collective operation: "
                "a deadlock (the ranks did not make the same Horovod calls in the same order), or a machine too "
                "busy for the check." if "has been shut down" in err["message"] else "")
        return (f"rank {rank} crashed before {where}: {err['type']}: {err['message'][:300]}"
                f"{script_frames(err.get('traceback', ''))}{shut}")
    exit_code = info.get("exit")
    if st is None:
        tail = (info.get("error") or info.get("log_tail", "")).strip()[-600:]
        return f"rank {rank} failed before the script started: " + (
            tail if tail else ending.exit_text(exit_code, bool(ev.get("oom_kills"))) + ".")
    if st.get("exit_code") is not None or (exit_code is not None and "end" in st.get("milestones", [])):
        return f"rank {rank} ended without reaching {where} (did the script call model.fit?)"
    last = st.get("milestones", ["start"])[-1]
    run, per_epoch = info.get("running_at_end"), -(-st.get("data", {}).get("train", 0) // ev.get("batch", BATCH))
    if run and st.get("fit_bound"):
        run = {**run, "stopped": ending.bound_text(st)}
    told = ending.busy(rank, run, where, last, per_epoch) if run else None
    if told:
        return told
    if ev.get("timed_out") or info.get("stalled"):
        return (
            f"rank {rank} never reached {where}: it was stuck after '{last}', waiting in a collective "
            "operation the other rank did not join (a deadlock). Every rank must make the same Horovod "
            "calls (init, broadcast, allreduce via the optimizer and callbacks) in the same order."
        )
    return (f"rank {rank} stopped after '{last}' before {where}: "
            f"{ending.exit_text(exit_code, bool(ev.get('oom_kills')))}.")


def need(ev: dict[str, Any], milestone: str) -> None:
    """Fail unless every rank got as far as ``milestone``; a crashed rank explains the others."""
    if ev.get("start_error"):
        raise Failed(f"the job could not start:\n{ev['start_error']}")
    missing = [r for r in range(ev["np"])
               if milestone not in ev["states"].get(str(r), {}).get("milestones", [])]
    if missing:
        raise Failed(why_not(ev, _culprit(ev, missing), milestone))


def _culprit(ev: dict[str, Any], missing: list[int]) -> int:
    """The rank whose fate explains the others': a crash of its own, then one busy in its own code (the
    others wait for it), then a crash caused by another rank (Horovod shut down), then the first missing."""
    def error(r: int) -> str:
        return ((ev["states"].get(str(r)) or {}).get("error") or {}).get("message", "")

    def busy(r: int) -> bool:
        run = ev["ranks"].get(str(r), {}).get("running_at_end") or {}
        return (run.get("where") or {}).get("kind") in ("own", "library")

    def bounded(r: int) -> bool:
        return bool((ev["states"].get(str(r)) or {}).get("fit_bound"))

    for pick in (lambda r: error(r) and "has been shut down" not in error(r), bounded, busy, error):
        found = [r for r in missing if pick(r)]
        if found:
            return found[0]
    return missing[0]


def rel(a: np.ndarray, b: np.ndarray) -> float:
    denom = float(np.linalg.norm(a) + np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / denom if denom else 0.0


def weights(ev: dict[str, Any], rank: int) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in ev["weights"].get(str(rank), {}).items()}
