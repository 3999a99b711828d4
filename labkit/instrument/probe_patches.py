"""The patches a probed rank runs under (:mod:`labkit.instrument.probe`): library entry points replaced in this
process only, so that the learner's script runs unchanged on a tiny slice of data with a narrow model, two
simulated GPUs, and every fit, evaluate, save and learning rate recorded (what Horovod all-reduces, by dtype:
:mod:`labkit.instrument.probe_allreduce`)."""

from __future__ import annotations

import os
from typing import Any

from labkit.instrument import data, probe_allreduce
from labkit.instrument.callback_reads import plain, wrap_callback
from labkit.instrument.hooks import fit as fit_hook
from labkit.instrument.keras_reads import learning_rate
from labkit.instrument.observer import OBSERVER
from labkit.instrument.probe_record import FAKE_GPUS, TEST_PER_RANK, TRAIN_PER_RANK, Rank
from labkit.records.hvd_probe import CallbackRead, Epoch, EvaluateCall, FitCall, LayerDtypes, ModelDtypes, Save


def patch_arguments(rank: Rank, tolerated: list[str]) -> None:
    """Let the script's own command line carry the check's ``tolerated`` options even when it does not define them.

    One probed run can then serve several steps: ``--checkpoint-dir DIR`` (step 7's option) reaches a script that
    has it, and a script that has not yet got it still runs steps 1-6. An option the script ignored this way is
    kept in the record's ``ignored_args``, for the step that asks for it to say so
    (:mod:`labkit.instrument.hooks.arguments` passes the arguments the script's parser did not know; ``parse_args``
    refuses those kept).
    """

    def drop_tolerated(_ns: Any, extras: list[str]) -> list[str]:
        kept: list[str] = []
        skip = False
        for i, arg in enumerate(extras):
            if skip:
                skip = False
                continue
            name = arg.split("=", 1)[0]
            if name in tolerated:
                if rank.state.ignored_args is None:
                    rank.state.ignored_args = []
                if name not in rank.state.ignored_args:
                    rank.state.ignored_args.append(name)
                skip = "=" not in arg and i + 1 < len(extras) and not extras[i + 1].startswith("-")
                continue
            kept.append(arg)
        return kept

    OBSERVER.arguments.add(drop_tolerated)


def patch_data(rank: Rank) -> None:
    """Each rank's own tiny slice of Fashion-MNIST (:meth:`labkit.instrument.observer.Observer.replace_data`)."""
    import numpy as np

    offset = rank.rank * (TRAIN_PER_RANK + TEST_PER_RANK)

    def slice_of_rank(_real: Any) -> Any:
        def load_data(*_a: Any, **_k: Any) -> Any:
            train, test = data.load(TRAIN_PER_RANK, TEST_PER_RANK, offset=offset)
            return (train.x.copy(), train.y.astype(np.uint8)), (test.x.copy(), test.y.astype(np.uint8))

        return load_data

    OBSERVER.replace_data(slice_of_rank)


