"""Run a learner's training script under observation: the ``horovod`` probe of :mod:`labkit.instrument.start`,
``python -m labkit.instrument.start horovod OUT [OPTIONS] -- SCRIPT ARGS``.

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
import sys
from dataclasses import dataclass, field
from typing import ClassVar

from labkit.core import env, stacks
from labkit.instrument import start
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


@dataclass
class HorovodProbe:
    """The Horovod checks' probe in one rank; :func:`labkit.instrument.start.run` runs the script."""

    OPTIONS: ClassVar[str] = "[--own-folders] [--epochs N] [--budget S] [--fit-bound F] [--tolerate OPTION]..."

    own_folders: bool = False
    max_epochs: int = 1
    budget: float | None = None  # seconds after which the stacks are dumped
    factor: float | None = None  # --fit-bound
    tolerated: list[str] = field(default_factory=list)
    rank: Rank = field(init=False, repr=False)

    @classmethod
    def parse(cls, options: list[str]) -> HorovodProbe | None:
        """The probe's own options, in any order; None for one it does not know."""
        probe, options = cls(), list(options)
        while options:
            flag, value = options[0], options[1] if len(options) > 1 else ""
            if flag == "--own-folders":
                probe.own_folders = True
                del options[0]
                continue
            if flag == "--epochs" and value.isdigit():
                probe.max_epochs = int(value)
            elif flag in ("--budget", "--fit-bound"):
                try:
                    number = float(value)
                except ValueError:
                    return None  # the usage line, exit 2
                if flag == "--budget":
                    probe.budget = number
                else:
                    probe.factor = number
            elif flag == "--tolerate" and value:
                probe.tolerated.append(value)
            else:
                return None
            del options[:2]
        return probe

    def prepare(self, out: str) -> None:
        env.apply_defaults()  # before TensorFlow loads
        out = os.path.abspath(out)
        os.makedirs(out, exist_ok=True)
        rank = self.rank = Rank(out)
        stacks.install(os.path.join(out, f"stack.{rank.rank}"), self.budget)
        if self.own_folders:  # as on separate nodes: each rank sees only its own files
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
        patch_keras(tf, rank, self.max_epochs)
        patch_saving(tf, rank)
        if self.tolerated:
            patch_arguments(rank, self.tolerated)
        rank.milestone("patched")
        if self.factor:
            rank.state.fit_rule = FitRule(self.factor, FIT_FLOOR)
            rank.watch_fit(fit_bound(self.factor, rank.state.times["patched"]), os.path.join(out, f"stack.{rank.rank}"))

    def failed(self, error: BaseException) -> None:
        self.rank.state.error = Failure(type(error).__name__, str(error)[:2000], start.format_error(error)[-4000:])

    def finish(self, code: int) -> None:
        rank = self.rank
        rank.state.pins.cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
        rank.state.exit_code = code
        rank.milestone("end")
        if rank.state.error:
            print(rank.state.error.traceback, file=sys.stderr)
