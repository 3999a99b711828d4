"""Lab 9's five steps: the first four judged from one probed 2-rank run of the learner's Horovod script.

:func:`collect` runs the script as the Horovod lab's check does (:func:`labkit.check.hvd_runs.run`: 2 ranks, a tiny
slice of data that differs per rank, narrow convolutions) for two epochs, warmed up over the first, with
``--accumulate 3``, then ``--sync-bn``, ``--precision bf16`` and ``--profile-dir profile`` for the steps asked. An
option a script does not have yet is tolerated while an earlier step is judged; the step that asks for it says to
add it.

What each step reads, all of it what the ranks did:

1. per training batch, whether the trainable weights moved, how many gradient tensors Horovod all-reduced as the step
   ran, and the norm of what came back (:class:`labkit.instrument.probe_allreduce.Tally`): with ``--accumulate K``
   both happen once every K batches. The rate an update used per *average* gradient of the effective batch is
   ``K x |weights' move| / |all-reduced sum|``: the optimizer's rate when the K batches' gradients are averaged,
   K times it when they are summed. Either is correct when that effective rate is ``--base-lr x workers x K``
   after the warm-up (:mod:`labkit.check.lr_rule`). Plain SGD, as the lab's script has it: an update is the rate
   times the gradient;
2. the model's non-trainable values (BatchNorm's moving statistics) on every rank after the second batch and at
   the end of training: equal on all ranks when each layer normalised with the global batch's statistics, apart
   when each used its own. A broadcast at the end would make only the last equal;
3. the dtype each layer computes in, the dtypes of its variables and of the model's output, as ``fit`` began;
4. with ``--profile-dir profile`` and each rank in a folder of its own (as on separate nodes), what each rank left
   there: rank 0 a TensorFlow profile holding training steps (:mod:`labkit.figures.step_profile`), every other rank
   nothing. Any way of profiling that writes the trace passes (the profiler's start and stop, its context manager,
   Keras's TensorBoard callback);
5. once that run trained to the end, a run of its own under Horovod's elastic mode (:mod:`labkit.check.elastic_run`),
   judged in :mod:`labkit.check.elastic_judge`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from labkit.check import elastic_judge, elastic_run, lr_rule
from labkit.check import hvd_runs as hr
from labkit.check.hvd_lr import BASE_LR
from labkit.check.hvd_runs import BATCH
from labkit.check.verdict import Failed
from labkit.figures import step_profile
from labkit.records import evidence as saved
from labkit.records.hvd_evidence import AtScaleEvidence, kept
from labkit.records.hvd_probe import Profiled, RankRecord

EVIDENCE = AtScaleEvidence  # what collect returns and the judges read (labkit.check.judging saves and loads it)
evidence = saved.from_json(EVIDENCE)  # the evidence from its JSON, every field checked (how a test builds one)
K = 3  # --accumulate: not the 2 workers, so that a rate scaled by one cannot pass for the other
EPOCHS = 2  # the first warms the rate up, the second runs at the scaled rate
RUN_ARGS = ["--epochs", str(EPOCHS), "--batch-size", str(BATCH), "--val-batch-size", str(BATCH), "--base-lr",
            str(BASE_LR), "--target-accuracy", "2", "--warmup-epochs", "1"]
PROFILE_DIR = "profile"  # relative: each rank runs in a folder of its own, so each rank's profile lands in its own
OPTIONS = (["--accumulate", str(K)], ["--sync-bn"], ["--precision", "bf16"], ["--profile-dir", PROFILE_DIR])
ELASTIC_TIMEOUT = 300.0  # seconds for the elastic run (about 60 s idle on the 2-core machine, 120 s when busy)
SAME_STATS = 1e-5  # relative spread of the ranks' moving statistics that counts as equal (float32 rounding)
LOW = frozenset({"bfloat16", "float16"})
ACCUMULATE = ("pass `backward_passes_per_step=args.accumulate` and `average_aggregated_gradients=True` to "
              "hvd.DistributedOptimizer")


def words(workers: int) -> lr_rule.Words:
    """How the learning-rate rule speaks of the batches one update averages: the workers' times the accumulated."""
    return lr_rule.Words(
        "rank", f"batches per update ({workers} workers × {K} accumulated)", "hvd.size() * args.accumulate",
        "`lr = args.base_lr * hvd.size() * args.accumulate`, the gradients averaged over the accumulated batches",
        "Horovod's LearningRateWarmupCallback to that rate, as in lab 2")


