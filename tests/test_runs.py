"""Run records: atomic append, tolerant reading, rank-0-only writing, the fields, and what is timed."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from pathlib import Path

import pytest

from labkit import runs

REQUIRED = {
    "run_id", "script", "lab", "step", "launcher", "strategy", "workers", "threads_per_worker", "device",
    "batch_per_worker", "global_batch", "widen_factor", "train_size", "test_size", "epochs", "images_per_sec",
    "val_accuracy", "time_to_target_s", "exit_status", "status", "start_time", "host", "versions",
}


def _writer(path: str, worker: int, count: int, size: int) -> None:
    for i in range(count):
        runs.append({"worker": worker, "i": i, "pad": "x" * size}, path)


def test_concurrent_appends_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    # Lines far bigger than a pipe buffer/page, from 4 processes at once.
    procs = [mp.get_context("fork").Process(target=_writer, args=(str(path), w, 25, 200_000)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    records = runs.read(path)
    assert records.skipped == 0
    assert len(records) == 100
    assert sorted((r["worker"], r["i"]) for r in records) == [(w, i) for w in range(4) for i in range(25)]


def test_append_is_one_write_of_a_whole_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    writes: list[bytes] = []
    real = os.write

    def spy(fd: int, data: bytes) -> int:
        writes.append(bytes(data))
        return real(fd, data)

    monkeypatch.setattr(os, "write", spy)
    runs.append({"a": 1, "b": [1.5, float("nan")]}, tmp_path / "r.jsonl")
    assert len(writes) == 1 and writes[0].endswith(b"\n") and writes[0].count(b"\n") == 1
    assert json.loads(writes[0]) == {"a": 1, "b": [1.5, None]}  # NaN is not valid JSON: stored as null


def test_corrupt_and_partial_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    runs.append({"run_id": "a"}, path)
    with open(path, "ab") as f:
        f.write(b'{"run_id": "half-writ\n')  # a torn line
        f.write(b"\xff\xfe garbage\n")
        f.write(b"[1, 2]\n")  # valid JSON but not a record
        f.write(b"\n")
    runs.append({"run_id": "b"}, path)
    with pytest.warns(UserWarning, match="skipped 3"):
        records = runs.read(path)
    assert [r["run_id"] for r in records] == ["a", "b"]
    assert records.skipped == 3


def test_missing_file_reads_empty(tmp_path: Path) -> None:
    assert runs.read(tmp_path / "none.jsonl") == []


def test_path_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(runs.FILE_VAR, raising=False)
    assert runs.runs_file() == Path("runs/runs.jsonl")
    monkeypatch.setenv(runs.FILE_VAR, str(tmp_path / "env.jsonl"))
    assert runs.runs_file() == tmp_path / "env.jsonl"
    assert runs.runs_file(tmp_path / "arg.jsonl") == tmp_path / "arg.jsonl"
    assert runs.live_file("abc", tmp_path / "arg.jsonl") == tmp_path / "live" / "abc.json"


def test_lab_and_step_from_script_names() -> None:
    assert runs.lab_and_step("solutions/fashion_mnist_after_step_03.py") == ("horovod", "3")
    assert runs.lab_and_step("fashion_mnist_solution.py") == ("horovod", "solution")
    assert runs.lab_and_step("fashion_mnist_multiworker.py") == ("multiworker", None)
    assert runs.lab_and_step("fashion_mnist_ps_solution.py")[0] == "parameter-server"


def test_world_from_env_and_tf_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TF_CONFIG", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "LABKIT_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LABKIT_NP", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    w = runs.world()
    assert (w["rank"], w["workers"], w["is_chief"]) == (2, 4, False)
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK")
    cluster = {"worker": ["h:1", "h:2", "h:3"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    w = runs.world()
    assert w["is_chief"] and w["workers"] == 3
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}))
    assert not runs.world()["is_chief"]
    with_chief = {"chief": ["h:0"], **cluster}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": with_chief, "task": {"type": "worker", "index": 0}}))
    assert not runs.world()["is_chief"]
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": with_chief, "task": {"type": "chief", "index": 0}}))
    assert runs.world()["is_chief"]


def test_failed_job_gets_a_record_unless_the_script_wrote_one(tmp_path: Path) -> None:
    from labkit.launch import JobResult

    path = tmp_path / "runs.jsonl"
    errors = {0: "Traceback...\nValueError: x"}
    failed = JobResult(1, ["mpirun"], tmp_path, 2, 3.0, rank_exit={0: 1}, rank_errors=errors)
    rec = runs.record_failed_job(failed, "r1", ["python", "train.py"], path, launcher="mpirun")
    assert rec is not None and rec["status"] == "failed" and rec["exit_status"] == 1 and rec["workers"] == 2
    assert rec["script"] == "train.py" and "ValueError" in rec["error"]
    # Already recorded (by the script or before): nothing more.
    assert runs.record_failed_job(failed, "r1", ["python", "train.py"], path) is None
    ok = JobResult(0, ["mpirun"], tmp_path, 2, 3.0)
    assert runs.record_failed_job(ok, "r2", [], path) is None
    timed_out = JobResult(124, ["mpirun"], tmp_path, 1, 9.0, timed_out=True)
    assert runs.record_failed_job(timed_out, "r3", [], path)["status"] == "timeout"
    assert [r["run_id"] for r in runs.read(path)] == ["r1", "r3"]


# ----------------------------------------------------------------------------- the Keras callback


@pytest.fixture(scope="module")
def keras():
    import tensorflow as tf  # labkit, imported above, made tf.keras Keras 2

    return tf


def _fit(tf, recorder, epochs=3, extra=(), validate=True):  # noqa: ANN001, ANN202
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.random((64, 4), dtype=np.float32)
    y = tf.one_hot(rng.integers(0, 2, 64), 2)
    model = tf.keras.Sequential([tf.keras.layers.Input((4,)), tf.keras.layers.Dense(2, activation="softmax")])
    model.compile("sgd", "categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, batch_size=8, epochs=epochs, validation_data=(x, y) if validate else None,
              callbacks=[recorder, *extra], verbose=0)


class _SlowValidation:
    """Keras callback (built lazily) that makes validation take ``seconds`` longer."""

    def __new__(cls, tf, seconds: float):  # noqa: ANN001, ANN204
        class Slow(tf.keras.callbacks.Callback):
            def on_test_end(self, logs=None):  # noqa: ANN001, ANN202
                time.sleep(seconds)

        return Slow()


def _clean_world(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TF_CONFIG", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "LABKIT_RANK",
                "LABKIT_NP", "LABKIT_LAUNCHER", "LABKIT_RUN_ID", runs.FILE_VAR):
        monkeypatch.delenv(var, raising=False)


def test_recorder_writes_one_complete_record(keras, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _clean_world(monkeypatch)
    monkeypatch.setenv("LABKIT_RUN_ID", "rid-1")
    path = tmp_path / "runs.jsonl"
    config = {"batch_size": 8, "widen_factor": 1, "train_size": 64, "test_size": 64, "epochs": 3,
              "target_accuracy": 0.0}
    rec = runs.Recorder("solutions/fashion_mnist_after_step_05.py", config, path=path)
    _fit(keras, rec, extra=[_SlowValidation(keras, 0.3)])
    records = runs.read(path)
    assert len(records) == 1
    r = records[0]
    assert REQUIRED <= set(r), REQUIRED - set(r)
    assert (r["run_id"], r["lab"], r["step"], r["status"], r["exit_status"]) == ("rid-1", "horovod", "5", "ok", 0)
    assert r["workers"] == 1 and r["batch_per_worker"] == 8 and r["global_batch"] == 8
    assert r["device"]["kind"] == "cpu" and r["versions"]["tensorflow"]
    assert len(r["epochs"]) == 3 and len(r["val_accuracy"]) == 3
    assert r["time_to_target_s"] == r["epochs"][0]["elapsed_s"] and r["epochs_to_target"] == 1
    for e in r["epochs"]:
        assert e["images"] == 64 and e["steps"] == 8
        # Validation (made 0.3 s slower) is in the epoch's wall time but not in the training time.
        assert e["wall_s"] - e["train_s"] >= 0.3
        assert e["images_per_sec"] == pytest.approx(64 / e["train_s"], rel=0.01)
        assert 0 < e["cpu_cores"] < 8  # CPU seconds per training second of this process
    # Steady state: the first epoch (tracing) is left out.
    assert r["images_per_sec"] == pytest.approx(sorted(e["images_per_sec"] for e in r["epochs"][1:])[0], rel=0.6)
    live = json.loads(runs.live_file("rid-1", path).read_text())
    assert live["status"] == "ok" and len(live["epochs"]) == 3


def test_recorder_without_validation_times_whole_epoch(keras, tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    _clean_world(monkeypatch)
    path = tmp_path / "runs.jsonl"
    _fit(keras, runs.Recorder("train.py", {"batch_size": 8}, path=path), epochs=1, validate=False)
    (r,) = runs.read(path)
    assert r["epochs"][0]["train_s"] == r["epochs"][0]["wall_s"] and r["val_accuracy"] == [None]
    assert r["time_to_target_s"] is None


def test_only_rank_zero_writes(keras, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _clean_world(monkeypatch)
    monkeypatch.setenv("LABKIT_NP", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    path = tmp_path / "runs.jsonl"
    rec = runs.Recorder("train.py", {"batch_size": 8}, path=path)
    _fit(keras, rec, epochs=1)
    assert not path.exists()
    rec._at_exit()  # the failure path must not write on other ranks either
    assert not path.exists()
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "0")
    _fit(keras, runs.Recorder("train.py", {"batch_size": 8}, path=path), epochs=1)
    (r,) = runs.read(path)
    assert r["workers"] == 2 and r["global_batch"] == 16 and r["epochs"][0]["images"] == 8 * 8 * 2


def test_a_run_that_dies_is_recorded_as_failed(keras, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _clean_world(monkeypatch)
    path = tmp_path / "runs.jsonl"
    rec = runs.Recorder("train.py", {"batch_size": 8}, path=path)

    class Boom(keras.keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):  # noqa: ANN001, ANN202
            if epoch == 1:
                raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError):
        _fit(keras, rec, epochs=3, extra=[Boom()])
    assert not path.exists()  # on_train_end never came
    rec._at_exit()  # what atexit does when the script dies
    rec._at_exit()  # and only once
    (r,) = runs.read(path)
    assert r["status"] == "failed" and r["exit_status"] == 1 and len(r["epochs"]) == 2
