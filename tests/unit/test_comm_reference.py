"""The communication lab's reference file: parts measured again while the others are kept, and read back as the
objects the lab draws (measurements faked: the real ones need virtual nodes)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from labkit.measure import comm_reference, compression, link_sweep
from labkit.records.runrecord import RunRecord
from labkit.records.sweep import Point, Sweep


def _sweep(*a: Any, **k: Any) -> link_sweep.LinkSweep:
    return link_sweep.LinkSweep("sol.py", 2, 600.0, 32, 1_000_000, [
        link_sweep.LinkPoint("unlimited", 1150.0, 0.0, 1200.0, 1200.0, "r1"),
        link_sweep.LinkPoint("100mbit", 420.0, 0.08, 492.3, 800.0, "r2")])


def _compare(*a: Any, **k: Any) -> compression.Comparison:
    return compression.Comparison("sol.py", 2, ["--epochs", "2"], [
        compression.Variant("float32 (none)", [0.70, 0.78], 1100.0, {"compression": "none"}, "r3"),
        compression.Variant("float16 (fp16)", [0.71, 0.77], 1050.0, {"compression": "fp16"}, "r4")])


def test_some_parts_again_and_the_others_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / comm_reference.FILE).write_text(json.dumps({"elastic": {"epochs": [], "ok": True, "summary": "s"}}))
    seen = []
    monkeypatch.setattr(link_sweep, "sweep", lambda script, rates, args: seen.append((script, rates, args)) or _sweep())
    monkeypatch.setattr(compression, "compare", lambda script, args: seen.append((script, args)) or _compare())
    path = comm_reference.make(tmp_path, parts=("links", "compression"), epochs=2, compression_epochs=6)
    data = json.loads(path.read_text())
    assert data["elastic"]["summary"] == "s" and set(data["parts_made"]) == {"links", "compression"}
    assert seen[0][0].endswith("fashion_mnist_solution.py") and seen[0][2] == ["--mode", "small", "--epochs", "2"]
    assert seen[1][1] == ["--mode", "small", "--epochs", "6"]
    assert "--only links,compression" in data["made"]["command"]
    assert data["links"]["script"] == data["compression"]["script"] == "fashion_mnist_solution.py"  # no path
    back = comm_reference.links_result(data)
    assert asdict(back) == {**asdict(_sweep()), "script": "fashion_mnist_solution.py"} and "100mbit" in str(back)
    again = comm_reference.compression_result(data)
    assert again.curves() == {"float32 (none)": [0.70, 0.78], "float16 (fp16)": [0.71, 0.77]}


def test_unknown_parts_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert comm_reference.main(["--only", "links,speed"]) == 2
    assert "--only takes some of link, knobs, elastic, links, compression" in capsys.readouterr().err


def test_compression_trains_float32_twice_and_float16_once(monkeypatch: pytest.MonkeyPatch) -> None:
    specs = []

    def fake_bench(script: str, plan: Any, job: Any) -> Sweep:
        optimizer = plan.optimizer
        specs.append(optimizer)
        knob = optimizer.split("=")[1]
        return Sweep(script, [Point(2, 1, images_per_sec=1000.0)], {},
                     records=[RunRecord(run_id="r", val_accuracy=[0.7, 0.8], optimizer_knobs={"compression": knob})])

    monkeypatch.setattr(compression.bench, "bench", fake_bench)
    out = compression.compare("sol.py", ["--epochs", "2"], say=lambda _: None)
    assert specs == ["compression=none", "compression=fp16", "compression=none"]
    assert [v.label for v in out.variants] == ["float32 (none)", "float16 (fp16)", "float32 again"]
    assert "(the optimizer did not take the knob" not in str(out)


def test_the_reference_results_name_no_folder_of_the_machine_that_made_them() -> None:
    assert comm_reference.without_folders("job finished OK in 54.4 s (2 workers); logs in /x/runs/logs/1") == \
        "job finished OK in 54.4 s (2 workers)"
    data = comm_reference.load()  # the committed file, as lab 8 reads it
    assert "logs in" not in data["elastic"]["summary"] and data["link"]["log_dir"] == ""
    assert "logs in" not in comm_reference.elastic_report({"elastic": {"epochs": [], "ok": True,
                                                                       "summary": "ok; logs in /a/b"}}).summary