def upto(step: int) -> int:
    """Each step's run has the options of the steps before it: step k's run covers steps 1..k (step 5 adds a run
    of its own)."""
    return max(1, min(step, len(STEPS)))


def run_args(covers: int) -> list[str]:
    """The command line of the run that covers steps 1..``covers``."""
    return [*RUN_ARGS, *(a for option in OPTIONS[:covers] for a in option)]


def collect(script: Path, upto: int, timeout: float, work: Path) -> AtScaleEvidence:
    """Run ``script`` on 2 ranks under the probe with the options of steps 1..``upto``; a script that lacks the
    options of steps 2 and 3 still runs, for the steps before them."""
    args = run_args(upto)
    tolerate = tuple(option[0] for option in OPTIONS[1:upto])
    profiling = upto >= 4  # each rank in a folder of its own (as on separate nodes): whose profile is whose
    run = hr.run(script, args, work / "probe", work / "run", timeout, own_folders=profiling, epochs=EPOCHS,
                 tolerate=tolerate)
    profiles = {r: profiled(work / "run" / f"rank{r}" / PROFILE_DIR) for r in range(hr.NP)} if profiling else {}
    trains = len(run.states) == hr.NP and all(st.reached("train_end") for st in run.states.values())
    elastic = None
    if upto >= 5 and trains:  # a script that does not train to the end fails an earlier step
        elastic = elastic_run.run(script, work / "elastic", ELASTIC_TIMEOUT)
    return kept(run, AtScaleEvidence, lab="at-scale", args=args, profiles=profiles, elastic=elastic)


def profiled(folder: Path) -> Profiled:
    """What a rank's profile folder holds: its trace files, and the training steps of the newest."""
    found = step_profile.traces(folder)
    if not found:
        return Profiled()
    try:
        prof = step_profile.read(found[-1])
    except step_profile.ProfileError as e:
        return Profiled(len(found), error=str(e)[-300:])
    return Profiled(len(found), len(prof.steps), sum(s.collectives for s in prof.steps))


def _refused(ev: AtScaleEvidence, option: str) -> bool:
    """Whether the script does not have ``option``: its parser refused it, or the probe let it run without it."""
    if hr.ignored(ev, option):
        return True
    return any("unrecognized arguments" in f"{i.error}\n{i.log_tail}" and option in f"{i.error}\n{i.log_tail}"
               for i in ev.ranks.values())


FINISH_LAB_2 = "Finish lab 2 first (`labkit check horovod fashion_mnist.py`)"
BF16_WIRE = "DataType bfloat16 not in list of allowed values"  # Horovod's all-reduce refusing bfloat16


def _horovod_script(ev: AtScaleEvidence) -> None:
    """Fail unless every rank trained to the end as the lab's Horovod script; a crash is told with the options the
    run had."""
    hr.need(ev, "fit_start")
    if not all(ev.state(r).hvd.initialized for r in range(ev.np)):
        raise Failed(f"Horovod was not initialised: this lab continues your Horovod script of labs 2 and 8. "
                     f"{FINISH_LAB_2}.")
    try:
        hr.need(ev, "train_end")
    except Failed as e:
        errors = " ".join(s.error.message for s in ev.states.values() if s.error)
        if BF16_WIRE in errors:
            raise Failed(f"{e}\nHorovod cannot all-reduce bfloat16 tensors, and the gradients were bfloat16: the "
                         "variables were. Use the mixed policy, `set_global_policy(\"mixed_bfloat16\")`: the layers "
                         "compute in bfloat16 while the variables, and so the gradients, stay float32.") from None
        given = [a for a in ev.args if a.startswith("--")]
        later = [o[0] for o in OPTIONS[1:] if o[0] in given]
        if later:
            raise Failed(f"{e}\nThe check ran your script with {', '.join(later)} as well (the options of the steps "
                         "asked): `labkit check at-scale fashion_mnist.py --step 1` runs step 1's alone.") from None
        raise


@dataclass(frozen=True)
class Batch:
    """One training batch of a rank: how far its weights moved, the gradient tensors it all-reduced as the step ran,
    the norm of what came back, and its learning rate."""

    moved: float
    reduced: int
    norm: float
    lr: float | None


def _epochs(st: RankRecord) -> list[list[Batch]]:
    """Each epoch's training batches, in order."""
    return [[Batch(*row) for row in zip(ep.moved, ep.reduced, ep.reduced_norm, ep.lr, strict=False)]
            for ep in st.epochs]


