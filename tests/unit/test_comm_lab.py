"""Lab 8's and lab 7's cells where they cannot measure: a starter script or no root shows the reference results
(read back and drawn) or says what the cell would show; nothing starts."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest
from matplotlib.figure import Figure

from labkit.measure import comm_reference, compression, link_sweep
from labkit.ui import comm_lab, nodes_lab, notebook

DATA = {
    "links": asdict(link_sweep.LinkSweep("sol.py", 2, 600.0, 32, 722_000, [
        link_sweep.LinkPoint("unlimited", 1150.0, 0.0, 1200.0, 1200.0),
        link_sweep.LinkPoint("100mbit", 700.0, 0.0578, 590.0, 1107.0)])),
    "compression": asdict(compression.Comparison("sol.py", 2, ["--epochs", "6"], [
        compression.Variant("float32 (none)", [0.70, 0.78], 1100.0, {"compression": "none"}),
        compression.Variant("float16 (fp16)", [0.71, 0.77], 1050.0, {"compression": "fp16"})])),
}


@pytest.fixture
def shown(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    figures: list[Any] = []
    monkeypatch.setattr(comm_lab.notebook, "show", figures.append)
    monkeypatch.setattr(comm_reference, "load", lambda: DATA)
    monkeypatch.setattr(link_sweep, "sweep", lambda *a, **k: pytest.fail("a starter must not be measured"))
    monkeypatch.setattr(compression, "compare", lambda *a, **k: pytest.fail("a starter must not be measured"))
    return figures


def test_a_starter_shows_the_reference_link_sweep_and_curves(shown: list[Any], monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(notebook, "untouched", lambda script: True)
    sweep = comm_lab.links("fashion_mnist.py")
    curves = comm_lab.compression("fashion_mnist.py")
    out = capsys.readouterr().out
    assert out.count("fashion_mnist.py is still the starter: finish steps 1-8 of lab 2") == 2
    assert sweep.points[1].images_per_sec == 700.0 and "100mbit" in out and "float16 (fp16)" in out
    assert curves.curves()["float16 (fp16)"] == [0.71, 0.77]
    assert len(shown) == 2 and all(isinstance(f, Figure) for f in shown)


def test_without_root_a_finished_script_still_shows_the_reference(shown: list[Any], monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(notebook, "ready", lambda script, lab, steps: (lab, steps) == ("horovod", 8))
    monkeypatch.setattr(nodes_lab, "why_not", lambda: "Virtual nodes need root")
    assert comm_lab.links("fashion_mnist.py").np == 2
    assert "Not run: Virtual nodes need root" in capsys.readouterr().out and len(shown) == 1


def test_workers_per_host_says_what_it_would_show_without_root(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(nodes_lab, "why_not", lambda: "Virtual nodes need root")
    assert nodes_lab.workers_per_host(["python", "fashion_mnist_multiworker.py"]) is None
    out = capsys.readouterr().out
    assert "Not run: Virtual nodes need root" in out and "worker 0 on node1 and worker 1 on node2" in out


def test_nodes_already_up_are_left_alone(shown: list[Any], monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(notebook, "ready", lambda script, lab, steps: (lab, steps) == ("horovod", 8))
    monkeypatch.setattr(nodes_lab, "why_not", lambda: None)
    monkeypatch.setattr(comm_lab.nodes.VirtualNodes, "load", classmethod(lambda cls: object()))
    assert comm_lab.links("fashion_mnist.py") is not None  # the reference, not a sweep
    assert "`labkit nodes down` first" in capsys.readouterr().out
