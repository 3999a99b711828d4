"""The fixed workload that measures this machine's speed for the final assessment (:mod:`labkit.grading.calibration`).

One process trains the course's small-mode model (WRN-16-1, plain tf.keras, no Horovod, no
tf.distribute: nothing of a lab's solution) for one epoch on one worker's share of the small-mode
training images (6,000 / WORKERS) and validates on the 1,000 small-mode test images, with the
lab's batch size, learning rate, augmentation and input pipeline. The calibration starts WORKERS
copies at once, one thread each: the same model, data, threads and contention as one epoch of the
assessment's run, start-up included, without the all-reduce. It ships inside the package, so a
released course (which has no solutions) measures exactly what the course repository measures.

    python -m labkit.instrument.calib_workload --workers 2
"""

from __future__ import annotations

import argparse

from labkit.instrument import data

TRAIN_IMAGES = 6000  # small mode's training images, shared by the workers
TEST_IMAGES = 1000  # small mode's test images
BATCH = 32  # the lab's per-worker batch size
LEARNING_RATE = 0.05  # small mode's base learning rate
VERSION = 1  # bump when the workload changes: calibrations of another version are not reused


def wide_resnet_16_1():  # a tf.keras Model
    """The course's WRN-16-1 for 28x28 grey images (16/32/64 channels, 0.18 M parameters)."""
    import tensorflow as tf

    layers = tf.keras.layers
    l2 = tf.keras.regularizers.l2(5e-6)

    def cbr(x, filters):  # convolution, batch norm, ReLU
        x = layers.Conv2D(filters, 3, padding="same", kernel_regularizer=l2)(x)
        return layers.Activation("relu")(layers.BatchNormalization(momentum=0.9)(x))

    def block(x, filters, project=False):
        shortcut = layers.Conv2D(filters, 1, padding="same", kernel_regularizer=l2)(x) if project else x
        y = cbr(layers.Dropout(0.01)(cbr(x, filters)), filters)
        return layers.Add()([shortcut, y])

    inputs = layers.Input(shape=(28, 28, 1))
    x = cbr(inputs, 16)
    for i, width in enumerate((16, 32, 64)):
        if i:
            x = layers.MaxPooling2D(2)(x)
        x = block(block(x, width, project=True), width)
    outputs = layers.Dense(10, activation="softmax", kernel_regularizer=l2)(layers.GlobalAveragePooling2D()(x))
    return tf.keras.Model(inputs, outputs, name="wrn_16_1")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2, help="the assessment's workers: each copy trains 6000/N images")
    p.add_argument("--epochs", type=int, default=1, help="epochs (default: %(default)s)")
    a = p.parse_args(argv)
    import tensorflow as tf

    tf.keras.utils.set_random_seed(1)
    train, test = data.load(TRAIN_IMAGES // max(1, a.workers), TEST_IMAGES)
    mean, std = data.stats(train.x)
    model = wide_resnet_16_1()
    model.compile(optimizer=tf.keras.optimizers.SGD(LEARNING_RATE, momentum=0.9), loss="categorical_crossentropy",
                  metrics=["accuracy"])
    model.fit(data.dataset(train, BATCH, True, mean, std, seed=1), steps_per_epoch=len(train) // BATCH,
              epochs=a.epochs, validation_data=data.dataset(test, BATCH, False, mean, std, repeat=False),
              verbose=2)


if __name__ == "__main__":
    main()
