"""A process the workshop started, as recorded in its state: pid, start time and command line.

A pid read back from a state file may belong to another process by now (after a reboot, or once the pid
was reused). :meth:`Started.process` gives the process only while the pid still has the recorded start
time (``psutil``'s ``create_time``) and command line, so :meth:`Started.signal` never reaches anything
else. Nothing in the workshop signals a process found by its name.
"""

from __future__ import annotations

import signal as signals
from dataclasses import dataclass
from typing import Any

import psutil

TIME_SLACK = 0.05  # seconds: create_time is read from /proc in clock ticks


@dataclass(frozen=True)
class Started:
    pid: int
    create_time: float
    cmdline: tuple[str, ...]

    @classmethod
    def of(cls, pid: int) -> Started:
        """Record the running process ``pid`` (psutil.Error when it is gone)."""
        p = psutil.Process(pid)
        with p.oneshot():
            return cls(pid, p.create_time(), tuple(p.cmdline()))

    @classmethod
    def from_dict(cls, data: Any) -> Started | None:
        """The record saved by :meth:`to_dict`, or None when ``data`` is not one."""
        try:
            return cls(int(data["pid"]), float(data["create_time"]), tuple(str(a) for a in data["cmdline"]))
        except (KeyError, TypeError, ValueError):
            return None

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "create_time": self.create_time, "cmdline": list(self.cmdline)}

    def process(self) -> psutil.Process | None:
        """The live process this record names, or None (ended, a zombie, or the pid now someone else's)."""
        try:
            p = psutil.Process(self.pid)
            with p.oneshot():
                same = abs(p.create_time() - self.create_time) <= TIME_SLACK and tuple(p.cmdline()) == self.cmdline
                return p if same and p.status() != psutil.STATUS_ZOMBIE else None
        except psutil.Error:
            return None

    def alive(self) -> bool:
        return self.process() is not None

    def signal(self, sig: int = signals.SIGTERM) -> bool:
        """Send ``sig`` when the process is still the one recorded; True when sent."""
        p = self.process()
        if p is None:
            return False
        try:
            p.send_signal(sig)  # psutil checks the pid again (create time) right before the signal
            return True
        except psutil.Error:
            return False
