"""Behaviour checks of the six Horovod steps.

The learner's script runs once on 2 ranks under :mod:`labkit.probe` (tiny data,
different per rank; narrow convolutions; two simulated GPUs with mirrored local
ranks). Each step is then judged from what the ranks did.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from labkit import labs, launch
from labkit.check import Report, StepResult

NP = 2
BATCH = 16
ARGS = ["--epochs", "1", "--batch-size", str(BATCH), "--val-batch-size", str(BATCH)]
# Horovod aborts a collective that some ranks never join, so a deadlock ends fast.
PROBE_ENV = {
    "HOROVOD_STALL_CHECK_TIME_SECONDS": "5",
    "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "20",
    "CUDA_VISIBLE_DEVICES": "",  # the probe simulates GPUs; real ones would only slow it down
}
TITLES = dict(enumerate(labs.get("horovod").steps, 1))
# What each step needs to have been observed on every rank.
NEEDS = {1: "fit_start", 2: "fit_start", 3: "batch1_end", 4: "train_end", 5: "epoch0_end", 6: "epoch0_end"}
STAGE_TEXT = {
    "fit_start": "model.fit",
    "batch1_end": "the second training batch",
    "train_end": "the end of training",
    "epoch0_end": "the end of the first epoch",
}


class Run:
    """What the probed 2-rank run produced."""

    def __init__(self, out: Path, job: launch.JobResult) -> None:
        self.job = job
        self.logs = {r: job.log(r) for r in range(NP)}  # read now: the folder may be temporary
        self.states: dict[int, dict[str, Any]] = {}
        self.weights: dict[int, dict[str, np.ndarray]] = {}
        for r in range(NP):
            f = out / f"probe.{r}.json"
            if f.exists():
                try:
                    self.states[r] = json.loads(f.read_text())
                except json.JSONDecodeError:
                    pass
            w = out / f"weights.{r}.npz"
            if w.exists():
                with np.load(w) as z:
                    self.weights[r] = {k: z[k] for k in z.files}

    def reached(self, rank: int, milestone: str) -> bool:
        return milestone in self.states.get(rank, {}).get("milestones", [])

    def why_not(self, rank: int, milestone: str) -> str:
        """Why ``rank`` never reached ``milestone``: its crash, or a hang."""
        st = self.states.get(rank)
        where = STAGE_TEXT.get(milestone, milestone)
        if st and st.get("error"):
            err = st["error"]
            tb = _script_frames(err.get("traceback", ""))
            return f"rank {rank} crashed before {where}: {err['type']}: {err['message'][:300]}{tb}"
        exit_code = self.job.rank_exit.get(rank)
        if st is None:
            tail = self.job.rank_errors.get(rank) or self.logs.get(rank, "")[-600:]
            return f"rank {rank} failed before the script started:\n{tail.strip()[-600:]}"
        if st.get("exit_code") is not None or (exit_code is not None and "end" in st.get("milestones", [])):
            return f"rank {rank} ended without reaching {where} (did the script call model.fit?)"
        last = st.get("milestones", ["start"])[-1]
        log = self.logs.get(rank, "")
        if self.job.timed_out or "stall" in log.lower():
            return (
                f"rank {rank} never reached {where}: it was stuck after '{last}', waiting in a collective "
                "operation the other rank did not join (a deadlock). Every rank must make the same Horovod "
                "calls (init, broadcast, allreduce via the optimizer and callbacks) in the same order."
            )
        return f"rank {rank} stopped after '{last}' (exit code {exit_code}) before {where}"


def _script_frames(tb: str) -> str:
    """The last traceback line that points into the learner's code, if any."""
    lines = [m for m in re.findall(r'File "([^"]+)", line (\d+)', tb) if "site-packages" not in m[0]
             and "/labkit/" not in m[0] and "runpy" not in m[0]]
    if not lines:
        return ""
    path, line = lines[-1]
    return f" (at {Path(path).name}:{line})"


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    denom = float(np.linalg.norm(a) + np.linalg.norm(b))
    return float(np.linalg.norm(a - b)) / denom if denom else 0.0