def _numbers(flags: list[bool]) -> str:
    """The 1-based batch numbers where ``flags`` holds, as "2, 4, 6" (at most 8 shown)."""
    found = [str(i + 1) for i, f in enumerate(flags) if f]
    return ", ".join(found[:8]) + (", ..." if len(found) > 8 else "") if found else "none"


def _every_kth(batches: int) -> list[bool]:
    return [(i + 1) % K == 0 for i in range(batches)]


def _pattern(rank: int, batches: list[Batch]) -> None:
    """Fail unless ``rank`` all-reduced and updated its weights at every K-th batch and only then."""
    want = _every_kth(len(batches))
    reduced = [b.reduced > 0 for b in batches]
    if not any(reduced):
        raise Failed(f"rank {rank} all-reduced no gradients while training: its optimizer is not Horovod's. Keep "
                     "lab 2's `opt = hvd.DistributedOptimizer(opt)` and " + ACCUMULATE + ".")
    if all(reduced):
        raise Failed(f"with --accumulate {K} rank {rank} still all-reduced its gradients at every batch: add up the "
                     f"gradients of {K} batches on each worker first, then all-reduce them once: {ACCUMULATE}.")
    if reduced != want:
        raise Failed(f"with --accumulate {K} rank {rank} all-reduced gradients at batches {_numbers(reduced)}; "
                     f"once every {K} batches ({_numbers(want)}) is what accumulating {K} batches gives: {ACCUMULATE}.")
    # Rank 0's first batch is its own; another rank's weights also change at the first batch's end, when
    # rank 0's initial weights are broadcast to it.
    first = 0 if rank == 0 else 1
    moved = [b.moved != 0 and i >= first for i, b in enumerate(batches)]
    if moved[first:] != want[first:]:
        if all(moved[first:]):
            raise Failed(f"with --accumulate {K} rank {rank}'s weights changed at every batch, though its "
                         f"gradients were all-reduced only at batches {_numbers(reduced)}: the optimizer must apply "
                         f"them once per {K} batches: {ACCUMULATE}.")
        raise Failed(f"rank {rank}'s weights changed at batches {_numbers(moved)} and its gradients were all-reduced "
                     f"at batches {_numbers(reduced)}: with --accumulate {K} both happen together, once every {K} "
                     "batches.")


def _multiplier(rank: int, batches: list[Batch]) -> int:
    """How many times the optimizer's rate the update's rate per average gradient was: 1 (the K batches' gradients
    averaged) or K (summed). It reads the all-reduced tensor as the sum of the K batches' gradients, as Horovod's
    accumulation (``backward_passes_per_step``) all-reduces it."""
    if any(b.reduced and b.lr is None for b in batches):
        raise Failed(f"the learning rate of rank {rank}'s optimizer could not be read: give the optimizer a number, a "
                     "variable or a tf.keras.optimizers.schedules.LearningRateSchedule as learning_rate.")
    seen = [K * b.moved / (b.lr * b.norm) for i, b in enumerate(batches)
            if b.reduced and b.norm > 0 and b.lr and b.moved > 0 and (rank == 0 or i > 0)]
    if not seen:
        raise Failed(f"rank {rank}'s updates could not be measured: no batch both moved its weights and all-reduced "
                     "gradients.")
    ratio = float(np.median(seen))
    best = min((1, K), key=lambda c: abs(np.log(ratio / c)))
    if abs(np.log(ratio / best)) > np.log(1.15):
        raise Failed(f"each update moved rank {rank}'s weights {ratio:.2f} times the learning rate times the average "
                     f"gradient of the {K} accumulated batches: an update is expected to be the rate times that "
                     "average (or times the sum, with the rate not scaled for the accumulation). Keep the lab's plain "
                     "SGD optimizer, and " + ACCUMULATE + ".")
    return best


def _not_horovod(ev: AtScaleEvidence) -> str:
    """What to say first when the script never initialised Horovod: it is not yet lab 2's finished script."""
    if ev.states and all(s.hvd.initialized for s in ev.states.values()):
        return ""
    return (" Horovod was not initialised before the script stopped: this lab continues your Horovod script of labs "
            f"2 and 8; if it is not finished yet, {FINISH_LAB_2.lower()}.")


