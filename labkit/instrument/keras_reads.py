"""What a fit call and its optimizer say, read without changing them: the batch size of fit's input, the
learning rate of the optimizer now."""

from __future__ import annotations

from typing import Any


def learning_rate(optimizer: Any) -> float | None:
    """The learning rate ``optimizer`` applies at its next step, however the script set it; None if unreadable.

    A rate set by a callback (``K.set_value``, Horovod's warm-up, ``LearningRateScheduler``) lives in a
    variable; a ``LearningRateSchedule`` is evaluated at the optimizer's step count (tf-keras 2.x
    optimizers' ``learning_rate`` would give the rate of the step already taken); a legacy optimizer
    reports its decayed rate.
    """
    try:
        import tensorflow as tf

        inner = getattr(optimizer, "_learning_rate", None)
        if isinstance(inner, tf.keras.optimizers.schedules.LearningRateSchedule):
            return float(inner(optimizer.iterations))
        if hasattr(optimizer, "_decayed_lr"):  # tf.keras.optimizers.legacy.*: schedules and decay included
            return float(optimizer._decayed_lr(tf.float32))
        value = optimizer.learning_rate
        if callable(value):  # a schedule another optimizer class keeps as is
            value = value(optimizer.iterations)
        return float(tf.keras.backend.get_value(value))
    except Exception:  # noqa: BLE001 - observing must never break the script
        return None


def batch_of(x: Any, batch_size: Any = None) -> tuple[int | None, str]:
    """Examples per step of the data given to ``fit``, and how that was found."""
    size = getattr(x, "batch_size", None)  # keras Sequence / ImageDataGenerator iterators
    if isinstance(size, int) and size > 0:
        return size, "iterator"
    spec = getattr(x, "element_spec", None)
    if spec is not None and type(x).__name__ != "DistributedDataset" and hasattr(x, "take"):
        first = spec[0] if isinstance(spec, tuple) else spec
        try:
            dim = first.shape[0]
        except (AttributeError, IndexError, TypeError):
            dim = None
        if dim is not None:
            return int(dim), "dataset"
        try:  # batch dimension not static: look at one element
            import tensorflow as tf

            for elem in x.take(1):
                t = elem[0] if isinstance(elem, tuple) else elem
                return int(tf.nest.flatten(t)[0].shape[0]), "dataset element"
        except Exception:  # noqa: BLE001
            pass
    shape = getattr(x, "shape", None)
    if shape is not None and len(shape) > 0:  # arrays: fit's batch_size argument
        return int(batch_size or 32), "arrays"
    return None, "unknown"
