"""labkit.core.machineload: other programs' share of the cores, our own processes left out."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from labkit.core import machineload

pytestmark = pytest.mark.skipif(machineload.cpu_seconds_busy() is None, reason="no /proc/stat")

SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass\n"


def test_a_waited_child_is_ours_and_a_running_one_is_other_work() -> None:
    mine = machineload.OtherWork(cores=1)
    subprocess.run([sys.executable, "-c", SPIN], check=True)  # waited for: its CPU time is ours
    ours = mine.share()
    other = machineload.OtherWork(cores=1)
    stranger = subprocess.Popen([sys.executable, "-c", SPIN])  # not waited for while measured: not ours
    try:
        while stranger.poll() is None:  # once it is reaped its time counts as ours: read it just before
            seen = other.share()
            time.sleep(0.05)
    finally:
        stranger.wait()
    assert ours is not None and seen is not None
    assert ours.other_cpu_s < 0.7, ours  # what else ran meanwhile, not the child's 1.5 s
    assert seen.other_cpu_s > 1.0, seen  # the stranger's CPU seconds, seen as other work


def test_the_share_is_over_the_machines_capacity(tmp_path) -> None:
    share = machineload.Share(seconds=10.0, cores=2, other_cpu_s=5.0)
    assert share.share == pytest.approx(0.25)
    assert "25.0% of 2 cores" in str(share)
    stat = tmp_path / "stat"
    stat.write_text("intr 5\n")
    assert machineload.cpu_seconds_busy(stat) is None
    assert machineload.OtherWork(stat=stat).share() is None
