"""labkit.core.machineload: other programs' share of the cores, our own processes left out."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from labkit.core import machineload

pytestmark = pytest.mark.skipif(machineload.cpu_seconds_busy() is None, reason="no /proc/stat")

SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass\n"


def _stat(path, busy_s: float) -> None:
    """A /proc/stat whose first line says the cores were busy ``busy_s`` seconds in all."""
    ticks = int(busy_s * os.sysconf("SC_CLK_TCK"))
    path.write_text(f"cpu  {ticks} 0 0 1000000 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n")


def test_our_waited_children_are_taken_out_of_the_machines_busy_time(tmp_path) -> None:
    """The machine's busy time (here a stat file the test writes) minus our CPU time, a waited child's included."""
    stat = tmp_path / "stat"
    _stat(stat, 100.0)
    watch = machineload.OtherWork(cores=2, stat=stat)
    before = machineload.own_cpu_seconds()
    subprocess.run([sys.executable, "-c", SPIN], check=True)  # waited for: its CPU time is ours
    ours = machineload.own_cpu_seconds() - before
    assert ours >= 1.4  # the child's 1.5 s of CPU, counted as ours once waited for
    _stat(stat, 100.0 + ours + 0.5)  # the machine was busy with our work and 0.5 s of someone else's
    share = watch.share()
    assert share is not None and abs(share.other_cpu_s - 0.5) < 0.1, share
    _stat(stat, 100.0 + ours)  # only ours: nothing else, and never below zero
    assert watch.share().other_cpu_s < 0.1


def test_a_child_still_running_counts_as_other_work_on_the_real_machine() -> None:
    other = machineload.OtherWork(cores=1)
    stranger = subprocess.Popen([sys.executable, "-c", SPIN])  # not waited for while measured: not ours
    try:
        seen = None
        while stranger.poll() is None:  # once it is reaped its time counts as ours: read it just before
            seen = other.share()
            time.sleep(0.05)
    finally:
        stranger.wait()
    assert seen is not None and seen.other_cpu_s > 1.0, seen  # at least the stranger's CPU seconds


def test_the_share_is_over_the_machines_capacity(tmp_path) -> None:
    share = machineload.Share(seconds=10.0, cores=2, other_cpu_s=5.0)
    assert share.share == pytest.approx(0.25)
    assert "25.0% of 2 cores" in str(share)
    stat = tmp_path / "stat"
    stat.write_text("intr 5\n")
    assert machineload.cpu_seconds_busy(stat) is None
    assert machineload.OtherWork(stat=stat).share() is None
