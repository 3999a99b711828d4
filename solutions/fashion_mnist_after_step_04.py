#!/usr/bin/env python
# Generated from solutions/source/fashion_mnist.py.tmpl (version 4) by `labkit gen`.
# Edit the template, not this file; `make gen` rewrites it.
"""Train a WideResNet on Fashion-MNIST with Keras (Horovod lab, after step 4).

Small mode (the default on a machine without a GPU) trains a narrow WRN-16-1 on
a subset so that an epoch takes seconds on a CPU; ``--mode full`` trains the
lab's WRN-16-10 (160/320/640 channels) on all 60,000 images.

    python fashion_mnist_after_step_04.py --epochs 3 --batch-size 64
    labkit run --np 2 -- python fashion_mnist_after_step_04.py --epochs 3
"""

from __future__ import annotations

import argparse
import os
import sys

import labkit  # noqa: F401  (sets TF_USE_LEGACY_KERAS=1 before TensorFlow loads)
import tensorflow as tf

from labkit import callbacks as lk
from labkit import data
from labkit import model as wrn
from labkit import runs

import horovod.tensorflow.keras as hvd  # Horovod: the Keras API of Horovod


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="Fashion-MNIST WideResNet", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--log-dir", default="./logs", help="folder for the per-epoch CSV log")
    p.add_argument("--batch-size", type=int, default=32, help="input batch size for training")
    p.add_argument("--val-batch-size", type=int, default=32, help="input batch size for validation")
    p.add_argument("--epochs", type=int, default=40, help="number of epochs to train")
    p.add_argument("--base-lr", type=float, default=0.01, help="learning rate for a single worker")
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
    # Horovod: initialise Horovod, then pin one GPU per process by its local rank.
    hvd.init()
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.experimental.set_memory_growth(gpus[hvd.local_rank()], True)
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    args = parse_args(argv)

    # Horovod: only the first worker (rank 0) prints progress.
    verbose = 1 if hvd.rank() == 0 else 0

    train, test = data.load(args.train_size, args.test_size)
    mean, std = data.stats(train.x)
    train_ds = data.dataset(train, args.batch_size, training=True, mean=mean, std=std)
    test_ds = data.dataset(test, args.val_batch_size, training=False, mean=mean, std=std)
    steps_per_epoch = data.steps(len(train), args.batch_size)
    validation_steps = data.steps(len(test), args.val_batch_size)
    # TODO: Step 5: divide steps_per_epoch by the number of workers, and
    # set validation_steps to 3 * validation_steps // number of workers

    base_lr = args.base_lr
    model = wrn.build(args.widen_factor, weight_decay=args.wd)
    opt = tf.keras.optimizers.SGD(learning_rate=base_lr)
    # Horovod: average the gradients of all workers (allreduce) before each update.
    opt = hvd.DistributedOptimizer(opt)
    model.compile(loss="categorical_crossentropy", optimizer=opt, metrics=["accuracy"])

    callbacks: list[tf.keras.callbacks.Callback] = [tf.keras.callbacks.LearningRateScheduler(lk.step_decay(base_lr))]
    # Horovod: start every worker from the initial weights of rank 0.
    callbacks.append(hvd.callbacks.BroadcastGlobalVariablesCallback(0))
    # TODO: Step 6: average the metrics over all workers at the end of every epoch
    if verbose:
        callbacks.append(lk.Throughput(images_per_epoch=len(train)))
        callbacks.append(lk.CumulativeTime())
        os.makedirs(args.log_dir, exist_ok=True)
        callbacks.append(tf.keras.callbacks.CSVLogger(os.path.join(args.log_dir, "training.csv")))
    callbacks.append(lk.StopAtAccuracy(args.target_accuracy, args.patience, verbose))
    callbacks.append(runs.Recorder(__file__, vars(args)))  # labkit: one line in runs/runs.jsonl per run

    if verbose:
        print(f"mode={args.mode} widen_factor={args.widen_factor} train={len(train)} test={len(test)} "
              f"batch={args.batch_size} steps/epoch={steps_per_epoch}", flush=True)
    model.fit(
        train_ds,
        steps_per_epoch=steps_per_epoch,
        epochs=args.epochs,
        validation_data=test_ds,
        validation_steps=validation_steps,
        callbacks=callbacks,
        verbose=verbose,
    )
    loss, accuracy = model.evaluate(test_ds, steps=data.steps(len(test), args.val_batch_size), verbose=verbose)
    if verbose:
        print(f"Test loss: {loss:.4f}")
        print(f"Test accuracy: {accuracy:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
