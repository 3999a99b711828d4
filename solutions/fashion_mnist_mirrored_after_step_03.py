#!/usr/bin/env python
# Generated from solutions/source/fashion_mnist_mirrored.py.tmpl (version 3) by `labkit gen`.
# Edit the template, not this file; `make gen` rewrites it.
"""Train a WideResNet on Fashion-MNIST with Keras (MirroredStrategy lab, after step 3).

One process, several devices: MirroredStrategy keeps a copy of every variable
on each device and averages the gradients of all copies at every step. On a
machine without GPUs the CPU is split into ``--devices`` logical devices, so
that the same code runs and shows the same behaviour.

    python fashion_mnist_mirrored_after_step_03.py --epochs 3 --devices 2
"""

from __future__ import annotations

import argparse
import os
import sys

# isort: off
import labkit  # noqa: F401  (sets TF_USE_LEGACY_KERAS=1 before TensorFlow loads)
import tensorflow as tf
# isort: on

from labkit import callbacks as lk
from labkit import data
from labkit import model as wrn
from labkit import runs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Fashion-MNIST WideResNet", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--devices", type=int, default=2, help="logical CPU devices to mirror over when there is no GPU")
    p.add_argument("--log-dir", default="./logs", help="folder for the per-epoch CSV log")
    p.add_argument("--model-path", default="./saved/mirrored.keras", help="where the trained model is saved")
    p.add_argument("--batch-size", type=int, default=32, help="input batch size per replica")
    p.add_argument("--val-batch-size", type=int, default=32, help="validation batch size per replica")
    p.add_argument("--epochs", type=int, default=40, help="number of epochs to train")
    p.add_argument("--base-lr", type=float, default=0.01, help="learning rate")
    p.add_argument("--wd", type=float, default=0.000005, help="weight decay (L2)")
    p.add_argument("--target-accuracy", type=float, default=0.85, help="stop when val accuracy exceeds this")
    p.add_argument("--patience", type=int, default=2, help="epochs above the target before stopping")
    p.add_argument("--mode", choices=["auto", "small", "full"], default="auto",
                   help="small: narrow net on a subset (CPU); full: WRN-16-10 on all data; auto: full with a GPU")
    p.add_argument("--widen-factor", type=int, default=None, help="WRN widen factor (mode default: small 1, full 10)")
    p.add_argument("--train-size", type=int, default=None, help="training images (mode default: small 6000, full all)")
    p.add_argument("--test-size", type=int, default=None, help="test images (mode default: small 1000, full all)")
    return wrn.apply_mode(p.parse_args(argv))


def local_devices(n_cpu: int) -> list[str] | None:
    """tf.distribute: all GPUs if there are any, else the CPU split into ``n_cpu`` logical devices.

    Must run before TensorFlow initialises its devices (before any tensor is made).
    """
    if tf.config.list_physical_devices("GPU"):
        return None  # MirroredStrategy's default: every visible GPU
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * n_cpu)
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # tf.distribute: one replica per device; OneDeviceStrategy("/cpu:0") would be the 1-device version.
    strategy = tf.distribute.MirroredStrategy(devices=local_devices(args.devices))
    replicas = strategy.num_replicas_in_sync
    print(f"MirroredStrategy over {replicas} devices: {', '.join(strategy.extended.worker_devices)}", flush=True)

    train, test = data.load(args.train_size, args.test_size)
    mean, std = data.stats(train.x)
    # tf.distribute: fit's batch is the global batch; the strategy splits it over the replicas.
    global_batch = args.batch_size * replicas
    val_batch = args.val_batch_size * replicas
    train_ds = data.dataset(train, global_batch, training=True, mean=mean, std=std)
    test_ds = data.dataset(test, val_batch, training=False, mean=mean, std=std)
    steps_per_epoch = data.steps(len(train), global_batch)
    validation_steps = data.steps(len(test), val_batch)

    # tf.distribute: variables made in the scope are MirroredVariables, one copy per device.
    with strategy.scope():
        model = wrn.build(args.widen_factor, weight_decay=args.wd)
        opt = tf.keras.optimizers.SGD(learning_rate=args.base_lr)
        model.compile(loss="categorical_crossentropy", optimizer=opt, metrics=["accuracy"])

    os.makedirs(args.log_dir, exist_ok=True)
    callbacks: list[tf.keras.callbacks.Callback] = [
        tf.keras.callbacks.LearningRateScheduler(lk.step_decay(args.base_lr)),
        lk.Throughput(images_per_epoch=len(train)),
        lk.CumulativeTime(),
        tf.keras.callbacks.CSVLogger(os.path.join(args.log_dir, "training.csv")),
        lk.StopAtAccuracy(args.target_accuracy, args.patience, 1),
        runs.Recorder(__file__, vars(args)),  # labkit: one line in runs/runs.jsonl per run
    ]
    print(f"mode={args.mode} widen_factor={args.widen_factor} train={len(train)} test={len(test)} "
          f"replicas={replicas} global_batch={global_batch} steps/epoch={steps_per_epoch}", flush=True)
    model.fit(
        train_ds,
        steps_per_epoch=steps_per_epoch,
        epochs=args.epochs,
        validation_data=test_ds,
        validation_steps=validation_steps,
        callbacks=callbacks,
        verbose=1,
    )
    loss, accuracy = model.evaluate(test_ds, steps=validation_steps, verbose=1)
    print(f"Test loss: {loss:.4f}")
    print(f"Test accuracy: {accuracy:.4f}")

    # TODO: Step 4: save the model to args.model_path and load it back (tf.keras.models.load_model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
