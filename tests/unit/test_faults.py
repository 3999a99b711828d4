"""labkit.tfdist.faults.Throttle: a process runs only part of the time, and is always left running."""

from __future__ import annotations

import sys
import time

import psutil
import pytest

from labkit.core import proc
from labkit.tfdist import faults


def test_a_throttled_process_is_stopped_part_of_the_time_and_continued_at_the_end() -> None:
    with proc.Job() as job:
        p = job.spawn([sys.executable, "-c", "while True: pass"], name="busy")
        states = []
        with faults.Throttle(p, share=0.3, period=0.1):
            for _ in range(40):
                states.append(psutil.Process(p.pid).status())
                time.sleep(0.013)
        after = psutil.Process(p.pid).status()
    assert psutil.STATUS_STOPPED in states and psutil.STATUS_STOPPED != after, (states, after)
    assert states.count(psutil.STATUS_STOPPED) > len(states) // 3  # stopped about 70% of the time


def test_share_must_be_a_fraction() -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        faults.Throttle(None, share=1.5)
