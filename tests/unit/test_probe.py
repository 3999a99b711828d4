"""labkit.instrument.probe pieces that need no MPI: conv shrinking, data slices."""

from __future__ import annotations

import pytest

from labkit.instrument import probe_patches as probe


def test_shrink_is_consistent_and_narrow() -> None:
    assert probe.shrink(16) == 16
    assert probe.shrink(160) == 20 and probe.shrink(640) == 80
    assert probe.shrink(32) == 8  # never below 8 channels


def test_every_input_fit_accepts_is_sampled() -> None:
    """Arrays, a dataset, a distributed dataset, a DatasetCreator and a generator: each is sampled as fit
    would distribute it, and a generator (readable once) still gives fit every batch."""
    import os

    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import numpy as np
    import tensorflow as tf

    from labkit.instrument import dprobe_record as dprobe

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((28, 28, 1)), tf.keras.layers.Flatten(),
                                     tf.keras.layers.Dense(10)])
        model.compile(loss="mse", optimizer="sgd")
    x = np.zeros((64, 28, 28, 1), np.float32) + np.arange(64, dtype=np.float32)[:, None, None, None]
    y = np.zeros((64, 10), np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    creator = tf.keras.utils.experimental.DatasetCreator(lambda ctx: tf.data.Dataset.from_tensor_slices(
        (x, y)).batch(ctx.get_per_replica_batch_size(8)).repeat())
    inputs = {"arrays": (x, {"y": y, "batch_size": 8}), "dataset": (ds, {}),
              "distributed": (strategy.experimental_distribute_dataset(ds), {}),
              "creator": (creator, {"steps_per_epoch": 4}),
              "generator": ((b for b in [(x[i:i + 8], y[i:i + 8]) for i in range(0, 64, 8)]), {})}
    for name, (given, kw) in inputs.items():
        out, back = dprobe.sample_batches(model, given, kw)
        assert out.per_replica_batch and {n for row in out.per_replica_batch for n in row} == {8}, name
        if name == "generator":
            assert [float(b[0][0, 0, 0, 0]) for b in back] == [float(i) for i in range(0, 64, 8)]
        else:
            assert back is given, name
    assert dprobe.sample_batches(model, ds, {})[0].ids[0] == [[float(i) for i in range(8)]]  # which examples


def test_a_rank_that_never_reaches_fit_is_stopped_at_its_bound_with_its_stack(tmp_path) -> None:
    """``watch_fit`` dumps where the script is, keeps the bound in the record and ends the process."""
    import json
    import subprocess
    import sys
    import time

    from labkit.check import ending
    from labkit.instrument import probe_record
    from labkit.records import evidence, hvd_evidence

    code = (f"import time\nfrom labkit.instrument import probe_record as p\nr = p.Rank({str(tmp_path)!r})\n"
            "r.milestone('patched')\n"
            f"r.watch_fit(1.5, {str(tmp_path / 'stack.0')!r})\n"
            "def stuck():\n    time.sleep(60)\nstuck()\n")
    script = tmp_path / "stuck.py"
    script.write_text(code)
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], timeout=30)
    assert done.returncode == probe_record.FIT_BOUND_EXIT and time.monotonic() - started < 15
    state = json.loads((tmp_path / "probe.0.json").read_text())
    assert state["fit_bound"]["bound_s"] == 1.5 and state["fit_bound"]["after_s"] >= 1.5
    stopped = ending.still_running(tmp_path, 0, "stuck.py", 2.0)
    at = stopped.where.at if stopped else None
    assert at and at.function == "stuck" and "time.sleep(60)" in (at.code or "")
    state["fit_rule"] = {"factor": 4, "floor_s": 10}
    state["fit_bound"]["patched_s"] = 2.0
    record = evidence.from_json(hvd_evidence.HorovodEvidence)({"np": 2, "states": {"0": state}}).state(0)
    assert "a correct script calls model.fit within 2 s here: 4 times the 2.0 s" in ending.bound_text(
        record.fit_bound, record.fit_rule)


def test_options_a_script_lacks_are_tolerated_only_on_its_command_line(monkeypatch) -> None:
    """The check's optional arguments reach a script that has them and are dropped, and recorded, for one that
    has not; ``parse_args`` must still go through ``parse_known_args`` (or this test fails)."""
    import argparse
    import sys

    from labkit.instrument import observer, probe_patches
    from labkit.instrument.probe_record import Rank

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", argparse.ArgumentParser.parse_known_args)
    monkeypatch.setattr(probe_patches, "OBSERVER", observer.Observer())  # this test's listener only, undone after it
    monkeypatch.setattr(sys, "argv", ["train.py", "--epochs", "3", "--checkpoint-dir", "ck"])
    rank = Rank(".")
    probe.patch_arguments(rank, ["--checkpoint-dir"])
    lacks = argparse.ArgumentParser()
    lacks.add_argument("--epochs", type=int)
    assert vars(lacks.parse_args()) == {"epochs": 3} and rank.state.ignored_args == ["--checkpoint-dir"]
    has = argparse.ArgumentParser()
    has.add_argument("--epochs", type=int)
    has.add_argument("--checkpoint-dir")
    assert vars(has.parse_args()) == {"epochs": 3, "checkpoint_dir": "ck"}
    with pytest.raises(SystemExit):
        lacks.parse_args(["--other", "1"])  # its own list, not the command line: refused as usual


def test_a_probed_rank_leaves_with_its_code_after_its_exit_functions() -> None:
    """leave() runs what atexit holds (Horovod's shutdown, the script's own) and skips only the teardown; it needs
    CPython's atexit._run_exitfuncs and falls back to a normal exit without it."""
    import atexit
    import subprocess
    import sys

    assert callable(getattr(atexit, "_run_exitfuncs", None))
    code = ("import atexit\nfrom labkit.instrument.leave import leave\n"
            "atexit.register(lambda: print('exit function ran', flush=True))\nprint('script', end='')\nleave(3)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3 and done.stdout == "scriptexit function ran\n", (done.returncode, done.stdout)
