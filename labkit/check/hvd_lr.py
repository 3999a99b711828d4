"""Step 8 of the Horovod lab (the learning rate scaled and warmed up), and a crash it explains.

The check's last probed run trains ``LR_EPOCHS`` epochs with ``--base-lr BASE_LR``; each rank
records the rate of every training batch, which :mod:`labkit.check.lr_rule` judges.
Horovod's warm-up callback with its default ``momentum_correction=True`` crashes the first
training step of tf-keras 2.x optimizers: :func:`explained` says so whatever step the crash
shows up in (the first run already trains with the callback).
"""

from __future__ import annotations

from typing import Any

from labkit.check import hvd_runs as hr
from labkit.check import lr_rule
from labkit.check.hvd_runs import BATCH
from labkit.check.verdict import Failed
from labkit.records.hvd_evidence import HorovodEvidence

# Step 8's run: --base-lr unlike any mode's default, epochs enough for a 5-epoch warm-up (NVIDIA's lab),
# a target accuracy no run reaches (training must not stop early).
BASE_LR, LR_EPOCHS = 0.02, 6


def lr_args(epochs: int = LR_EPOCHS) -> list[str]:
    """The learning-rate run's command line, for ``epochs`` epochs."""
    return ["--epochs", str(epochs), "--batch-size", str(BATCH), "--val-batch-size", str(BATCH),
            "--base-lr", str(BASE_LR), "--target-accuracy", "2"]


LR_ARGS = lr_args()
WORDS = lr_rule.Words(
    "rank", "workers", "hvd.size()", "`lr = args.base_lr * hvd.size()` for the optimizer",
    "`hvd.callbacks.LearningRateWarmupCallback(initial_lr=lr, warmup_epochs=args.warmup_epochs, "
    "momentum_correction=False)` (or a LearningRateScheduler that ramps from args.base_lr)")


MOMENTUM = ("This crash comes from Horovod's learning-rate callback: by default (momentum_correction=True) it assigns "
            "to optimizer.momentum, which tf-keras 2.x optimizers keep as a plain float, so the first training step "
            "fails. Pass `momentum_correction=False` to LearningRateWarmupCallback.")


def momentum_crash(ev: HorovodEvidence) -> bool:
    """Whether a rank of any run crashed in Horovod's momentum correction."""
    tracebacks = [s.error.traceback for run in ev.runs() for s in run.states.values() if s.error]
    return any("_adjust_learning_rate" in tb and "momentum" in tb for tb in tracebacks)


def explained(judge: Any) -> Any:
    """``judge``, its failures completed with the cause of a crash that shows far from its step."""

    def run(ev: HorovodEvidence) -> str:
        try:
            return judge(ev)
        except Failed as e:
            if momentum_crash(ev):
                raise Failed(f"{e} {MOMENTUM}") from None
            raise

    run.__name__ = judge.__name__
    return run


def step_8(ev: HorovodEvidence) -> str:
    run = ev.lr_run
    if run is None:
        raise Failed("the learning-rate run did not happen: steps 1-7 must pass first.")
    logs = " ".join(i.log_tail + i.error for i in run.ranks.values())
    if "unrecognized arguments" in logs:
        raise Failed(f"the check runs your script with `{' '.join(LR_ARGS)}` (the lab's command line), and it "
                     "refused an argument: keep the starter's arguments.")
    hr.need(run, "train_end")
    rates = {f"rank {r}": [ep.lr for ep in run.state(r).epochs] for r in range(run.np)}
    done = len(rates["rank 0"])
    if done < LR_EPOCHS:
        raise Failed(f"training stopped after {done} of the {LR_EPOCHS} epochs the check asked for (--epochs "
                     f"{LR_EPOCHS}), too soon to see the warm-up end.")
    return lr_rule.judge(rates, BASE_LR, run.np, WORDS)

