"""How busy the machine is with work that is not ours: for measurements that must be made on an idle machine.

The load average counts our own processes too (a 2-worker run on 2 cores makes it 2), so it says little
while we measure. :class:`OtherWork` compares the CPU time the whole machine spent (``/proc/stat``) with
the CPU time this process and its waited-for children spent (``getrusage``) over the same wall-clock
interval: what is left is other programs' share of the cores.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from pathlib import Path

STAT = Path("/proc/stat")


def cpu_seconds_busy(stat: Path = STAT) -> float | None:
    """CPU seconds every core of the machine has spent not idle since boot (``None`` off Linux)."""
    try:
        first = stat.read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    if not first or first[0] != "cpu":
        return None
    ticks = [int(x) for x in first[1:]]
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    busy = sum(ticks[:8]) - idle  # user nice system idle iowait irq softirq steal; guest is inside user
    return busy / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """CPU seconds spent by this process and the children it has waited for."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def load_average() -> float | None:
    """The 1-minute load average, or ``None`` where the system has none."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


@dataclass
class Share:
    """Other programs' use of the machine over an interval."""

    seconds: float  # wall clock
    cores: int
    other_cpu_s: float  # CPU seconds spent by programs that are not ours

    @property
    def share(self) -> float:
        """Other programs' CPU time over the machine's capacity in the interval (0 = idle, 1 = every core)."""
        return self.other_cpu_s / (self.seconds * self.cores) if self.seconds > 0 and self.cores else 0.0

    def __str__(self) -> str:
        return (f"other programs used {100 * self.share:.1f}% of {self.cores} cores over "
                f"{self.seconds / 60:.1f} min")


class OtherWork:
    """A running count of other programs' CPU time since it was made (``None`` where ``/proc/stat`` is missing).

    Children must be waited for to be counted as ours: a still-running child's time counts as other work.
    """

    def __init__(self, cores: int | None = None, stat: Path = STAT) -> None:
        self.stat = stat
        self.cores = cores or os.cpu_count() or 1
        self.start_busy = cpu_seconds_busy(stat)
        self.start_own = own_cpu_seconds()
        self.start = time.monotonic()

    def share(self) -> Share | None:
        busy = cpu_seconds_busy(self.stat)
        if busy is None or self.start_busy is None:
            return None
        other = (busy - self.start_busy) - (own_cpu_seconds() - self.start_own)
        return Share(time.monotonic() - self.start, self.cores, max(0.0, other))


def idle_now(seconds: float = 5.0, cores: int | None = None) -> Share | None:
    """Watch the machine for ``seconds`` while doing nothing: other programs' share of it."""
    watch = OtherWork(cores)
    time.sleep(seconds)
    return watch.share()
