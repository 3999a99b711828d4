"""What a tf.distribute cluster run did: each task's exit code, its errors, where the logs are."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ClusterResult:
    """What a cluster run did."""

    returncodes: dict[str, int | None]
    log_dir: Path
    duration: float
    timed_out: bool = False
    interrupted: bool = False
    errors: dict[str, str] = field(default_factory=dict)
    record: dict | None = None  # the run record, when the cluster was recorded

    @property
    def ok(self) -> bool:
        return not self.timed_out and not self.interrupted and not self.errors

    def log(self, task: str = "worker.0") -> str:
        path = self.log_dir / f"{task}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def summary(self) -> str:
        if self.ok:
            n = len(self.returncodes)
            return f"cluster finished OK in {self.duration:.1f} s ({n} tasks); logs in {self.log_dir}"
        why = (
            f"timed out after {self.duration:.0f} s" if self.timed_out
            else "interrupted" if self.interrupted else "failed"
        )
        lines = [f"cluster {why}; logs in {self.log_dir}"]
        for name, err in sorted(self.errors.items()):
            lines += [f"--- {name} (exit {self.returncodes.get(name)}) ---", err]
        return "\n".join(lines)
