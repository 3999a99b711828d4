"""What a running cluster lets you do to its tasks one by one: kill one, start it again, read its output, wait
for a line (:class:`labkit.tfdist.cluster.Cluster` has these; the fault demos in :mod:`labkit.tfdist.faults`
use them)."""

from __future__ import annotations

import re
import signal
import time
from typing import Any

from labkit.core import output, proc
from labkit.launching import launchers
from labkit.tfdist.cluster_result import Task

TaskId = tuple[str, int]


class TaskControl:
    """Per-task operations on ``self.tasks``; the class using it starts tasks with ``start_task``."""

    tasks: dict[TaskId, Task]
    renderers: dict[TaskId, output.Renderer]
    show: TaskId

    def start_task(self, task_type: str, index: int) -> Any:
        raise NotImplementedError

    def expect_failures(self) -> None:
        """From now on the shown task's tracebacks are expected (a peer is killed): one line each, full in the log."""
        for renderer in self.renderers.values():
            renderer.fold = True

    def kill_task(self, task_type: str, index: int, sig: int = signal.SIGKILL) -> None:
        """Kill one task (SIGKILL by default, like a machine that disappears)."""
        task = self.tasks[(task_type, index)]
        if task.proc is None:
            return
        task.killed = True
        task.proc.signal(sig)
        task.returncode = task.proc.wait()

    def restart_task(self, task_type: str, index: int) -> Task:
        """Kill the task if it still runs, then start it again with the same TF_CONFIG."""
        if self.tasks[(task_type, index)].alive():
            self.kill_task(task_type, index)
        return self.start_task(task_type, index)

    def restart_dead(self, settle: float = 0.0) -> list[str]:
        """Start again every task that is not running (after a kill, the peers often exit too)."""
        time.sleep(settle)
        dead = [k for k, t in self.tasks.items() if not t.alive()]
        for key in dead:
            self.start_task(*key)
        return [self.tasks[k].name for k in dead]

    def alive(self) -> list[str]:
        return [t.name for t in self.tasks.values() if t.alive()]

    def output(self, task_type: str | None = None, index: int | None = None) -> str:
        """Everything a task printed so far (default: the shown task)."""
        key = (task_type, index) if task_type is not None else self.show
        path = self.tasks[(key[0], key[1] if key[1] is not None else 0)].log
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_for_output(
        self, pattern: str, task_type: str | None = None, index: int | None = None,
        timeout: float = 300, count: int = 1,
    ) -> re.Match:
        """Block until ``pattern`` appears ``count`` times in a task's output; raise on exit or timeout."""
        rx = re.compile(pattern)
        key = (task_type, index or 0) if task_type is not None else self.show
        found: list[re.Match] = []

        def seen() -> bool:
            found[:] = list(rx.finditer(self.output(*key)))
            if len(found) < count and not self.tasks[key].alive():
                raise launchers.LaunchError(f"{key[0]}.{key[1]} exited before printing {pattern!r}")
            return len(found) >= count

        if not proc.wait_until(seen, timeout):
            raise TimeoutError(f"{key[0]}.{key[1]} did not print {pattern!r} within {timeout:.0f} s")
        return found[count - 1]
