"""The lab's WideResNet for 28x28 grey images.

Depth 16 means two residual blocks per stage; the widen factor ``k`` sets the
stage widths to 16k/32k/64k channels (k=10: 160/320/640, about 17.1 M
parameters). Small mode uses a narrow net so that CPUs train an epoch in seconds.
"""

from __future__ import annotations

from typing import Any

FULL_WIDEN = 10
SMALL_WIDEN = 1
DEPTH = 16
DROPOUT = 0.01
# Keras' default (0.99) leaves the moving statistics near their initial values after
# the ~100 steps of a small-mode epoch, so evaluation (which uses them) scores near
# chance although training accuracy is fine. 0.9 settles within a few dozen steps.
BN_MOMENTUM = 0.9


def stage_widths(widen_factor: int) -> tuple[int, int, int]:
    """Channels of the three stages for a widen factor."""
    if widen_factor < 1:
        raise ValueError(f"widen factor must be >= 1, got {widen_factor}")
    return 16 * widen_factor, 32 * widen_factor, 64 * widen_factor


def build(
    widen_factor: int = FULL_WIDEN,
    num_classes: int = 10,
    weight_decay: float = 0.0,
    dropout: float = DROPOUT,
    input_shape: tuple[int, int, int] = (28, 28, 1),
) -> Any:
    """An uncompiled WRN-16-k ``tf.keras.Model`` with a softmax head."""
    import tensorflow as tf

    layers = tf.keras.layers
    reg = tf.keras.regularizers.l2(weight_decay) if weight_decay else None

    def conv(x: Any, filters: int, size: int) -> Any:
        return layers.Conv2D(filters, size, padding="same", kernel_regularizer=reg)(x)

    def cbr(x: Any, filters: int) -> Any:
        x = conv(x, filters, 3)
        x = layers.BatchNormalization(momentum=BN_MOMENTUM)(x)
        return layers.Activation("relu")(x)

    def block(x: Any, filters: int, project: bool) -> Any:
        shortcut = conv(x, filters, 1) if project else x
        y = cbr(x, filters)
        y = layers.Dropout(dropout)(y)
        y = cbr(y, filters)
        return layers.Add()([shortcut, y])

    per_stage = (DEPTH - 4) // 6
    inputs = layers.Input(shape=input_shape)
    x = cbr(inputs, 16)
    for i, width in enumerate(stage_widths(widen_factor)):
        if i:
            x = layers.MaxPooling2D(2)(x)
        for j in range(per_stage):
            x = block(x, width, project=(j == 0))
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(num_classes, activation="softmax", kernel_regularizer=reg)(x)
    return tf.keras.Model(inputs, outputs, name=f"wrn_{DEPTH}_{widen_factor}")


def count_params(widen_factor: int) -> int:
    """Trainable and non-trainable parameters of WRN-16-k, computed without TensorFlow."""
    total = 0
    c_in = 1

    def conv(cin: int, cout: int, k: int) -> int:
        return cin * cout * k * k + cout

    total += conv(c_in, 16, 3) + 4 * 16
    c_in = 16
    for width in stage_widths(widen_factor):
        for j in range((DEPTH - 4) // 6):
            if j == 0:
                total += conv(c_in, width, 1)
            total += conv(c_in, width, 3) + 4 * width + conv(width, width, 3) + 4 * width
            c_in = width
    return total + c_in * 10 + 10


# Small mode: a narrow net on a class-balanced subset, fast on a laptop CPU.
MODES: dict[str, dict[str, int | None]] = {
    "small": {"widen_factor": SMALL_WIDEN, "train_size": 6000, "test_size": 1000},
    "full": {"widen_factor": FULL_WIDEN, "train_size": None, "test_size": None},
}


def resolve_mode(mode: str = "auto") -> str:
    """``small`` or ``full``; ``auto`` reads ``$LABKIT_MODE``, else full only with a GPU."""
    import os

    if mode == "auto":
        mode = os.environ.get("LABKIT_MODE", "auto")
    if mode == "auto":
        from tensorflow.python.framework import config

        mode = "full" if config.list_physical_devices("GPU") else "small"
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: use small, full or auto")
    return mode


def apply_mode(args: Any) -> Any:
    """Fill ``widen_factor``, ``train_size`` and ``test_size`` left as None from the mode."""
    args.mode = resolve_mode(getattr(args, "mode", "auto"))
    for key, value in MODES[args.mode].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    return args
