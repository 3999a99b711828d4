#!/usr/bin/env python
# Generated from solutions/source/fashion_mnist_multiworker.py.tmpl (version 2) by `labkit gen`.
# Edit the template, not this file; `make gen` rewrites it.
"""Train a WideResNet on Fashion-MNIST with Keras (MultiWorkerMirroredStrategy lab, after step 2).

Every worker of the cluster runs this same script; ``TF_CONFIG`` tells each one
the cluster's addresses and its own role. Run it alone (one worker) or as a
cluster from a notebook or a shell:

    python fashion_mnist_multiworker_after_step_02.py --epochs 3
    labkit cluster --workers 2 -- python fashion_mnist_multiworker_after_step_02.py --epochs 3
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
    p.add_argument("--model-path", default="./saved/model.keras", help="where the trained model is saved")
    p.add_argument("--backup-dir", default="./backup", help="folder for the fault-tolerance backups")
    p.add_argument("--batch-size", type=int, default=32, help="input batch size per worker")
    p.add_argument("--val-batch-size", type=int, default=32, help="validation batch size per worker")
    p.add_argument("--epochs", type=int, default=40, help="number of epochs to train")
    p.add_argument("--base-lr", type=float, default=0.01, help="learning rate")
    p.add_argument("--wd", type=float, default=0.000005, help="weight decay (L2)")
    p.add_argument("--target-accuracy", type=float, default=0.85, help="stop when val accuracy exceeds this")
    p.add_argument("--patience", type=int, default=2, help="epochs above the target before stopping")
    p.add_argument("--seed", type=int, default=1234, help="shuffle seed, the same on every worker")
    p.add_argument("--mode", choices=["auto", "small", "full"], default="auto",
                   help="small: narrow net on a subset (CPU); full: WRN-16-10 on all data; auto: full with a GPU")
    p.add_argument("--widen-factor", type=int, default=None, help="WRN widen factor (mode default: small 1, full 10)")
    p.add_argument("--train-size", type=int, default=None, help="training images (mode default: small 6000, full all)")
    p.add_argument("--test-size", type=int, default=None, help="test images (mode default: small 1000, full all)")
    return wrn.apply_mode(p.parse_args(argv))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # tf.distribute: one strategy per process, created first; it reads TF_CONFIG and joins the cluster.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    replicas = strategy.num_replicas_in_sync
    # TODO: Step 3: only the chief (worker 0) should print and write logs
    chief = True
    verbose = 1 if chief else 0

    train, test = data.load(args.train_size, args.test_size)
    mean, std = data.stats(train.x)
    # tf.distribute: the batch given to fit is the global batch; each worker gets batch_size of it.
    global_batch = args.batch_size * replicas
    val_batch = args.val_batch_size * replicas
    # tf.distribute: every worker shuffles in the same order, so that sharding by DATA splits one permutation.
    train_ds = data.dataset(train, global_batch, training=True, mean=mean, std=std, seed=args.seed)
    test_ds = data.dataset(test, val_batch, training=False, mean=mean, std=std)
    # tf.distribute: say how the workers split the data: DATA gives each worker every n-th example.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train_ds = train_ds.with_options(options)
    test_ds = test_ds.with_options(options)
    steps_per_epoch = data.steps(len(train), global_batch)
    validation_steps = data.steps(len(test), val_batch)

    # tf.distribute: variables created in the scope are mirrored on every replica of every worker.
    with strategy.scope():
        model = wrn.build(args.widen_factor, weight_decay=args.wd)
        opt = tf.keras.optimizers.SGD(learning_rate=args.base_lr)
        model.compile(loss="categorical_crossentropy", optimizer=opt, metrics=["accuracy"])

    callbacks: list[tf.keras.callbacks.Callback] = [
        tf.keras.callbacks.LearningRateScheduler(lk.step_decay(args.base_lr))
    ]
    # TODO: Step 4: add a tf.keras.callbacks.BackupAndRestore(backup_dir=args.backup_dir) callback
    if chief:
        callbacks.append(lk.Throughput(images_per_epoch=len(train)))
        callbacks.append(lk.CumulativeTime())
        os.makedirs(args.log_dir, exist_ok=True)
        callbacks.append(tf.keras.callbacks.CSVLogger(os.path.join(args.log_dir, "training.csv"), append=True))
    callbacks.append(lk.StopAtAccuracy(args.target_accuracy, args.patience, verbose))
    callbacks.append(runs.Recorder(__file__, vars(args)))  # labkit: one line in runs/runs.jsonl per run (chief only)

    if verbose:
        print(f"mode={args.mode} widen_factor={args.widen_factor} train={len(train)} test={len(test)} "
              f"replicas={replicas} global_batch={global_batch} steps/epoch={steps_per_epoch}", flush=True)
    model.fit(
        train_ds,
        steps_per_epoch=steps_per_epoch,
        epochs=args.epochs,
        validation_data=test_ds,
        validation_steps=validation_steps,
        callbacks=callbacks,
        verbose=verbose,
    )
    loss, accuracy = model.evaluate(test_ds, steps=validation_steps, verbose=verbose)
    if verbose:
        print(f"Test loss: {loss:.4f}")
        print(f"Test accuracy: {accuracy:.4f}")

    # TODO: Step 3: every worker saves, but non-chief workers to a temporary folder they delete afterwards
    os.makedirs(os.path.dirname(os.path.abspath(args.model_path)), exist_ok=True)
    model.save(args.model_path)
    if verbose:
        print(f"Saved the model to {args.model_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
