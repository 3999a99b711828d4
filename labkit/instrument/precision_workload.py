"""One process timing the course's model trained under one Keras dtype policy (lab 9's mixed precision).

The small-mode model (WRN-16-1, :func:`labkit.instrument.calib_workload.wide_resnet_16_1`: plain tf.keras, nothing of
a lab's solution) trains on batches of 32 of the course's images with the lab's input pipeline, under ``--policy``
(``float32`` or ``mixed_bfloat16``: the layers compute in bfloat16, the variables stay float32, and the last layer,
the softmax, computes in float32 as lab 9's script has it). The first ``--warmup`` batches (tracing, first
allocations) are not timed; the next ``--batches`` are. It prints one JSON line, the fields of
:class:`labkit.measure.precision.Speed`.

    python -m labkit.instrument.precision_workload --policy mixed_bfloat16 --batches 40
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from labkit.instrument import calib_workload, data

POLICIES = ("float32", "mixed_bfloat16")
BATCH = calib_workload.BATCH


def model(tf: Any) -> Any:
    """The course's model under the global policy, its last layer float32 (the softmax and the loss in full
    precision), as lab 9's script builds it."""
    inner = calib_workload.wide_resnet_16_1()
    features = inner.layers[-2].output  # the global average pooling, before the classifier
    out = tf.keras.layers.Dense(10, activation="softmax", kernel_regularizer=tf.keras.regularizers.l2(5e-6),
                                dtype="float32")(features)
    return tf.keras.Model(inner.inputs, out, name="wrn_16_1_output_float32")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", choices=POLICIES, required=True, help="the Keras dtype policy")
    p.add_argument("--batches", type=int, default=40, help="timed batches (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=5, help="untimed batches first (default: %(default)s)")
    a = p.parse_args(argv)
    if a.batches < 1 or a.warmup < 1:
        p.error("--batches and --warmup must be at least 1")
    import tensorflow as tf

    tf.keras.mixed_precision.set_global_policy(a.policy)
    tf.keras.utils.set_random_seed(1)
    train, _ = data.load(BATCH * (a.batches + a.warmup), BATCH)
    mean, std = data.stats(train.x)
    net = model(tf)
    net.compile(optimizer=tf.keras.optimizers.SGD(calib_workload.LEARNING_RATE), loss="categorical_crossentropy")
    times: list[float] = []

    class Clock(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            times.append(time.perf_counter())

    net.fit(data.dataset(train, BATCH, True, mean, std, seed=1), steps_per_epoch=a.batches + a.warmup, epochs=1,
            verbose=0, callbacks=[Clock()])
    seconds = times[-1] - times[a.warmup - 1]
    compute = sorted({layer.compute_dtype for layer in net.layers if layer.weights})
    print(json.dumps({"policy": a.policy, "batches": a.batches, "seconds": round(seconds, 3),
                      "images_per_sec": round(BATCH * a.batches / seconds, 1), "compute_dtypes": compute}), flush=True)


if __name__ == "__main__":
    main()
