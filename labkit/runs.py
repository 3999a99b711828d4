"""Run records: one JSON line per training run, in ``runs/runs.jsonl``.

Every run that labkit starts (``labkit run``/``bench``/``cluster``, the same from a
cell) adds one record, although the script carries no labkit code: the processes
are observed from outside (:mod:`labkit.observe`) and the launcher writes the
record when the job ends (:mod:`labkit.jobrecord`): what ran, on how many workers
and threads, how fast it trained (images/sec timed on training steps only,
validation excluded), the validation accuracy of each epoch, the time to the
target accuracy, and how it ended.

Records are appended with one ``write`` of a whole line to a file opened in append
mode under an exclusive lock, so a record is never half-written and concurrent
runs do not interleave; :func:`read` skips (and counts) any damaged line.

While training, the chief process also keeps ``runs/live/RUN_ID.json`` up to date (the
progress of the current run, replaced atomically each epoch) for
:mod:`labkit.dashboard`.

Where records go: the ``path`` argument, else ``$LABKIT_RUNS_FILE``, else
``runs/runs.jsonl`` under the current directory.
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import statistics
import sys
import time
import uuid
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from labkit import contract

DEFAULT_FILE = "runs/runs.jsonl"
FILE_VAR = contract.RUNS_FILE
RUN_ID_VAR = contract.RUN_ID
LAUNCHER_VAR = contract.LAUNCHER
SCHEMA = 2


def runs_file(path: str | os.PathLike | None = None) -> Path:
    """The records file: ``path``, else ``$LABKIT_RUNS_FILE``, else ``runs/runs.jsonl``."""
    return Path(path or os.environ.get(FILE_VAR) or DEFAULT_FILE)


def live_file(run_id: str, path: str | os.PathLike | None = None) -> Path:
    """Where the progress of a running job is kept: ``<records folder>/live/RUN_ID.json``."""
    return runs_file(path).parent / "live" / f"{run_id}.json"


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [_json_safe(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    try:  # numpy scalars
        return _json_safe(value.item())
    except (AttributeError, ValueError):
        return str(value)


def append(record: dict[str, Any], path: str | os.PathLike | None = None) -> Path:
    """Append ``record`` as one line, atomically with respect to other writers and readers."""
    target = runs_file(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(_json_safe(record), separators=(",", ":"), allow_nan=False) + "\n").encode()
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_EX)
        except (ImportError, OSError):  # pragma: no cover - no locking on this platform/file system
            pass
        written = os.write(fd, line)
        while written < len(line):  # pragma: no cover - regular files take it in one write
            written += os.write(fd, line[written:])
    finally:
        os.close(fd)  # closing releases the lock
    return target


class Records(list):
    """The records of a file (a list of dicts) plus ``skipped``, the damaged lines left out."""

    skipped: int = 0


def read(path: str | os.PathLike | None = None, warn: bool = True) -> Records:
    """Every well-formed record of the file, oldest first; damaged lines are skipped."""
    out = Records()
    target = runs_file(path)
    if not target.exists():
        return out
    with open(target, "rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            try:
                rec = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                out.skipped += 1
                continue
            if isinstance(rec, dict):
                out.append(rec)
            else:
                out.skipped += 1
    if out.skipped and warn:
        warnings.warn(f"{target}: skipped {out.skipped} damaged line(s)", stacklevel=2)
    return out


def select(records: Iterable[dict[str, Any]], **match: Any) -> list[dict[str, Any]]:
    """Records whose fields equal every ``key=value`` given (``run_id=...``, ``workers=2``...)."""
    return [r for r in records if all(r.get(k) == v for k, v in match.items())]


def write_json_atomic(path: str | os.PathLike, data: dict[str, Any]) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file, never a mix."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(_json_safe(data)))
    os.replace(tmp, path)


# ----------------------------------------------------------------------------- who am I


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


def _tf_config() -> dict[str, Any] | None:
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


def world(strategy: Any = None) -> dict[str, Any]:
    """``rank``, ``workers``, ``is_chief``, ``launcher``/``strategy`` and ``host``/``local_rank`` of this process."""
    return {**_world(strategy), **where()}


def _world(strategy: Any = None) -> dict[str, Any]:
    from labkit.rank import rank_from_env

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
    conf = _tf_config()
    if conf is not None:
        task = conf.get("task", {})
        cluster = conf.get("cluster", {})
        kind, index = task.get("type"), int(task.get("index", 0))
        has_chief = bool(cluster.get("chief"))
        chief = kind == "chief" or (kind == "worker" and index == 0 and not has_chief)
        workers = len(cluster.get("worker", [])) + (len(cluster.get("chief", [])) if "Mirrored" in (name or "") else 0)
        return {"rank": 0 if chief else index + 1, "workers": max(1, workers or replicas), "is_chief": chief,
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
    from labkit.launchers import cpu_count

    info["cores"] = cpu_count()
    return info


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    from labkit import __version__

    out["labkit"] = __version__
    for name in ("tensorflow", "horovod"):
        mod = sys.modules.get(name)
        out[name] = getattr(mod, "__version__", None) if mod else None
    return out


def lab_and_step(script: str) -> tuple[str | None, str | None]:
    """Guess the lab and step from a lab script's name (``fashion_mnist_after_step_03.py`` -> step 3)."""
    import re

    name = Path(script).stem
    step = None
    m = re.search(r"after_step_(\d+)", name)
    if m:
        step = str(int(m.group(1)))
    elif name.endswith("_solution"):
        step = "solution"
    for lab in ("multiworker", "mirrored", "parameter_server", "ps"):
        if lab in name:
            return ("parameter-server" if lab in ("ps", "parameter_server") else lab), step
    return ("horovod" if name.startswith("fashion_mnist") else None), step


def summarize(epochs: list[dict[str, Any]], key: str = "images_per_sec") -> float | None:
    """Steady state of ``key``: the median over epochs, leaving out the first (graph tracing) if there are more."""
    rates = [e[key] for e in epochs if e.get(key)]
    if len(rates) >= 2:
        rates = rates[1:]
    return statistics.median(rates) if rates else None


# ----------------------------------------------------------------------------- jobs


