"""Observe a training script from outside, so that every run labkit starts gets a record: the ``run`` probe of
:mod:`labkit.instrument.start`.

The script carries no labkit code. A launcher that records its job starts each rank's ``python SCRIPT ARGS`` as
``python -m labkit.instrument.start run FOLDER -- SCRIPT ARGS`` (:func:`labkit.instrument.start.command`), and
:class:`RunProbe` observes the script through the shared hooks (:mod:`labkit.instrument.hooks`), in this
process only:

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

Each process writes ``FOLDER/observed.PID.json`` at every epoch end and when the script ends
(atomically); the launcher, which knows the exit status and the wall time, turns
the chief's observations into the run record (:func:`labkit.records.jobrecord.finish`).
A script that never calls ``fit`` still leaves its start, end and world. A long-lived process that runs one
script after another (an ipyparallel engine) starts each run with a fresh record (:meth:`RunProbe.prepare`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from labkit.core import contract, env, files, identity
from labkit.instrument import optimizer_knobs, shrink, start
from labkit.instrument.hooks import fit as fit_hook
from labkit.instrument.keras_reads import batch_of
from labkit.instrument.observer import OBSERVER
from labkit.records import jobrecord, observation, runs, typed
from labkit.records.observation import EpochNote, FitNote

SHRINK_VAR = contract.SHRINK


# ----------------------------------------------------------------------------- the record-to-be


def _save() -> None:
    rec = OBSERVER.run.record
    if not rec.folder:
        return
    try:
        # The world as training saw it: at exit Horovod (or a strategy) may already be shut down.
        if not (rec.train_end and rec.world):
            rec.world = identity.world(OBSERVER.run.strategy)
        rec.argv = list(sys.argv)
        _config()
        rec.updated = time.time()
        files.write_json_atomic(observation.path(rec.folder, os.getpid()),
                                json.loads(json.dumps(typed.dump(rec), default=str)))
    except Exception as e:  # noqa: BLE001
        OBSERVER.run.error(f"save: {e}")


def _live() -> None:
    """The chief keeps ``runs/live/RUN_ID.json`` current for :mod:`labkit.ui.dashboard`."""
    run_id = os.environ.get(runs.RUN_ID_VAR)
    world = OBSERVER.run.record.world
    if not run_id or world is None or not world.is_chief:
        return
    try:
        runs.write_live(dataclasses.replace(jobrecord.observed_record(OBSERVER.run.record, run_id), status="running"))
    except Exception:  # noqa: BLE001 - progress display is best effort
        pass


# ----------------------------------------------------------------------------- patches


def _config() -> None:
    """The script's parsed arguments as they are now (plain values only)."""
    try:
        OBSERVER.run.record.config = {k: v for k, v in vars(OBSERVER.run.args).items()
                                  if isinstance(v, (str, int, float, bool)) or v is None}
    except TypeError:  # no namespace (yet)
        pass


def _arguments(ns: Any, extras: list[str]) -> list[str]:
    """The script's own command line was parsed: keep its namespace (read at each save: scripts fill defaults in
    after parsing, e.g. by mode)."""
    OBSERVER.run.args = ns
    _config()
    return extras


class _FitListener:
    """Around every ``fit`` (:mod:`labkit.instrument.hooks.fit`): note the call and add the observer callback, last."""

    def before(self, call: fit_hook.FitCall) -> None:
        try:
            a = call.arguments
            OBSERVER.run.strategy = getattr(call.model, "distribute_strategy", None)
            per_step, how = batch_of(a.get("x"), a.get("batch_size"))
            OBSERVER.run.record.fits.append(FitNote(time.time(), per_step, how, a.get("epochs"),
                                                    a.get("steps_per_epoch"), a.get("initial_epoch")))
            # Keras refuses batch-level callbacks under a ParameterServerStrategy: count steps from fit's arguments.
            ps = "ParameterServer" in type(OBSERVER.run.strategy).__name__
            call.callbacks.append(_observer(per_step, batch_hooks=not ps, steps=a.get("steps_per_epoch")))
        except Exception as e:  # noqa: BLE001 - never stand between the script and fit
            OBSERVER.run.error(f"fit: {type(e).__name__}: {e}")

    def after(self, call: fit_hook.FitCall) -> None:
        pass



