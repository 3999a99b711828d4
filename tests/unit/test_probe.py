"""labkit.instrument.probe pieces that need no MPI: conv shrinking, data slices."""

from __future__ import annotations

from labkit.instrument import probe_patches as probe


def test_shrink_is_consistent_and_narrow() -> None:
    assert probe.shrink(16) == 16
    assert probe.shrink(160) == 20 and probe.shrink(640) == 80
    assert probe.shrink(32) == 8  # never below 8 channels


def test_every_input_fit_accepts_is_sampled() -> None:
    """Arrays, a dataset, a distributed dataset, a DatasetCreator and a generator: each is sampled as fit
    would distribute it, and a generator (readable once) still gives fit every batch."""
    import os

    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import numpy as np
    import tensorflow as tf

    from labkit.instrument import dprobe_record as dprobe

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((28, 28, 1)), tf.keras.layers.Flatten(),
                                     tf.keras.layers.Dense(10)])
        model.compile(loss="mse", optimizer="sgd")
    x = np.zeros((64, 28, 28, 1), np.float32) + np.arange(64, dtype=np.float32)[:, None, None, None]
    y = np.zeros((64, 10), np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    creator = tf.keras.utils.experimental.DatasetCreator(lambda ctx: tf.data.Dataset.from_tensor_slices(
        (x, y)).batch(ctx.get_per_replica_batch_size(8)).repeat())
    inputs = {"arrays": (x, {"y": y, "batch_size": 8}), "dataset": (ds, {}),
              "distributed": (strategy.experimental_distribute_dataset(ds), {}),
              "creator": (creator, {"steps_per_epoch": 4}),
              "generator": ((b for b in [(x[i:i + 8], y[i:i + 8]) for i in range(0, 64, 8)]), {})}
    for name, (given, kw) in inputs.items():
        out, back = dprobe.sample_batches(model, given, kw)
        assert out["per_replica_batch"] and {n for row in out["per_replica_batch"] for n in row} == {8}, name
        if name == "generator":
            assert [float(b[0][0, 0, 0, 0]) for b in back] == [float(i) for i in range(0, 64, 8)]
        else:
            assert back is given, name
    assert dprobe.sample_batches(model, ds, {})[0]["ids"][0] == [[float(i) for i in range(8)]]  # which examples
