"""The Horovod lab's eight steps, judged from probed 2-rank runs.

:func:`collect` runs the learner's script on 2 ranks under :mod:`labkit.instrument.probe`
(tiny data, different per rank; narrow convolutions; two simulated GPUs with mirrored
local ranks) and returns what the ranks did. Each ``step_N`` is a plain function of
that evidence. Steps 1-6 need one run. Steps 7 (checkpoints) and 8 (the learning rate) need two: one of
several epochs with ``--base-lr`` and ``--checkpoint-dir`` given, each rank in a folder of its own as on
separate nodes, which also serves steps 1-6 and whose rate at every batch :mod:`labkit.check.lr_rule` judges;
and one that must resume from what the first saved.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np

from labkit.check import hvd_runs as hr
from labkit.check.hvd_lr import LR_ARGS, LR_EPOCHS, explained, lr_args, step_8
from labkit.check.hvd_resume import CHECKPOINT_ARGS, step_7
from labkit.check.hvd_runs import BATCH
from labkit.check.verdict import Failed
from labkit.records import evidence as saved
from labkit.records.hvd_evidence import HorovodEvidence, Resume, kept

EVIDENCE = HorovodEvidence  # what collect returns and the judges read (labkit.check.judging saves and loads it)
evidence = saved.from_json(EVIDENCE)  # the evidence from its JSON, every field checked (how a test builds one)
ARGS = ["--epochs", "1", "--batch-size", str(BATCH), "--val-batch-size", str(BATCH)]


def upto(step: int) -> int:
    """Step 1 alone needs the ranks only up to their call of fit; steps 1-6 come from one run; steps 7 and 8 from
    a longer one and the run that resumes from it."""
    return 1 if step <= 1 else 6 if step <= 6 else min(step, 8)


def collect(script: Path, upto: int, timeout: float, work: Path) -> HorovodEvidence:
    """Run ``script`` on 2 ranks under the probe (and, for steps 7 and 8, the run that resumes).

    Up to step 6 one run of one epoch. For steps 7 and 8 that run is longer and serves them all: it trains the
    learning-rate run's epochs with ``--checkpoint-dir``, each rank in a folder of its own as on separate
    nodes (a script without that option still runs, for steps 1-6, and step 7 says what is missing); then a
    second run, given one epoch more, must resume from what the first saved. Its evidence is kept as the first
    checkpoint run and the learning-rate run too, the shape step 7 and step 8 read.
    """
    deadline = time.monotonic() + timeout
    if upto <= 1:  # how the ranks get to fit is all step 1 asks: they end there
        return kept(hr.run(script, ARGS, work / "probe", work / "run", timeout, epochs=0), HorovodEvidence,
                    partial=True)
    if upto <= 6:  # a folder the script may even delete
        return kept(hr.run(script, ARGS, work / "probe", work / "run", timeout), HorovodEvidence)
    first = hr.run(script, [*LR_ARGS, *CHECKPOINT_ARGS], work / "probe", work / "resume", timeout, own_folders=True,
                   epochs=LR_EPOCHS, tolerate=(CHECKPOINT_ARGS[0],))
    ev = kept(first, HorovodEvidence, resume=Resume(first), lr_run=first)
    if _may_resume(ev):
        left = max(10.0, deadline - time.monotonic())
        second = hr.run(script, [*lr_args(LR_EPOCHS + 1), *CHECKPOINT_ARGS], work / "probe-second", work / "resume",
                        left, own_folders=True)
        ev = dataclasses.replace(ev, resume=Resume(first, second))
    return ev


def _may_resume(ev: HorovodEvidence) -> bool:
    """Whether every rank's record was read, steps 1-6 pass and the first checkpoint run trained to its end with
    ``--checkpoint-dir``: then the second run may resume from what it saved."""
    if ev.record_error():
        return False
    try:
        for judge in STEPS[:6]:
            judge(ev)
    except (Failed, KeyError, IndexError, TypeError):
        return False
    first = ev.resume.first if ev.resume else None
    return first is not None and hr.reached(first, "train_end") and not hr.ignored(first, CHECKPOINT_ARGS[0])


def step_1(ev: HorovodEvidence) -> str:
    hr.need(ev, "fit_start")
    n = ev.np
    s0 = ev.state(0)
    if s0.hvd_import_error is not None and not s0.hvd.initialized:
        raise Failed(f"Horovod cannot be imported here ({s0.hvd_import_error}); run `make setup`.")
    hvds = [ev.state(r).hvd for r in range(n)]
    if not all(h.initialized for h in hvds):
        raise Failed(f"Horovod was not initialised: the {n} processes each trained alone. Add "
                     "`import horovod.tensorflow.keras as hvd` and call `hvd.init()` at the start of the script.")
    if any(h.size != n for h in hvds):
        raise Failed(f"hvd.size() was {[h.size for h in hvds]} instead of {n} on every rank.")
    problems = []
    for r in range(n):
        st = ev.state(r)
        local = st.hvd.local_rank
        visible = st.pins.visible
        cvd = (st.fit[0].cuda_visible_devices if st.fit else None) or st.pins.cuda_visible_devices
        if visible == [f"/physical_device:GPU:{local}"] or (visible is None and cvd == str(local)):
            continue
        if visible is None:
            problems.append(f"rank {r} left both GPUs visible. Pin one GPU per process: "
                            "`gpus = tf.config.list_physical_devices('GPU')` then "
                            "`tf.config.set_visible_devices(gpus[hvd.local_rank()], 'GPU')`.")
        else:
            idx = [v.rsplit(":", 1)[-1] for v in visible]
            hint = (" It looks pinned by hvd.rank(); use hvd.local_rank() (the rank within the node)."
                    if idx == [str(r)] else "")
            problems.append(f"rank {r} (local rank {local} in this simulated node) made GPU(s) {idx} visible "
                            f"instead of GPU {local}.{hint}")
    if problems:
        raise Failed(" ".join(problems))
    growth = all(ev.state(r).pins.memory_growth for r in range(n))
    extra = "" if growth else " (Tip: also call tf.config.experimental.set_memory_growth(gpu, True).)"
    return f"Horovod initialised on {n} ranks; each rank pinned the GPU of its local rank.{extra}"


def _prints_progress(verbose: Any) -> bool:
    return verbose not in (0, False, None) and verbose != "0"


def step_2(ev: HorovodEvidence) -> str:
    hr.need(ev, "fit_start")
    v0 = ev.state(0).fit[0].verbose
    if not _prints_progress(v0) and v0 != "auto":
        raise Failed(f"rank 0 called model.fit with verbose={v0!r}: rank 0 should still print progress "
                     "(verbose=1).")
    noisy = []
    for r in range(1, ev.np):
        st = ev.state(r)
        calls = [c.verbose for c in st.fit] + [c.verbose for c in st.evaluate]
        if any(_prints_progress(v) for v in calls):
            noisy.append(r)
    if noisy:
        raise Failed(f"rank(s) {noisy} also print Keras progress "
                     f"(verbose={ev.state(noisy[0]).fit[0].verbose!r}). "
                     "Set `verbose = 1 if hvd.rank() == 0 else 0` and pass it to fit() and evaluate().")
    return "only rank 0 prints training progress."


def step_3(ev: HorovodEvidence) -> str:
    hr.need(ev, "batch1_end")
    upd = {}
    for r in range(ev.np):
        w = hr.weights(ev, r)
        if "b1_begin" not in w or "b1_end" not in w:
            raise Failed(f"rank {r} recorded no second training batch, so the update could not be compared.")
        upd[r] = w["b1_end"] - w["b1_begin"]
    if not any(np.linalg.norm(u) for u in upd.values()):
        raise Failed("no weight changed during a training step (is the learning rate 0?).")
    diff = hr.rel(upd[0], upd[1])
    opt = ev.state(0).fit[0].optimizer or "?"
    if diff > 1e-3:
        hint = "" if "horovod" not in opt else " (the optimizer is a Horovod one, yet the updates differ)"
        raise Failed(
            f"in the same training step the ranks applied different weight updates (relative difference "
            f"{diff:.2f}): each rank used only its own gradients{hint}. Wrap the optimizer: "
            "`opt = hvd.DistributedOptimizer(opt)` before model.compile().")
    return f"both ranks applied the same averaged update in each step (relative difference {diff:.1e})."


def step_4(ev: HorovodEvidence) -> str:
    hr.need(ev, "train_end")
    w = {r: hr.weights(ev, r) for r in range(ev.np)}
    if any(k not in w[r] for r in w for k in ("init", "after_b0", "final")):
        raise Failed("the weight snapshots of a rank are missing; training did not finish on both ranks.")
    final_diff = hr.rel(w[0]["final"], w[1]["final"])
    if final_diff > 1e-4:
        raise Failed(f"the ranks finished with different weights (relative difference {final_diff:.2f}): they "
                     "started from different random weights. Add "
                     "`hvd.callbacks.BroadcastGlobalVariablesCallback(0)` to the callbacks.")
    for r in w:  # after the broadcast every rank continues from rank 0's initial weights
        d_root = float(np.linalg.norm(w[r]["after_b0"] - w[0]["init"]))
        d_other = min(float(np.linalg.norm(w[r]["after_b0"] - w[o]["init"])) for o in w if o)
        if d_other < d_root:
            raise Failed("the ranks agree, but on the initial weights of another rank: broadcast from rank 0 "
                         "(`BroadcastGlobalVariablesCallback(0)`).")
    return "all ranks start from rank 0's initial weights and stay identical."


def _within(value: int, exact: float) -> bool:
    return int(np.floor(exact)) - 1 <= value <= int(np.ceil(exact)) + 1


def _validation_failure(r: int, v: int, full: int, n: int, steps: Any) -> str:
    """What rank ``r``, which ran ``v`` validation batches per epoch of ``full``, should divide, and by what."""
    shard, rule = f"{full} // {n} = {full // n}", f"3 * {full} // {n} = {3 * full // n}"
    divide = (f"Pass `validation_steps=3 * <test batches> // hvd.size()` to fit() (the lab's rule: {rule}), or "
              f"`validation_steps=<test batches> // hvd.size()` ({shard}) with a sharded test set.")
    if abs(v - 3 * full) < abs(v - full):
        return (f"rank {r} ran {v} validation batches per epoch, 3 times the test set of {full} batches, as a single "
                f"worker does with the lab's rule: validation_steps={steps} was not divided by the {n} workers. "
                f"Divide it: `validation_steps=3 * <test batches> // hvd.size()` ({rule}).")
    if steps is None:
        return (f"rank {r} ran through the whole test set ({v} of {full} batches) at every validation: fit() got no "
                f"validation_steps and an unsharded test set, so each of the {n} workers validated as much as a "
                "single one does. Shard the test set (`test_ds.shard(hvd.size(), hvd.rank())` before batching), "
                "or pass `validation_steps=3 * <test batches> // hvd.size()` to fit() with a repeated one.")
    return (f"rank {r} ran {v} validation batches per epoch, the whole test set of {full} batches: "
            f"validation_steps={steps} was not divided by the {n} workers, so each validated as much as a single "
            f"worker does. {divide}")


def step_5(ev: HorovodEvidence) -> str:
    hr.need(ev, "epoch0_end")
    n, batch = ev.np, ev.batch
    data = ev.state(0).data
    full_train, full_val = -(-data.train // batch), -(-data.test // batch)
    for r in range(n):
        ep = ev.state(r).epochs[0]
        if not _within(ep.train_batches, full_train / n):
            raise Failed(
                f"rank {r} ran {ep.train_batches} training batches in an epoch of {full_train}; with {n} "
                f"workers each should run about {full_train} // {n} = {full_train // n}. "
                "Pass `steps_per_epoch=<batches per epoch> // hvd.size()` to fit().")
        # Validation is judged by what a rank runs, not by how the script says it: about a shard each (test
        # batches / N: a sharded test set, with or without validation_steps) or about the lab's rule (3 x test
        # batches / N on an unsharded, shuffled one) passes. About the whole test set, or 3x it, is what a single
        # worker runs: validation_steps not divided by the workers. (With 3 workers the lab's rule is the whole
        # test set and the two cannot be told apart; the check runs 2.)
        v = ep.val_batches
        right = min(abs(v - full_val / n), abs(v - 3 * full_val / n))
        undivided = min(abs(v - full_val), abs(v - 3 * full_val))
        if (_within(v, full_val / n) or _within(v, 3 * full_val / n)) and right <= undivided:
            continue
        if (_within(v, full_val) or _within(v, 3 * full_val)) and undivided < right:
            raise Failed(_validation_failure(r, v, full_val, n, ev.state(r).fit[0].validation_steps))
        raise Failed(
            f"rank {r} ran {v} validation batches per epoch of {full_val}; with {n} workers each should run about "
            f"{full_val} // {n} = {full_val // n} (a shard each) or about 3 * {full_val} // {n} = "
            f"{3 * full_val // n} (the lab's rule). Pass `validation_steps=<test batches> // hvd.size()` with a "
            "sharded test set, or `3 * <test batches> // hvd.size()`, to fit().")
    ep0 = ev.state(0).epochs[0]
    v0 = ep0.val_batches
    how = ("a shard of the test set each" if abs(v0 - full_val / n) <= abs(v0 - 3 * full_val / n)
           else "the lab's rule: 3 x the test batches over the workers")
    return (f"each worker ran {ep0.train_batches} of {full_train} training batches and {v0} validation batches "
            f"per epoch, with {full_val} test batches ({how}).")


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def step_6(ev: HorovodEvidence) -> str:
    hr.need(ev, "epoch0_end")
    n = ev.np
    finals = [ev.state(r).epochs[0].final_logs for r in range(n)]
    keys = sorted(k for k in finals[0] if k.startswith("val_") and all(k in f for f in finals))
    if not keys:
        raise Failed("no validation metrics were logged: pass validation_data and validation_steps to fit().")
    if not all(_same(finals[0][k], f[k]) for k in keys for f in finals[1:]):
        k = keys[0]
        raise Failed(f"the ranks ended the epoch with different {k} ({finals[0][k]:.4f} vs {finals[1][k]:.4f}): "
                     "each rank only saw its own validation batches. Add "
                     "`hvd.callbacks.MetricAverageCallback()` to the callbacks.")
    for r in range(n):
        for rd in ev.state(r).epochs[0].reads:
            if rd.callback.startswith("horovod.") or rd.epoch != 0:  # judged on the first epoch
                continue
            stale = [k for k in rd.read if k in keys and k in rd.seen and not _same(rd.seen[k], finals[r][k])]
            if stale:
                name = rd.callback.rsplit(".", 1)[-1]
                raise Failed(f"{name} (callback #{rd.index} on rank {r}) read {stale[0]} before it was averaged. "
                             f"Put MetricAverageCallback before {name} in the callbacks list.")
    return "validation metrics are averaged over the workers before any callback reads them."


STEPS = [explained(s) for s in (step_1, step_2, step_3, step_4, step_5, step_6, step_7, step_8)]
