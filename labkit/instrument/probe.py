"""Run a learner's training script under observation: ``python -m labkit.instrument.probe OUT -- SCRIPT ARGS``.

Used by :mod:`labkit.check` under a 2-rank launch. It never edits the script; it
patches library entry points in this process only:

* data: ``fashion_mnist.load_data`` returns a tiny slice
  that differs per rank (so unaveraged gradients and metrics differ);
* model: ``Conv2D`` filters are shrunk so a full WideResNet runs in seconds;
* devices: two simulated GPUs are listed and pinning calls are recorded, and the
  local rank is mirrored (rank 0 has local rank 1) so that pinning by global rank
  can be told from pinning by local rank;
* ``Model.fit``/``evaluate``: arguments, callback order, metric reads per callback,
  batches per epoch, the learning rate of every training batch and weight snapshots are
  recorded (at most one epoch runs; ``--epochs N`` lets N run);
* saving: every ``Model.save``/``save_weights``/``save_model`` and ``tf.train.Checkpoint``
  write is recorded with its path and the epoch it happened in.

With ``--own-folders`` each rank runs in a folder of its own (``rank0/``, ``rank1/``), as
ranks on separate nodes see only their own disk.

Each rank writes ``OUT/probe.N.json`` (rewritten at every milestone, so a hang
still leaves evidence) and ``OUT/weights.N.npz``; ``OUT/progress.N.json`` (the batch it
is at, rewritten at most every second) and, when it is stopped or ``--budget S`` seconds
pass, its Python stacks (``OUT/stack.N.*.txt``, :mod:`labkit.core.stacks`), so that a rank that
never ends can be told where it was.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback
from typing import Any

import labkit  # noqa: F401  (environment defaults)
from labkit.core import patch, stacks
from labkit.core.identity import rank_from_env
from labkit.instrument import data
from labkit.instrument.callback_reads import plain, wrap_callback
from labkit.instrument.observe import learning_rate

TRAIN_PER_RANK = 192
TEST_PER_RANK = 64
FAKE_GPUS = 2

STATE: dict[str, Any] = {
    "rank_env": rank_from_env(),
    "milestones": [],
    "hvd": {},
    "pins": {"visible": None, "memory_growth": [], "cuda_visible_devices": None},
    "fit": [],
    "evaluate": [],
    "saves": [],
    "epochs": [],
    "data": {"train": TRAIN_PER_RANK, "test": TEST_PER_RANK},
    "error": None,
}
WEIGHTS: dict[str, Any] = {}
OUT = "."


def _write(name: str, value: Any) -> None:
    """Write ``OUT/name`` whole; never fails into the script (which may have deleted the folder)."""
    path = os.path.join(OUT, name)
    try:
        os.makedirs(OUT, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(value, f, default=str)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def _save() -> None:
    _write(f"probe.{STATE['rank_env']}.json", STATE)


_PROGRESS = {"t": 0.0}


def progress(phase: str, epoch: int, batch: int) -> None:
    """Where training is (at most one write a second): tells a loop that never ends from a hang."""
    now = time.time()
    if now - _PROGRESS["t"] >= 1.0:
        _PROGRESS["t"] = now
        _write(f"progress.{STATE['rank_env']}.json", {"phase": phase, "epoch": epoch, "batch": batch, "t": now})


def milestone(name: str) -> None:
    STATE["milestones"].append(name)
    _hvd_state()
    _save()


def _hvd_state() -> None:
    mod = sys.modules.get("horovod.tensorflow")
    if mod is None:
        return
    try:
        if mod.is_initialized():
            STATE["hvd"] = {"initialized": True, "rank": mod.rank(), "size": mod.size(),
                            "local_rank": _sim_local_rank(mod)}
        else:
            STATE["hvd"] = {"initialized": False}
    except Exception as e:  # noqa: BLE001
        STATE["hvd"] = {"initialized": False, "error": str(e)}


def _sim_local_rank(mod: Any) -> int:
    """The mirrored local rank the script is shown: local_size - 1 - real local rank."""
    return mod.local_size() - 1 - _REAL["local_rank"]()


_REAL: dict[str, Any] = {}


# ----------------------------------------------------------------------------- patches


def patch_data(tf: Any) -> None:
    import numpy as np


    rank = STATE["rank_env"]

    def load_data(*_a: Any, **_k: Any) -> Any:
        train, test = data.load(TRAIN_PER_RANK, TEST_PER_RANK, offset=rank * (TRAIN_PER_RANK + TEST_PER_RANK))
        return (train.x.copy(), train.y.astype(np.uint8)), (test.x.copy(), test.y.astype(np.uint8))

    patch.set_everywhere(tf, "datasets.fashion_mnist", "load_data", load_data)


def shrink(filters: int) -> int:
    """Narrower conv layers: same shape logic, a fraction of the compute."""
    return filters if filters <= 16 else max(8, filters // 8)


def patch_model(tf: Any) -> None:
    real = tf.keras.layers.Conv2D

    class Conv2D(real):  # type: ignore[misc, valid-type]
        def __init__(self, filters: int, *args: Any, **kwargs: Any) -> None:
            super().__init__(shrink(int(filters)), *args, **kwargs)

        @classmethod
        def from_config(cls, config: dict) -> Any:  # a saved model's layers are already narrow
            return real.from_config(config)

    Conv2D.__name__ = "Conv2D"
    patch.set_everywhere(tf, "layers", "Conv2D", Conv2D)


def patch_devices(tf: Any) -> None:
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
            STATE["pins"]["visible"] = [d.name for d in devs]
            milestone("pinned")
            return
        real_set_visible([d for d in devs if not is_fake(d)], device_type)

    def get_visible_devices(device_type: str | None = None) -> list[Any]:
        real = [d for d in real_get_visible(device_type) if d.device_type != "GPU"]
        if device_type in (None, "GPU"):
            visible = STATE["pins"]["visible"]
            return real + [f for f in fakes if visible is None or f.name in visible]
        return real

    def set_memory_growth(device: Any, enable: bool) -> None:
        if is_fake(device):
            STATE["pins"]["memory_growth"].append([device.name, bool(enable)])
            return
        real_growth(device, enable)

    for ns in (tf.config, tf.config.experimental):
        ns.list_physical_devices = list_physical_devices
        ns.set_visible_devices = set_visible_devices
        ns.get_visible_devices = get_visible_devices
    tf.config.experimental.set_memory_growth = set_memory_growth


def patch_horovod() -> None:
    try:
        import horovod.tensorflow as hvd_tf
        import horovod.tensorflow.keras as hvd_keras
    except Exception as e:  # noqa: BLE001 - reported by the check if the script needs it
        STATE["hvd_import_error"] = f"{type(e).__name__}: {e}"
        return
    _REAL["local_rank"] = hvd_tf.local_rank
    real_init = hvd_tf.init

    def local_rank() -> int:
        return _sim_local_rank(hvd_tf)

    def init(*args: Any, **kwargs: Any) -> Any:
        out = real_init(*args, **kwargs)
        milestone("hvd_init")
        return out

    for mod in (hvd_tf, hvd_keras):
        mod.local_rank = local_rank
        mod.init = init


def _flat_weights(model: Any) -> Any:
    import numpy as np

    return np.concatenate([np.asarray(v.numpy(), dtype=np.float64).ravel() for v in model.trainable_variables])


def make_probe_callback(tf: Any, record: dict) -> Any:
    class Probe(tf.keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.epoch = 0
            self.train_batches = 0
            self.test_batches = 0
            self.in_fit_test = False
            self.rates: list[float | None] = []

        def on_train_begin(self, logs: Any = None) -> None:
            WEIGHTS["init"] = _flat_weights(self.model)
            milestone("train_begin")

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch, self.train_batches, self.test_batches, self.rates = epoch, 0, 0, []
            self.first = getattr(self, "first", epoch)  # the first epoch this fit runs (initial_epoch)
            STATE["epoch"] = epoch

        def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
            self.rates.append(learning_rate(self.model.optimizer))  # after the script's callbacks set it
            if self.epoch == self.first and batch == 1:
                WEIGHTS["b1_begin"] = _flat_weights(self.model)

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.train_batches += 1
            progress("training", self.epoch, self.train_batches)
            if self.epoch == self.first and batch == 0:
                WEIGHTS["after_b0"] = _flat_weights(self.model)
                milestone("batch0_end")
            if self.epoch == self.first and batch == 1:
                WEIGHTS["b1_end"] = _flat_weights(self.model)
                _save_weights()  # evidence for steps 3-4 even if the run is cut short later
                milestone("batch1_end")

        def on_test_batch_end(self, batch: int, logs: Any = None) -> None:
            self.test_batches += 1
            progress("validation", self.epoch, self.test_batches)

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            STATE["epochs"].append({
                "epoch": epoch, "train_batches": self.train_batches, "val_batches": self.test_batches,
                "final_logs": plain(logs or {}), "reads": record["epoch_reads"], "lr": self.rates,
            })
            record["epoch_reads"] = []
            milestone(f"epoch{epoch}_end")

        def on_train_end(self, logs: Any = None) -> None:
            WEIGHTS["final"] = _flat_weights(self.model)
            _save_weights()
            milestone("train_end")

    return Probe()


def _save_weights() -> None:
    import numpy as np

    path = os.path.join(OUT, f"weights.{STATE['rank_env']}.npz")
    os.makedirs(OUT, exist_ok=True)
    np.savez(path + ".tmp.npz", **WEIGHTS)
    os.replace(path + ".tmp.npz", path)


def patch_saving(tf: Any) -> None:
    """Record every model or checkpoint save: which path, in which epoch."""

    def recorder(owner: Any, name: str, kind: str, path_arg: int) -> None:
        real = getattr(owner, name)

        def save(*args: Any, **kwargs: Any) -> Any:
            path = args[path_arg] if len(args) > path_arg else kwargs.get("filepath", kwargs.get("file_prefix"))
            STATE["saves"].append({"kind": kind, "path": str(path), "epoch": STATE.get("epoch"),
                                   "in_fit": bool(STATE.get("in_fit"))})
            _save()
            return real(*args, **kwargs)

        setattr(owner, name, save)

    recorder(tf.keras.Model, "save", "model", 1)
    recorder(tf.keras.Model, "save_weights", "weights", 1)
    recorder(tf.keras.models, "save_model", "model", 1)
    recorder(tf.train.Checkpoint, "write", "checkpoint", 1)


def patch_keras(tf: Any, max_epochs: int = 1) -> None:
    import inspect

    model_cls = tf.keras.Model
    real_fit = model_cls.fit
    real_evaluate = model_cls.evaluate
    fit_sig = inspect.signature(real_fit)

    def fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound = fit_sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        callbacks = list(a.get("callbacks") or [])
        record: dict[str, Any] = {"epoch_reads": []}
        for i, cb in enumerate(callbacks):
            wrap_callback(cb, i, record["epoch_reads"])
        opt = getattr(self, "optimizer", None)
        STATE["fit"].append({
            "verbose": a.get("verbose"),
            "epochs": a.get("epochs"),
            "initial_epoch": a.get("initial_epoch"),
            "steps_per_epoch": a.get("steps_per_epoch"),
            "validation_steps": a.get("validation_steps"),
            "has_validation": a.get("validation_data") is not None,
            "callbacks": [f"{type(c).__module__}.{type(c).__qualname__}" for c in callbacks],
            "optimizer": f"{type(opt).__module__}.{type(opt).__qualname__}" if opt is not None else None,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        })
        milestone("fit_start")
        a["callbacks"] = callbacks + [make_probe_callback(tf, record)]
        a["epochs"] = min(int(a.get("epochs") or 1), int(a.get("initial_epoch") or 0) + max_epochs)
        args2 = {k: v for k, v in a.items() if k != "self"}
        STATE["in_fit"] = True
        try:
            return real_fit(self, **args2)
        finally:
            STATE["in_fit"] = False

    def evaluate(self: Any, *args: Any, **kwargs: Any) -> Any:
        if STATE.get("in_fit"):  # fit's own validation pass
            return real_evaluate(self, *args, **kwargs)
        sig = inspect.signature(real_evaluate)
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        STATE["evaluate"].append({"verbose": bound.arguments.get("verbose")})
        return real_evaluate(self, *args, **kwargs)

    model_cls.fit = fit
    model_cls.evaluate = evaluate


def main(argv: list[str] | None = None) -> int:
    global OUT
    argv = list(sys.argv[1:] if argv is None else argv)
    own_folders = len(argv) > 1 and argv[1] == "--own-folders"
    if own_folders:
        del argv[1]
    max_epochs = 1
    if len(argv) > 2 and argv[1] == "--epochs" and argv[2].isdigit():
        max_epochs = int(argv[2])
        del argv[1:3]
    budget = None
    if len(argv) > 2 and argv[1] == "--budget":
        budget = float(argv[2])
        del argv[1:3]
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m labkit.instrument.probe OUTDIR [--own-folders] [--epochs N] [--budget S] "
              "-- SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    OUT, script, script_args = os.path.abspath(argv[0]), os.path.abspath(argv[2]), argv[3:]
    os.makedirs(OUT, exist_ok=True)
    stacks.install(os.path.join(OUT, f"stack.{STATE['rank_env']}"), budget)
    if own_folders:  # as on separate nodes: each rank sees only its own files
        folder = os.path.join(os.getcwd(), f"rank{STATE['rank_env']}")
        os.makedirs(folder, exist_ok=True)
        os.chdir(folder)
    milestone("start")
    import tensorflow as tf

    patch_data(tf)
    patch_model(tf)
    patch_devices(tf)
    patch_horovod()
    patch_keras(tf, max_epochs)
    patch_saving(tf)
    milestone("patched")

    sys.argv = [script, *script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:  # noqa: BLE001 - everything is reported to the checker
        STATE["error"] = {"type": type(e).__name__, "message": str(e)[:2000],
                          "traceback": traceback.format_exc()[-4000:]}
        code = 1
    STATE["pins"]["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    STATE["exit_code"] = code
    milestone("end")
    sys.stdout.flush()
    if STATE["error"]:
        print(STATE["error"]["traceback"], file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
