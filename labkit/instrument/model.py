"""Sizes of the lab's WideResNet, for estimates without TensorFlow.

The model itself is defined in the lab scripts (``wide_resnet``). Depth 16 means
two residual blocks per stage; the widen factor ``k`` sets the stage widths to
16k/32k/64k channels (k=10: 160/320/640, about 17.1 M parameters).
"""

from __future__ import annotations

FULL_WIDEN = 10
SMALL_WIDEN = 1
DEPTH = 16


def stage_widths(widen_factor: int) -> tuple[int, int, int]:
    """Channels of the three stages for a widen factor."""
    if widen_factor < 1:
        raise ValueError(f"widen factor must be >= 1, got {widen_factor}")
    return 16 * widen_factor, 32 * widen_factor, 64 * widen_factor


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
