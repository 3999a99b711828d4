"""Run records: one JSON line per training run, in ``runs/runs.jsonl``.

A training script appends :class:`Recorder` last to its Keras callbacks::

    callbacks.append(runs.Recorder(__file__, vars(args)))

and every run (alone, under ``labkit run``/``labkit bench``, Horovod or
tf.distribute) adds one record: what ran, on how many workers and threads, how
fast it trained (images/sec timed on training steps only, validation excluded),
the validation accuracy of each epoch, the time to the target accuracy, and how
it ended. Only rank 0 (Horovod) or the chief (tf.distribute) writes.

Records are appended with one ``write`` of a whole line to a file opened in append
mode under an exclusive lock, so a record is never half-written and concurrent
runs do not interleave; :func:`read` skips (and counts) any damaged line.

While training, the recorder also keeps ``runs/live/RUN_ID.json`` up to date (the
progress of the current run, replaced atomically each epoch) for
:mod:`labkit.dashboard`.

Where records go: the ``path`` argument, else ``$LABKIT_RUNS_FILE``, else
``runs/runs.jsonl`` under the current directory.
"""

from __future__ import annotations

import atexit
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

DEFAULT_FILE = "runs/runs.jsonl"
FILE_VAR = "LABKIT_RUNS_FILE"
RUN_ID_VAR = "LABKIT_RUN_ID"
LAUNCHER_VAR = "LABKIT_LAUNCHER"
SCHEMA = 1


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


def world(strategy: Any = None) -> dict[str, Any]:
    """``rank``, ``workers``, ``is_chief`` and ``launcher``/``strategy`` of this process."""
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
    np_env = os.environ.get("LABKIT_NP", "")
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
    from labkit.launch import cpu_count

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


# ----------------------------------------------------------------------------- the callback