def _observer(per_step: int | None, batch_hooks: bool = True, steps: int | None = None) -> Any:
    """The callback that records each epoch; without ``batch_hooks`` (parameter servers) steps come from ``steps``."""
    import tensorflow as tf

    rec = OBSERVER.run.record

    class EpochObserver(tf.keras.callbacks.Callback):
        """Times each epoch's training steps (validation excluded) and keeps its metrics."""

        def on_train_begin(self, logs: Any = None) -> None:
            rec.train_begin = rec.train_begin or time.time()
            rec.versions = identity.versions()
            rec.device = identity.device_info()
            try:  # what each step all-reduces (data parallelism): one gradient per trainable weight
                rec.gradient_bytes = sum(int(w.shape.num_elements() or 0) * w.dtype.size
                                         for w in self.model.trainable_weights)
            except Exception as e:  # noqa: BLE001 - never stand between the script and fit
                OBSERVER.run.error(f"gradient size: {e}")
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
            metrics = {}
            for key, value in (logs or {}).items():
                try:
                    metrics[str(key)] = float(value)
                except (TypeError, ValueError):
                    continue
            rec.epochs.append(EpochNote(epoch + 1, time.time(), round(wall, 4), round(train, 4), self.batches or steps,
                                        per_step, round(cpu, 4), metrics))
            _save()
            _live()

        def on_train_end(self, logs: Any = None) -> None:
            rec.train_end = time.time()
            _save()

    class BatchObserver(EpochObserver):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            # With steps_per_execution=K Keras calls this once per K steps, with the last step's index.
            self.batches = max(self.batches + 1, batch + 1)

    return BatchObserver() if batch_hooks else EpochObserver()


def _worker_step(worker: int) -> None:
    """ParameterServerStrategy: a worker finished a step (closure) the coordinator sent it
    (:mod:`labkit.instrument.hooks.coordinator`)."""
    OBSERVER.run.record.worker_steps.setdefault(str(worker), []).append(round(time.time(), 3))


def _from_outside(key: str, spec: str, make: Callable[[str], tuple[Any, dict[str, Callable[[Any], None]]]]) -> None:
    """Patches a benchmark sets from outside (``--shrink``, ``--optimizer``): the record notes them as ``key``;
    a bad setting is an observer error, never the script's."""
    try:
        note, hooks = make(spec)
    except ValueError as e:
        OBSERVER.run.error(str(e))
        return
    setattr(OBSERVER.run.record, key, note)
    for module, hook in hooks.items():
        OBSERVER.when_imported(module, hook, noted=True)


def _install() -> None:
    """The hooks, once per process: arguments, the patches a benchmark sets from outside, fit, the coordinator."""
    OBSERVER.arguments.add(_arguments)
    job = contract.current()
    if job.shrink:
        _from_outside("shrink", job.shrink, shrink.from_spec)
    if job.optimizer:
        _from_outside("optimizer_knobs", job.optimizer, optimizer_knobs.from_spec)
    OBSERVER.fit.add(_FitListener())
    OBSERVER.closures.add(_worker_step)
    OBSERVER.run.installed = True


def begin(folder: str) -> bool:
    """Observe the run about to start in this process into ``folder``, with a fresh record (the hooks are installed
    the first time); True when observing. Never raises."""
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        OBSERVER.run.begin(folder)
        if not OBSERVER.run.installed:
            _install()
    except Exception as e:  # noqa: BLE001 - observing must never stop the script
        print(f"labkit: could not observe this run: {e}", file=sys.stderr)
        return False
    return True


def end() -> None:
    """The run observed since :func:`begin` is over: write its last observation."""
    OBSERVER.run.record.ended = time.time()
    _save()


class RunProbe:
    """The ``run`` probe of :mod:`labkit.instrument.start`: the run record's observations, no options."""

    OPTIONS: ClassVar[str] = ""

    @classmethod
    def parse(cls, options: list[str]) -> RunProbe | None:
        return None if options else cls()

    def prepare(self, out: str) -> None:
        env.apply_defaults()  # before TensorFlow loads
        begin(os.path.abspath(out))

    def failed(self, error: BaseException) -> None:
        print(start.format_error(error), end="", file=sys.stderr)  # as Python prints an exception nobody caught

    def finish(self, code: int) -> None:
        end()
