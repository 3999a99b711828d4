#!/usr/bin/env python
# Generated from solutions/source/fashion_mnist.py.tmpl (version 14) by `labkit gen`.
# Edit the template, not this file; `make gen` rewrites it.
"""Train a WideResNet on Fashion-MNIST with Keras (at-scale lab, after step 5).

Plain TensorFlow + tf-keras + Horovod: needs TF_USE_LEGACY_KERAS=1 in the environment
(Horovod's Keras API works with Keras 2, which TensorFlow 2.16+ only gives through
tf-keras); the script sets it itself when it is missing, before TensorFlow loads.

Small mode (the default without a GPU) trains WRN-16-1 on a 6,000-image subset so that an
epoch takes seconds on a CPU; --mode full trains the lab's WRN-16-10 (160/320/640
channels) on all 60,000 images.

    python fashion_mnist_at_scale_after_step_05.py --epochs 3
    mpirun -np 2 python fashion_mnist_at_scale_after_step_05.py --epochs 3   # or: horovodrun -np 2 ..., srun ...
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # tf.keras is Keras 2 (tf-keras)

import numpy as np
import tensorflow as tf

import horovod.tensorflow.keras as hvd  # Horovod: the Keras API of Horovod
from horovod.tensorflow import SyncBatchNormalization  # Horovod: BatchNorm over every worker's batch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Fashion-MNIST WideResNet",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--log-dir", default="./logs", help="folder for the per-epoch CSV log")
    p.add_argument("--batch-size", type=int, default=32, help="input batch size for training (per worker)")
    p.add_argument("--val-batch-size", type=int, default=32, help="input batch size for validation")
    p.add_argument("--epochs", type=int, default=40, help="number of epochs to train")
    p.add_argument("--base-lr", type=float, default=None,
                   help="learning rate for a single worker (mode default: small 0.05, full 0.01)")
    p.add_argument("--wd", type=float, default=0.000005, help="weight decay (L2)")
    p.add_argument("--target-accuracy", type=float, default=None,
                   help="stop when val accuracy exceeds this (mode default: small 0.82, full 0.85)")
    p.add_argument("--patience", type=int, default=2, help="epochs above the target before stopping")
    p.add_argument("--mode", choices=["auto", "small", "full"], default="auto",
                   help="small: WRN-16-1 on a subset (CPU); full: WRN-16-10 on all data; auto: full with a GPU")
    p.add_argument("--widen-factor", type=int, default=None, help="WRN widen factor (mode default: small 1, full 10)")
    p.add_argument("--train-size", type=int, default=None,
                   help="training images, 0 for all (mode default: small 6000, full all)")
    p.add_argument("--test-size", type=int, default=None,
                   help="test images, 0 for all (mode default: small 1000, full all)")
    p.add_argument("--checkpoint-dir", default="",
                   help="save a checkpoint here every epoch and resume from the latest one (empty: off)")
    p.add_argument("--warmup-epochs", type=int, default=3, help="epochs to ramp the learning rate up")
    p.add_argument("--fp16-allreduce", action="store_true",
                   help="all-reduce the gradients as float16: half the bytes on the wire")
    p.add_argument("--accumulate", type=int, default=1,
                   help="batches whose gradients are added up before each all-reduce and update")
    p.add_argument("--sync-bn", action="store_true",
                   help="BatchNorm statistics over the global batch (every worker's), not each worker's own")
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32",
                   help="what the layers compute in: float32, or bfloat16/float16 with float32 variables")
    p.add_argument("--profile-dir", default="",
                   help="rank 0 profiles training batches 3 to 5 into this folder (empty: off)")
    p.add_argument("--elastic", action="store_true",
                   help="elastic training (horovodrun --host-discovery-script): go on when workers leave or join")
    return apply_mode(p.parse_args(argv))


# Small mode trains a narrow WRN-16-1 on a class-balanced subset with a larger learning
# rate, so that a CPU reaches the target accuracy in minutes; full mode is the lab's
# WRN-16-10 on all data with the lab's settings.
MODES = {
    "small": {"widen_factor": 1, "train_size": 6000, "test_size": 1000, "base_lr": 0.05, "target_accuracy": 0.82},
    "full": {"widen_factor": 10, "train_size": 0, "test_size": 0, "base_lr": 0.01, "target_accuracy": 0.85},
}


def apply_mode(args: argparse.Namespace) -> argparse.Namespace:
    """Resolve --mode auto (full with a GPU, else small) and fill the settings left unset."""
    if args.mode == "auto":
        args.mode = "full" if tf.config.list_physical_devices("GPU") else "small"
    for key, value in MODES[args.mode].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def load_fashion_mnist(train_size: int, test_size: int) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    """The first train_size/test_size images (0: all) as (N, 28, 28, 1) uint8, with integer labels.

    The files are shuffled by their authors, so a leading slice is class balanced.
    """
    try:
        (x_train, y_train), (x_test, y_test) = tf.keras.datasets.fashion_mnist.load_data()
    except Exception as e:  # no cached copy and no download: say how to get the files
        sys.exit(f"Fashion-MNIST could not be loaded: {type(e).__name__}: {e}\n"
                 "tf.keras.datasets.fashion_mnist.load_data() reads ~/.keras/datasets/fashion-mnist and\n"
                 "downloads the four files there when they are missing. Without internet access, copy\n"
                 "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and\n"
                 "t10k-labels-idx1-ubyte.gz into that folder (Debian/Ubuntu: apt-get install\n"
                 "dataset-fashion-mnist puts them in /usr/share/datasets/fashion-mnist).")
    if train_size:
        x_train, y_train = x_train[:train_size], y_train[:train_size]
    if test_size:
        x_test, y_test = x_test[:test_size], y_test[:test_size]
    return (x_train[..., None], y_train), (x_test[..., None], y_test)


def standardize(mean: float, std: float):
    """A tf.data map function: images to zero mean and unit variance, labels to one-hot."""

    def fn(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return (tf.cast(x, tf.float32) - mean) / std, tf.one_hot(tf.cast(y, tf.int32), 10)

    return fn


def augment(x: tf.Tensor, y: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Random horizontal flips and shifts of up to 20% (nearest-pixel fill) of a batch of images."""
    n, h, w = tf.shape(x)[0], 28, 28
    x = tf.where(tf.random.uniform([n, 1, 1, 1]) < 0.5, tf.reverse(x, axis=[2]), x)
    dy = tf.random.uniform([n], -(h // 5), h // 5 + 1, dtype=tf.int32)
    dx = tf.random.uniform([n], -(w // 5), w // 5 + 1, dtype=tf.int32)
    rows = tf.clip_by_value(tf.range(h)[None, :] - dy[:, None], 0, h - 1)
    cols = tf.clip_by_value(tf.range(w)[None, :] - dx[:, None], 0, w - 1)
    x = tf.gather(x, rows, axis=1, batch_dims=1)
    return tf.gather(x, cols, axis=2, batch_dims=1), y


def wide_resnet(widen_factor: int, weight_decay: float, num_classes: int = 10,
                norm: type | None = None) -> tf.keras.Model:
    """WideResNet-16-k for 28x28 grey images: 16k/32k/64k channels (k=10: 160/320/640); ``norm``: the
    batch-normalisation layer (default: Keras's BatchNormalization)."""
    layers = tf.keras.layers
    norm = norm or layers.BatchNormalization
    l2 = tf.keras.regularizers.l2(weight_decay) if weight_decay else None

    def cbr(x: tf.Tensor, filters: int) -> tf.Tensor:  # convolution, batch norm, ReLU
        conv = layers.Conv2D(filters, 3, padding="same", kernel_regularizer=l2)
        x = conv(x)
        # momentum 0.9: the moving statistics settle within the ~100 steps of a small-mode epoch; a name of its
        # own after its convolution's (Horovod's SyncBatchNormalization gives every instance the same one)
        x = norm(momentum=0.9, name=f"{conv.name}_bn")(x)
        return layers.Activation("relu")(x)

    def block(x: tf.Tensor, filters: int, project: bool = False) -> tf.Tensor:
        shortcut = layers.Conv2D(filters, 1, padding="same", kernel_regularizer=l2)(x) if project else x
        y = cbr(x, filters)
        y = layers.Dropout(0.01)(y)
        y = cbr(y, filters)
        return layers.Add()([shortcut, y])

    inputs = layers.Input(shape=(28, 28, 1))
    x = cbr(inputs, 16)
    for i, width in enumerate((16 * widen_factor, 32 * widen_factor, 64 * widen_factor)):
        if i:
            x = layers.MaxPooling2D(2)(x)
        x = block(x, width, project=True)
        x = block(x, width)
    x = layers.GlobalAveragePooling2D()(x)
    # float32 output: the softmax and the loss stay in full precision whatever the layers compute in
    outputs = layers.Dense(num_classes, activation="softmax", kernel_regularizer=l2, dtype="float32")(x)
    return tf.keras.Model(inputs, outputs, name=f"wrn_16_{widen_factor}")


def lr_schedule(base_lr: float, warmup_epochs: int = 0, start_lr: float | None = None):
    """The lab's schedule: base_lr until epoch 15, then divided by 10 at epochs 15, 25 and 35; with
    warmup_epochs, a linear ramp from start_lr up to base_lr over the first epochs."""

    def schedule(epoch: int, lr: float | None = None) -> float:
        if epoch < warmup_epochs and start_lr is not None:
            return start_lr + (base_lr - start_lr) * epoch / warmup_epochs
        return base_lr * (1.0 if epoch < 15 else 1e-1 if epoch < 25 else 1e-2 if epoch < 35 else 1e-3)

    return schedule


class Throughput(tf.keras.callbacks.Callback):
    """Print training images/sec after every epoch, timing the training steps only (not validation)."""

    def __init__(self, images_per_epoch: int) -> None:
        super().__init__()
        self.images_per_epoch = images_per_epoch
        self.start = self.train_time = 0.0

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        self.start, self.train_time = time.perf_counter(), 0.0

    def on_test_begin(self, logs: dict | None = None) -> None:
        if self.start and not self.train_time:
            self.train_time = time.perf_counter() - self.start

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        seconds = self.train_time or time.perf_counter() - self.start
        print(f"\nImages/sec: {self.images_per_epoch / seconds:.1f}", flush=True)


class CumulativeTime(tf.keras.callbacks.Callback):
    """Print the wall time since training began after every epoch and at the end."""

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        print(f"Cumulative training time after epoch {epoch + 1}: {time.perf_counter() - self.start:.2f}",
              flush=True)

    def on_train_end(self, logs: dict | None = None) -> None:
        print(f"Cumulative training time: {time.perf_counter() - self.start:.2f}", flush=True)


class StopAtAccuracy(tf.keras.callbacks.Callback):
    """Stop once val_accuracy exceeded the target for `patience` epochs in a row."""

    def __init__(self, target: float, patience: int = 2, verbose: int = 0) -> None:
        super().__init__()
        self.target, self.patience, self.verbose = target, patience, verbose
        self.met, self.stopped_epoch = 0, None

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        accuracy = (logs or {}).get("val_accuracy")
        self.met = self.met + 1 if accuracy is not None and accuracy > self.target else 0
        if self.met >= self.patience:
            self.stopped_epoch = epoch
            self.model.stop_training = True

    def on_train_end(self, logs: dict | None = None) -> None:
        if self.stopped_epoch is not None and self.verbose:
            print(f"Reached the target accuracy; stopped after epoch {self.stopped_epoch + 1}", flush=True)


class ProfileBatches(tf.keras.callbacks.Callback):
    """Profile training batches first..last of the first epoch trained (0-based; batch 0 traces the graph) into
    log_dir, once: TensorFlow writes log_dir/plugins/profile/<time>/<host>.xplane.pb when the profiler stops."""

    def __init__(self, log_dir: str, first: int = 2, last: int = 4) -> None:
        super().__init__()
        self.log_dir, self.first, self.last = log_dir, first, last
        self.running = self.done = False

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        if batch == self.first and not (self.running or self.done):
            tf.profiler.experimental.start(self.log_dir)
            self.running = True

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        if self.running and batch >= self.last:
            self.stop()

    def on_train_end(self, logs: dict | None = None) -> None:
        if self.running:  # an epoch shorter than the window: keep what was profiled
            self.stop()

    def stop(self) -> None:
        tf.profiler.experimental.stop()
        self.running, self.done = False, True


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

    # Horovod: resume from the latest checkpoint. Only rank 0 is sure to see it (on a cluster it is on
    # rank 0's disk), so rank 0 decides the epoch and broadcasts it to every rank.
    checkpoint_format = os.path.join(args.checkpoint_dir, "checkpoint-{epoch}.h5")
    resume_from_epoch = 0
    if args.checkpoint_dir:
        for try_epoch in range(args.epochs, 0, -1):
            if os.path.exists(checkpoint_format.format(epoch=try_epoch)):
                resume_from_epoch = try_epoch
                break
    # Horovod elastic: a worker that joins a running job runs this alone, while the others train: no collective
    # call outside the elastic function below. The epoch comes to it with the rest of the state (state.sync).
    if not args.elastic:
        resume_from_epoch = int(hvd.broadcast(resume_from_epoch, 0, name="resume_from_epoch"))

    (x_train, y_train), (x_test, y_test) = load_fashion_mnist(args.train_size, args.test_size)
    mean, std = float(x_train.mean()), float(x_train.std())
    # Input pipeline: every worker shuffles the whole training set in its own random order,
    # draws augmented batches of --batch-size, and prepares the next batches while training.
    train_ds = (tf.data.Dataset.from_tensor_slices((x_train, y_train))
                .shuffle(len(x_train)).repeat()
                .batch(args.batch_size, drop_remainder=True)
                .map(standardize(mean, std), num_parallel_calls=tf.data.AUTOTUNE)
                .map(augment, num_parallel_calls=tf.data.AUTOTUNE)
                .prefetch(tf.data.AUTOTUNE))
    # Validation batches are drawn at random too, in each worker's own order.
    test_ds = (tf.data.Dataset.from_tensor_slices((x_test, y_test))
               .shuffle(len(x_test)).repeat()
               .batch(args.val_batch_size)
               .map(standardize(mean, std), num_parallel_calls=tf.data.AUTOTUNE)
               .prefetch(tf.data.AUTOTUNE))
    steps_per_epoch = math.ceil(len(x_train) / args.batch_size)
    validation_steps = math.ceil(len(x_test) / args.val_batch_size)
    test_steps = validation_steps
    # Horovod: each worker runs 1/size of an epoch; validate on 3x the test batches split over the workers.
    steps_per_epoch = max(1, steps_per_epoch // hvd.size())
    validation_steps = max(1, 3 * validation_steps // hvd.size())

    # Horovod: scale the learning rate by the number of workers: each step averages the gradients of
    # hvd.size() batches, a global batch hvd.size() times larger (the linear scaling rule).
    base_lr = args.base_lr * hvd.size()
    # Horovod: with --accumulate K each update averages K batches per worker: a global batch K times larger
    # again, so the rate grows K times too.
    base_lr *= args.accumulate
    # Mixed precision: the layers compute in bfloat16 (float16 on a GPU) while the variables stay float32.
    # Set the policy before the model is built: each layer takes it when it is created.
    if args.precision != "fp32":
        tf.keras.mixed_precision.set_global_policy("mixed_bfloat16" if args.precision == "bf16" else "mixed_float16")
    # Horovod: with --sync-bn each BatchNorm layer normalises with the mean and variance of the global batch,
    # all-reduced over the workers, so every worker's moving statistics stay the same.
    norm = SyncBatchNormalization if args.sync_bn else tf.keras.layers.BatchNormalization
    model = wide_resnet(args.widen_factor, weight_decay=args.wd, norm=norm)
    opt = tf.keras.optimizers.SGD(learning_rate=base_lr)
    # Horovod: average the gradients of all workers (allreduce) before each update.
    # With --fp16-allreduce the gradients cross the wire as float16 (half the bytes); the update stays float32.
    # With --accumulate K each worker adds up the gradients of K batches (backward passes) before they are
    # all-reduced, once, and applied, averaged over the K batches: one all-reduce and one update per K batches.
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    opt = hvd.DistributedOptimizer(opt, compression=compression, backward_passes_per_step=args.accumulate,
                                   average_aggregated_gradients=True)
    model.compile(loss="categorical_crossentropy", optimizer=opt, metrics=["accuracy"])
    if resume_from_epoch > 0 and hvd.rank() == 0:
        # Horovod: rank 0 restores the checkpoint's weights into the model every rank built;
        # the broadcast callback then gives them to every other rank.
        model.load_weights(checkpoint_format.format(epoch=resume_from_epoch))

    callbacks: list[tf.keras.callbacks.Callback] = [tf.keras.callbacks.LearningRateScheduler(lr_schedule(base_lr))]
    if not args.elastic:  # Horovod elastic: state.sync() gives every worker rank 0's weights instead
        # Horovod: start every worker from the initial weights of rank 0.
        callbacks.append(hvd.callbacks.BroadcastGlobalVariablesCallback(0))
    # Horovod: average the validation metrics over workers, before any callback reads them.
    callbacks.append(hvd.callbacks.MetricAverageCallback())
    if args.checkpoint_dir and hvd.rank() == 0:
        # Horovod: only rank 0 saves checkpoints (other ranks would overwrite the same files).
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(checkpoint_format))
    # Horovod: ramp the learning rate up from base_lr / size to base_lr over the first epochs.
    # momentum_correction=False: the correction assigns to optimizer.momentum, a plain float in
    # tf-keras 2.x optimizers, and so crashes the first training step (AttributeError: 'float' object
    # has no attribute 'dtype'), whatever the momentum; this SGD has none to correct anyway.
    callbacks.append(hvd.callbacks.LearningRateWarmupCallback(
        initial_lr=base_lr, warmup_epochs=args.warmup_epochs, verbose=verbose, momentum_correction=False))
    if verbose:
        callbacks.append(Throughput(images_per_epoch=len(x_train)))
        callbacks.append(CumulativeTime())
        os.makedirs(args.log_dir, exist_ok=True)
        callbacks.append(tf.keras.callbacks.CSVLogger(os.path.join(args.log_dir, "training.csv")))
    if args.profile_dir and hvd.rank() == 0:
        # Horovod: only rank 0 profiles. In synchronous training every rank waits for the others at each
        # all-reduce, so one rank's steps show the job's; ranks sharing a host would also write the same file.
        callbacks.append(ProfileBatches(args.profile_dir))
    callbacks.append(StopAtAccuracy(args.target_accuracy, args.patience, verbose))

    if verbose:
        print(f"mode={args.mode} widen_factor={args.widen_factor} train={len(x_train)} test={len(x_test)} "
              f"batch={args.batch_size} steps/epoch={steps_per_epoch}", flush=True)
    if args.elastic:
        # Horovod elastic: the state every worker agrees on: the model's weights, its optimizer's and the epoch
        # reached. Every worker commits it after each batch; when a worker leaves, the others go back to the last
        # commit and go on; a worker that joins gets rank 0's. Build the optimizer's variables first, so that a
        # newcomer has the same ones to receive as the workers that trained have to send.
        opt.build(model.trainable_variables)
        state = hvd.elastic.KerasState(model, epoch=resume_from_epoch)
        # Horovod elastic: the epochs done, as tf.keras numbers them from initial_epoch. (Horovod's
        # UpdateEpochStateCallback counts from 0 in every call of fit, for fit(epochs=args.epochs - state.epoch);
        # with initial_epoch=state.epoch it would skip epochs after each change of workers.)
        epoch_done = tf.keras.callbacks.LambdaCallback(
            on_epoch_end=lambda epoch, logs: setattr(state, "epoch", epoch + 1))
        callbacks = [hvd.elastic.CommitStateCallback(state), epoch_done, *callbacks]

        @hvd.elastic.run
        def train(state: hvd.elastic.KerasState) -> None:
            # Horovod elastic: run again after every change of workers, from the epoch the state holds.
            model.fit(train_ds, steps_per_epoch=steps_per_epoch, epochs=args.epochs, initial_epoch=state.epoch,
                      validation_data=test_ds, validation_steps=validation_steps,
                      callbacks=callbacks, verbose=verbose)

        train(state)
    else:
        model.fit(train_ds, steps_per_epoch=steps_per_epoch, epochs=args.epochs, initial_epoch=resume_from_epoch,
                  validation_data=test_ds, validation_steps=validation_steps,
                  callbacks=callbacks, verbose=verbose)
    loss, accuracy = model.evaluate(test_ds, steps=test_steps, verbose=verbose)
    if verbose:
        print(f"Test loss: {loss:.4f}")
        print(f"Test accuracy: {accuracy:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