def shrink(filters: int) -> int:
    """Narrower conv layers: same shape logic, a fraction of the compute."""
    return filters if filters <= 16 else max(8, filters // 8)


def patch_model() -> None:
    """Narrow convolutions (:meth:`labkit.instrument.observer.Observer.narrow`)."""
    OBSERVER.narrow(shrink)


def patch_devices(tf: Any, rank: Rank) -> None:
    from tensorflow.python.eager import context

    fakes = [context.PhysicalDevice(name=f"/physical_device:GPU:{i}", device_type="GPU") for i in range(FAKE_GPUS)]
    real_list = tf.config.list_physical_devices
    real_set_visible = tf.config.set_visible_devices
    real_get_visible = tf.config.get_visible_devices
    real_growth = tf.config.experimental.set_memory_growth

    def is_fake(d: Any) -> bool:
        return any(d == f for f in fakes)

    def list_physical_devices(device_type: str | None = None) -> list[Any]:
        real = [d for d in real_list(device_type) if d.device_type != "GPU"]
        if device_type in (None, "GPU"):
            return real + list(fakes)
        return real

    def set_visible_devices(devices: Any, device_type: str | None = None) -> None:
        devs = [devices] if hasattr(devices, "device_type") else list(devices)
        if device_type == "GPU" or (devs and all(is_fake(d) for d in devs)):
            rank.state.pins.visible = [d.name for d in devs]
            rank.milestone("pinned")
            return
        real_set_visible([d for d in devs if not is_fake(d)], device_type)

    def get_visible_devices(device_type: str | None = None) -> list[Any]:
        real = [d for d in real_get_visible(device_type) if d.device_type != "GPU"]
        if device_type in (None, "GPU"):
            visible = rank.state.pins.visible
            return real + [f for f in fakes if visible is None or f.name in visible]
        return real

    def set_memory_growth(device: Any, enable: bool) -> None:
        if is_fake(device):
            rank.state.pins.memory_growth.append([device.name, bool(enable)])
            return
        real_growth(device, enable)

    for ns in (tf.config, tf.config.experimental):
        ns.list_physical_devices = list_physical_devices
        ns.set_visible_devices = set_visible_devices
        ns.get_visible_devices = get_visible_devices
    tf.config.experimental.set_memory_growth = set_memory_growth


def patch_horovod(rank: Rank) -> None:
    try:
        import horovod.tensorflow as hvd_tf
        import horovod.tensorflow.keras as hvd_keras
    except Exception as e:  # noqa: BLE001 - reported by the check if the script needs it
        rank.state.hvd_import_error = f"{type(e).__name__}: {e}"
        return
    rank.real_local_rank = hvd_tf.local_rank
    real_init = hvd_tf.init

    def local_rank() -> int:
        return rank.sim_local_rank(hvd_tf)

    def init(*args: Any, **kwargs: Any) -> Any:
        out = real_init(*args, **kwargs)
        rank.milestone("hvd_init")
        return out

    for mod in (hvd_tf, hvd_keras):
        mod.local_rank = local_rank
        mod.init = init
    probe_allreduce.patch(hvd_tf, rank)  # the dtypes Horovod all-reduces: gradients in the step, the rest apart


def _flat(variables: Any) -> Any:
    import numpy as np

    values = [np.asarray(v.numpy(), dtype=np.float64).ravel() for v in variables]
    return np.concatenate(values) if values else np.zeros(0)


def _flat_weights(model: Any) -> Any:
    return _flat(model.trainable_variables)


def _dtypes(tf: Any, model: Any) -> ModelDtypes:
    """The dtype each layer of ``model`` computes in and keeps its variables in, and its outputs' dtypes."""
    layers = [m for m in model.submodules if isinstance(m, tf.keras.layers.Layer) and not isinstance(m, tf.keras.Model)]
    outputs = getattr(model, "outputs", None)
    return ModelDtypes(
        layers=[LayerDtypes(layer.name, type(layer).__name__, getattr(layer, "compute_dtype", None),
                            sorted({v.dtype.name for v in layer.weights})) for layer in layers],
        outputs=[o.dtype.name for o in outputs] if outputs else None,
        non_trainable=sum(int(v.shape.num_elements() or 0) for v in model.non_trainable_variables))


def make_probe_callback(tf: Any, epoch_reads: list[CallbackRead], rank: Rank) -> Any:
    class Probe(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.epoch = 0
            self.train_batches = 0
            self.test_batches = 0
            self.in_fit_test = False
            self.rates: list[float | None] = []
            self.moved: list[float] = []  # per training batch: the weights' move, gradients all-reduced, their norm
            self.reduced: list[int] = []
            self.reduced_norm: list[float] = []
            self.last: Any = None  # the flat weights at the end of the last batch

        def on_train_begin(self, logs: Any = None) -> None:
            rank.weights["init"] = self.last = _flat_weights(self.model)
            rank.weights["stats_init"] = _flat(self.model.non_trainable_variables)
            try:
                rank.state.model = _dtypes(tf, self.model)
            except Exception:  # noqa: BLE001 - observing never breaks the script; the judge says it is missing
                pass
            rank.milestone("train_begin")

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch, self.train_batches, self.test_batches, self.rates = epoch, 0, 0, []
            self.moved, self.reduced, self.reduced_norm = [], [], []
            self.first = getattr(self, "first", epoch)  # the first epoch this fit runs (initial_epoch)
            rank.state.epoch = epoch

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            _tally(rank)  # what ran between training batches (fit's validation) is not this batch's
            self.rates.append(learning_rate(self.model.optimizer))  # after the script's callbacks set it
            if self.epoch == self.first and batch == 1:
                rank.weights["b1_begin"] = _flat_weights(self.model)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            import numpy as np

            self.train_batches += 1
            now = _flat_weights(self.model)
            same = self.last is not None and now.shape == self.last.shape
            self.moved.append(float(np.linalg.norm(now - self.last)) if same else -1.0)
            self.last = now
            n, norm = _tally(rank)
            self.reduced.append(n)
            self.reduced_norm.append(norm)
            rank.progress("training", self.epoch, self.train_batches)
            if self.epoch == self.first and batch == 0:
                rank.weights["after_b0"] = now
                rank.milestone("batch0_end")
            if self.epoch == self.first and batch == 1:
                rank.weights["b1_end"] = now
                rank.weights["stats_b1"] = _flat(self.model.non_trainable_variables)
                _save_weights(rank)  # evidence for steps 3-4 even if the run is cut short later
                rank.milestone("batch1_end")

        def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
            self.test_batches += 1
            rank.progress("validation", self.epoch, self.test_batches)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            rank.state.epochs.append(Epoch(
                epoch=epoch, train_batches=self.train_batches, val_batches=self.test_batches,
                final_logs=plain(logs or {}), lr=self.rates,
                # the callbacks wrapped append to this very list, epoch after epoch: keep this epoch's reads
                reads=[rd for rd in epoch_reads if rd.epoch == epoch],
                moved=self.moved, reduced=self.reduced, reduced_norm=self.reduced_norm,
            ))
            rank.milestone(f"epoch{epoch}_end")

        def on_train_end(self, logs: Any = None) -> None:
            rank.weights["final"] = _flat_weights(self.model)
            rank.weights["stats_final"] = _flat(self.model.non_trainable_variables)
            _save_weights(rank)
            rank.milestone("train_end")

    return Probe()


def _tally(rank: Rank) -> tuple[int, float]:
    """The gradients all-reduced since the last call, and their norm (none when the tally cannot be read: observing
    never breaks the script)."""
    try:
        return rank.tally.take() if rank.tally is not None else (0, 0.0)
    except Exception:  # noqa: BLE001
        return 0, 0.0


def _save_weights(rank: Rank) -> None:
    import numpy as np

    path = os.path.join(rank.out, f"weights.{rank.rank}.npz")
    os.makedirs(rank.out, exist_ok=True)
    np.savez(path + ".tmp.npz", **rank.weights)
    os.replace(path + ".tmp.npz", path)


def patch_saving(tf: Any, rank: Rank) -> None:
    """Record every model or checkpoint save: which path, in which epoch."""

    def recorder(owner: Any, name: str, kind: str, path_arg: int) -> None:
        real = getattr(owner, name)

        def save(*args: Any, **kwargs: Any) -> Any:
            path = args[path_arg] if len(args) > path_arg else kwargs.get("filepath", kwargs.get("file_prefix"))
            rank.state.saves.append(Save(kind, str(path), rank.state.epoch, bool(rank.state.in_fit)))
            rank.save()
            return real(*args, **kwargs)

        setattr(owner, name, save)

    recorder(tf.keras.Model, "save", "model", 1)
    recorder(tf.keras.Model, "save_weights", "weights", 1)
    recorder(tf.keras.models, "save_model", "model", 1)
    recorder(tf.train.Checkpoint, "write", "checkpoint", 1)


class _FitListener:
    """Around every ``fit`` (:mod:`labkit.instrument.hooks.fit`): record the call, wrap the script's callbacks to
    see what they read, add the probe's callback last, and let at most ``max_epochs`` epochs run (none: the rank
    ends cleanly at its call of fit, for a check that only asks how the script gets there)."""

    def __init__(self, tf: Any, max_epochs: int, rank: Rank) -> None:
        self.tf, self.max_epochs, self.rank = tf, max_epochs, rank

    def before(self, call: fit_hook.FitCall) -> None:
        a = call.arguments
        epoch_reads: list[CallbackRead] = []
        for i, cb in enumerate(call.callbacks):
            wrap_callback(cb, i, epoch_reads)
        opt = getattr(call.model, "optimizer", None)
        self.rank.state.fit.append(FitCall(
            verbose=a.get("verbose"),
            epochs=a.get("epochs"),
            initial_epoch=a.get("initial_epoch"),
            steps_per_epoch=a.get("steps_per_epoch"),
            validation_steps=a.get("validation_steps"),
            has_validation=a.get("validation_data") is not None,
            callbacks=[f"{type(c).__module__}.{type(c).__qualname__}" for c in call.callbacks],
            optimizer=f"{type(opt).__module__}.{type(opt).__qualname__}" if opt is not None else None,
            cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        ))
        self.rank.milestone("fit_start")
        if self.max_epochs == 0:  # the run was only asked how the script gets to fit: it ends here, cleanly
            raise SystemExit(0)
        if self.rank.tally is None:
            try:
                self.rank.tally = probe_allreduce.Tally(self.tf)
            except Exception:  # noqa: BLE001 - observing never breaks the script
                pass
        call.callbacks.append(make_probe_callback(self.tf, epoch_reads, self.rank))
        a["epochs"] = min(int(a.get("epochs") or 1), int(a.get("initial_epoch") or 0) + self.max_epochs)
        self.rank.state.in_fit = True

    def after(self, call: fit_hook.FitCall) -> None:
        self.rank.state.in_fit = False


def patch_keras(tf: Any, rank: Rank, max_epochs: int = 1) -> None:
    import inspect

    OBSERVER.fit.add(_FitListener(tf, max_epochs, rank))
    model_cls = tf.keras.Model
    real_evaluate = model_cls.evaluate

    def evaluate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if rank.state.in_fit:  # fit's own validation pass
            return real_evaluate(self, *args, **kwargs)
        sig = inspect.signature(real_evaluate)
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        rank.state.evaluate.append(EvaluateCall(bound.arguments.get("verbose")))
        return real_evaluate(self, *args, **kwargs)

    model_cls.evaluate = evaluate
