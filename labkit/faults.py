"""Fault tolerance made visible: kill one task of a running cluster, restart it, report the epochs.

    report = kill_and_resume(["python", "fashion_mnist_multiworker.py"], workers=2)
    print(report)      # epochs before the kill, after the restart, and any repeated
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from labkit.cluster import Cluster, ClusterResult, TaskId


@dataclass
class ResumeReport:
    """What happened around a worker kill: epochs begun before and after the restart."""

    killed: str
    before: list[int]  # epochs (1-based) the chief began before the kill
    after: list[int]  # epochs it began after the restart
    result: ClusterResult | None = None
    job_id: str = ""

    @property
    def completed_before(self) -> list[int]:
        """Epochs finished before the kill (all begun ones but the last, which was cut)."""
        return self.before[:-1]

    @property
    def repeated(self) -> list[int]:
        return sorted(set(self.completed_before) & set(self.after))

    @property
    def ok(self) -> bool:
        return bool(self.after) and not self.repeated and self.result is not None and self.result.ok

    def __str__(self) -> str:
        lines = [
            f"killed {self.killed} during epoch {self.before[-1] if self.before else '?'}",
            f"epochs completed before the kill: {self.completed_before}",
            f"epochs run after the restart:     {self.after}",
        ]
        if self.repeated:
            lines.append(f"REPEATED after the restart: {self.repeated} (no BackupAndRestore?)")
        elif self.after:
            lines.append("nothing repeated: training resumed from the last backup")
        if self.result is not None:
            lines.append(self.result.summary().splitlines()[0])
        return "\n".join(lines)


EPOCH_LINE = re.compile(r"^Epoch (\d+)/\d+", re.M)


def kill_and_resume(
    command: Sequence[str] | str,
    workers: int = 2,
    kill: TaskId = ("worker", 1),
    kill_in_epoch: int = 2,
    timeout: float = 600,
    settle: float = 30,
    **kw: object,
) -> ResumeReport:
    """Start a cluster, kill one task once the chief begins epoch ``kill_in_epoch``, restart, and report.

    When a worker of a MultiWorkerMirroredStrategy cluster dies, its peers' next
    collective fails and they exit too; every task that died is started again
    with its old TF_CONFIG, as a cluster manager would.
    """
    c = Cluster(command, workers=workers, **kw)  # type: ignore[arg-type]
    deadline = time.monotonic() + timeout
    with c:
        c.start()
        c.wait_for_output(rf"(?m)^Epoch {kill_in_epoch}/", timeout=max(1.0, deadline - time.monotonic()))
        before_text = c.output()
        c.expect_failures()  # the survivors' collectives fail: their tracebacks are part of the demo
        c.kill_task(*kill)
        if c.sink:
            c.sink.line(f"*** killed {kill[0]}.{kill[1]} (SIGKILL) ***")
        end = time.monotonic() + settle
        while time.monotonic() < end and any(c.tasks[k].alive() for k in c.leading if k != kill):
            time.sleep(0.2)
        restarted = c.restart_dead()
        if c.sink:
            c.sink.line(f"*** restarted {', '.join(restarted)} ***")
        result = c.wait(max(1.0, deadline - time.monotonic()))
    after_text = c.output()[len(before_text):]
    marker = after_text.find("restarted (start")
    after_text = after_text[marker:] if marker >= 0 else after_text
    before = [int(m) for m in EPOCH_LINE.findall(before_text)]
    after = [int(m) for m in EPOCH_LINE.findall(after_text)]
    return ResumeReport(f"{kill[0]}.{kill[1]}", sorted(dict.fromkeys(before)), sorted(dict.fromkeys(after)), result,
                        c.job_id)
