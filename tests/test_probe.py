"""labkit.probe pieces that need no MPI: conv shrinking, data slices."""

from __future__ import annotations

from labkit import probe


def test_shrink_is_consistent_and_narrow() -> None:
    assert probe.shrink(16) == 16
    assert probe.shrink(160) == 20 and probe.shrink(640) == 80
    assert probe.shrink(32) == 8  # never below 8 channels
