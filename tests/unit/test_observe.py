"""Scripts without labkit code are observed from outside: the run probe of the starter, fit, argparse, --shrink."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from labkit.instrument import keras_reads, observe, observer, shrink
from labkit.instrument.start import command as probe_command
from labkit.records import jobrecord, observation, runs, typed
from labkit.records.observation import Observation
from labkit.records.runrecord import CopyStats

SCRIPT = textwrap.dedent('''
    import argparse, time
    import numpy as np
    import tensorflow as tf

    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--target-accuracy", type=float, default=None)
    args = p.parse_args()
    if args.target_accuracy is None:  # filled in after parsing, as the lab scripts do by mode
        args.target_accuracy = 0.0
    (x, y), (xt, yt) = tf.keras.datasets.fashion_mnist.load_data()
    print("sizes", len(x), len(xt), flush=True)
    x = x[:64, :, :, None] / 255.0
    y = y[:64]
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size).repeat()

    class SlowValidation(tf.keras.callbacks.Callback):
        def on_test_end(self, logs=None):
            time.sleep(0.3)

    model = tf.keras.Sequential([tf.keras.layers.Input((28, 28, 1)), tf.keras.layers.Conv2D(160, 3),
                                 tf.keras.layers.GlobalAveragePooling2D(), tf.keras.layers.Dense(10)])
    print("filters", model.layers[0].filters, flush=True)
    model.compile("sgd", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    model.fit(ds, steps_per_epoch=8, epochs=3, validation_data=(x, y), callbacks=[SlowValidation()], verbose=0)
''')


def _run(tmp_path: Path, env: dict[str, str], script: str = SCRIPT,
         observed: Path | None = None) -> subprocess.CompletedProcess:
    """``python train.py`` as a launcher starts it: under the run probe when ``observed`` is given."""
    path = tmp_path / "train.py"
    path.write_text(script)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LABKIT_") and k != "TF_CONFIG"}
    argv = [sys.executable, str(path)]
    return subprocess.run(probe_command("run", str(observed), argv) if observed else argv, env={**clean, **env},
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, Path, float]:
    tmp = tmp_path_factory.mktemp("observed")
    start = time.time()
    out = _run(tmp, {observe.SHRINK_VAR: "1000,100,10"}, observed=tmp / "obs")
    assert out.returncode == 0, out.stderr[-3000:]
    return out, tmp / "obs", start


@pytest.mark.slow  # several seconds: out of make test-fast
def test_a_plain_script_is_observed_by_the_run_probe(observed) -> None:
    out, folder, start = observed
    (obs,) = observation.read(folder)
    assert obs.config == {"batch_size": 8, "target_accuracy": 0.0}  # its own argparse, seen from outside
    assert obs.fits[0].batch_per_step == 8 and obs.world is not None and obs.world.is_chief
    assert len(obs.epochs) == 3 and obs.ended and obs.train_end and obs.ended >= obs.train_end
    rec = jobrecord.measured([obs], t0=start)
    assert rec.batch_per_worker == 8 and rec.target_accuracy == 0.0
    assert rec.gradient_bytes == 4 * ((16 * 9 + 16) + (16 * 10 + 10))  # float32 weights, 160 filters shrunk to 16
    assert rec.epochs_to_target == 1 and rec.time_to_target_s == rec.epochs[0].elapsed_s
    for e in rec.epochs:
        assert e.steps == 8 and e.images == 64
        # Validation (made 0.3 s slower) is in the epoch's wall time but not in the training time.
        assert e.wall_s is not None and e.train_s is not None and e.wall_s - e.train_s >= 0.3
        assert e.images_per_sec == pytest.approx(64 / e.train_s, rel=0.01)
        assert e.val_accuracy is not None and e.cpu_cores is not None and 0 < e.cpu_cores < 8
    assert rec.versions["tensorflow"] and rec.device is not None and rec.device["kind"] in ("cpu", "gpu")


@pytest.mark.slow  # several seconds: out of make test-fast
def test_shrink_narrows_convolutions_and_data_from_outside(observed) -> None:
    out, _, _ = observed
    assert "sizes 1000 100" in out.stdout and "filters 16" in out.stdout
    assert shrink.shrink_filters(160, 10) == 16 and shrink.shrink_filters(640, 10) == 64
    assert shrink.shrink_filters(16, 10) == 16 and shrink.shrink_filters(8, 10) == 8


@pytest.mark.slow  # several seconds: out of make test-fast
def test_without_a_launcher_nothing_is_patched_or_written(tmp_path: Path) -> None:
    out = _run(tmp_path, {observe.SHRINK_VAR: "1000,100,10"})  # a setting alone starts no observer
    assert out.returncode == 0, out.stderr[-3000:]
    assert "sizes 60000 10000" in out.stdout and "filters 160" in out.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


FAILING = textwrap.dedent('''
    import argparse, sys
    p = argparse.ArgumentParser()
    p.add_argument("--how", default="raise")
    args = p.parse_args()
    print("ran", flush=True)
    if args.how == "raise":
        raise ValueError("the script's own error")
    sys.exit(args.how if not args.how.isdigit() else int(args.how))
''')


@pytest.mark.parametrize(("how", "code", "shown"), [("raise", 1, "ValueError: the script's own error"),
                                                     ("3", 3, ""), ("stopped here", 1, "stopped here")])
def test_the_run_probe_keeps_the_scripts_exit_and_its_error(tmp_path: Path, how: str, code: int, shown: str) -> None:
    path = tmp_path / "fail.py"
    path.write_text(FAILING)
    argv = probe_command("run", str(tmp_path / "obs"), [sys.executable, str(path), "--how", how])
    out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == code and "ran" in out.stdout and shown in out.stderr
    if how == "raise":  # as Python shows an uncaught exception: the script's frames, not the starter's
        plain = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert out.stderr.endswith(plain.stderr) and out.stderr.count("Traceback") == 1
        assert "labkit" not in out.stderr and "runpy" not in out.stderr
    (obs,) = observation.read(tmp_path / "obs")
    assert obs.config == {"how": how} and obs.ended and not obs.fits


def test_when_imported_runs_before_anyone_imports_from_the_module(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "lk_target_mod.py").write_text("VALUE = 1\n")
    (tmp_path / "lk_user_mod.py").write_text("from lk_target_mod import VALUE\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # this test's finder leaves with it
    own = observer.Observer()
    own.when_imported("lk_target_mod", lambda m: setattr(m, "VALUE", 2))
    import lk_user_mod  # noqa: F401

    assert sys.modules["lk_user_mod"].VALUE == 2
    seen = []
    own.when_imported("lk_target_mod", lambda m: seen.append(m.VALUE))  # already loaded: at once
    assert seen == [2]
    own.when_imported("lk_target_mod", lambda m: 1 / 0, noted=True)  # a noted hook's error goes to the record
    assert own.run.record.observer_errors == ["lk_target_mod: ZeroDivisionError: division by zero"]


def test_batch_of_every_kind_of_input() -> None:
    import numpy as np
    import tensorflow as tf

    x = np.zeros((10, 3), np.float32)
    ds = tf.data.Dataset.from_tensor_slices((x, x))
    assert keras_reads.batch_of(ds.batch(4, drop_remainder=True)) == (4, "dataset")
    assert keras_reads.batch_of(ds.batch(4)) == (4, "dataset element")  # batch dimension not static

    class Iterator:  # keras Sequence / ImageDataGenerator.flow
        batch_size = 16

    assert keras_reads.batch_of(Iterator()) == (16, "iterator")
    assert keras_reads.batch_of(x, 5) == (5, "arrays") and keras_reads.batch_of(x) == (32, "arrays")
    assert keras_reads.batch_of(object()) == (None, "unknown")


# ----------------------------------------------------------------------------- records from observations


def _obs(world: dict, batch: int = 16, epochs: int = 3, started: float = 100.0, acc: tuple = (0.5, 0.7, 0.9),
         **kw: object) -> Observation:
    return typed.parse(Observation, _obs_json(world, batch, epochs, started, acc, **kw))


def _obs_json(world: dict, batch: int = 16, epochs: int = 3, started: float = 100.0, acc: tuple = (0.5, 0.7, 0.9),
              **kw: object) -> dict:
    """An observation as the observer writes it."""
    return {"started": started, "train_begin": started + 2, "world": world, "config": {"epochs": epochs},
            "fits": [{"batch_per_step": batch, "batch_from": "dataset"}],
            "epochs": [{"epoch": i + 1, "end": started + 2 + 10 * (i + 1), "wall_s": 10.0, "train_s": 8.0,
                        "steps": 10, "batch_per_step": batch, "cpu_s": 8.0, "val_accuracy": acc[i]}
                       for i in range(epochs)], **kw}


HVD = {"rank": 0, "workers": 2, "is_chief": True, "strategy": "horovod"}


def test_horovod_ranks_each_train_their_own_batch() -> None:
    rec = jobrecord.measured([_obs(HVD), _obs({**HVD, "rank": 1, "is_chief": False})], target=0.7, t0=100.0)
    assert rec.batch_per_worker == 16 and rec.global_batch == 32
    assert rec.epochs[0].images == 320 and rec.images_per_sec == 40.0
    assert rec.time_to_target_s == 22.0 and rec.epochs_to_target == 2  # from the job's start


def test_tf_distribute_fit_gets_the_global_batch() -> None:
    world = {"rank": 0, "workers": 2, "is_chief": True, "strategy": "MultiWorkerMirroredStrategy"}
    rec = jobrecord.measured([_obs(world, batch=64)])
    assert rec.global_batch == 64 and rec.batch_per_worker == 32 and rec.epochs[0].images == 640


def test_the_chief_that_trained_is_used_and_a_restart_is_merged() -> None:
    launcher = typed.parse(Observation, {"started": 99.0, "world": {"rank": 0, "workers": 1, "is_chief": True}})
    first = _obs(HVD, epochs=2, acc=(0.1, 0.2))
    again = _obs(HVD, epochs=3, started=200.0, acc=(0.1, 0.3, 0.4))
    again.epochs = again.epochs[1:]  # resumed at epoch 2
    rec = jobrecord.measured([launcher, first, again])
    assert [e.epoch for e in rec.epochs] == [1, 2, 3] and rec.val_accuracy == [0.1, 0.3, 0.4]


def test_target_comes_from_the_scripts_arguments_unless_given() -> None:
    obs = _obs(HVD)
    obs.config = {**(obs.config or {}), "target_accuracy": 0.85}
    assert jobrecord.measured([obs]).time_to_target_s == 30.0  # from its training start: no job start given
    assert jobrecord.measured([obs], target=0.4).epochs_to_target == 1


def test_finish_records_a_job_that_never_called_fit(tmp_path: Path) -> None:
    (tmp_path / "obs").mkdir()
    (tmp_path / "obs" / "observed.1.json").write_text(json.dumps(
        {"started": 5.0, "world": {"rank": 0, "workers": 1, "is_chief": True}, "fits": [], "epochs": []}))
    end = jobrecord.JobEnd("r1", ["python", "loop.py"], "mpirun", 1, 1, start=4.0, duration=12.5, exit_status=0,
                           status="ok")
    rec = jobrecord.finish(end, tmp_path / "obs", tmp_path / "runs.jsonl")
    assert (rec.script, rec.status, rec.duration_s, rec.called_fit) == ("loop.py", "ok", 12.5, False)
    assert rec.images_per_sec is None and rec.epochs == []
    assert runs.read(tmp_path / "runs.jsonl") == [rec]  # as appended, read back
    live = runs.read_live(runs.live_file("r1", tmp_path / "runs.jsonl"))
    assert live is not None and live.status == "ok" and "updated" in live.extra


def test_a_diverged_run_keeps_its_epochs_and_accuracy(tmp_path: Path) -> None:
    # a learning rate too large for the batch: the loss is NaN, written as null; the run's epochs stay in its record
    (tmp_path / "obs").mkdir()
    epoch = {"epoch": 1, "end": 20.0, "wall_s": 10.0, "train_s": 9.0, "steps": 12, "batch_per_step": 256,
             "loss": None, "accuracy": 0.0965, "val_loss": None, "val_accuracy": 0.1084, "lr": 0.8}
    (tmp_path / "obs" / "observed.1.json").write_text(json.dumps(
        {"started": 5.0, "world": {"rank": 0, "workers": 2, "is_chief": True, "strategy": "horovod"},
         "fits": [{"start": 10.0, "batch_per_step": 256, "epochs": 1, "steps_per_epoch": 12}],
         "epochs": [epoch, {**epoch, "epoch": 2, "end": 30.0}]}))
    end = jobrecord.JobEnd("r2", ["python", "train.py"], "mpirun", 2, 1, start=4.0, duration=30.0, exit_status=0,
                           status="ok")
    rec = jobrecord.finish(end, tmp_path / "obs", tmp_path / "runs.jsonl")
    assert rec.epochs_run == 2 and rec.val_accuracy == [0.1084, 0.1084]
    assert rec.epochs[0].metrics["loss"] is None and rec.epochs[0].steps == 12


def test_independent_copies_add_up(tmp_path: Path) -> None:
    folder = tmp_path / "obs"
    folder.mkdir()
    single = {"rank": 0, "workers": 1, "is_chief": True, "strategy": "horovod"}
    for i in range(2):
        (folder / f"observed.{i}.json").write_text(json.dumps(_obs_json(single, started=100.0 + i)))
    end = jobrecord.JobEnd("c", ["python", "t.py"], "independent", 2, 1, start=100.0, duration=40.0, exit_status=0,
                           status="ok", copies=True)
    rec = jobrecord.finish(end, folder, tmp_path / "r.jsonl")
    assert rec.images_per_sec == 40.0 and rec.copies is not None and len(rec.copies) == 2 and rec.workers == 2
    assert rec.copies[0] == CopyStats(images_per_sec=20.0, cpu_cores=1.0, final_val_accuracy=0.9)
    assert rec.time_to_target_s is None  # copies do not train one model together
    assert runs.read(tmp_path / "r.jsonl") == [rec]


def test_the_observer_has_no_batch_hooks_where_parameter_servers_forbid_them() -> None:
    """Keras refuses batch-level callbacks under a ParameterServerStrategy (the lab 5 solution failed with them)."""
    from labkit.instrument import observe

    assert observe._observer(32)._implements_train_batch_hooks()
    ps = observe._observer(32, batch_hooks=False, steps=16)
    assert not ps._implements_train_batch_hooks() and not ps._implements_test_batch_hooks()


def test_a_recorded_script_ends_as_python_ends_it(tmp_path: Path) -> None:
    """Its threads are joined and its files closed: the run probe does not cut the interpreter's teardown short."""
    path = tmp_path / "late.py"
    path.write_text("import threading, time\nlog = open('log.txt', 'w')\nlog.write('buffered')\n"
                    "threading.Thread(target=lambda: (time.sleep(0.5), open('late.txt', 'w').write('done'))).start()\n")
    argv = probe_command("run", str(tmp_path / "obs"), [sys.executable, str(path)])
    out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "late.txt").read_text() == "done" and (tmp_path / "log.txt").read_text() == "buffered"
