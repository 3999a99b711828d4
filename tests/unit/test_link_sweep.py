"""``labkit bench SCRIPT --rates ...``: the ring model's bounds, the sweep's steps (nodes and runs faked), the CLI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from labkit.cli import main as cli
from labkit.measure import link_sweep
from labkit.records.runrecord import RunRecord
from labkit.records.sweep import Point, Sweep


def test_rates_are_checked() -> None:
    assert link_sweep.parse_rates("unlimited, 1gbit,100mbit") == ["unlimited", "1gbit", "100mbit"]
    for bad in ("", "fast", "100mb"):
        with pytest.raises(ValueError):
            link_sweep.parse_rates(bad)


def test_the_model_bounds_the_throughput() -> None:
    # 32 images in 50 ms alone; a 1 MB gradient over a 100 Mbit/s ring of 2: 2 * 1/2 * 8e6 bits / 1e8 = 80 ms
    comm, serial, overlap = link_sweep.model("100mbit", 2, 640.0, 32, 1_000_000)
    assert comm == pytest.approx(0.080)
    assert serial == pytest.approx(64 / 0.130) and overlap == pytest.approx(64 / 0.080)
    comm, serial, overlap = link_sweep.model("unlimited", 2, 640.0, 32, 1_000_000)
    assert comm == 0 and serial == overlap == pytest.approx(1280.0)  # no link cost: twice one worker


class FakeNodes:
    made: list[Any] = []

    def __init__(self, count: int, slots: int, rate: str | None) -> None:
        self.rate, self.hostfile, self.up = rate, f"/nodes/{rate}/hostfile", False
        FakeNodes.made.append(self)

    def __enter__(self) -> FakeNodes:
        self.up = True
        return self

    def __exit__(self, *exc: object) -> None:
        self.up = False


def test_the_sweep_runs_alone_then_on_fresh_nodes_per_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict] = []

    def fake_bench(script: str, plan: Any, job: Any) -> Sweep:
        nps, hostfile = plan.nps, plan.hostfile
        calls.append({"nps": nps, "hostfile": hostfile, "threads": job.threads})
        if hostfile is None:
            return Sweep(script, [Point(1, 1, images_per_sec=640.0, run_ids=["a"])], {},
                         records=[RunRecord(run_id="a", batch_per_worker=32, gradient_bytes=1_000_000)])
        assert FakeNodes.made[-1].up  # the run happens while its nodes are up
        ips = {"/nodes/None/hostfile": 1200.0, "/nodes/100mbit/hostfile": 500.0}[hostfile]
        return Sweep(script, [Point(2, 1, images_per_sec=ips, run_ids=["b"])], {})

    FakeNodes.made = []
    monkeypatch.setattr(link_sweep.bench, "bench", fake_bench)
    monkeypatch.setattr(link_sweep.nodes, "VirtualNodes", FakeNodes)
    said: list[str] = []
    out = link_sweep.sweep("train.py", ["unlimited", "100mbit"], ["--epochs", "1"], say=said.append)
    assert [c["nps"] for c in calls] == [[1], [2], [2]] and {c["threads"] for c in calls} == {1}
    assert [n.rate for n in FakeNodes.made] == [None, "100mbit"] and not any(n.up for n in FakeNodes.made)
    slow = out.points[1]
    assert slow.images_per_sec == 500.0 and slow.model_serial == pytest.approx(64 / 0.130)
    assert slow.model_serial < slow.images_per_sec < slow.model_overlap
    text = str(out)
    assert "one worker alone: 640.0 images/sec at a batch of 32" in text and "100mbit" in text and "80.0 ms" in text
    assert json.loads(out.to_json())["points"][0]["rate"] == "unlimited"
    assert len(said) == 5  # alone, then each rate and its result


def test_the_cli_routes_rates_and_refuses_what_does_not_fit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    seen = {}

    def fake_sweep(script: str, rates: list[str], args: list[str], np: int, **kw: Any) -> link_sweep.LinkSweep:
        seen.update(rates=rates, args=args, np=np)
        return link_sweep.LinkSweep(script, np, 640.0, 32, 1_000_000, [link_sweep.LinkPoint("1gbit", 1100.0)])

    monkeypatch.setattr(link_sweep, "sweep", fake_sweep)
    assert cli.main(["bench", str(script), "--rates", "1gbit", "--json", "--", "--epochs", "1"]) == 0
    assert seen == {"rates": ["1gbit"], "args": ["--epochs", "1"], "np": 2}
    assert json.loads(capsys.readouterr().out)["points"][0]["images_per_sec"] == 1100.0
    assert cli.main(["bench", str(script), "--rates", "1gbit", "--np", "1,2"]) == 2
    assert "--rates takes one --np" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bench", str(script), "--rates", "fast"])