def _step1(run: Run) -> tuple[bool, str]:
    s0 = run.states[0]
    if "hvd_import_error" in s0 and not s0.get("hvd", {}).get("initialized"):
        return False, f"Horovod cannot be imported here ({s0['hvd_import_error']}); run `make setup`."
    sizes = {r: run.states[r].get("hvd", {}) for r in range(NP)}
    if not all(h.get("initialized") for h in sizes.values()):
        return False, (
            "Horovod was not initialised: the 2 processes each trained alone. "
            "Add `import horovod.tensorflow.keras as hvd` and call `hvd.init()` at the start of the script."
        )
    if any(h.get("size") != NP for h in sizes.values()):
        return False, f"hvd.size() was {[h.get('size') for h in sizes.values()]} instead of {NP} on every rank."
    problems = []
    for r in range(NP):
        st = run.states[r]
        local = st["hvd"]["local_rank"]
        want = f"/physical_device:GPU:{local}"
        visible = st["pins"]["visible"]
        cvd = (st["fit"][0].get("cuda_visible_devices") if st.get("fit") else None) or st["pins"].get(
            "cuda_visible_devices")
        if visible == [want] or (visible is None and cvd == str(local)):
            continue
        if visible is None:
            problems.append(
                f"rank {r} left both GPUs visible. Pin one GPU per process: "
                "`gpus = tf.config.list_physical_devices('GPU')` then "
                "`tf.config.set_visible_devices(gpus[hvd.local_rank()], 'GPU')`."
            )
        else:
            idx = [v.rsplit(":", 1)[-1] for v in visible]
            hint = " It looks pinned by hvd.rank(); use hvd.local_rank() (the rank within the node)." if idx == [
                str(r)] else ""
            problems.append(f"rank {r} (local rank {local} in this simulated node) made GPU(s) {idx} visible "
                            f"instead of GPU {local}.{hint}")
    if problems:
        return False, " ".join(problems)
    growth = all(run.states[r]["pins"]["memory_growth"] for r in range(NP))
    extra = "" if growth else " (Tip: also call tf.config.experimental.set_memory_growth(gpu, True).)"
    return True, f"Horovod initialised on {NP} ranks; each rank pinned the GPU of its local rank.{extra}"


def _prints_progress(verbose: Any) -> bool:
    return verbose not in (0, False, None) and verbose != "0"


def _step2(run: Run) -> tuple[bool, str]:
    v0 = run.states[0]["fit"][0]["verbose"]
    if not _prints_progress(v0) and v0 != "auto":
        return False, f"rank 0 called model.fit with verbose={v0!r}: rank 0 should still print progress (verbose=1)."
    noisy = []
    for r in range(1, NP):
        st = run.states[r]
        calls = [c["verbose"] for c in st.get("fit", [])] + [c["verbose"] for c in st.get("evaluate", [])]
        if any(_prints_progress(v) for v in calls):
            noisy.append(r)
    if noisy:
        return False, (
            f"rank(s) {noisy} also print Keras progress (verbose={run.states[noisy[0]]['fit'][0]['verbose']!r}). "
            "Set `verbose = 1 if hvd.rank() == 0 else 0` and pass it to fit() and evaluate()."
        )
    return True, "only rank 0 prints training progress."


def _step3(run: Run) -> tuple[bool, str]:
    upd = {}
    for r in range(NP):
        w = run.weights.get(r, {})
        if "b1_begin" not in w or "b1_end" not in w:
            return False, f"rank {r} recorded no second training batch, so the update could not be compared."
        upd[r] = w["b1_end"] - w["b1_begin"]
    if not any(np.linalg.norm(u) for u in upd.values()):
        return False, "no weight changed during a training step (is the learning rate 0?)."
    diff = _rel(upd[0], upd[1])
    opt = run.states[0]["fit"][0].get("optimizer") or "?"
    if diff > 1e-3:
        hint = "" if "horovod" not in opt else " (the optimizer is a Horovod one, yet the updates differ)"
        return False, (
            f"in the same training step the ranks applied different weight updates (relative difference {diff:.2f}): "
            f"each rank used only its own gradients{hint}. Wrap the optimizer: `opt = hvd.DistributedOptimizer(opt)` "
            "before model.compile()."
        )
    return True, f"both ranks applied the same averaged update in each step (relative difference {diff:.1e})."


