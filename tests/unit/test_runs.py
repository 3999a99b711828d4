"""Run records: atomic append, typed and tolerant reading, who is the chief; the fields of a launched job's record."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path

import pytest

from labkit.core import identity
from labkit.course import labs
from labkit.records import jsonlines, runrecord, runs, typed
from labkit.records.runrecord import EpochStats, RunRecord

REQUIRED = {
    "run_id", "script", "lab", "step", "launcher", "strategy", "workers", "threads_per_worker", "device",
    "batch_per_worker", "global_batch", "widen_factor", "train_size", "test_size", "epochs", "images_per_sec",
    "val_accuracy", "time_to_target_s", "exit_status", "status", "start_time", "host", "versions",
}


def _writer(path: str, worker: int, count: int, size: int) -> None:
    for i in range(count):
        runs.append(RunRecord(run_id=f"{worker}-{i}", extra={"worker": worker, "i": i, "pad": "x" * size}), path)


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
    assert sorted((r.extra["worker"], r.extra["i"]) for r in records) == [(w, i) for w in range(4) for i in range(25)]


def test_append_is_one_write_of_a_whole_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    writes: list[bytes] = []
    real = os.write

    def spy(fd: int, data: bytes) -> int:
        writes.append(bytes(data))
        return real(fd, data)

    monkeypatch.setattr(os, "write", spy)
    jsonlines.append_line({"a": 1, "b": [1.5, float("nan")]}, tmp_path / "r.jsonl")
    assert len(writes) == 1 and writes[0].endswith(b"\n") and writes[0].count(b"\n") == 1
    assert json.loads(writes[0]) == {"a": 1, "b": [1.5, None]}  # NaN is not valid JSON: stored as null
    writes.clear()
    runs.append(RunRecord(run_id="r", images_per_sec=float("nan")), tmp_path / "r.jsonl")
    assert len(writes) == 1 and json.loads(writes[0])["images_per_sec"] is None


def test_corrupt_and_partial_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    runs.append(RunRecord(run_id="a"), path)
    with open(path, "ab") as f:
        f.write(b'{"run_id": "half-writ\n')  # a torn line
        f.write(b"\xff\xfe garbage\n")
        f.write(b"[1, 2]\n")  # valid JSON but not a record
        f.write(b"\n")
    runs.append(RunRecord(run_id="b"), path)
    with pytest.warns(UserWarning, match=f"{path}: skipped 3"):
        records = runs.read(path)
    assert [r.run_id for r in records] == ["a", "b"]
    assert records.skipped == 3


REFERENCE = labs.ROOT / "labs" / "reference" / "runs.jsonl"  # real records of every kind the course makes


def test_every_reference_record_parses_with_no_line_skipped() -> None:
    records = runs.read(REFERENCE)
    lines = [line for line in REFERENCE.read_text().splitlines() if line.strip()]
    assert records.skipped == 0 and len(records) == len(lines) >= 10
    assert all(isinstance(e, EpochStats) for r in records for e in r.epochs)
    assert {"bench", "tasks", "reference", "label", "slowed"} <= {k for r in records for k in r.extra}
    assert any(r.copies for r in records) and all(r.ranks for r in records)


def test_a_reference_record_keeps_every_key_and_value_on_a_round_trip() -> None:
    for n, line in enumerate(REFERENCE.read_text().splitlines(), 1):
        data = json.loads(line)
        again = typed.dump(runrecord.parse(data, f"line {n}"))
        assert {k: again[k] for k in data} == data, n  # every key, the same value (epochs' metrics too)
        assert set(again) - set(data) <= {"log_dir"}, n  # the reference leaves out the machine's log folder
        assert REQUIRED <= set(again)
        assert json.dumps(typed.dump(runrecord.parse(again))) == json.dumps(again)  # and again, to the byte


def test_a_line_that_does_not_fit_the_type_is_skipped_and_counted_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    good = typed.dump(RunRecord(run_id="good", workers=2, epochs=[EpochStats(epoch=1, steps=10)]))
    wrong_epoch = {**good, "run_id": "x", "epochs": [{"epoch": 1, "steps": "ten"}]}
    lines = [good, {**good, "run_id": "w", "workers": "two"}, wrong_epoch, {"workers": 2}, good]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.warns(UserWarning) as seen:
        records = runs.read(path)
    assert [r.run_id for r in records] == ["good", "good"] and records.skipped == 3
    (warning,) = seen
    assert str(path) in str(warning.message) and "skipped 3" in str(warning.message)
    assert "line 2: record.workers: expected int, got 'two'" in str(warning.message)  # the first, by its field
    with pytest.raises(typed.RecordError, match=r"epochs\[0\]\.steps: expected int, got 'ten'"):
        runrecord.parse(wrong_epoch)
    with pytest.raises(typed.RecordError, match="the field 'run_id' is missing"):
        runrecord.parse({"workers": 2})


def test_select_matches_fields_and_extra_keys() -> None:
    recs = [RunRecord(run_id="a", workers=1, extra={"label": "one"}), RunRecord(run_id="b", workers=2)]
    assert runs.select(recs, workers=2) == [recs[1]]
    assert runs.select(recs, label="one", workers=1) == [recs[0]]
    assert runs.select(recs, label="two") == [] and runs.select(recs) == recs


def test_the_live_file_is_the_record_read_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from labkit.records import boundedjson

    live = runs.write_live(RunRecord(run_id="r1", status="running", epochs=[EpochStats(epoch=1)]), tmp_path / "r.jsonl")
    assert live == runs.live_file("r1", tmp_path / "r.jsonl")
    got = runs.read_live(live)
    assert got is not None and got.status == "running" and got.epochs[0].epoch == 1 and "updated" in got.extra
    monkeypatch.setattr(boundedjson, "FILE_LIMIT", 64)
    assert runs.read_live(live) is None  # larger than a live file can be: not read
    monkeypatch.undo()
    live.write_text('{"run_id": "r1", "epochs": "many"}')
    assert runs.read_live(live) is None and runs.read_live(tmp_path / "none.json") is None


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
