"""The files a rank writes while the learner's script runs in it (probe records, weight snapshots, observations,
task records) are read bounded: a script that fills or corrupts them makes the record missing, never a checker
that runs out of memory or crashes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from labkit.check import hvd_runs, tfdist
from labkit.records import boundedjson, observation


def test_a_record_file_is_read_up_to_its_limit(tmp_path: Path) -> None:
    good = tmp_path / "probe.0.json"
    good.write_text(json.dumps({"milestones": ["start"]}))
    assert boundedjson.read_file(good) == {"milestones": ["start"]}
    big = tmp_path / "probe.1.json"
    big.write_text(json.dumps({"x": "a" * 2000}))
    with pytest.raises(ValueError, match="larger than 1000 bytes"):
        boundedjson.read_file(big, limit=1000)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match="nested too deep"):
        boundedjson.read_file(deep)
    for name, data in (("junk.json", b"{not json"), ("latin.json", b'{"a": "\xff"}')):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError):
            boundedjson.read_file(tmp_path / name)
    with pytest.raises(OSError):
        boundedjson.read_file(tmp_path / "missing.json")


def test_weight_snapshots_a_script_broke_are_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ok = tmp_path / "weights.0.npz"
    np.savez(ok, init=np.arange(10.0), final=np.ones(10))
    got = hvd_runs._weights(ok)
    assert got is not None and set(got) == {"init", "final"} and len(got["init"]) == hvd_runs.PROJECTION
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 not a zip")
    assert hvd_runs._weights(tmp_path / "junk.npz") is None
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, init=np.array([{"a": 1}], dtype=object))
    assert hvd_runs._weights(pickled) is None  # never unpickled
    assert hvd_runs._weights(tmp_path / "missing.npz") is None
    bomb = tmp_path / "bomb.npz"
    np.savez_compressed(bomb, init=np.zeros(100_000))  # about 800 KB of arrays in a small file
    monkeypatch.setattr(hvd_runs, "WEIGHTS_LIMIT", 100_000)
    assert bomb.stat().st_size < 100_000 and hvd_runs._weights(bomb) is None  # too large once decompressed
    monkeypatch.setattr(hvd_runs, "WEIGHTS_LIMIT", 100)
    assert hvd_runs._weights(ok) is None  # larger than the limit: not even opened


def test_task_records_and_observations_too_large_are_left_out(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(boundedjson, "FILE_LIMIT", 50)
    (tmp_path / "worker.0.json").write_text(json.dumps({"task": "worker", "pad": "x" * 100}))
    (tmp_path / "worker.1.json").write_text(json.dumps({"task": "worker"}))
    assert list(tfdist.records(tmp_path)) == ["worker.1"]
    (tmp_path / "observed.1.json").write_text(json.dumps({"pad": "x" * 100}))
    assert observation.read(tmp_path) == []


def test_a_hostile_events_file_is_read_bounded_and_never_crashes_the_checker(tmp_path: Path) -> None:
    events = tmp_path / "worker.0.events.jsonl"
    events.write_bytes(b'{"kind": "epoch_begin", "epoch": 0}\n' + b"[" * 100_000 + b"\n\xff\xfe{\n"
                       + b'{"kind": "epoch_end", "epoch": 1e999999}\n')
    unreadable: list[str] = []
    assert [e.kind for e in tfdist.events(tmp_path, "worker.0", unreadable)] == ["epoch_begin"]
    assert unreadable and "line 4" in unreadable[0]  # an epoch that is no number is named, with its line
    events.write_bytes(b" " * (boundedjson.FILE_LIMIT + 1))
    assert tfdist.events(tmp_path, "worker.0", unreadable) == [] and "larger than" in unreadable[-1]