def _step4(run: Run) -> tuple[bool, str]:
    w0, w1 = run.weights[0], run.weights[1]
    if any(k not in w for w in (w0, w1) for k in ("init", "after_b0", "final")):
        return False, "the weight snapshots of a rank are missing; training did not finish on both ranks."
    final_diff = _rel(w0["final"], w1["final"])
    if final_diff > 1e-4:
        return False, (
            f"the ranks finished with different weights (relative difference {final_diff:.2f}): they started from "
            "different random weights. Add `hvd.callbacks.BroadcastGlobalVariablesCallback(0)` to the callbacks."
        )
    # After the broadcast every rank continues from rank 0's initial weights.
    for r in range(NP):
        d_root = float(np.linalg.norm(run.weights[r]["after_b0"] - w0["init"]))
        d_other = min(float(np.linalg.norm(run.weights[r]["after_b0"] - run.weights[o]["init"]))
                      for o in range(1, NP))
        if d_other < d_root:
            return False, ("the ranks agree, but on the initial weights of another rank: broadcast from rank 0 "
                           "(`BroadcastGlobalVariablesCallback(0)`).")
    return True, "all ranks start from rank 0's initial weights and stay identical."


def _within(value: int, exact: float) -> bool:
    return int(np.floor(exact)) - 1 <= value <= int(np.ceil(exact)) + 1


