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
