"""What a probed rank handed Horovod's all-reduce, by dtype (:mod:`labkit.instrument.probe`).

Horovod's TensorFlow API passes every tensor it all-reduces through ``horovod.tensorflow._allreduce`` (one
tensor) or ``horovod.tensorflow._grouped_allreduce`` (several): ``allreduce()`` and ``grouped_allreduce()``, which
``hvd.DistributedOptimizer`` and ``hvd.allreduce`` use, call them right after ``compression.compress``. The dtype
seen there is the one that crosses the wire, however the script chose its compression.

The gradients of ``hvd.DistributedOptimizer`` are all-reduced inside the training step, which Keras builds as a
TensorFlow graph (Horovod wraps the gradients' all-reduce in a graph of its own even when the step runs eagerly);
metric averaging (``MetricAverageCallback``) and other ``hvd.allreduce`` calls between steps run eagerly. A tensor
all-reduced while a graph is being built inside ``Model.fit`` is therefore counted as a gradient, any other as
``other``. Counts are tensors handed to the op as the graph is built: one per gradient for each time Keras traces
the step (once in a probed run).

What those graphs do when they run is counted apart (:class:`Tally`): the gradient tensors all-reduced in each
training batch and the norm of what the all-reduces returned, two variables the step adds to as it runs (an
all-reduce in a branch that does not run, as in Horovod's gradient accumulation, adds nothing); the probe's
callback reads and resets them after every batch.

Each rank writes ``OUT/allreduce.N.json``, ``{"gradients": {"float16": 26}, "other": {"float32": 4}}``, rewritten at
every new tensor (a rank that crashes later keeps what it built). The wrappers are left alone by AutoGraph, and the
``tf.cond`` Horovod puts around each gradient's all-reduce is decided in Python (:func:`_decide_in_python`), which
halves a probed step's tracing. All four names are private to Horovod (the first two imported there from
``horovod.tensorflow.mpi_ops``); ``tests/unit/test_probe_allreduce.py`` fails when any of them moves, and a Horovod
without the first two leaves ``{"error": ...}`` instead of patching nothing in silence.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from labkit.instrument.probe_record import Rank

NAMES = ("_allreduce", "_grouped_allreduce")  # in horovod.tensorflow, called by allreduce() and grouped_allreduce()
CONDS = ("_allreduce_cond", "_grouped_allreduce_cond")  # in horovod.tensorflow, around the gradients' all-reduce
GRADIENTS, OTHER = "gradients", "other"


class Tally:
    """Run-time tally of the gradients all-reduced inside ``fit``: how many tensors, and the sum of the squares of
    the values the all-reduces returned. Made when ``fit`` is called (the variables outside any graph)."""

    def __init__(self, tf: Any) -> None:
        self.tf = tf
        self.tensors = tf.Variable(0, dtype=tf.int64, trainable=False, name="labkit_allreduced")
        self.squares = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="labkit_allreduced_squares")

    def add(self, outputs: Sequence[Any]) -> None:
        """Add ops to the graph being built: when they run, ``outputs`` are counted."""
        tf = self.tf
        dense = [o for o in outputs if isinstance(o, tf.Tensor)]
        self.tensors.assign_add(len(outputs))
        if dense:
            self.squares.assign_add(tf.add_n([tf.reduce_sum(tf.square(tf.cast(o, tf.float64))) for o in dense]))

    def take(self) -> tuple[int, float]:
        """The tensors all-reduced and the norm of their values since the last call; the tally starts again."""
        n, squares = int(self.tensors.numpy()), float(self.squares.numpy())
        self.tensors.assign(0)
        self.squares.assign(0.0)
        return n, squares ** 0.5


def file_name(rank: int) -> str:
    """The record of rank ``rank`` in the probe's folder."""
    return f"allreduce.{rank}.json"


def note(rank: Rank, tensors: Sequence[Any], eager: bool) -> None:
    """Count ``tensors`` by dtype: gradients when built into a graph during ``fit``, other otherwise."""
    counts = rank.allreduced[GRADIENTS if not eager and rank.state.in_fit else OTHER]
    for t in tensors:
        dtype = getattr(getattr(t, "dtype", None), "name", None) or str(getattr(t, "dtype", "?"))
        counts[dtype] = counts.get(dtype, 0) + 1
    rank.write(file_name(rank.rank), rank.allreduced)


