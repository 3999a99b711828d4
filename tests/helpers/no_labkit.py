"""Run a script as ``__main__`` with labkit impossible to import: ``python no_labkit.py SCRIPT ARGS``.

The lab scripts must run on a machine that has only TensorFlow, tf-keras and
Horovod. Any ``import labkit`` in them (or in what they import) raises here.

``python no_labkit.py --record-validation PREFIX SCRIPT ARGS`` also writes
``PREFIX.<rank>.json``: a fingerprint of every example of every validation batch that
``fit`` drew, in order (test code, so that a test can see which examples each rank
validated on).
"""

from __future__ import annotations

import atexit
import importlib.abc
import json
import os
import runpy
import sys


class _Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name == "labkit" or name.startswith("labkit."):
            raise ImportError(f"{name} is not importable here: lab scripts must not need labkit")
        return None


def record_validation(prefix: str) -> None:
    """Wrap ``fit``'s validation dataset so that each batch's examples are noted (by pixel sum)."""
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import numpy as np
    import tensorflow as tf

    batches: list[list[float]] = []
    real_fit = tf.keras.Model.fit

    def note(xb: np.ndarray) -> np.int64:
        batches.append(np.round(xb.reshape(len(xb), -1).astype(np.float64).sum(axis=1), 3).tolist())
        return np.int64(len(xb))

    def fit(self: object, *args: object, **kwargs: object) -> object:
        val = kwargs.get("validation_data")
        if isinstance(val, tf.data.Dataset):
            def noted(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
                with tf.control_dependencies([tf.numpy_function(note, [x], tf.int64)]):
                    return tf.identity(x), y
            kwargs["validation_data"] = val.map(noted)
        return real_fit(self, *args, **kwargs)

    tf.keras.Model.fit = fit
    rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
    atexit.register(lambda: open(f"{prefix}.{rank}.json", "w").write(json.dumps(batches)))


if __name__ == "__main__":
    if sys.argv[1] == "--record-validation":
        record_validation(sys.argv[2])
        del sys.argv[1:3]
    for loaded in [m for m in sys.modules if m == "labkit" or m.startswith("labkit.")]:
        del sys.modules[loaded]
    sys.meta_path.insert(0, _Blocked())
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    runpy.run_path(sys.argv[0], run_name="__main__")
