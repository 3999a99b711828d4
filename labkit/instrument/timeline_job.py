"""A small synchronous training loop for Horovod's timeline (a plain script: no labkit import).

    HOROVOD_TIMELINE=tl.json mpirun -np 2 python timeline_job.py --steps 30

Each step does the work that takes rank 0 ``--compute-ms`` of CPU time (matrix products standing in for forward and
backward passes), then all-reduces ``--tensors`` "gradients" of ``--kib`` KiB each in one graph (so Horovod can
fuse them; ``--fp16`` sends them as float16). Every rank prints one line per step:
``STEP {"rank": r, "step": s, "compute_s": ..., "comm_s": ...}``; ``comm_s`` is the time in the all-reduce,
waiting for the slowest rank included.
"""

from __future__ import annotations

import argparse
import json
import os
import time

MARK = "STEP "


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--compute-ms", type=float, default=40.0)
    p.add_argument("--tensors", type=int, default=6)
    p.add_argument("--kib", type=int, default=64)
    p.add_argument("--tag", default="", help="a mark in the command line (to find a rank from outside)")
    p.add_argument("--fp16", action="store_true", help="compress the gradients to float16 for the all-reduce")
    a = p.parse_args(argv)

    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    hvd.init()
    grads = [tf.ones([a.kib * 256 + i]) for i in range(a.tensors)]

    @tf.function
    def reduce(gs):
        compression = hvd.Compression.fp16 if a.fp16 else hvd.Compression.none
        return [hvd.allreduce(g, op=hvd.Average, name=f"grad_{i}", compression=compression) for i, g in enumerate(gs)]

    m = np.random.default_rng(hvd.rank()).random((96, 96))
    start, work = time.process_time(), 0  # CPU time: the same count on a busy machine
    while time.process_time() - start < a.compute_ms / 1000:
        m, work = (m @ m) / 96.0, work + 1
    # the same work on every rank (rank 0's count): a rank that gets less CPU takes longer
    work = int(hvd.broadcast(tf.constant(work), 0, name="work").numpy())
    reduce(grads)  # trace the graph before the timed steps
    for step in range(a.steps):
        start = time.perf_counter()
        for _ in range(work):  # like a forward and backward pass
            m = (m @ m) / 96.0
        mid = time.perf_counter()
        [g.numpy() for g in reduce(grads)]
        end = time.perf_counter()
        print(MARK + json.dumps({"rank": hvd.rank(), "step": step, "compute_s": round(mid - start, 5),
                                 "comm_s": round(end - mid, 5), "end": round(time.time(), 4)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
