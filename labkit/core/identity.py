"""Who and where this process is: its rank, its place in the job, its machine, the versions it runs.

Read from the environment that launchers set (mpirun, horovodrun, Slurm, ``TF_CONFIG``, labkit's own) and
from the modules the process has already imported; nothing is imported here that the process did not load.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
from dataclasses import dataclass
from typing import Any

from labkit import __version__
from labkit.core import contract

LAUNCHER_VAR = contract.LAUNCHER
# Who set the rank: Horovod, OpenMPI's mpirun, a PMI/PMIx launcher (srun --mpi=...), Slurm, labkit.
RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", contract.RANK)


def rank_from_env(environ: dict[str, str] | os._Environ = os.environ) -> int:
    """This process's rank as set by mpirun/horovodrun/labkit (0 when none is set)."""
    for var in RANK_VARS:
        if environ.get(var, "").isdigit():
            return int(environ[var])
    return 0


def cpu_count() -> int:
    """Cores this process may use (affinity aware)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _horovod() -> Any | None:
    """The initialised Horovod module this process uses, else None (never imports Horovod)."""
    for name in ("horovod.tensorflow.keras", "horovod.tensorflow"):
        mod = sys.modules.get(name)
        if mod is None:
            continue
        try:
            if mod.is_initialized():
                return mod
        except Exception:  # noqa: BLE001 - older builds or a half-loaded module
            continue
    return None


def tf_config() -> dict[str, Any] | None:
    """This process's ``TF_CONFIG`` when it names a task, else None."""
    try:
        conf = json.loads(os.environ.get("TF_CONFIG", "") or "null")
    except ValueError:
        return None
    return conf if isinstance(conf, dict) and conf.get("task") else None


# Class names of tf.distribute strategies -> the names learners use.
STRATEGY_NAMES = {
    "CollectiveAllReduceStrategy": "MultiWorkerMirroredStrategy",
    "CollectiveAllReduceStrategyV1": "MultiWorkerMirroredStrategy",
    "_CollectiveAllReduceStrategyExperimental": "MultiWorkerMirroredStrategy",
    "ParameterServerStrategyV2": "ParameterServerStrategy",
    "ParameterServerStrategyV1": "ParameterServerStrategy",
}


LOCAL_RANK_VARS = ("HOROVOD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")


def where() -> dict[str, Any]:
    """``host`` (this machine's name) and ``local_rank`` (rank among this host's processes, if set)."""
    local = next((os.environ[v] for v in LOCAL_RANK_VARS if os.environ.get(v, "").isdigit()), None)
    return {"host": socket.gethostname(), "local_rank": int(local) if local is not None else None}


@dataclass(frozen=True)
class World:
    """Where this process stands in its job: its rank among ``workers``, whether it is the chief, who launched it
    and with which strategy, and its host and rank on that host."""

    rank: int = 0
    workers: int = 1
    is_chief: bool = True
    launcher: str | None = None
    strategy: str | None = None
    host: str = ""
    local_rank: int | None = None


def world(strategy: Any = None) -> World:
    """``rank``, ``workers``, ``is_chief``, ``launcher``/``strategy`` and ``host``/``local_rank`` of this process."""
    return World(**_world(strategy), **where())


def _world(strategy: Any = None) -> dict[str, Any]:
    launcher = os.environ.get(LAUNCHER_VAR) or None
    hvd = _horovod()
    if hvd is not None:
        rank, size = hvd.rank(), hvd.size()
        return {"rank": rank, "workers": size, "is_chief": rank == 0, "launcher": launcher or "horovod",
                "strategy": "horovod"}
    name = type(strategy).__name__ if strategy is not None else None
    if name and name.startswith("_Default"):
        name = None
    name = STRATEGY_NAMES.get(name, name) if name else None
    replicas = int(getattr(strategy, "num_replicas_in_sync", 1) or 1) if name else 1
    conf = tf_config()
    if conf is not None:
        task = conf.get("task", {})
        cluster = conf.get("cluster", {})
        kind, index = task.get("type"), int(task.get("index", 0))
        has_chief = bool(cluster.get("chief"))
        chief = kind == "chief" or (kind == "worker" and index == 0 and not has_chief)
        workers = len(cluster.get("worker", [])) + (len(cluster.get("chief", [])) if "Mirrored" in (name or "") else 0)
        # Ranks as a launcher numbers processes: the chief (or worker 0 without one) 0, the workers next, then
        # the parameter servers, so a cluster of N workers has ranks 0..N-1.
        if chief:
            rank = 0
        elif kind == "worker":
            rank = index + int(has_chief)
        else:
            rank = int(has_chief) + len(cluster.get("worker", [])) + index
        return {"rank": rank, "workers": max(1, workers or replicas), "is_chief": chief,
                "launcher": launcher or "tf_config", "strategy": name or "tf_config"}
    rank = rank_from_env()
    np_env = os.environ.get(contract.NP, "")
    workers = replicas if name else (int(np_env) if np_env.isdigit() else 1)
    return {"rank": rank, "workers": max(1, workers), "is_chief": rank == 0,
            "launcher": launcher or ("labkit" if np_env else "python"), "strategy": name}


def device_info() -> dict[str, Any]:
    """``kind`` (``gpu``/``cpu``), how many, and the CPU model; cheap and TensorFlow-optional."""
    info: dict[str, Any] = {"kind": "cpu", "gpus": 0}
    tf = sys.modules.get("tensorflow")
    if tf is not None:
        try:
            gpus = tf.config.list_physical_devices("GPU")
            info.update(kind="gpu" if gpus else "cpu", gpus=len(gpus))
        except Exception:  # noqa: BLE001
            pass
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info["cores"] = cpu_count()
    return info


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    out["labkit"] = __version__
    for name in ("tensorflow", "horovod"):
        mod = sys.modules.get(name)
        out[name] = getattr(mod, "__version__", None) if mod else None
    return out
