"""A Keras training job in Horovod's elastic form (a plain script: no labkit import).

    horovodrun -np 2 --min-np 1 --max-np 2 --host-discovery-script ./discover_hosts.sh python elastic_job.py

The model and its optimizer state live in a ``KerasState`` committed at the end of every epoch (the commit is also
where a worker learns that the hosts changed); when a worker leaves, the others roll back to the last commit and go
on with fewer workers; when one joins, it receives the state and the job grows again. The epoch is counted here:
Horovod's ``UpdateEpochStateCallback`` adds the initial epoch to the epoch tf-keras already counts from it, so after a
restart from epoch k it skips k epochs. Every rank prints one line per epoch:
``ELASTIC {"epoch": e, "size": workers, "rank": r, "t": the epoch's seconds, "end": when it ended}``.

The optimizer is built before the state is made: a worker that joins later must hold as many optimizer variables
as the trained ones, or the state's broadcast waits for ever.
"""

from __future__ import annotations

import argparse
import json
import os
import time

MARK = "ELASTIC "


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--steps", type=int, default=20, help="batches per epoch")
    p.add_argument("--epoch-seconds", type=float, default=1.0, help="at least this long per epoch (a pause per step)")
    p.add_argument("--events", default=None, help="also append each epoch line to this file (all workers share it)")
    a = p.parse_args(argv)

    import horovod.tensorflow.keras as hvd
    import numpy as np
    import tensorflow as tf

    hvd.init()
    rng = np.random.default_rng(0)
    x = rng.random((a.steps * 32, 64), dtype=np.float32)
    y = (x.sum(axis=1) > 32).astype(np.int64)
    model = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="relu", input_shape=(64,)),
                                 tf.keras.layers.Dense(2)])
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=opt, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.optimizer.build(model.trainable_variables)  # before the state: a newcomer needs the same variables
    state = hvd.elastic.KerasState(model, batch=0, epoch=0)
    pause = a.epoch_seconds / a.steps

    class Pace(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            time.sleep(pause)

        def on_epoch_end(self, epoch, logs=None):
            line = MARK + json.dumps({"epoch": epoch, "size": hvd.size(), "rank": hvd.rank(),
                                      "t": round(time.perf_counter() - self.start, 3), "end": round(time.time(), 3)})
            print(line, flush=True)
            if a.events:  # one short append per line: whole lines, whichever worker writes
                with open(a.events, "a") as f:
                    f.write(line + "\n")
            state.epoch = epoch + 1  # tf-keras' epoch already counts from initial_epoch
            state.commit()  # save, then stop here if the hosts changed

    callbacks = [Pace()]

    @hvd.elastic.run
    def train(state):
        model.fit(x, y, batch_size=32, steps_per_epoch=a.steps, epochs=a.epochs, initial_epoch=state.epoch,
                  callbacks=callbacks, verbose=0)

    train(state)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
