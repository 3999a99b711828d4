"""Smaller data and narrower convolutions from outside a script (``labkit bench --shrink TRAIN,TEST,DIVISOR``),
for benchmarking a full-size script on a CPU; installed by the observer (:mod:`labkit.instrument.observe`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from labkit.instrument.hooks import conv, dataset


def parse(spec: str) -> tuple[int, int, int]:
    """``TRAIN,TEST,DIVISOR`` as three numbers; :class:`ValueError` otherwise."""
    train, test, divisor = (int(v) for v in spec.split(","))
    return train, test, divisor


def shrink_filters(filters: int, divisor: int) -> int:
    """Conv2D filters after ``--shrink``: divided, but not below 16 (nor above the original)."""
    return max(min(filters, 16), filters // max(1, divisor))


def hooks(train: int, test: int, divisor: int) -> dict[str, Callable[[Any], None]]:
    """The module patches that shrink: the data set's first ``train``/``test`` images, Conv2D's filters
    (:mod:`labkit.instrument.hooks.dataset`, :mod:`labkit.instrument.hooks.conv`)."""

    def first(real: Any) -> Any:
        def load_data(*a: Any, **k: Any) -> Any:
            (x, y), (xt, yt) = real(*a, **k)
            return (x[:train] if train else x, y[:train] if train else y), (
                xt[:test] if test else xt, yt[:test] if test else yt)

        return load_data

    out: dict[str, Callable[[Any], None]] = {dataset.MODULE: dataset.hook(first)}
    if divisor > 1:
        out[conv.MODULE] = conv.hook(lambda filters: shrink_filters(filters, divisor))
    return out


def from_spec(spec: str) -> tuple[dict[str, int], dict[str, Callable[[Any], None]]]:
    """What the record notes and the module patches for ``LABKIT_SHRINK=TRAIN,TEST,DIVISOR``; :class:`ValueError`
    with the expected form otherwise."""
    try:
        train, test, divisor = parse(spec)
    except ValueError:
        raise ValueError(f"bad LABKIT_SHRINK={spec!r}: want TRAIN,TEST,DIVISOR") from None
    return {"train": train, "test": test, "width_divisor": divisor}, hooks(train, test, divisor)