def _step5(run: Run) -> tuple[bool, str]:
    data = run.states[0]["data"]
    full_train = -(-data["train"] // BATCH)
    full_val = -(-data["test"] // BATCH)
    want_train, want_val = full_train / NP, 3 * full_val / NP
    msgs = []
    for r in range(NP):
        ep = run.states[r]["epochs"][0]
        if not _within(ep["train_batches"], want_train):
            msgs.append(
                f"rank {r} ran {ep['train_batches']} training batches in an epoch of {full_train}; with {NP} workers "
                f"each should run about {full_train} // {NP} = {full_train // NP}. "
                "Pass `steps_per_epoch=<batches per epoch> // hvd.size()` to fit()."
            )
        if not _within(ep["val_batches"], want_val):
            msgs.append(
                f"rank {r} ran {ep['val_batches']} validation batches; the lab's rule is 3 * {full_val} // {NP} = "
                f"{3 * full_val // NP}. Pass `validation_steps=3 * <test batches> // hvd.size()` to fit()."
            )
        if msgs:
            break
    if msgs:
        return False, " ".join(msgs)
    ep0 = run.states[0]["epochs"][0]
    return True, (f"each worker ran {ep0['train_batches']} of {full_train} training batches and "
                  f"{ep0['val_batches']} validation batches per epoch.")


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def _step6(run: Run) -> tuple[bool, str]:
    finals = [run.states[r]["epochs"][0]["final_logs"] for r in range(NP)]
    keys = sorted(k for k in finals[0] if k.startswith("val_") and all(k in f for f in finals))
    if not keys:
        return False, "no validation metrics were logged: pass validation_data and validation_steps to fit()."
    averaged = all(_same(finals[0][k], f[k]) for k in keys for f in finals[1:])
    if not averaged:
        k = keys[0]
        return False, (
            f"the ranks ended the epoch with different {k} ({finals[0][k]:.4f} vs {finals[1][k]:.4f}): each rank "
            "only saw its own validation batches. Add `hvd.callbacks.MetricAverageCallback()` to the callbacks."
        )
    for r in range(NP):
        for rd in run.states[r]["epochs"][0]["reads"]:
            if rd["callback"].startswith("horovod."):
                continue
            read = [k for k in rd["read"] if k in keys]
            stale = [k for k in read if k in rd["seen"] and not _same(rd["seen"][k], finals[r][k])]
            if stale:
                name = rd["callback"].rsplit(".", 1)[-1]
                return False, (
                    f"{name} (callback #{rd['index']} on rank {r}) read {stale[0]} before it was averaged. "
                    f"Put MetricAverageCallback before {name} in the callbacks list."
                )
    return True, "validation metrics are averaged over the workers before any callback reads them."


CHECKS = {1: _step1, 2: _step2, 3: _step3, 4: _step4, 5: _step5, 6: _step6}


def _syntax_error(script: Path) -> str | None:
    try:
        ast.parse(script.read_text(), filename=str(script))
    except SyntaxError as e:
        return f"{script.name} does not parse: line {e.lineno}: {e.msg}. Fix the syntax, then check again."
    return None


def evaluate(run: Run, step: int) -> list[StepResult]:
    """Judge steps 1..step from one probed run."""
    results: list[StepResult] = []
    for k in range(1, step + 1):
        failed = next((r.step for r in results if not r.passed), None)
        if failed is not None:
            results.append(StepResult(k, False, f"not checked: fix step {failed} first."))
            continue
        missing = [r for r in range(NP) if not run.reached(r, NEEDS[k])]
        if missing:
            # A rank that crashed explains the others, which were only stopped or left waiting.
            culprit = next((r for r in missing if run.states.get(r, {}).get("error")), missing[0])
            results.append(StepResult(k, False, f"{TITLES[k]}: {run.why_not(culprit, NEEDS[k])}"))
            continue
        try:
            ok, msg = CHECKS[k](run)
        except (KeyError, IndexError) as e:
            ok, msg = False, f"the run did not record what this step needs ({type(e).__name__}: {e})."
        results.append(StepResult(k, ok, f"{TITLES[k]}: {msg}"))
    return results


# One probed run per script content: checking step 2, then 3, ... of an unchanged
# script (as the notebook's check cells do) reuses it.
_CACHE: dict[str, Run] = {}


def _key(script: Path) -> str:
    return hashlib.sha256(script.read_bytes()).hexdigest()


def check(
    lab: str, script: Path, step: int, timeout: float = 120, keep: str | Path | None = None, reuse: bool = True
) -> Report:
    """Run ``script`` under the probe on 2 ranks and judge steps 1..``step``."""
    start = time.perf_counter()
    script = Path(script).resolve()
    report = Report(lab, str(script))
    if not script.is_file():
        raise FileNotFoundError(f"no such script: {script}")
    key = _key(script)
    if reuse and key in _CACHE:
        report.steps = evaluate(_CACHE[key], step)
        report.seconds = time.perf_counter() - start
        return report
    bad = _syntax_error(script)
    if bad:
        report.steps = [StepResult(1, False, bad)] + [
            StepResult(k, False, "not checked: fix step 1 first.") for k in range(2, step + 1)]
        report.seconds = time.perf_counter() - start
        return report
    with tempfile.TemporaryDirectory(prefix="labkit-check-") as tmp:
        work = Path(keep) if keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        out = work / "probe"
        job = launch.run(
            [sys.executable, "-m", "labkit.probe", str(out), "--", str(script), *ARGS],
            np=NP, launcher="mpirun", timeout=timeout, threads=1, log_dir=work / "logs",
            env=dict(PROBE_ENV), quiet=True, cwd=work, record=False,  # probe runs are not the learner's runs
        )
        run = Run(out, job)
        if not job.timed_out and not job.interrupted:
            _CACHE[key] = run
        if not run.states and job.returncode:
            msg = job.summary()
            report.steps = [StepResult(1, False, f"the job could not start:\n{msg}")] + [
                StepResult(k, False, "not checked: fix step 1 first.") for k in range(2, step + 1)]
        else:
            report.steps = evaluate(run, step)
    report.seconds = time.perf_counter() - start
    return report

