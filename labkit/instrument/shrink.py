"""Smaller data and narrower convolutions from outside a script (``labkit bench --shrink TRAIN,TEST,DIVISOR``),
for benchmarking a full-size script on a CPU; installed by the observer (:mod:`labkit.instrument.observe`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def parse(spec: str) -> tuple[int, int, int]:
    """``TRAIN,TEST,DIVISOR`` as three numbers; :class:`ValueError` otherwise."""
    train, test, divisor = (int(v) for v in spec.split(","))
    return train, test, divisor


def shrink_filters(filters: int, divisor: int) -> int:
    """Conv2D filters after ``--shrink``: divided, but not below 16 (nor above the original)."""
    return max(min(filters, 16), filters // max(1, divisor))


def hooks(train: int, test: int, divisor: int) -> dict[str, Callable[[Any], None]]:
    """The module patches that shrink: the data set's first ``train``/``test`` images, Conv2D's filters."""

    def data(module: Any) -> None:
        real = module.load_data

        def load_data(*a: Any, **k: Any) -> Any:
            (x, y), (xt, yt) = real(*a, **k)
            return (x[:train] if train else x, y[:train] if train else y), (
                xt[:test] if test else xt, yt[:test] if test else yt)

        module.load_data = load_data

    def conv(module: Any) -> None:
        cls = module.Conv2D
        real_init = cls.__init__

        def __init__(self: Any, filters: int, *a: Any, **k: Any) -> None:
            real_init(self, shrink_filters(int(filters), divisor), *a, **k)

        cls.__init__ = __init__

    out: dict[str, Callable[[Any], None]] = {"tf_keras.src.datasets.fashion_mnist": data}
    if divisor > 1:
        out["tf_keras.src.layers.convolutional.conv2d"] = conv
    return out


def from_spec(spec: str) -> tuple[dict[str, int], dict[str, Callable[[Any], None]]]:
    """What the record notes and the module patches for ``LABKIT_SHRINK=TRAIN,TEST,DIVISOR``; :class:`ValueError`
    with the expected form otherwise."""
    try:
        train, test, divisor = parse(spec)
    except ValueError:
        raise ValueError(f"bad LABKIT_SHRINK={spec!r}: want TRAIN,TEST,DIVISOR") from None
    return {"train": train, "test": test, "width_divisor": divisor}, hooks(train, test, divisor)
