"""labkit.instrument.keras_reads.learning_rate:
the rate a tf-keras optimizer applies next, however the script set it."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
tf = pytest.importorskip("tensorflow")

from labkit.instrument.keras_reads import learning_rate  # noqa: E402


def test_a_plain_rate_and_one_set_by_a_callback() -> None:
    opt = tf.keras.optimizers.SGD(learning_rate=0.05)
    assert learning_rate(opt) == pytest.approx(0.05)
    tf.keras.backend.set_value(opt.learning_rate, 0.2)  # what LearningRateScheduler and Horovod's warm-up do
    assert learning_rate(opt) == pytest.approx(0.2)


def test_a_schedule_is_read_at_the_optimizers_next_step() -> None:
    ramp = tf.keras.optimizers.schedules.PolynomialDecay(0.01, 10, end_learning_rate=0.04, power=1.0)
    opt = tf.keras.optimizers.SGD(learning_rate=ramp)
    var = tf.Variable([1.0])
    assert learning_rate(opt) == pytest.approx(0.01)
    for _ in range(5):
        opt.apply_gradients([(tf.constant([1.0]), var)])
    # tf-keras' own learning_rate property still holds the rate of the step already taken
    assert float(opt.learning_rate) == pytest.approx(0.01 + 0.03 * 4 / 10)
    assert learning_rate(opt) == pytest.approx(0.01 + 0.03 * 5 / 10)


def test_a_legacy_optimizer_and_something_unreadable() -> None:
    legacy = tf.keras.optimizers.legacy.SGD(learning_rate=0.03)
    assert learning_rate(legacy) == pytest.approx(0.03)
    assert learning_rate(object()) is None
