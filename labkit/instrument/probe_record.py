"""What a probed rank saw, written as it goes (:mod:`labkit.instrument.probe`).

``STATE`` is rewritten to ``OUT/probe.N.json`` at every milestone, so that a rank that hangs or is killed
still leaves its evidence; ``progress.N.json`` says where training is, at most once a second.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from labkit.core.identity import rank_from_env

TRAIN_PER_RANK = 192
TEST_PER_RANK = 64
FAKE_GPUS = 2

STATE: dict[str, Any] = {
    "rank_env": 0,  # set by start()
    "milestones": [],
    "hvd": {},
    "pins": {"visible": None, "memory_growth": [], "cuda_visible_devices": None},
    "fit": [],
    "evaluate": [],
    "saves": [],
    "epochs": [],
    "data": {"train": TRAIN_PER_RANK, "test": TEST_PER_RANK},
    "error": None,
    "times": {},  # seconds from the probe's start to each milestone
}
WEIGHTS: dict[str, Any] = {}
OUT = "."


def _write(name: str, value: Any) -> None:
    """Write ``OUT/name`` whole; never fails into the script (which may have deleted the folder)."""
    path = os.path.join(OUT, name)
    try:
        os.makedirs(OUT, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(value, f, default=str)
        os.replace(path + ".tmp", path)
    except OSError:
        pass


def save() -> None:
    """Rewrite ``probe.N.json`` with everything seen so far."""
    _write(f"probe.{STATE['rank_env']}.json", STATE)


_PROGRESS = {"t": 0.0}


def progress(phase: str, epoch: int, batch: int) -> None:
    """Where training is (at most one write a second): tells a loop that never ends from a hang."""
    now = time.time()
    if now - _PROGRESS["t"] >= 1.0:
        _PROGRESS["t"] = now
        _write(f"progress.{STATE['rank_env']}.json", {"phase": phase, "epoch": epoch, "batch": batch, "t": now})


_T0 = {"t": time.monotonic()}


def since_start() -> float:
    """Seconds since :func:`start` (the probe's start)."""
    return time.monotonic() - _T0["t"]


def milestone(name: str) -> None:
    STATE["milestones"].append(name)
    STATE["times"].setdefault(name, round(since_start(), 2))
    _hvd_state()
    save()


def _hvd_state() -> None:
    mod = sys.modules.get("horovod.tensorflow")
    if mod is None:
        return
    try:
        if mod.is_initialized():
            STATE["hvd"] = {"initialized": True, "rank": mod.rank(), "size": mod.size(),
                            "local_rank": sim_local_rank(mod)}
        else:
            STATE["hvd"] = {"initialized": False}
    except Exception as e:  # noqa: BLE001
        STATE["hvd"] = {"initialized": False, "error": str(e)}


def sim_local_rank(mod: Any) -> int:
    """The mirrored local rank the script is shown: local_size - 1 - real local rank."""
    return mod.local_size() - 1 - REAL["local_rank"]()


REAL: dict[str, Any] = {}


def start(out: str) -> None:
    """Write under ``out`` from now on, as this process's rank."""
    global OUT
    OUT = out
    _T0["t"] = time.monotonic()
    STATE["rank_env"] = rank_from_env()


FIT_BOUND_EXIT = 86  # the exit status of a rank stopped by its bound on reaching fit


def watch_fit(bound: float, stem: str, milestone_name: str = "fit_start") -> None:
    """Stop this process when it has not reached ``milestone_name`` ``bound`` seconds after the probe started.

    The stacks of every thread go to ``STEM.bound.txt`` first (where the rank was, at its line), the bound
    and the time it took are kept in the record, and the process exits with :data:`FIT_BOUND_EXIT`: the
    launcher then stops the other ranks, so a check learns in seconds what a budget would tell in minutes.
    The watch runs in a thread of its own, started from this module, so that the dump's main thread is
    still the one running the script.
    """
    import threading

    from labkit.core import stacks

    def watch() -> None:
        left = bound - since_start()
        if left > 0:
            time.sleep(left)
        if milestone_name in STATE["milestones"] or "end" in STATE["milestones"]:
            return
        stacks.dump(stem)
        STATE["fit_bound"] = {"bound_s": round(bound, 1), "after_s": round(since_start(), 1),
                              "patched_s": STATE["times"].get("patched")}
        save()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(FIT_BOUND_EXIT)

    threading.Thread(target=watch, name="labkit-fit-bound", daemon=True).start()

