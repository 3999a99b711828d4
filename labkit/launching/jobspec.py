"""How one job runs, whatever starts it: :func:`labkit.launching.launch.run` (a launcher's ranks),
:class:`labkit.tfdist.cluster.Cluster` (a tf.distribute cluster's tasks) and :func:`labkit.measure.bench.bench`
(a sweep of either) take the same :class:`JobSpec`.

What is *where* and *how many* stays with each of them (``np`` and a launcher; a cluster's tasks; a sweep's
worker counts); what every job has is here: its time limit, threads per process, extra environment, folders,
how its output is shown, whether it is recorded, and when it is stopped early.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.core.output import Sink


@dataclass(frozen=True)
class JobSpec:
    """What one job is given.

    ``timeout``: seconds before the job is stopped (None: no limit). ``threads``: compute threads per process
    (default: the cores shared out). ``env``: variables added to the processes' environment. ``log_dir``: the
    job's folder of logs (default: a new one under ``CWD/runs/logs``). ``cwd``: where the processes run.
    ``sink``: where the shown process's output goes (default: the console, or the notebook's output), nothing
    with ``quiet``. ``record``: observe the processes and append the run record when the job ends; ``target``:
    the validation accuracy its time to target is measured for (default: the script's ``--target-accuracy``).
    ``stop_when(OBSERVED)``: asked while the job runs, with the folder of its observations; a reason it returns
    stops the job then.
    """

    timeout: float | None = None
    threads: int | None = None
    env: Mapping[str, str] | None = None
    log_dir: str | Path | None = None
    cwd: str | Path | None = None
    sink: Sink | None = None
    quiet: bool = False
    record: bool = True
    target: float | None = None
    stop_when: Callable[[Path], str | None] | None = None

    def but(self, **changes: Any) -> JobSpec:
        """This spec with ``changes``."""
        return dataclasses.replace(self, **changes)


FIELDS = frozenset(f.name for f in dataclasses.fields(JobSpec))


def split(options: Mapping[str, Any]) -> tuple[JobSpec, dict[str, Any]]:
    """The :class:`JobSpec` among keyword ``options`` (a notebook cell's flat ones) and the rest."""
    return (JobSpec(**{k: v for k, v in options.items() if k in FIELDS}),
            {k: v for k, v in options.items() if k not in FIELDS})
