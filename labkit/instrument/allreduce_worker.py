"""Time the all-reduce of float32 tensors on every worker (a plain script: no labkit import).

    mpirun -np 2 python allreduce_worker.py --sizes 1048576,8388608 --repeat 5           # Horovod (MPI or Gloo)
    TF_CONFIG=... python allreduce_worker.py --via mwms --sizes 8388608 --repeat 5        # MultiWorkerMirroredStrategy

For each size (bytes): ``--warmup`` untimed all-reduces, then ``--repeat`` timed ones. Before each timed
one the workers meet in a tiny all-reduce, so that they start together; a repeat's time is the slowest
worker's under Horovod (an all-reduce ends for all when it ends for the last), the first worker's own
under MultiWorkerMirroredStrategy. The first worker prints one line per size:
``ALLREDUCE {"bytes": ..., "workers": ..., "seconds": [...]}``.
"""

from __future__ import annotations

import argparse
import json
import os
import time

MARK = "ALLREDUCE "


def horovod(sizes: list[int], warmup: int, repeat: int) -> list[dict]:
    import horovod.tensorflow as hvd
    import tensorflow as tf

    hvd.init()
    meet = tf.zeros([1])
    out = []
    for nbytes in sizes:
        x = tf.ones([max(1, nbytes // 4)], tf.float32)
        for _ in range(warmup):
            hvd.allreduce(x, op=hvd.Sum, name=f"warm{nbytes}").numpy()
        times = []
        for _ in range(repeat):
            hvd.allreduce(meet, op=hvd.Sum, name="meet").numpy()
            start = time.perf_counter()
            hvd.allreduce(x, op=hvd.Sum, name=f"timed{nbytes}").numpy()
            took = tf.constant([time.perf_counter() - start], tf.float64)
            times.append(float(hvd.allreduce(took, op=hvd.Max, name="slowest").numpy()[0]))
        out.append({"bytes": x.shape[0] * 4, "workers": hvd.size(), "seconds": times, "rank": hvd.rank(),
                    "via": "horovod-" + ("gloo" if hvd.gloo_enabled() else "mpi")})
    return out


def mwms(sizes: list[int], warmup: int, repeat: int) -> list[dict]:
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.cluster_resolver.cluster_spec().num_tasks("worker")
    rank = strategy.cluster_resolver.task_id

    def reducer(n: int):  # a graph that all-reduces n float32s made on each worker
        @tf.function
        def step():
            ctx = tf.distribute.get_replica_context
            return strategy.run(lambda: ctx().all_reduce(tf.distribute.ReduceOp.SUM, tf.ones([n])))
        return step

    meet = reducer(1)
    out = []
    for nbytes in sizes:
        step = reducer(max(1, nbytes // 4))
        for _ in range(max(1, warmup)):  # the first call also traces the graph
            strategy.experimental_local_results(step())[0].numpy()
        times = []
        for _ in range(repeat):  # each worker's own time: they start together after the meeting
            strategy.experimental_local_results(meet())[0].numpy()
            start = time.perf_counter()
            strategy.experimental_local_results(step())[0].numpy()
            times.append(time.perf_counter() - start)
        out.append({"bytes": max(1, nbytes // 4) * 4, "workers": workers, "seconds": times, "rank": rank,
                    "via": "mwms"})
    return out


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", required=True, help="bytes per tensor, comma-separated")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--via", choices=("horovod", "mwms"), default="horovod")
    a = p.parse_args(argv)
    sizes = [int(s) for s in a.sizes.split(",") if s]
    results = (mwms if a.via == "mwms" else horovod)(sizes, a.warmup, a.repeat)
    for r in results:
        if r.pop("rank") == 0:
            print(MARK + json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
