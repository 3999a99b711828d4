"""Horovod Elastic made visible: a node leaves a running job and comes back; the job goes on without it and grows
again.

    report = leave_and_return("/run/labkit-nodes/hostfile", epochs=24)    # virtual nodes: labkit nodes up
    print(report)          # workers per epoch: 2 2 2 1 1 1 1 2 2 ...

The job (:mod:`labkit.instrument.elastic_job`) runs with ``labkit run --launcher elastic``, whose host discovery
script prints the job's ``hosts.now``. Once ``leave_after`` epochs are done the last host is taken out of that file
(as a cluster manager takes a machine away); after ``away`` epochs with fewer workers it is put back. Every worker
commits the state at the end of each epoch, so what a leaving worker had started is redone, nothing before.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from pathlib import Path

from labkit.core import contract, proc
from labkit.instrument import elastic_job
from labkit.launching import hosts, launch
from labkit.launching.jobspec import JobSpec
from labkit.launching.launchers import Elastic


@dataclass
class ElasticReport:
    """The epochs the job's rank 0 finished, in time order, and how the job ended."""

    epochs: list[dict] = field(default_factory=list)  # {"epoch", "size", "rank", "t", "end"}
    ok: bool = False
    summary: str = ""
    log_dir: str = ""

    def sizes(self) -> list[int]:
        return [e["size"] for e in self.epochs]

    def completed(self) -> set[int]:
        return {e["epoch"] for e in self.epochs}

    def __str__(self) -> str:
        lines = [f"{'epoch':>5}  workers"] + [f"{e['epoch']:>5}  {e['size']}" for e in self.epochs]
        return "\n".join([*lines, self.summary])


EVENTS = "epochs.txt"  # in the job's log folder: every worker appends its epoch lines


def read_epochs(log_dir: str | Path) -> list[dict]:
    """Rank 0's epoch lines (whichever process held rank 0 then), in the order they ended."""
    path = Path(log_dir) / EVENTS
    found = []
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        if line.startswith(elastic_job.MARK):
            try:
                found.append(json.loads(line[len(elastic_job.MARK):]))
            except ValueError:
                continue
    return sorted((e for e in found if e.get("rank") == 0), key=lambda e: e.get("end", 0))


def _write_hosts(path: Path, host_list: list[hosts.Host]) -> None:
    tmp = path.with_name(path.name + ".tmp")  # the discovery script never reads half a file
    tmp.write_text("".join(f"{h.name}:{hosts.slots(h)}\n" for h in host_list))
    tmp.replace(path)


def leave_and_return(hostfile: str | Path, epochs: int = 24, leave_after: int = 3, away: int = 5,
                     epoch_seconds: float = 1.0, timeout: float = 600, log_dir: str | Path | None = None,
                     quiet: bool = True) -> ElasticReport:
    """Run the elastic job on the hostfile's hosts; take the last host away and give it back."""
    host_list = hosts.parse_hostfile(hostfile)
    if len(host_list) < 2:
        raise ValueError("give a hostfile of at least 2 hosts: one of them leaves")
    if leave_after < 1 or away < 1 or leave_after + away >= epochs:
        raise ValueError("leave_after + away must be less than epochs, both at least 1")
    np = sum(hosts.slots(h) for h in host_list)
    logs = Path(log_dir) if log_dir else proc.new_log_dir()
    logs.mkdir(parents=True, exist_ok=True)
    hosts_now = Elastic.files({contract.LOG_DIR: str(logs.resolve())})[0]
    command = ["python", str(Path(elastic_job.__file__).resolve()), "--epochs", str(epochs),
               "--epoch-seconds", f"{epoch_seconds:g}", "--events", str(logs.resolve() / EVENTS)]
    out: dict = {}

    def go() -> None:
        out["result"] = launch.run(command,
                                   job=JobSpec(log_dir=logs, timeout=timeout, quiet=quiet, record=False,
                                               threads=1), np=np, launcher="elastic", hostfile=hostfile)

    job = threading.Thread(target=go, daemon=True)
    job.start()

    def done(n: int, below: int | None = None) -> bool:
        """``n`` epochs finished (with fewer than ``below`` workers), or the job over."""
        finished = [e for e in read_epochs(logs) if below is None or e["size"] < below]
        return len(finished) >= n or not job.is_alive()

    if proc.wait_until(lambda: done(leave_after), timeout):
        _write_hosts(hosts_now, host_list[:-1])
        if proc.wait_until(lambda: done(away, below=np), timeout):
            _write_hosts(hosts_now, host_list)
    job.join(timeout)
    result = out.get("result")
    return ElasticReport(read_epochs(logs), bool(result and result.ok),
                         result.summary() if result else "the job did not end in time", str(logs))
