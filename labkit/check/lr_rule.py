"""The learning-rate step both data-parallel labs end with: scale the rate by the workers, warm it up.

The probes record the rate of every training batch, read from the optimizer after the
script's own callbacks ran (:func:`labkit.instrument.keras_reads.learning_rate`: a variable set by any
callback, or a ``LearningRateSchedule`` at the optimizer's step), so any way of setting it
is judged alike. The check runs the script with ``--base-lr BASE`` (the lab's "learning
rate for a single worker") on ``n`` workers for several epochs; it then asks that

* every worker used the same rate at every step;
* the rate rose to ``BASE * n`` (the linear scaling rule: each step averages ``n``
  batches, a global batch ``n`` times larger), and no higher;
* it started below that and rose steadily to it (the warm-up), within the run.

After the warm-up the rate may stay or decay (a schedule's later decays are the script's
choice); it must have reached ``BASE * n``.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.check.verdict import Failed

RTOL = 1e-3  # float32 rates, schedules' arithmetic


@dataclass(frozen=True)
class Words:
    """How a lab names its workers and says what to change."""

    who: str  # "rank", "worker"
    many: str  # "workers", "replicas"
    count: str  # the expression for their number: "hvd.size()"
    scale: str  # how to scale
    warmup: str  # how to warm up


def close(a: float, b: float, rtol: float = RTOL) -> bool:
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-12)


def _checked(rates: dict[str, list[list[float | None]]]) -> dict[str, list[list[float]]]:
    out = {}
    for name, epochs in rates.items():
        if not any(epochs):
            raise Failed(f"{name} recorded no training batch, so its learning rate could not be seen.")
        if any(r is None for ep in epochs for r in ep):
            raise Failed(f"the learning rate of {name}'s optimizer could not be read: give the optimizer a number, "
                         "a variable or a tf.keras.optimizers.schedules.LearningRateSchedule as learning_rate.")
        out[name] = [[float(r) for r in ep] for ep in epochs]
    return out


def _same_everywhere(rates: dict[str, list[list[float]]], w: Words) -> None:
    names = list(rates)
    ref = names[0]
    for other in names[1:]:
        for e, (mine, theirs) in enumerate(zip(rates[ref], rates[other], strict=False)):
            for i, (a, b) in enumerate(zip(mine, theirs, strict=False)):
                if not close(a, b, 1e-5):
                    raise Failed(
                        f"in epoch {e + 1}, batch {i + 1}, {other} trained with a learning rate of {b:.4g} while "
                        f"{ref} used {a:.4g}: every {w.who} must use the same rate. Compute it from the number of "
                        f"{w.many} ({w.count}), which every {w.who} knows, not from a {w.who}'s own index.")


def judge(rates: dict[str, list[list[float | None]]], base: float, n: int, w: Words) -> str:
    """Pass (a summary) or raise :class:`Failed` saying what to change; ``rates[name][epoch]`` per batch."""
    clean = _checked(rates)
    _same_everywhere(clean, w)
    epochs = [ep for ep in next(iter(clean.values())) if ep]
    seq = [r for ep in epochs for r in ep]
    target, peak, first = base * n, max(seq), seq[0]
    rule = f"--base-lr {base:g} × {n} {w.many} = {target:g}"
    if close(peak, base) and n > 1:
        raise Failed(
            f"the learning rate never rose above --base-lr ({base:g}) on any {w.who}. With {n} {w.many} each step "
            f"averages the gradients of {n} batches, a global batch {n} times larger, so scale the rate as much "
            f"({rule}): {w.scale}. Then ramp it up to that over the first epochs: {w.warmup}.")
    if peak > target * (1 + RTOL):
        raise Failed(f"the learning rate reached {peak:.4g}, above {rule}: scale it by the number of {w.many} "
                     f"once ({w.scale}).")
    if not close(peak, target):
        last_epoch, before = epochs[-1], epochs[-2][-1] if len(epochs) > 1 else epochs[-1][0]
        if last_epoch and (last_epoch[-1] > before * (1 + 1e-6) or last_epoch[-1] > last_epoch[0] * (1 + 1e-6)):
            raise Failed(f"after the check's {len(epochs)} epochs the learning rate was still rising "
                         f"({last_epoch[-1]:.4g}, short of {rule}): warm up over at most {len(epochs) - 1} "
                         f"epochs, to the scaled rate ({w.scale}).")
        raise Failed(f"the learning rate rose to {peak:.4g} at most, but {rule}: {w.scale}.")
    if close(first, target):
        raise Failed(
            f"the scaled rate {target:g} was used from the very first batch: no warm-up. A rate {n} times larger "
            "applied to the random initial weights can make training diverge; start lower (e.g. at --base-lr) "
            f"and ramp it up over the first epochs: {w.warmup}.")
    reached = next(i for i, r in enumerate(seq) if close(r, target))
    for i in range(1, reached + 1):
        if seq[i] < seq[i - 1] * (1 - 1e-6):
            raise Failed(f"during the warm-up the learning rate fell from {seq[i - 1]:.4g} to {seq[i]:.4g}: it should "
                         f"rise steadily from its first value to {target:g}.")
    at = 0
    while reached >= len(epochs[at]):
        reached -= len(epochs[at])
        at += 1
    return (f"the learning rate rose from {first:.4g} at the first batch to {rule} in epoch {at + 1}, "
            f"the same on every {w.who}.")