def step_1(ev: AtScaleEvidence) -> str:
    if _refused(ev, OPTIONS[0][0]):
        raise Failed("the script does not accept --accumulate (argparse: unrecognized arguments): add "
                     "`p.add_argument(\"--accumulate\", type=int, default=1)` to parse_args; then " + ACCUMULATE +
                     ", and multiply the learning rate by args.accumulate too." + _not_horovod(ev))
    _horovod_script(ev)
    rates: dict[str, list[list[float | None]]] = {}
    multipliers = set()
    for r in range(ev.np):
        epochs = _epochs(ev.state(r))
        batches = [b for ep in epochs for b in ep]
        if len(batches) < 2 * K:
            raise Failed(f"rank {r} trained {len(batches)} batches: too few to see {K} batches accumulated (the check "
                         f"runs {EPOCHS} epochs; keep `steps_per_epoch` as lab 2 has it).")
        _pattern(r, batches)
        m = _multiplier(r, batches)
        multipliers.add(m)
        rates[f"rank {r}"] = [[b.lr * m if b.lr is not None else None for b in ep if b.reduced] for ep in epochs]
    summed = multipliers != {1}
    try:
        said = lr_rule.judge(rates, BASE_LR, ev.np * K, words(ev.np))
    except Failed as e:
        if summed:
            raise Failed(f"{e} (Your gradients were summed over the {K} batches, not averaged, so each update used {K} "
                         "times the optimizer's rate: that effective rate is the one judged.)") from None
        raise
    said = said.replace("at the first batch", "at the first update")
    return (f"each rank all-reduced and applied its gradients once every {K} batches "
            f"({'summed' if summed else 'averaged'} over them); the effective rate: {said}")


def _stats(ev: AtScaleEvidence, rank: int, moment: str) -> np.ndarray | None:
    w = hr.weights(ev, rank)
    return w.get(f"stats_{moment}")


def step_2(ev: AtScaleEvidence) -> str:
    if _refused(ev, OPTIONS[1][0]):
        raise Failed("the script does not accept --sync-bn: add `p.add_argument(\"--sync-bn\", action=\"store_true\")` "
                     "to parse_args; then, when it is set, build the model's BatchNormalization layers as "
                     "`horovod.tensorflow.SyncBatchNormalization`.")
    _horovod_script(ev)
    model = ev.state(0).model
    if model is not None and not model.non_trainable:
        raise Failed("the model has no moving statistics (non-trainable variables) to compare: keep the "
                     "WideResNet's BatchNormalization layers, and with --sync-bn make them SyncBatchNormalization.")
    start, b1, end = (_stats(ev, 0, m) for m in ("init", "b1", "final"))
    if start is None or b1 is None or end is None:
        raise Failed("the ranks' moving statistics were not recorded: training did not get past its second batch.")
    if hr.rel(start, end) == 0:
        raise Failed("the moving statistics never changed while training: BatchNormalization must update them "
                     "(keep its momentum below 1).")
    for r in range(1, ev.np):
        for moment, ref, what in (("b1", b1, "after the second batch"), ("final", end, "at the end of training")):
            theirs = _stats(ev, r, moment)
            spread = hr.rel(ref, theirs) if theirs is not None else 1.0
            if spread > SAME_STATS:
                raise Failed(
                    f"with --sync-bn rank {r}'s BatchNorm moving statistics differ from rank 0's {what} (relative "
                    f"difference {spread:.2g}): each worker normalised with the mean and variance of its own batch. "
                    "When args.sync_bn is set, build the BatchNormalization layers as "
                    "`horovod.tensorflow.SyncBatchNormalization` (give each a name of its own): it all-reduces the "
                    "statistics over the workers. Keras's SyncBatchNormalization synchronises only under a "
                    "tf.distribute strategy, not across Horovod's processes.")
    return ("every rank's moving statistics were the same after the second batch and at the end of training: each "
            "BatchNorm layer normalised with the global batch's statistics")


