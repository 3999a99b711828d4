"""A tf.distribute cluster's tasks, and what a run of them did: each task's exit code, its errors, where the
logs are, and the run record made of it."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labkit.core import output, proc
from labkit.records import jobrecord
from labkit.records.runrecord import RunRecord


@dataclass
class Task:
    """One process of the cluster (its current incarnation)."""

    type: str
    index: int
    log: Path
    cwd: Path | None = None
    proc: proc.Proc | None = None
    starts: int = 0
    killed: bool = False  # by kill_task, on purpose
    returncode: int | None = None

    @property
    def name(self) -> str:
        return f"{self.type}.{self.index}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()


@dataclass
class ClusterResult:
    """What a cluster run did."""

    returncodes: dict[str, int | None]
    log_dir: Path
    duration: float
    timed_out: bool = False
    interrupted: bool = False
    errors: dict[str, str] = field(default_factory=dict)
    record: RunRecord | None = None  # the run record, when the cluster was recorded
    lost: str | None = None  # why the run was stopped when a host stopped answering
    stopped: str | None = None  # why the caller's ``stop_when`` ended the run early

    @classmethod
    def of_tasks(cls, tasks: dict[tuple[str, int], Task], leading: list[tuple[str, int]], log_dir: Path,
                 duration: float, timed_out: bool, interrupted: bool) -> ClusterResult:
        """The result of stopped ``tasks``: a leading task that did not exit 0, or another task that failed
        other than by being stopped, is an error, with the end of its log."""
        codes: dict[str, int | None] = {}
        errors: dict[str, str] = {}
        stopped = (0, None, -signal.SIGTERM, -signal.SIGKILL)
        for key, t in tasks.items():
            code = t.returncode if t.returncode is not None else (t.proc.returncode if t.proc else None)
            codes[t.name] = code
            failed = code != 0 if key in leading else (code not in stopped and not t.killed)
            if failed:
                errors[t.name] = output.error_tail(t.log.read_text(errors="replace") if t.log.exists() else "")
        return cls(codes, log_dir, duration, timed_out, interrupted, errors)

    @property
    def ok(self) -> bool:
        return not self.timed_out and not self.interrupted and not self.errors and not self.lost and not self.stopped

    def log(self, task: str = "worker.0") -> str:
        path = self.log_dir / f"{task}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def summary(self) -> str:
        if self.ok:
            n = len(self.returncodes)
            return f"cluster finished OK in {self.duration:.1f} s ({n} tasks); logs in {self.log_dir}"
        why = (
            f"stopped after {self.duration:.0f} s: {self.stopped}" if self.stopped
            else f"timed out after {self.duration:.0f} s" if self.timed_out
            else "interrupted" if self.interrupted else "failed"
        )
        lines = [f"cluster {why}; logs in {self.log_dir}"] + ([self.lost] if self.lost else [])
        for name, err in sorted(self.errors.items()):
            lines += [f"--- {name} (exit {self.returncodes.get(name)}) ---", err]
        return "\n".join(lines)


def record(cluster: Any, result: ClusterResult) -> RunRecord:
    """The run record of a finished :class:`labkit.tfdist.cluster.Cluster` run."""
    status = "ok" if result.ok else "stopped" if result.stopped else "timeout" if result.timed_out else (
        "interrupted" if result.interrupted else "failed")
    code = 0 if result.ok else next((c for c in result.returncodes.values() if c), 1)
    spec = cluster.spec
    workers = len(spec.get("worker", [])) + len(spec.get("chief", []))
    end = jobrecord.JobEnd(
        cluster.contract.run_id or "", cluster.command, cluster.contract.launcher or "cluster", workers,
        cluster.contract.threads, cluster.start_wall or time.time(), result.duration, code or 0, status,
        error=result.stopped or next(iter(result.errors.values()), None), log_dir=cluster.log_dir,
        target=cluster.target, copies=cluster.independent,
        extra={"bench": cluster.contract.bench, "tasks": {t: len(v) for t, v in spec.items()}, **cluster.record_fields})
    return jobrecord.finish(end, cluster.log_dir / "observed", cluster.records)
