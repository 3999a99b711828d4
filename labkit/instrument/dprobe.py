"""Run a learner's tf.distribute script and record what each process really does.

The ``tfdist`` probe of :mod:`labkit.instrument.start`: ``python -m labkit.instrument.start tfdist OUTDIR -- SCRIPT
[ARGS...]`` runs ``SCRIPT`` as ``__main__`` after patching, in this process only:

* ``fashion_mnist.load_data``: the real labels, but every training image is a
  constant grey level equal to its index modulo 256, so that a batch tells which
  examples it holds whatever the shuffling, flipping and shifting;
* strategies and ``ClusterCoordinator`` objects, as they are created and used;
* ``tf.keras.Model.fit``: the model's strategy, its variables (types, devices,
  whether replicas hold the same values), the batches each replica receives,
  epoch begin/end events (appended to ``OUTDIR/<task>.events.jsonl`` at once, so a
  killed process leaves them; an epoch's end carries the learning rate of each of its
  training batches), the weights after training;
* ``Model.save``: where each process saved.

A process stopped with SIGTERM leaves its Python stacks in ``OUTDIR/stack.<task>.term.txt``
(:mod:`labkit.core.stacks`). The record goes to ``OUTDIR/<task>.json`` (``<task>`` from ``LABKIT_TASK`` or
``TF_CONFIG``, else ``local.0``). ``LABKIT_PROBE_LOAD=PATH`` reloads a saved
model at the end and compares its weights with the trained ones.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any, ClassVar

from labkit.core import contract, stacks
from labkit.instrument import data, start
from labkit.instrument.dprobe_record import Recorder, digest, model_variables, sample_batches
from labkit.instrument.hooks import fit as fit_hook
from labkit.instrument.keras_reads import learning_rate
from labkit.instrument.observer import OBSERVER
from labkit.records.tfdist_probe import Fit, Load


def install(rec: Recorder) -> None:
    """Patch data loading, strategies, the coordinator, fit and save."""
    import numpy as np

    def tagged(_real: Any) -> Any:
        def load_data(*_a: Any, **_k: Any) -> Any:
            train, test = data.load()
            grey = (np.arange(len(train)) % 256).astype(np.uint8)
            x = np.broadcast_to(grey[:, None, None], train.x.shape).copy()
            return (x, train.y.astype(np.uint8)), (test.x.copy(), test.y.astype(np.uint8))

        return load_data

    import tensorflow as tf
    from tensorflow.python.distribute import distribute_lib

    # A probed run trains a few batches: optimising their graphs (Grappler) costs more than it saves.
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    OBSERVER.replace_data(tagged)

    base_init = distribute_lib.StrategyBase.__init__

    def strategy_init(self: Any, *a: Any, **kw: Any) -> None:
        base_init(self, *a, **kw)
        if not type(self).__name__.startswith("_Default") and not rec.done:
            rec.strategies.append(self)
            rec.dump()

    distribute_lib.StrategyBase.__init__ = strategy_init

    coord = tf.distribute.experimental.coordinator.ClusterCoordinator
    stats = rec.record.coordinator
    c_init, c_schedule, c_join = coord.__init__, coord.schedule, coord.join
    c_per_worker = coord.create_per_worker_dataset

    def cper_worker(self: Any, dataset_fn: Any, *a: Any, **kw: Any) -> Any:
        # Each worker gets its own input pipeline, however the script asked for it (fit or a custom loop).
        function = callable(dataset_fn) and not isinstance(dataset_fn, tf.data.Dataset)
        stats.per_worker_datasets.append("function" if function else type(dataset_fn).__name__)
        rec.dump()
        return c_per_worker(self, dataset_fn, *a, **kw)

    coord.create_per_worker_dataset = cper_worker
    _record_ps_variables(tf, rec)

    def cinit(self: Any, *a: Any, **kw: Any) -> None:
        c_init(self, *a, **kw)
        stats.created += 1
        rec.dump()

    def cschedule(self: Any, *a: Any, **kw: Any) -> Any:
        stats.scheduled += 1
        return c_schedule(self, *a, **kw)

    def cjoin(self: Any, *a: Any, **kw: Any) -> Any:
        out = c_join(self, *a, **kw)
        stats.joined += 1
        try:
            stats.workers = int(self._cluster._num_workers)
        except Exception:  # noqa: BLE001
            pass
        return out

    coord.__init__, coord.schedule, coord.join = cinit, cschedule, cjoin

    class Events(tf.keras.callbacks.Callback):
        """Epoch events; ParameterServerStrategy refuses batch-level callbacks, so the rate is read per epoch."""

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.rates: list[float | None] = []
            rec.event(kind="epoch_begin", epoch=int(epoch))

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            rates = getattr(self, "rates", None) or [learning_rate(self.model.optimizer)]
            rec.event(kind="epoch_end", epoch=int(epoch), lr=rates)

    class BatchEvents(Events):
        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.rates.append(learning_rate(self.model.optimizer))  # after the script's callbacks set it

    OBSERVER.fit.add(_FitListener(rec, Events, BatchEvents))
    model_cls = tf.keras.Model
    original_save = model_cls.save

    def save(self: Any, filepath: Any, *a: Any, **kw: Any) -> Any:
        out = original_save(self, filepath, *a, **kw)
        rec.record.saves.append(os.path.abspath(str(filepath)))
        rec.dump()
        return out

    model_cls.save = save


class _FitListener:
    """Around every ``fit`` (:mod:`labkit.instrument.hooks.fit`): the model's strategy and variables, the batches
    each replica receives, the input pipelines built, epoch events; after training, the variables and weights."""

    def __init__(self, rec: Recorder, events: Any, batch_events: Any) -> None:
        self.rec, self.events, self.batch_events = rec, events, batch_events

    def before(self, call: fit_hook.FitCall) -> None:
        rec, a, model = self.rec, call.arguments, call.model
        x = a.get("x")
        info = Fit(
            strategy=type(model.distribute_strategy).__name__,
            replicas=int(model.distribute_strategy.num_replicas_in_sync),
            steps_per_epoch=a.get("steps_per_epoch"),
            epochs=a.get("epochs"),
            callbacks=[type(c).__name__ for c in call.callbacks],
            variables=model_variables(model),
            input=type(x).__name__,
        )
        call.notes["dprobe"] = info
        rec.record.fits.append(info)
        rec.dump()
        fn = getattr(x, "dataset_fn", None)
        if callable(fn):  # a DatasetCreator: count the input pipelines built from it (one per worker)
            calls: list[int | None] = []
            info.dataset_fn_calls = calls

            def counted(context: Any = None, *args: Any, **kwargs: Any) -> Any:
                calls.append(getattr(context, "input_pipeline_id", None))
                rec.dump()
                return fn(context, *args, **kwargs)

            x.dataset_fn = counted
        if "Parameter" not in info.strategy:
            try:
                info.batches, a["x"] = sample_batches(model, x, a)
            except Exception as e:  # noqa: BLE001 - report, never break the learner's run
                info.batches_error = f"{type(e).__name__}: {e}"[:300]
        rec.dump()
        call.callbacks.append(self.events() if "Parameter" in info.strategy else self.batch_events())
        rec.event(kind="fit_begin")

    def after(self, call: fit_hook.FitCall) -> None:
        if call.error is not None or "dprobe" not in call.notes:
            return
        rec, info, model = self.rec, call.notes["dprobe"], call.model
        rec.event(kind="fit_end")
        info.after = model_variables(model)
        info.weights = digest(model.get_weights())
        try:
            info.iterations = int(model.optimizer.iterations.numpy())
        except Exception:  # noqa: BLE001
            pass
        rec.model = model
        rec.dump()


def _record_ps_variables(tf: Any, rec: Recorder) -> None:
    """Where the variables created under a ParameterServerStrategy go (with fit or without)."""
    try:
        from tensorflow.python.distribute import parameter_server_strategy_v2 as pss
    except ImportError:  # pragma: no cover - TensorFlow moved it
        return
    extended = pss.ParameterServerStrategyV2Extended
    original = extended._create_variable
    devices = rec.record.ps_variable_devices

    def create(self: Any, *a: Any, **kw: Any) -> Any:
        var = original(self, *a, **kw)
        try:
            parts = getattr(var, "model_variables", None) or [var]  # a sharded variable has parts
            for part in parts:
                devices[part.device] = devices.get(part.device, 0) + 1
        except Exception:  # noqa: BLE001 - observing must never break the run
            pass
        return var

    extended._create_variable = create


class DistributeProbe:
    """The tf.distribute checks' probe in one task; :func:`labkit.instrument.start.run` runs the script."""

    OPTIONS: ClassVar[str] = ""

    rec: Recorder

    @classmethod
    def parse(cls, options: list[str]) -> DistributeProbe | None:
        """It has no options of its own."""
        return None if options else cls()

    def prepare(self, out: str) -> None:
        rec = self.rec = Recorder(Path(out))
        stacks.install(rec.outdir / f"stack.{rec.task}")  # where it was, if it has to be stopped
        install(rec)
        rec.dump()

    def failed(self, error: BaseException) -> None:
        self.rec.record.error = "".join(traceback.format_exception_only(type(error), error)).strip()[-2000:]
        print(start.format_error(error), end="", file=sys.stderr)

    def finish(self, code: int) -> None:
        rec = self.rec
        model = rec.model
        rec.done = True
        load = contract.settings().probe_load
        if code == 0 and load and model is not None:
            rec.record.load = _reload(load, rec.record.fits[-1].weights or "")
        rec.record.exit = code
        rec.dump()


def _reload(path: str, trained: str) -> Load:
    import tensorflow as tf

    if not os.path.exists(path):
        return Load(False, error=f"{path} does not exist")
    try:
        # A fresh one-device scope: loading must not join the (finished) cluster's collectives.
        with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
            loaded = tf.keras.models.load_model(path)
        same = digest(loaded.get_weights()) == trained
        return Load(True, same)
    except Exception as e:  # noqa: BLE001
        return Load(False, error=f"{type(e).__name__}: {e}"[:400])
