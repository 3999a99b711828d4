"""Lab 9's measurement cell: mixed precision on this machine, beside the course's reference.

``scale_lab.precision_speed()`` times the course's model in float32 and in mixed bfloat16
(:mod:`labkit.measure.precision`, one process each, nothing of the learner's script or of a solution), then prints
both speeds and the course's reference, made on an idle machine (``labs/reference/precision.json``), the median of
its repeats. In quick mode (the test suite's) each policy times a few batches.
"""

from __future__ import annotations

from labkit.instrument.precision_workload import POLICIES
from labkit.measure import precision
from labkit.ui import notebook

QUICK_BATCHES = 3


def _table(speeds: list[precision.Speed]) -> str:
    base = next((s.images_per_sec for s in speeds if s.policy == "float32"), None)
    rows = [f"  {'policy':<16}{'computes in':<13}{'images/sec':>11}{'vs float32':>12}"]
    for s in speeds:
        rel = f"{s.images_per_sec / base:.2f} x" if base else "-"
        rows.append(f"  {s.policy:<16}{'/'.join(s.compute_dtypes):<13}{s.images_per_sec:>11.0f}{rel:>12}")
    return "\n".join(rows)


def precision_speed(batches: int = precision.BATCHES) -> list[precision.Speed]:
    """Time the course's model in each precision on this machine; print it beside the course's reference."""
    n = QUICK_BATCHES if notebook.quick() else batches
    speeds = precision.compare(n)
    print(f"\nThis machine, one process per policy, {n} batches of {precision.BATCH} images:")
    print(_table(speeds))
    ref = precision.read()
    if ref is None:
        print("\n(no reference results for mixed precision in this course)")
        return speeds
    load = f", other programs {100 * ref.made.other_work:.0f}% of it" if ref.made.other_work is not None else ""
    ratios = ", ".join(f"{r:.2f}" for r in ref.ratios())
    print(f"\nThe course's reference ({ref.made.machine}, {ref.made.date}{load}; {ref.made.command}): the median "
          f"of {len(ref.ratios())} repeats (mixed bfloat16 over float32 in each: {ratios}):")
    print(_table([ref.typical(policy) for policy in POLICIES]))
    return speeds
