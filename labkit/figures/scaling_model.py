"""Two small models lab 6 reasons with: the lab's learning-rate schedule, and the efficiency of a
step when the gradient all-reduce does not overlap the compute."""

from __future__ import annotations

DECAY_EPOCHS = (15, 25, 35)  # the lab's schedule: the rate divided by 10 at each of these epochs


def step_decay(epoch: int, lr: float, at: tuple[int, ...] = DECAY_EPOCHS) -> float:
    """``lr`` divided by 10 at every epoch of ``at`` reached."""
    return lr * 0.1 ** sum(epoch >= e for e in at)


def learning_rate(epoch: float, workers: int, base_lr: float = 0.01, warmup_epochs: int = 3) -> float:
    """The lab's rate at ``epoch`` on ``workers`` workers: scaled by the workers (the linear scaling rule),
    ramped up from ``base_lr`` over the first ``warmup_epochs`` (Horovod's warm-up), then the step decay."""
    scaled = base_lr * workers
    if epoch < warmup_epochs:
        return base_lr * (epoch * (workers - 1) / warmup_epochs + 1)
    return step_decay(int(epoch), scaled)


def ring_allreduce_s(grad_bytes: float, workers: int, bandwidth: float, latency_s: float = 1e-4) -> float:
    """Seconds a ring all-reduce of ``grad_bytes`` takes on ``workers`` workers: ``2 (N-1)`` steps (N-1 of
    reduce-scatter, N-1 of all-gather), each paying ``latency_s`` and sending ``1/N`` of the bytes at
    ``bandwidth`` bytes/s, so ``2 (N-1) × latency + 2 (N-1)/N × bytes / bandwidth`` in all."""
    if workers == 1:
        return 0.0
    steps = 2 * (workers - 1)
    return steps * latency_s + steps / workers * grad_bytes / bandwidth


def efficiency(compute_s: float, grad_bytes: float, workers: int, bandwidth: float, latency_s: float = 1e-4) -> float:
    """Share of a step spent computing on ``workers`` workers when the ring all-reduce of ``grad_bytes``
    (:func:`ring_allreduce_s`) follows the compute."""
    if workers == 1:
        return 1.0
    return compute_s / (compute_s + ring_allreduce_s(grad_bytes, workers, bandwidth, latency_s))
