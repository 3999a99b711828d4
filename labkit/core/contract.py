"""The contract between a launcher and the processes it starts, and every ``LABKIT_*`` name.

A launcher fills one :class:`JobEnv` and writes it to the children's environment
(:meth:`JobEnv.to_env`); a child reads it back with :func:`current`. Nothing
else in the package spells a ``LABKIT_*`` variable: modules use the names below.

    >>> env = JobEnv(job_id="abc", run_id="r1", launcher="mpirun", np=2, threads=1).to_env()
    >>> env["LABKIT_NP"], JobEnv.from_env(env).threads
    ('2', 1)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields

# -- the job contract (written by launchers, read by children) --------------------------------
JOB_ID = "LABKIT_JOB_ID"  # marks every process of a job, so the process layer finds and stops them
JOB_IDS = "LABKIT_JOB_IDS"  # the marks of the jobs this job runs inside (a job started by a job), ':'-separated
RUN_ID = "LABKIT_RUN_ID"  # the run record's id
LAUNCHER = "LABKIT_LAUNCHER"  # mpirun, horovodrun, gloo, slurm, cluster, ipyparallel, ...
LOG_DIR = "LABKIT_LOG_DIR"  # the job's log folder
RUNS_FILE = "LABKIT_RUNS_FILE"  # where run records go
THREADS = "LABKIT_THREADS"  # threads per worker
NP = "LABKIT_NP"  # workers in the job
SHOW_RANK = "LABKIT_SHOW_RANK"  # the rank whose output is streamed
TASK = "LABKIT_TASK"  # a tf.distribute task's name, e.g. worker.1
RANK = "LABKIT_RANK"  # set by the per-rank wrapper
BENCH = "LABKIT_BENCH"  # the benchmark sweep a run belongs to
SHRINK = "LABKIT_SHRINK"  # TRAIN,TEST,DIVISOR: data and width shrunk from outside (bench --shrink)
OPTIMIZER = "LABKIT_OPTIMIZER"  # Horovod optimizer knobs set from outside (bench --optimizer compression=fp16)
PROBE_LOAD = "LABKIT_PROBE_LOAD"  # a saved model the tf.distribute probe reloads
K8S_WORKER_INDEX = "LABKIT_WORKER_INDEX"  # a Kubernetes worker pod's index (labkit.deploy.k8s manifests)

# -- user settings (read where they apply) -----------------------------------------------------
DATA = "LABKIT_DATA"  # a folder holding Fashion-MNIST
NB_QUICK = "LABKIT_NB_QUICK"  # "1": notebooks in quick mode (the test suite)
DASHBOARD = "LABKIT_DASHBOARD"  # "text": no widget dashboard
NODES_STATE = "LABKIT_NODES_STATE"  # the state folder of virtual nodes (labkit nodes up)
CACHE = "LABKIT_CACHE"  # labkit's cache folder (default ~/.cache/labkit): Horovod wheels, calibration
WORKSHOP_STATE = "LABKIT_WORKSHOP_STATE"  # the state folder of a workshop (labkit workshop up)
CLASS_DIR = "LABKIT_CLASS_DIR"  # a workshop's class folder: checks and assessments append records there
WORKSHOP_LEARNERS = "LABKIT_WORKSHOP_LEARNERS"  # the class view service's learners, comma-separated
SOLUTIONS_DIR = "LABKIT_SOLUTIONS_DIR"  # a workshop's revealed step solutions (labkit workshop reveal), root's
CHECK_SLOTS = "LABKIT_CHECK_SLOTS"  # checks and assessments take one of this many slots first (labkit.core.slots)
CHECK_QUEUE = "LABKIT_CHECK_QUEUE"  # the slots: a folder (default: LABKIT_CACHE/check-queue), or a queue socket

# -- setup settings (read by scripts/setup.sh and make; listed here so that every name is in one place) ----
SETUP_NAMES = {
    "LABKIT_TEST_TOOLS": "1: also the test-only system tools (make test sets it)",
    "LABKIT_SKIP_APT": "1: install no Debian packages (they are there already)",
    "LABKIT_SYSTEM_PYTHON": "1: install into the running Python, not .venv (Binder)",
    "LABKIT_INSTALLER": "the command that installs Debian packages (default apt-get)",
    "LABKIT_HOROVOD_GPU": "1: build Horovod with NCCL for GPUs",
    CACHE: "where the built Horovod wheel is kept",
    DATA: "where the data set is put",
}

_NAMES = {
    "job_id": JOB_ID, "run_id": RUN_ID, "launcher": LAUNCHER, "log_dir": LOG_DIR, "runs_file": RUNS_FILE,
    "threads": THREADS, "np": NP, "show_rank": SHOW_RANK, "task": TASK, "rank": RANK,
    "bench": BENCH, "shrink": SHRINK, "optimizer": OPTIMIZER, "probe_load": PROBE_LOAD,
}
_INTS = {"threads", "np", "show_rank", "rank"}


@dataclass
class JobEnv:
    """What a child process knows about the job it belongs to (``None``: not set)."""

    job_id: str | None = None
    run_id: str | None = None
    launcher: str | None = None
    log_dir: str | None = None
    runs_file: str | None = None
    threads: int | None = None
    np: int | None = None
    show_rank: int | None = None
    task: str | None = None
    rank: int | None = None
    bench: str | None = None
    shrink: str | None = None
    optimizer: str | None = None
    probe_load: str | None = None

    def to_env(self) -> dict[str, str]:
        """The set fields as environment variables."""
        return {_NAMES[f.name]: str(v) for f in fields(self) if (v := getattr(self, f.name)) is not None}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> JobEnv:
        """Read the contract back (unset or malformed numbers are ``None``)."""
        environ = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for name, var in _NAMES.items():
            raw = environ.get(var)
            if raw is None or raw == "":
                continue
            if name in _INTS:
                try:
                    values[name] = int(raw)
                except ValueError:
                    values[name] = None
            else:
                values[name] = raw
        return cls(**values)


def current() -> JobEnv:
    """This process's contract, from its environment."""
    return JobEnv.from_env()


def strip(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the job contract (a process that must not look like part of a job)."""
    names = {*_NAMES.values(), JOB_IDS}
    return {k: v for k, v in environ.items() if k not in names}


@dataclass(frozen=True)
class Settings:
    """The user's settings from the environment (``None``: not set), read in one place."""

    data: str | None = None
    nb_quick: bool = False
    dashboard: str | None = None
    nodes_state: str | None = None
    cache: str | None = None
    task: str | None = None
    probe_load: str | None = None
    check_slots: str | None = None
    check_queue: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        environ = os.environ if environ is None else environ
        return cls(data=environ.get(DATA) or None, nb_quick=environ.get(NB_QUICK) == "1",
                   dashboard=environ.get(DASHBOARD) or None, nodes_state=environ.get(NODES_STATE) or None,
                   cache=environ.get(CACHE) or None, task=environ.get(TASK) or None,
                   probe_load=environ.get(PROBE_LOAD) or None, check_slots=environ.get(CHECK_SLOTS) or None,
                   check_queue=environ.get(CHECK_QUEUE) or None)


def settings() -> Settings:
    """This process's settings, from its environment now."""
    return Settings.from_env()
