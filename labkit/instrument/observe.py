"""Observe a training script from outside, so that every run labkit starts gets a record.

The script carries no labkit code. A launcher sets ``LABKIT_OBSERVE=FOLDER`` in
the environment of the processes it starts; the start-up hook that ``make setup``
installs (:mod:`labkit.core.env`) then calls :func:`install` before the script runs.
Like :mod:`labkit.instrument.probe` it patches library entry points in this process only:

* ``argparse``: the parsed arguments are kept (batch size, target accuracy, ...);
* ``Model.fit`` (tf-keras): one more callback, last, measures every epoch: time of
  the training steps only (validation excluded), batches, CPU time, and the
  metrics the other callbacks left (averaged ones when the script averages them);
* with ``LABKIT_SHRINK=TRAIN,TEST,DIVISOR`` (set by ``labkit bench --shrink``)
  ``fashion_mnist.load_data`` returns the first TRAIN/TEST images and every
  ``Conv2D`` gets ``filters // DIVISOR`` (at least 16) filters: a full-size script
  benchmarked on a CPU;
* with ``LABKIT_OPTIMIZER=compression=fp16,...`` (``labkit bench --optimizer``) Horovod's
  ``DistributedOptimizer`` takes those knobs (:mod:`labkit.instrument.optimizer_knobs`).

Each process writes ``FOLDER/observed.PID.json`` at every epoch end and at exit
(atomically); the launcher, which knows the exit status and the wall time, turns
the chief's observations into the run record (:func:`labkit.records.jobrecord.finish`).
A script that never calls ``fit`` still leaves its start, end and world.
Without ``LABKIT_OBSERVE`` nothing is patched and nothing is written.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from labkit.core import contract, files, identity, patch
from labkit.instrument import optimizer_knobs, shrink
from labkit.instrument.hooks import arguments
from labkit.instrument.hooks import fit as fit_hook
from labkit.instrument.keras_reads import batch_of
from labkit.records import jobrecord, runs

OBSERVE_VAR = contract.OBSERVE
SHRINK_VAR = contract.SHRINK

STATE: dict[str, Any] = {}
_INSTALLED: list[bool] = []


# ----------------------------------------------------------------------------- after-import hooks


def when_imported(name: str, hook: Callable[[Any], None]) -> None:
    """:func:`labkit.core.patch.when_imported`, but a failing hook is noted, never raised into the script."""

    def guarded(module: Any) -> None:
        try:
            hook(module)
        except Exception as e:  # noqa: BLE001 - observing must never break the script
            STATE.setdefault("observer_errors", []).append(f"{name}: {type(e).__name__}: {e}")

    patch.when_imported(name, guarded)


# ----------------------------------------------------------------------------- the record-to-be


def _who() -> dict[str, Any]:
    return identity.world(STATE.get("strategy"))


def _save() -> None:
    folder = STATE.get("folder")
    if not folder:
        return
    try:
        # The world as training saw it: at exit Horovod (or a strategy) may already be shut down.
        if not (STATE.get("train_end") and STATE.get("world")):
            STATE["world"] = _who()
        STATE["argv"] = list(sys.argv)
        _config()
        STATE["updated"] = time.time()
        files.write_json_atomic(jobrecord.observation_path(folder, os.getpid()),
                                {k: v for k, v in STATE.items() if k not in ("strategy", "args")})
    except Exception as e:  # noqa: BLE001
        STATE.setdefault("observer_errors", []).append(f"save: {e}")


def _live() -> None:
    """The chief keeps ``runs/live/RUN_ID.json`` current for :mod:`labkit.ui.dashboard`."""
    run_id = os.environ.get(runs.RUN_ID_VAR)
    if not run_id or not STATE.get("world", {}).get("is_chief"):
        return
    try:
        rec = jobrecord.observed_record(json.loads(json.dumps(STATE, default=str)), run_id)
        files.write_json_atomic(runs.live_file(run_id), {**rec, "status": "running", "updated": time.time()})
    except Exception:  # noqa: BLE001 - progress display is best effort
        pass


def _at_exit() -> None:
    STATE["ended"] = time.time()
    _save()


# ----------------------------------------------------------------------------- the learning rate


# ----------------------------------------------------------------------------- patches


def _config() -> None:
    """The script's parsed arguments as they are now (plain values only)."""
    try:
        STATE["config"] = {k: v for k, v in vars(STATE["args"]).items()
                           if isinstance(v, (str, int, float, bool)) or v is None}
    except (KeyError, TypeError):
        pass


def _arguments(ns: Any, extras: list[str]) -> list[str]:
    """The script's own command line was parsed: keep its namespace (read at each save: scripts fill defaults in
    after parsing, e.g. by mode)."""
    STATE["args"] = ns
    _config()
    return extras


class _FitListener:
    """Around every ``fit`` (:mod:`labkit.instrument.hooks.fit`): note the call and add the observer callback, last."""

    def before(self, call: fit_hook.FitCall) -> None:
        try:
            a = call.arguments
            STATE["strategy"] = getattr(call.model, "distribute_strategy", None)
            per_step, how = batch_of(a.get("x"), a.get("batch_size"))
            STATE["fits"].append({"start": time.time(), "batch_per_step": per_step, "batch_from": how,
                                  "epochs": a.get("epochs"), "steps_per_epoch": a.get("steps_per_epoch"),
                                  "initial_epoch": a.get("initial_epoch")})
            # Keras refuses batch-level callbacks under a ParameterServerStrategy: count steps from fit's arguments.
            ps = "ParameterServer" in type(STATE["strategy"]).__name__
            call.callbacks.append(_observer(per_step, batch_hooks=not ps, steps=a.get("steps_per_epoch")))
        except Exception as e:  # noqa: BLE001 - never stand between the script and fit
            STATE.setdefault("observer_errors", []).append(f"fit: {type(e).__name__}: {e}")

    def after(self, call: fit_hook.FitCall) -> None:
        pass