def patch(hvd_tf: Any, rank: Rank, eager: Callable[[], bool] | None = None) -> None:
    """Count what ``horovod.tensorflow``'s all-reduce entry points receive, then call them as before.

    ``eager`` tells a tensor run now from one built into a graph (default: ``tf.executing_eagerly``)."""
    if eager is None:
        import tensorflow as tf

        eager = tf.executing_eagerly
    missing = [name for name in NAMES if not callable(getattr(hvd_tf, name, None))]
    if missing:
        why = f"horovod.tensorflow has no {', '.join(missing)}: this Horovod cannot be observed"
        rank.write(file_name(rank.rank), {"error": why})
        return
    real_one, real_group = (getattr(hvd_tf, name) for name in NAMES)

    def _observed(tensors: Sequence[Any]) -> None:
        try:
            note(rank, tensors, eager())
        except Exception:  # noqa: BLE001 - observing never breaks the script
            pass

    def _tallied(outputs: Sequence[Any]) -> None:
        try:
            if rank.tally is not None and rank.state.in_fit and not eager():
                rank.tally.add(outputs)
        except Exception:  # noqa: BLE001 - observing never breaks the script
            pass

    def _allreduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        _observed([tensor])
        out = real_one(tensor, *args, **kwargs)
        _tallied([out])
        return out

    def _grouped_allreduce(tensors: Any, *args: Any, **kwargs: Any) -> Any:
        _observed(list(tensors) if isinstance(tensors, (list, tuple)) else [])
        out = real_group(tensors, *args, **kwargs)
        _tallied(list(out) if isinstance(out, (list, tuple)) else [])
        return out

    quiet = _unconverted()
    hvd_tf._allreduce, hvd_tf._grouped_allreduce = quiet(_allreduce), quiet(_grouped_allreduce)
    _decide_in_python(hvd_tf, quiet)


def _unconverted() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """AutoGraph leaves a function so marked as it is (and what it calls): the probe's wrappers hold no tensor
    control flow, and converting them and Horovod's code below them was most of a probed step's tracing."""
    import tensorflow as tf

    return tf.autograph.experimental.do_not_convert


def _decide_in_python(hvd_tf: Any, quiet: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Build the gradients' all-reduce without Horovod's ``tf.cond`` around each one.

    Outside elastic mode ``horovod.tensorflow._allreduce_cond`` (and ``_grouped_allreduce_cond``) wrap each
    gradient's all-reduce in ``tf.cond`` on a constant, ``process_set.included() and process_set.size() > 1``:
    the same all-reduce runs, but two branch graphs are built per gradient (about 2 s of each probed run on the
    2-core machine). Here that constant is decided in Python, as Horovod decides it. In elastic mode the
    condition is read at run time and Horovod's own functions stay. ``tests/unit/test_probe_allreduce.py`` fails
    when Horovod changes them.
    """
    if int(os.environ.get("HOROVOD_ELASTIC", 0)) or not all(callable(getattr(hvd_tf, n, None)) for n in CONDS):
        return

    def _allreduce_cond(tensor: Any, *args: Any, process_set: Any = hvd_tf.global_process_set, **kwargs: Any) -> Any:
        if process_set.included() and process_set.size() > 1:
            return hvd_tf.allreduce(tensor, *args, process_set=process_set, **kwargs)
        return tensor

    def _grouped_allreduce_cond(tensors: Any, *args: Any, process_set: Any = hvd_tf.global_process_set,
                                **kwargs: Any) -> Any:
        if process_set.included() and process_set.size() > 1:
            return hvd_tf.grouped_allreduce(tensors, *args, process_set=process_set, **kwargs)
        return tensors

    hvd_tf._allreduce_cond, hvd_tf._grouped_allreduce_cond = quiet(_allreduce_cond), quiet(_grouped_allreduce_cond)