class _RecorderMixin:
    """Keras callback that appends one run record when training ends (rank 0 / chief only).

    ``script`` is the training script (pass ``__file__``) and ``config`` its settings
    (``vars(args)``): ``batch_size`` (per worker), ``widen_factor``, ``train_size``,
    ``test_size``, ``epochs``, ``target_accuracy`` are read from it when present.
    Put it last in the callbacks so it sees averaged metrics.
    """

    def __init__(
        self,
        script: str,
        config: dict[str, Any] | None = None,
        lab: str | None = None,
        path: str | os.PathLike | None = None,
        target: float | None = None,
        batch_size: int | None = None,
    ) -> None:
        super().__init__()
        self.script = str(script)
        self.config = dict(config or {})
        guess_lab, self.step = lab_and_step(self.script)
        self.lab = lab or os.environ.get("LABKIT_LAB") or guess_lab
        self.path = runs_file(path)
        self.run_id = os.environ.get(RUN_ID_VAR) or new_run_id()
        self.target = target if target is not None else self.config.get("target_accuracy")
        self.batch_size = batch_size or self.config.get("batch_size")
        self.epochs: list[dict[str, Any]] = []
        self.record: dict[str, Any] | None = None
        self.written = False
        self.active = False
        self._t_train = self._t_epoch = self._c_epoch = 0.0
        self._train_time: float | None = None
        self._train_cpu: float | None = None
        self._error: str | None = None

    # -- Keras hooks
    def on_train_begin(self, logs: Any = None) -> None:
        strategy = getattr(self.model, "distribute_strategy", None) if getattr(self, "model", None) else None
        self.world = world(strategy)
        self.active = bool(self.world["is_chief"])
        self.start = time.time()
        self._t_train = time.perf_counter()
        self.epochs = []
        self.written = False
        if self.active:
            self.record = self._base_record()
            self._write_live("running")
            atexit.register(self._at_exit)
            self._hook_excepthook()

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._t_epoch = time.perf_counter()
        self._c_epoch = time.process_time()
        self._train_time = self._train_cpu = None

    def on_test_begin(self, logs: Any = None) -> None:
        if self._t_epoch and self._train_time is None:
            self._train_time = time.perf_counter() - self._t_epoch
            self._train_cpu = time.process_time() - self._c_epoch

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        now = time.perf_counter()
        wall = now - self._t_epoch
        train = self._train_time if self._train_time is not None else wall
        cpu = self._train_cpu if self._train_cpu is not None else time.process_time() - self._c_epoch
        steps = int((self.params or {}).get("steps") or 0)
        images = steps * int(self.batch_size or 0) * int(self.world["workers"])
        logs = dict(logs or {})
        entry = {
            "epoch": epoch + 1,
            "wall_s": round(wall, 4),
            "train_s": round(train, 4),
            "steps": steps,
            "images": images,
            "images_per_sec": round(images / train, 2) if images and train > 0 else None,
            # CPU seconds this process (all its threads) used per second of training: about the
            # number of cores it got. Far below the threads it was given means a busy machine.
            "cpu_cores": round(cpu / train, 3) if train > 0 else None,
            "elapsed_s": round(now - self._t_train, 4),
        }
        for key in ("loss", "accuracy", "val_loss", "val_accuracy"):
            if key in logs:
                entry[key] = float(logs[key])
        self.epochs.append(entry)
        if self.active:
            self._write_live("running")

    def on_train_end(self, logs: Any = None) -> None:
        if self.active and not self.written:
            self._finish(0, "ok")

    # -- record building
    def _base_record(self) -> dict[str, Any]:
        c, w = self.config, self.world
        per_worker = int(self.batch_size) if self.batch_size else None
        threads = os.environ.get("LABKIT_THREADS") or os.environ.get("TF_NUM_INTRAOP_THREADS")
        return {
            "schema": SCHEMA,
            "run_id": self.run_id,
            "script": self.script,
            "lab": self.lab,
            "step": self.step,
            "launcher": w["launcher"],
            "strategy": w["strategy"],
            "workers": w["workers"],
            "threads_per_worker": int(threads) if threads and threads.isdigit() else None,
            "device": device_info(),
            "batch_per_worker": per_worker,
            "global_batch": per_worker * w["workers"] if per_worker else None,
            "widen_factor": c.get("widen_factor"),
            "train_size": c.get("train_size"),
            "test_size": c.get("test_size"),
            "mode": c.get("mode"),
            "epochs_requested": c.get("epochs"),
            "target_accuracy": self.target,
            "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.start)),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "log_dir": os.environ.get("LABKIT_LOG_DIR"),
            "bench": os.environ.get("LABKIT_BENCH"),
            "versions": versions(),
            "config": c,
        }

    def results(self) -> dict[str, Any]:
        """The measured part of the record so far."""
        accs = [e.get("val_accuracy") for e in self.epochs]
        ttt = epochs_to = None
        if self.target is not None:
            for e in self.epochs:
                if e.get("val_accuracy") is not None and e["val_accuracy"] >= float(self.target):
                    ttt, epochs_to = e["elapsed_s"], e["epoch"]
                    break
        return {
            "epochs": self.epochs,
            "epochs_run": len(self.epochs),
            "val_accuracy": accs,
            "final_val_accuracy": accs[-1] if accs else None,
            "images_per_sec": summarize(self.epochs),
            "cpu_cores": summarize(self.epochs, "cpu_cores"),
            "time_to_target_s": ttt,
            "epochs_to_target": epochs_to,
            "train_time_s": round(sum(e["train_s"] for e in self.epochs), 4),
            "duration_s": round(time.perf_counter() - self._t_train, 4),
        }

    def _finish(self, exit_status: int, status: str, error: str | None = None) -> None:
        if self.written or self.record is None:
            return
        self.written = True
        rec = {**self.record, **self.results(), "exit_status": exit_status, "status": status, "error": error}
        try:
            append(rec, self.path)
        finally:
            self._write_live(status, rec)

    def _write_live(self, status: str, rec: dict[str, Any] | None = None) -> None:
        try:
            base = rec or {**(self.record or {}), **self.results()}
            write_json_atomic(live_file(self.run_id, self.path), {**base, "status": status, "updated": time.time()})
        except OSError:
            pass  # progress display is best effort; the record is what counts

    # -- failures: the process dies before on_train_end
    def _hook_excepthook(self) -> None:
        previous = sys.excepthook

        def hook(kind: Any, value: Any, tb: Any) -> None:
            self._error = f"{kind.__name__}: {value}"
            previous(kind, value, tb)

        sys.excepthook = hook

    def _at_exit(self) -> None:
        if self.active and not self.written:
            status = "interrupted" if (self._error or "").startswith("KeyboardInterrupt") else "failed"
            self._finish(1, status, self._error or "the process exited before training ended")


def __getattr__(name: str) -> Any:
    """``Recorder`` is built on ``tf.keras.callbacks.Callback`` on first use, so that
    reading records, benchmarks and plots never import TensorFlow."""
    if name == "Recorder":
        import tensorflow as tf

        cls = type("Recorder", (_RecorderMixin, tf.keras.callbacks.Callback), {
            "__doc__": _RecorderMixin.__doc__, "__module__": __name__})
        globals()["Recorder"] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ----------------------------------------------------------------------------- jobs


def record_failed_job(
    result: Any, run_id: str, command: list[str] | None = None, path: str | os.PathLike | None = None,
    **fields: Any,
) -> dict[str, Any] | None:
    """After a launched job: if it failed and its script wrote no record, append one that says so.

    ``result`` is a :class:`labkit.launch.JobResult`. Returns the record written, or None.
    """
    if getattr(result, "ok", False):
        return None
    if select(read(path, warn=False), run_id=run_id):
        return None
    status = "timeout" if result.timed_out else "interrupted" if result.interrupted else "failed"
    error = next(iter(result.rank_errors.values()), None) if result.rank_errors else None
    rec = {
        "schema": SCHEMA,
        "run_id": run_id,
        "script": next((c for c in (command or []) if c.endswith(".py")), None),
        "workers": result.np,
        "exit_status": result.returncode,
        "status": status,
        "error": (error or "")[-2000:] or None,
        "log_dir": str(result.log_dir),
        "duration_s": round(result.duration, 3),
        "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() - result.duration)),
        "host": socket.gethostname(),
        "epochs": [],
        "images_per_sec": None,
        "versions": versions(),
        **fields,
    }
    append(rec, path)
    return rec
