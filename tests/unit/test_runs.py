"""Run records: atomic append, tolerant reading, who is the chief; the fields of a launched job's record."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest

from labkit.core import identity
from labkit.records import runs

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
    assert runs.lab_and_step("fashion_mnist_communication_after_step_01.py") == ("communication", "1")


def test_world_from_env_and_tf_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TF_CONFIG", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "LABKIT_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LABKIT_NP", "4")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    w = identity.world()
    assert (w.rank, w.workers, w.is_chief) == (2, 4, False)
    monkeypatch.delenv("OMPI_COMM_WORLD_RANK")
    cluster = {"worker": ["h:1", "h:2", "h:3"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    w = identity.world()
    assert w.is_chief and w.workers == 3
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}))
    assert not identity.world().is_chief and identity.world().rank == 1  # ranks 0..N-1, as a launcher's
    with_chief = {"chief": ["h:0"], **cluster}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": with_chief, "task": {"type": "worker", "index": 0}}))
    assert not identity.world().is_chief and identity.world().rank == 1
    with_ps = {**with_chief, "ps": ["h:9"]}
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": with_ps, "task": {"type": "ps", "index": 0}}))
    assert identity.world().rank == 4  # after the chief and the three workers
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": with_chief, "task": {"type": "chief", "index": 0}}))
    assert identity.world().is_chief
