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
  recorded (at most one epoch runs; ``--epochs N`` lets N run, ``--epochs 0`` ends the
  run cleanly at the call of ``fit``, for a check that only asks how the script gets there);
* saving: every ``Model.save``/``save_weights``/``save_model`` and ``tf.train.Checkpoint``
  write is recorded with its path and the epoch it happened in.

With ``--own-folders`` each rank runs in a folder of its own (``rank0/``, ``rank1/``), as
ranks on separate nodes see only their own disk.

Each rank writes ``OUT/probe.N.json`` (rewritten at every milestone, so a hang
still leaves evidence) and ``OUT/weights.N.npz``; ``OUT/progress.N.json`` (the batch it
is at, rewritten at most every second) and, when it is stopped or ``--budget S`` seconds
pass, its Python stacks (``OUT/stack.N.*.txt``, :mod:`labkit.core.stacks`), so that a rank that
never ends can be told where it was.

``--fit-bound F`` stops a rank that has not called ``Model.fit`` within ``F`` times the seconds this
very process took to import and patch TensorFlow, plus :data:`FIT_FLOOR` seconds: the import is the same
work on every machine, timed at the moment the check runs, so the bound grows on a slow or busy machine and
stays short on a fast one (:meth:`labkit.instrument.probe_record.Rank.watch_fit`).
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback

from labkit.core import env, stacks
from labkit.instrument.leave import leave
from labkit.instrument.probe_patches import (
    patch_arguments,
    patch_data,
    patch_devices,
    patch_horovod,
    patch_keras,
    patch_model,
    patch_saving,
)
from labkit.instrument.probe_record import Rank
from labkit.records.hvd_probe import Failure, FitRule

FIT_FLOOR = 5.0  # seconds added to the fit bound: the script's own start-up is never shorter than this


def fit_bound(factor: float, patched_s: float) -> float:
    """Seconds after the probe's start by which a rank must reach ``Model.fit``."""
    return factor * patched_s + FIT_FLOOR


def main(argv: list[str] | None = None) -> int:
    env.apply_defaults()  # before TensorFlow loads
    argv = list(sys.argv[1:] if argv is None else argv)
    own_folders, max_epochs, budget, factor = False, 1, None, None
    tolerated: list[str] = []
    while len(argv) > 1 and argv[1] != "--":  # the probe's own options, in any order, before "--"
        flag, value = argv[1], argv[2] if len(argv) > 2 else ""
        if flag == "--own-folders":
            own_folders = True
            del argv[1]
            continue
        if flag == "--epochs" and value.isdigit():
            max_epochs = int(value)
        elif flag == "--budget":
            budget = float(value)
        elif flag == "--fit-bound":
            factor = float(value)
        elif flag == "--tolerate" and value:
            tolerated.append(value)
        else:
            break
        del argv[1:3]
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m labkit.instrument.probe OUTDIR [--own-folders] [--epochs N] [--budget S] "
              "[--fit-bound F] [--tolerate OPTION]... -- SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    out, script, script_args = os.path.abspath(argv[0]), os.path.abspath(argv[2]), argv[3:]
    os.makedirs(out, exist_ok=True)
    rank = Rank(out)
    stacks.install(os.path.join(out, f"stack.{rank.rank}"), budget)
    if own_folders:  # as on separate nodes: each rank sees only its own files
        folder = os.path.join(os.getcwd(), f"rank{rank.rank}")
        os.makedirs(folder, exist_ok=True)
        os.chdir(folder)
    rank.milestone("start")
    import tensorflow as tf
    # A probe run trains a few batches: optimising their graph (Grappler) costs more than it saves.
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})

    patch_data(rank)
    patch_model()
    patch_devices(tf, rank)
    patch_horovod(rank)
    patch_keras(tf, rank, max_epochs)
    patch_saving(tf, rank)
    if tolerated:
        patch_arguments(rank, tolerated)
    rank.milestone("patched")
    if factor:
        rank.state.fit_rule = FitRule(factor, FIT_FLOOR)
        rank.watch_fit(fit_bound(factor, rank.state.times["patched"]), os.path.join(out, f"stack.{rank.rank}"))

    sys.argv = [script, *script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException as e:  # noqa: BLE001 - everything is reported to the checker
        rank.state.error = Failure(type(e).__name__, str(e)[:2000], traceback.format_exc()[-4000:])
        code = 1
    rank.state.pins.cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    rank.state.exit_code = code
    rank.milestone("end")
    sys.stdout.flush()
    if rank.state.error:
        print(rank.state.error.traceback, file=sys.stderr)
    return code


if __name__ == "__main__":
    leave(main())
