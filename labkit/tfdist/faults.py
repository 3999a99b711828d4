"""Faults made visible: kill one task of a running cluster and restart it, or slow one down.

    report = kill_and_resume(["python", "fashion_mnist_multiworker.py"], workers=2)
    print(report)      # epochs before the kill, after the restart, and any repeated
    result = slowed_worker(["python", "fashion_mnist_ps.py"], share=0.3)
    result.record.worker_steps        # steps each worker ran: the slow one ran fewer
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from labkit.core import proc, tfconfig
from labkit.tfdist.cluster import Cluster, ClusterResult, TaskId, split


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
    c = Cluster(command, *split({"workers": workers, **kw}))  # a cell's flat options: the tasks', the job's
    deadline = time.monotonic() + timeout
    with c:
        c.start()
        c.wait_for_output(rf"(?m)^Epoch {kill_in_epoch}/", timeout=max(1.0, deadline - time.monotonic()))
        before_text = c.output()
        c.expect_failures()  # the survivors' collectives fail: their tracebacks are part of the demo
        c.kill_task(*kill)
        if c.sink:
            c.sink.line(f"*** killed {kill[0]}.{kill[1]} (SIGKILL) ***")
        proc.wait_until(lambda: not any(c.tasks[k].alive() for k in c.leading if k != kill), settle)
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


class Throttle:
    """Let a process run only ``share`` of the time, as a busy or weaker machine would: its process
    group is stopped (SIGSTOP) and continued (SIGCONT) every ``period`` seconds. Always continued on exit."""

    def __init__(self, proc: Any, share: float = 0.3, period: float = 0.2) -> None:
        if not 0 < share < 1:
            raise ValueError(f"share is the fraction of time the process runs, between 0 and 1; got {share}")
        self.proc, self.share, self.period = proc, share, period
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="labkit-throttle", daemon=True)

    def _loop(self) -> None:
        while not self._done.is_set() and self.proc.alive():
            self.proc.signal(signal.SIGCONT)
            if self._done.wait(self.share * self.period):
                break
            self.proc.signal(signal.SIGSTOP)
            self._done.wait((1 - self.share) * self.period)
        self.proc.signal(signal.SIGCONT)

    def __enter__(self) -> Throttle:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=5)
        self.proc.signal(signal.SIGCONT)


def slowed_worker(command: Sequence[str] | str, slow: TaskId = ("worker", 1), share: float = 0.3,
                  workers: int = 2, ps: int = 1, timeout: float = 900, **kw: object) -> ClusterResult:
    """Run a parameter-server cluster (a chief, ``workers`` workers, ``ps`` servers) with one task slowed
    down to ``share`` of the time; the result's record has the steps each worker ran (``worker_steps``)."""
    c = Cluster(command, *split({"workers": workers, "ps": ps, "chief": True, **kw}))
    c.record_fields["slowed"] = {"task": f"{slow[0]}.{slow[1]}", "share": share}
    with c:
        c.start()
        task = c.tasks[slow]
        # Slowed once it serves (its TensorFlow server accepts connections): start-up runs at full speed, as
        # on a machine that gets busy during training, and the cluster does not wait for a crawling start.
        address = c.spec[slow[0]][slow[1]]
        proc.wait_until(lambda: tfconfig.serving(address) or not task.alive(), min(timeout, 300))
        if c.sink:
            c.sink.line(f"*** {task.name} runs {share:.0%} of the time ***")
        with Throttle(task.proc, share):
            return c.wait(timeout)
