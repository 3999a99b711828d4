"""Lab 8's exercise, judged from one probed 2-rank run: with ``--fp16-allreduce`` the learner's Horovod script
all-reduces its gradients as float16.

:func:`collect` runs the script as the Horovod lab's check does (:func:`labkit.check.hvd_runs.run`: 2 ranks, a
tiny slice of data, one epoch), with ``--fp16-allreduce``, and adds what each rank handed Horovod's all-reduce
(:mod:`labkit.instrument.probe_allreduce`): the dtypes of the gradients all-reduced in the training step, and of
the rest. The judge reads only that dtype, so every correct spelling passes: ``compression=hvd.Compression.fp16``,
a compressor class of the script's own, the compression chosen in a variable. A script that casts its gradients
elsewhere but still all-reduces float32, or ignores the flag, fails and is told what to pass; one that does not
accept the option (argparse refuses it, and the run ends in seconds) is told to add it.

Only the run with the flag is judged. That the gradients stay float32 without it would take a second probed run
(about 20 s on 2 cores), and the Horovod lab's check, which does run the script without the flag, runs in a
process of its own (``labkit grade`` checks each lab apart), so its evidence is not at hand here. One run keeps
``labkit grade`` fast; the notebook says what the flag must leave as it was.
"""

from __future__ import annotations

from pathlib import Path

from labkit.check import hvd_runs as hr
from labkit.check.lab_horovod import ARGS as HOROVOD_ARGS
from labkit.check.verdict import Failed
from labkit.instrument import probe_allreduce
from labkit.records import evidence as saved
from labkit.records.hvd_evidence import CommunicationEvidence, kept
from labkit.records.hvd_probe import Allreduced

EVIDENCE = CommunicationEvidence  # what collect returns and the judges read (labkit.check.judging saves and loads it)
evidence = saved.from_json(EVIDENCE)  # the evidence from its JSON, every field checked (how a test builds one)
FLAG = "--fp16-allreduce"
ARGS = [*HOROVOD_ARGS, FLAG]
HALF = "float16"
FIX = "pass `compression=hvd.Compression.fp16` to hvd.DistributedOptimizer when args.fp16_allreduce is set"


def upto(step: int) -> int:
    """The one step comes from the one run."""
    return 1


def collect(script: Path, upto: int, timeout: float, work: Path) -> CommunicationEvidence:
    """Run ``script --fp16-allreduce`` on 2 ranks under the probe; the evidence of :func:`hvd_runs.run` plus
    ``allreduce``, each rank's record of what it all-reduced, by dtype."""
    out = work / "probe"
    run = hr.run(script, ARGS, out, work / "run", timeout)
    unreadable = [run.unreadable] if run.unreadable else []
    allreduce = read(out, run.np, unreadable)
    return kept(run, CommunicationEvidence, lab="communication", args=list(ARGS), allreduce=allreduce,
                unreadable=unreadable[0] if unreadable else None)


def read(out: Path, np: int, unreadable: list[str] | None = None) -> dict[int, Allreduced]:
    """Each rank's all-reduce record (:mod:`labkit.instrument.probe_allreduce`), by rank; a rank without one is
    left out (one of the wrong shape too, named in ``unreadable``)."""
    records = {}
    for r in range(np):
        record = saved.record(Allreduced, out / probe_allreduce.file_name(r), unreadable)
        if record is not None:
            records[r] = record
    return records


def refused(ev: CommunicationEvidence) -> bool:
    """Whether the script's argument parser refused the option (argparse: "unrecognized arguments")."""
    for info in ev.ranks.values():
        said = f"{info.error}\n{info.log_tail}"
        if "unrecognized arguments" in said and FLAG in said:
            return True
    return False


def _counted(by_dtype: dict[str, int]) -> str:
    """``{"float16": 20, "float32": 6}`` as "20 as float16 and 6 as float32"."""
    parts = [f"{n} as {dtype}" for dtype, n in sorted(by_dtype.items(), key=lambda kv: (-kv[1], kv[0]))]
    return " and ".join(parts)


def _not_half(rank: int, grads: dict[str, int]) -> str:
    """What to change when some gradients of ``rank`` crossed the wire in another dtype than float16."""
    total = sum(grads.values())
    if set(grads) == {"float32"}:
        return (f"with {FLAG} the gradients were still all-reduced as float32: {FIX} (rank {rank} sent all {total} "
                "as float32). Casting the gradients elsewhere does not change what Horovod sends: it all-reduces "
                "what the optimizer's compression gives it.")
    if HALF in grads:
        return (f"with {FLAG} rank {rank} all-reduced {_counted(grads)} of its {total} gradient tensors: every "
                f"gradient should cross as float16 ({FIX}).")
    return (f"with {FLAG} rank {rank} all-reduced its gradients {_counted(grads)}: the option asks for float16, "
            "Horovod's `hvd.Compression.fp16`.")


def step_1(ev: CommunicationEvidence) -> str:
    if refused(ev):
        alone = not all(s.hvd.initialized for s in ev.states.values()) or not ev.states
        raise Failed(f"the script does not accept {FLAG} (argparse: unrecognized arguments): add the {FLAG} option "
                     "to parse_args, e.g. `p.add_argument(\"--fp16-allreduce\", action=\"store_true\")`; then, "
                     "when it is set, pass `compression=hvd.Compression.fp16` to hvd.DistributedOptimizer."
                     + (" Horovod was not initialised before the script stopped: if this is not yet your Horovod "
                        "script of lab 2, finish that lab first." if alone else ""))
    hr.need(ev, "batch1_end")
    n = ev.np
    if not all(ev.state(r).hvd.initialized for r in range(n)):
        raise Failed("Horovod was not initialised: this exercise continues your Horovod script of lab 2. Finish "
                     "its eight steps first (`labkit check horovod fashion_mnist.py`).")
    records = ev.allreduce
    broken = next((rec.error for rec in records.values() if rec.error), None)
    if broken:
        raise Failed(f"the check could not see what Horovod all-reduced: {broken}.")
    for r in range(n):
        rec = records.get(r)
        grads = {d: k for d, k in ((rec.gradients or {}) if rec else {}).items() if k}
        if not grads:
            raise Failed(f"rank {r} all-reduced no gradients in the training step: its optimizer is not Horovod's. "
                         "Wrap it as in lab 2 (step 3), `opt = hvd.DistributedOptimizer(opt)`, and with "
                         f"{FLAG} pass it `compression=hvd.Compression.fp16`.")
        if set(grads) != {HALF}:
            raise Failed(_not_half(r, grads))
    per_rank = sum((records[0].gradients or {}).values())
    return (f"each rank all-reduced its {per_rank} gradient tensors as float16, half the bytes of float32 (the check "
            f"runs with {FLAG} only: without it they should stay float32).")


STEPS = [step_1]
