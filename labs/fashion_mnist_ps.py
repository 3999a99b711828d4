#!/usr/bin/env python
# Generated from solutions/source/fashion_mnist_ps.py.tmpl (version 0) by `labkit gen`.
# Edit the template, not this file; `make gen` rewrites it.
"""Train a WideResNet on Fashion-MNIST with Keras (ParameterServerStrategy lab, starting point).

With ParameterServerStrategy the cluster has three roles. Parameter servers
(``ps``) hold the variables; workers run training steps; the chief (the
coordinator) owns the Python program and sends steps to whichever worker is
free. Every task runs this script: ``TF_CONFIG`` says which role it has.

    python fashion_mnist_ps.py --epochs 3
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
    p.add_argument("--log-dir", default="./logs", help="folder for the per-epoch CSV log")
    p.add_argument("--batch-size", type=int, default=32, help="batch size of one training step (on one worker)")
    p.add_argument("--val-batch-size", type=int, default=32, help="validation batch size")
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # TODO: Step 1: read TF_CONFIG with tf.distribute.cluster_resolver.TFConfigClusterResolver(); on 'worker'
    # and 'ps' tasks start a tf.distribute.Server and join() it; on the chief create a ParameterServerStrategy

    train, test = data.load(args.train_size, args.test_size)
    mean, std = data.stats(train.x)
    steps_per_epoch = data.steps(len(train), args.batch_size)
    validation_steps = data.steps(len(test), args.val_batch_size)
    # TODO: Step 3: with ParameterServerStrategy fit needs a function that builds each worker's dataset:
    # wrap one in tf.keras.utils.experimental.DatasetCreator
    train_ds = data.dataset(train, args.batch_size, training=True, mean=mean, std=std)
    test_ds = data.dataset(test, args.val_batch_size, training=False, mean=mean, std=std)

    # TODO: Step 2: build and compile the model inside strategy.scope() so that its variables live on the ps tasks
    model = wrn.build(args.widen_factor, weight_decay=args.wd)
    opt = tf.keras.optimizers.SGD(learning_rate=args.base_lr)
    model.compile(loss="categorical_crossentropy", optimizer=opt, metrics=["accuracy"])

    os.makedirs(args.log_dir, exist_ok=True)
    callbacks: list[tf.keras.callbacks.Callback] = [
        tf.keras.callbacks.LearningRateScheduler(lk.step_decay(args.base_lr)),
        lk.Throughput(images_per_epoch=steps_per_epoch * args.batch_size),
        lk.CumulativeTime(),
        tf.keras.callbacks.CSVLogger(os.path.join(args.log_dir, "training.csv")),
        lk.StopAtAccuracy(args.target_accuracy, args.patience, 1),
        runs.Recorder(__file__, vars(args)),  # labkit: one line in runs/runs.jsonl per run
    ]
    print(f"mode={args.mode} widen_factor={args.widen_factor} train={len(train)} test={len(test)} "
          f"batch={args.batch_size} steps/epoch={steps_per_epoch}", flush=True)
    model.fit(
        train_ds,
        steps_per_epoch=steps_per_epoch,
        epochs=args.epochs,
        validation_data=test_ds,
        validation_steps=validation_steps,
        callbacks=callbacks,
        verbose=2,
    )
    loss, accuracy = model.evaluate(test_ds, steps=validation_steps, verbose=2)
    print(f"Test loss: {loss:.4f}")
    print(f"Test accuracy: {accuracy:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
