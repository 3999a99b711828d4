"""What a probed rank saw, written as it goes (:mod:`labkit.instrument.probe`).

One :class:`Rank` object per probed process holds everything the probe keeps: its record (``state``, a
:class:`labkit.records.hvd_probe.RankRecord` rewritten to
``OUT/probe.N.json`` at every milestone, so that a rank that hangs or is killed still leaves its evidence), the
weight snapshots (``OUT/weights.N.npz``), what Horovod all-reduced (``OUT/allreduce.N.json``) and where training is
(``OUT/progress.N.json``, at most once a second). The patches of :mod:`labkit.instrument.probe_patches` are given
that object; nothing of the probe lives in a module global.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from labkit.core.identity import rank_from_env
from labkit.records import typed
from labkit.records.hvd_probe import DataSize, FitBound, HorovodState, RankRecord

TRAIN_PER_RANK = 192
TEST_PER_RANK = 64
FAKE_GPUS = 2
FIT_BOUND_EXIT = 86  # the exit status of a rank stopped by its bound on reaching fit


class Rank:
    """One probed rank: what it saw so far, and the folder it writes to."""

    def __init__(self, out: str) -> None:
        self.out = out
        self.t0 = time.monotonic()
        # times: seconds from the probe's start to each milestone
        self.state = RankRecord(rank_env=rank_from_env(), data=DataSize(TRAIN_PER_RANK, TEST_PER_RANK))
        self.weights: dict[str, Any] = {}  # snapshots of the flat trainable weights, by moment
        self.allreduced: dict[str, dict[str, int]] = {"gradients": {}, "other": {}}  # tensors by dtype
        self.real_local_rank: Callable[[], int] | None = None  # Horovod's own, before the probe mirrors it
        self.tally: Any = None  # labkit.instrument.probe_allreduce.Tally, made when fit is called
        self._progress_at = 0.0

    @property
    def rank(self) -> int:
        return self.state.rank_env

    def write(self, name: str, value: Any) -> None:
        """Write ``OUT/name`` whole; never fails into the script (which may have deleted the folder)."""
        path = os.path.join(self.out, name)
        try:
            os.makedirs(self.out, exist_ok=True)
            with open(path + ".tmp", "w") as f:
                json.dump(value, f, default=str)
            os.replace(path + ".tmp", path)
        except OSError:
            pass

    def save(self) -> None:
        """Rewrite ``probe.N.json`` with everything seen so far."""
        self.write(f"probe.{self.rank}.json", typed.dump(self.state))

    def progress(self, phase: str, epoch: int, batch: int) -> None:
        """Where training is (at most one write a second): tells a loop that never ends from a hang."""
        now = time.time()
        if now - self._progress_at >= 1.0:
            self._progress_at = now
            self.write(f"progress.{self.rank}.json", {"phase": phase, "epoch": epoch, "batch": batch, "t": now})

    def since_start(self) -> float:
        """Seconds since the probe started."""
        return time.monotonic() - self.t0

    def milestone(self, name: str) -> None:
        self.state.milestones.append(name)
        self.state.times.setdefault(name, round(self.since_start(), 2))
        self._hvd_state()
        self.save()

    def _hvd_state(self) -> None:
        mod = sys.modules.get("horovod.tensorflow")
        if mod is None:
            return
        try:
            if mod.is_initialized():
                self.state.hvd = HorovodState(True, mod.rank(), mod.size(), self.sim_local_rank(mod))
            else:
                self.state.hvd = HorovodState(False)
        except Exception as e:  # noqa: BLE001
            self.state.hvd = HorovodState(False, error=str(e))

    def sim_local_rank(self, mod: Any) -> int:
        """The mirrored local rank the script is shown: local_size - 1 - real local rank."""
        real = self.real_local_rank or mod.local_rank
        return mod.local_size() - 1 - real()

    def watch_fit(self, bound: float, stem: str, milestone_name: str = "fit_start") -> None:
        """Stop this process when it has not reached ``milestone_name`` ``bound`` seconds after the probe started.

        The stacks of every thread go to ``STEM.bound.txt`` first (where the rank was, at its line), the bound
        and the time it took are kept in the record, and the process exits with :data:`FIT_BOUND_EXIT`: the
        launcher then stops the other ranks, so a check learns in seconds what a budget would tell in minutes.
        The watch runs in a thread of its own, so that the dump's main thread is still the one running the script.
        """
        import threading

        from labkit.core import stacks

        def watch() -> None:
            left = bound - self.since_start()
            if left > 0:
                time.sleep(left)
            if milestone_name in self.state.milestones or "end" in self.state.milestones:
                return
            stacks.dump(stem)
            self.state.fit_bound = FitBound(round(bound, 1), round(self.since_start(), 1),
                                            self.state.times.get("patched"))
            self.save()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(FIT_BOUND_EXIT)

        threading.Thread(target=watch, name="labkit-fit-bound", daemon=True).start()