def step_3(ev: AtScaleEvidence) -> str:
    if _refused(ev, OPTIONS[2][0]):
        raise Failed("the script does not accept --precision: add `p.add_argument(\"--precision\", "
                     "choices=[\"fp32\", \"bf16\", \"fp16\"], default=\"fp32\")`; with bf16, call "
                     "`tf.keras.mixed_precision.set_global_policy(\"mixed_bfloat16\")` before building the model.")
    _horovod_script(ev)
    counted = ""
    for r in range(ev.np):
        model = ev.state(r).model
        if model is None:
            raise Failed(f"the dtypes of rank {r}'s model could not be read.")
        weighted = [layer for layer in model.layers if _floating(layer.variables)]
        low = [layer for layer in weighted if layer.compute in LOW]
        if not low:
            raise Failed(f"with --precision bf16 every layer of rank {r}'s model computed in float32: call "
                         "`tf.keras.mixed_precision.set_global_policy(\"mixed_bfloat16\")` when args.precision is "
                         "bf16, before the model is built (each layer takes the policy when it is created).")
        if any(layer.compute == "float16" for layer in low):
            raise Failed(f"with --precision bf16 rank {r}'s layers computed in float16: bf16 asks for bfloat16 "
                         "(\"mixed_bfloat16\"); float16 (\"mixed_float16\") is for --precision fp16 on a GPU.")
        full = [layer.name for layer in weighted if layer.compute == "float32"]
        if len(full) > len(low):
            raise Failed(f"with --precision bf16 most of rank {r}'s layers ({', '.join(full[:4])}, ...) still computed "
                         "in float32: set the policy before any layer is created; only the last layer should keep "
                         "float32.")
        narrow = {d for layer in weighted for d in _floating(layer.variables)} - {"float32"}
        if narrow:
            names = sorted({layer.name for layer in weighted if set(_floating(layer.variables)) & narrow})
            kept = "/".join(sorted(narrow))
            raise Failed(f"rank {r}'s layers {', '.join(names[:4])} keep their variables in {kept}: "
                         "use the mixed policy \"mixed_bfloat16\" (bfloat16 compute, float32 variables), not "
                         "\"bfloat16\": updates too small for bfloat16's 7 bits of mantissa would be lost.")
        # A model built by subclassing has no symbolic outputs: its last layer's dtype is what it returns.
        outputs = model.outputs if model.outputs is not None else [weighted[-1].compute or "?"] if weighted else []
        if any(d != "float32" for d in outputs):
            raise Failed(f"with --precision bf16 rank {r}'s model returns {'/'.join(outputs)}: give its last layer "
                         "`dtype=\"float32\"`, so that the softmax and the loss are computed in float32.")
        counted = f"{len(low)} of the model's {len(weighted)} layers with variables"
    return (f"{counted} computed in bfloat16, every variable was float32, and so was the model's output, on every "
            "rank")


def _floating(dtypes: list[str]) -> list[str]:
    """The floating-point dtypes among a layer's variables (a counter kept as an integer is no precision)."""
    return [d for d in dtypes if "float" in d]


PROFILE = ("start the profiler on rank 0 only (`hvd.rank() == 0`) at a training batch, "
           "`tf.profiler.experimental.start(args.profile_dir)`, and stop it a few batches later, "
           "`tf.profiler.experimental.stop()` (a callback's on_train_batch_begin and on_train_batch_end)")


def step_4(ev: AtScaleEvidence) -> str:
    if _refused(ev, OPTIONS[3][0]):
        raise Failed("the script does not accept --profile-dir: add `p.add_argument(\"--profile-dir\", default=\"\")` "
                     "to parse_args; when it is given, " + PROFILE + ".")
    _horovod_script(ev)
    mine = ev.profiles.get(0, Profiled())
    if mine.error:
        raise Failed(f"rank 0's profile could not be read: {mine.error}")
    if not mine.files:
        raise Failed(f"rank 0 wrote no profile into --profile-dir (the check ran your script with `--profile-dir "
                     f"{PROFILE_DIR}` for {EPOCHS} epochs of a few batches each): {PROFILE}. TensorFlow writes the "
                     "trace when the profiler stops: a profiler never stopped leaves nothing.")
    if not mine.steps:
        raise Failed("rank 0's profile holds no training step: the profiler ran before or after fit's batches, not "
                     "during them; " + PROFILE + ".")
    others = [r for r, p in sorted(ev.profiles.items()) if r != 0 and p.files]
    if others:
        raise Failed(f"rank {others[0]} wrote a profile too: profile on rank 0 only (`if args.profile_dir and "
                     "hvd.rank() == 0`). Every rank waits for the others at each all-reduce, so one rank's steps "
                     "show the job's, and ranks sharing a host would write the same file.")
    return (f"rank 0 profiled {mine.steps} training step(s) into --profile-dir ({mine.collectives} Horovod "
            "collective(s) started in them), and no other rank profiled")


def step_5(ev: AtScaleEvidence) -> str:
    el = ev.elastic
    if el is not None and el.refused:
        raise Failed("the script does not accept --elastic: add `p.add_argument(\"--elastic\", action=\"store_true\")` "
                     "to parse_args; then, " + elastic_judge.ELASTIC + ".")
    _horovod_script(ev)
    if el is None:
        raise Failed("the elastic run was not made: the probed run did not train to the end on both ranks.")
    return elastic_judge.judge(el)


STEPS = [step_1, step_2, step_3, step_4, step_5]
