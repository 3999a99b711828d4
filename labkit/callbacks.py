"""Keras callbacks the lab scripts share: throughput, cumulative time, stop at accuracy."""

from __future__ import annotations

import time
from typing import Any

import tensorflow as tf

_PRINTED_AT: dict[int, int] = {}


def _epoch_print(cb: tf.keras.callbacks.Callback, epoch: int, text: str) -> None:
    """Print at the end of an epoch; the first such line of the epoch starts below Keras' progress bar."""
    bar_open = (cb.params or {}).get("verbose") == 1 and _PRINTED_AT.get(id(cb.model)) != epoch
    _PRINTED_AT[id(cb.model)] = epoch
    print(("\n" if bar_open else "") + text, flush=True)


class Throughput(tf.keras.callbacks.Callback):
    """Print training images/sec each epoch, timing training steps only (not validation)."""

    def __init__(self, images_per_epoch: int) -> None:
        super().__init__()
        self.images_per_epoch = images_per_epoch
        self.rates: list[float] = []
        self._start = 0.0
        self._train_time = 0.0

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        self._start = time.perf_counter()
        self._train_time = 0.0

    def on_test_begin(self, logs: Any = None) -> None:
        if self._start:
            self._train_time = time.perf_counter() - self._start

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        train_time = self._train_time or (time.perf_counter() - self._start)
        rate = self.images_per_epoch / train_time
        self.rates.append(rate)
        _epoch_print(self, epoch, f"Images/sec: {rate:.1f}")


class CumulativeTime(tf.keras.callbacks.Callback):
    """Print the wall time since training began after every epoch and at the end."""

    def on_train_begin(self, logs: Any = None) -> None:
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        elapsed = time.perf_counter() - self.start
        _epoch_print(self, epoch, f"Cumulative training time after epoch {epoch + 1}: {elapsed:.2f}")

    def on_train_end(self, logs: Any = None) -> None:
        print(f"Cumulative training time: {time.perf_counter() - self.start:.2f}", flush=True)


class StopAtAccuracy(tf.keras.callbacks.Callback):
    """Stop once ``val_accuracy`` exceeded ``target`` for ``patience`` epochs in a row."""

    def __init__(self, target: float = 0.85, patience: int = 2, verbose: int = 0) -> None:
        super().__init__()
        self.target = target
        self.patience = patience
        self.verbose = verbose
        self.met = 0
        self.stopped_epoch: int | None = None

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        accuracy = (logs or {}).get("val_accuracy")
        self.met = self.met + 1 if accuracy is not None and accuracy > self.target else 0
        if self.met >= self.patience:
            self.stopped_epoch = epoch
            self.model.stop_training = True

    def on_train_end(self, logs: Any = None) -> None:
        if self.stopped_epoch is not None and self.verbose:
            print(f"Reached the target accuracy; stopped after epoch {self.stopped_epoch + 1}", flush=True)


def step_decay(base_lr: float) -> Any:
    """The lab's schedule: base_lr until epoch 15, then /10 at 15, 25 and 35."""

    def schedule(epoch: int, lr: float | None = None) -> float:
        if epoch < 15:
            return base_lr
        if epoch < 25:
            return 1e-1 * base_lr
        if epoch < 35:
            return 1e-2 * base_lr
        return 1e-3 * base_lr

    return schedule
