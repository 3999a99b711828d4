"""Horovod's optimizer knobs set from outside a script (``labkit bench --optimizer compression=fp16``), to measure
what they do to throughput and accuracy without editing the script; installed by the observer
(:mod:`labkit.instrument.observe`).

``compression=none|fp16`` and ``backward_passes_per_step=K`` become the defaults of every
``hvd.DistributedOptimizer(...)`` the script builds (``horovod.tensorflow.keras`` or ``horovod.keras``); an
argument the script passes itself wins (and one this optimizer does not take is left out: ``horovod.keras`` has no
``backward_passes_per_step``); the record says which were applied.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

MODULES = ("horovod.tensorflow.keras", "horovod.keras")


def parse(spec: str) -> dict[str, Any]:
    """``"compression=fp16,backward_passes_per_step=2"`` as keyword values; :class:`ValueError` otherwise."""
    out: dict[str, Any] = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, sep, value = part.partition("=")
        if name == "compression" and sep and value in ("none", "fp16"):
            out[name] = value
        elif name == "backward_passes_per_step" and sep and value.isdigit() and int(value) >= 1:
            out[name] = int(value)
        else:
            raise ValueError(f"bad optimizer knob {part!r}: use compression=none|fp16 or backward_passes_per_step=K")
    if not out:
        raise ValueError("no optimizer knob given: use compression=none|fp16 or backward_passes_per_step=K")
    return out


def hooks(knobs: dict[str, Any], applied: Callable[[dict[str, Any]], None]) -> dict[str, Callable[[Any], None]]:
    """Module patches giving ``DistributedOptimizer`` these defaults; ``applied(kwargs)`` notes each use."""

    def patch(module: Any) -> None:
        real = module.DistributedOptimizer
        signature = inspect.signature(real)

        def DistributedOptimizer(*a: Any, **k: Any) -> Any:  # noqa: N802 - stands for Horovod's own
            try:
                passed = signature.bind_partial(*a, **k).arguments
            except TypeError:  # Horovod's own error, as without the knobs
                return real(*a, **k)
            given = {name: value for name, value in knobs.items()
                     if name in signature.parameters and name not in passed}
            for name, value in given.items():
                k[name] = getattr(module.Compression, value) if name == "compression" else value
            applied(given)
            return real(*a, **k)

        module.DistributedOptimizer = DistributedOptimizer

    return dict.fromkeys(MODULES, patch)


def from_spec(spec: str) -> tuple[dict[str, Any], dict[str, Callable[[Any], None]]]:
    """What the record notes (the knobs each optimizer received, filled in as the script builds them) and the
    module patches for ``LABKIT_OPTIMIZER=...``; :class:`ValueError` otherwise."""
    applied: dict[str, Any] = {}
    return applied, hooks(parse(spec), applied.update)