_FIT = _FitListener()


def _observer(per_step: int | None, batch_hooks: bool = True, steps: int | None = None) -> Any:
    """The callback that records each epoch; without ``batch_hooks`` (parameter servers) steps come from ``steps``."""
    import tensorflow as tf

    class Observer(tf.keras.callbacks.Callback):
        """Times each epoch's training steps (validation excluded) and keeps its metrics."""

        def on_train_begin(self, logs: Any = None) -> None:

            STATE["train_begin"] = STATE.get("train_begin") or time.time()
            STATE["versions"] = identity.versions()
            STATE["device"] = identity.device_info()
            try:  # what each step all-reduces (data parallelism): one gradient per trainable weight
                STATE["gradient_bytes"] = sum(int(w.shape.num_elements() or 0) * w.dtype.size
                                              for w in self.model.trainable_weights)
            except Exception as e:  # noqa: BLE001 - never stand between the script and fit
                STATE.setdefault("observer_errors", []).append(f"gradient size: {e}")
            self.batches = 0
            self.t0 = self.c0 = 0.0
            self.train_s: float | None = None
            self.cpu_s: float | None = None
            _save()

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.batches, self.train_s, self.cpu_s = 0, None, None
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def on_test_begin(self, logs: Any = None) -> None:
            if self.t0 and self.train_s is None:
                self.train_s = time.perf_counter() - self.t0
                self.cpu_s = time.process_time() - self.c0

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            wall = time.perf_counter() - self.t0
            train = self.train_s if self.train_s is not None else wall
            cpu = self.cpu_s if self.cpu_s is not None else time.process_time() - self.c0
            entry: dict[str, Any] = {"epoch": epoch + 1, "end": time.time(), "wall_s": round(wall, 4),
                                     "train_s": round(train, 4), "steps": self.batches or steps,
                                     "batch_per_step": per_step, "cpu_s": round(cpu, 4)}
            for key, value in (logs or {}).items():
                try:
                    entry[str(key)] = float(value)
                except (TypeError, ValueError):
                    continue
            STATE["epochs"].append(entry)
            _save()
            _live()

        def on_train_end(self, logs: Any = None) -> None:
            STATE["train_end"] = time.time()
            _save()

    class BatchObserver(Observer):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            # With steps_per_execution=K Keras calls this once per K steps, with the last step's index.
            self.batches = max(self.batches + 1, batch + 1)

    return BatchObserver() if batch_hooks else Observer()


def _patch_coordinator(module: Any) -> None:
    """ParameterServerStrategy: note when each worker finished each step (closure) the coordinator sent it."""
    real = module.Worker._process_closure

    def _process_closure(self: Any, closure: Any) -> Any:
        try:
            return real(self, closure)
        finally:
            STATE.setdefault("worker_steps", {}).setdefault(str(self.worker_index), []).append(round(time.time(), 3))

    module.Worker._process_closure = _process_closure


def _from_outside(key: str, spec: str, make: Callable[[str], tuple[Any, dict[str, Callable[[Any], None]]]]) -> None:
    """Patches a benchmark sets from outside (``--shrink``, ``--optimizer``): the record notes them as ``key``;
    a bad setting is an observer error, never the script's."""
    try:
        note, hooks = make(spec)
    except ValueError as e:
        STATE.setdefault("observer_errors", []).append(str(e))
        return
    STATE[key] = note
    for module, hook in hooks.items():
        when_imported(module, hook)


def install(folder: str | None = None) -> bool:
    """Start observing this process (once); True when observing. Never raises."""
    if _INSTALLED:
        return True
    folder = folder or os.environ.get(OBSERVE_VAR)
    if not folder:
        return False
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        STATE.update(folder=folder, pid=os.getpid(), started=time.time(), fits=[], epochs=[], config=None,
                     task=contract.settings().task)
        arguments.add(_arguments)
        job = contract.current()
        if job.shrink:
            _from_outside("shrink", job.shrink, shrink.from_spec)
        if job.optimizer:
            _from_outside("optimizer_knobs", job.optimizer, optimizer_knobs.from_spec)
        fit_hook.add(_FIT)
        when_imported("tensorflow.python.distribute.coordinator.cluster_coordinator", _patch_coordinator)
        atexit.register(_at_exit)
        _INSTALLED.append(True)
    except Exception as e:  # noqa: BLE001
        print(f"labkit: could not observe this run: {e}", file=sys.stderr)
        return False
    return True


def begin(folder: str) -> bool:
    """Observe the next run of a long-lived process (an ipyparallel engine) into ``folder``, afresh."""
    ok = install(folder)
    STATE.update(folder=folder, pid=os.getpid(), started=time.time(), fits=[], epochs=[], config=None, world={},
                 strategy=None, train_begin=None, train_end=None, ended=None, task=contract.settings().task)
    return ok


def end() -> None:
    """The run observed since :func:`begin` is over: write its last observation."""
    STATE["ended"] = time.time()
    _save()


def stop() -> None:
    """Stop observing this process and leave nothing (for labkit's own helper processes)."""
    if _INSTALLED:
        atexit.unregister(_at_exit)
        STATE["folder"] = None
