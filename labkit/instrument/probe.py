"""Run a learner's training script under observation: ``python -m labkit.instrument.probe OUT -- SCRIPT ARGS``.

Used by :mod:`labkit.check` under a 2-rank launch. It never edits the script; it
patches library entry points in this process only:

* data: ``fashion_mnist.load_data`` returns a tiny slice
  that differs per rank (so unaveraged gradients and metrics differ);
* model: ``Conv2D`` filters are shrunk so a full WideResNet runs in seconds;
* devices: two simulated GPUs are listed and pinning calls are recorded, and the
  local rank is mirrored (rank 0 has local rank 1) so that pinning by global rank
  can be told from pinning by local rank;
* ``Model.fit``/``evaluate``: arguments, callback order, metric reads per callback,
  batches per epoch, the learning rate of every training batch and weight snapshots are
  recorded (at most one epoch runs; ``--epochs N`` lets N run);
* saving: every ``Model.save``/``save_weights``/``save_model`` and ``tf.train.Checkpoint``
  write is recorded with its path and the epoch it happened in.

With ``--own-folders`` each rank runs in a folder of its own (``rank0/``, ``rank1/``), as
ranks on separate nodes see only their own disk.

Each rank writes ``OUT/probe.N.json`` (rewritten at every milestone, so a hang
still leaves evidence) and ``OUT/weights.N.npz``; ``OUT/progress.N.json`` (the batch it
is at, rewritten at most every second) and, when it is stopped or ``--budget S`` seconds
pass, its Python stacks (``OUT/stack.N.*.txt``, :mod:`labkit.core.stacks`), so that a rank that
never ends can be told where it was.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback

from labkit.core import env, stacks
from labkit.instrument import probe_record
from labkit.instrument.probe_patches import (
    patch_data,
    patch_devices,
    patch_horovod,
    patch_keras,
    patch_model,
    patch_saving,
)
from labkit.instrument.probe_record import STATE, milestone


def main(argv: list[str] | None = None) -> int:
    env.apply_defaults()  # before TensorFlow loads
    argv = list(sys.argv[1:] if argv is None else argv)
    own_folders = len(argv) > 1 and argv[1] == "--own-folders"
    if own_folders:
        del argv[1]
    max_epochs = 1
    if len(argv) > 2 and argv[1] == "--epochs" and argv[2].isdigit():
        max_epochs = int(argv[2])
        del argv[1:3]
    budget = None
    if len(argv) > 2 and argv[1] == "--budget":
        budget = float(argv[2])
        del argv[1:3]
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m labkit.instrument.probe OUTDIR [--own-folders] [--epochs N] [--budget S] "
              "-- SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    out, script, script_args = os.path.abspath(argv[0]), os.path.abspath(argv[2]), argv[3:]
    os.makedirs(out, exist_ok=True)
    probe_record.start(out)
    stacks.install(os.path.join(out, f"stack.{STATE['rank_env']}"), budget)
    if own_folders:  # as on separate nodes: each rank sees only its own files
        folder = os.path.join(os.getcwd(), f"rank{STATE['rank_env']}")
        os.makedirs(folder, exist_ok=True)
        os.chdir(folder)
    milestone("start")
    import tensorflow as tf

    patch_data(tf)
    patch_model(tf)
    patch_devices(tf)
    patch_horovod()
    patch_keras(tf, max_epochs)
    patch_saving(tf)
    milestone("patched")

    sys.argv = [script, *script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:  # noqa: BLE001 - everything is reported to the checker
        STATE["error"] = {"type": type(e).__name__, "message": str(e)[:2000],
                          "traceback": traceback.format_exc()[-4000:]}
        code = 1
    STATE["pins"]["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    STATE["exit_code"] = code
    milestone("end")
    sys.stdout.flush()
    if STATE["error"]:
        print(STATE["error"]["traceback"], file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
