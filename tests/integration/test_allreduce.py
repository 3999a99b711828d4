"""``labkit bench allreduce``: the ring model, the table, the command line, and the link measured on virtual nodes."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.nodes import nodes_problem

from labkit.cli import allreduce as allreduce_cli
from labkit.cli import main as cli
from labkit.core import contract
from labkit.instrument import allreduce_worker
from labkit.measure import allreduce, knobs
from labkit.nodes import virtual as nodes


def test_sizes_are_bytes_with_binary_units() -> None:
    assert allreduce.parse_sizes("1M,8M,64M") == [2**20, 2**23, 2**26]
    assert allreduce.parse_sizes("4096, 512K,1g,6") == [4096, 2**19, 2**30, 4]  # whole float32s
    for bad in ("", "8 MB", "1T", "x", "2"):
        with pytest.raises(ValueError):
            allreduce.parse_sizes(bad)


def test_the_ring_model_and_bus_bandwidth() -> None:
    assert allreduce.bus_factor(2) == 1.0 and allreduce.bus_factor(4) == 1.5 and allreduce.bus_factor(1) == 0.0
    # 8 MiB over 2 workers at 200 Mbit/s each way: every worker sends 8 MiB, 0.3355 s
    assert allreduce.ring_seconds(2**23, 2, 200e6) == pytest.approx(2**23 * 8 / 200e6)
    assert allreduce.ring_seconds(2**23, 4, 200e6) == pytest.approx(1.5 * 2**23 * 8 / 200e6)
    assert allreduce.bus_bandwidth(2**23, 0.5, 4) == pytest.approx(1.5 * 2**23 / 0.5)
    s = allreduce.SizeResult(2**23, 2, [0.5, 0.4, 9.0], 200e6)
    assert s.median == 0.5 and s.busbw == pytest.approx(2**23 / 0.5)
    assert s.ratio == pytest.approx(0.5 / (2**23 * 8 / 200e6))
    assert allreduce.SizeResult(4096, 2, [0.1]).ratio is None  # no link rate: no model


def _result() -> allreduce.AllreduceResult:
    r = allreduce.AllreduceResult("mpi", 2, "200mbit", hosts=["198.18.0.11", "198.18.0.12"], log_dir="/x")
    r.sizes = [allreduce.SizeResult(2**20, 2, [0.05, 0.06, 0.055], 200e6),
               allreduce.SizeResult(2**23, 2, [0.40, 0.38, 0.39], 200e6)]
    return r


def test_the_table_shows_bytes_median_bandwidth_model_and_ratio() -> None:
    lines = str(_result()).splitlines()
    assert "mpi, 2 workers on 198.18.0.11, 198.18.0.12; link 200mbit each way" in lines[0]
    assert lines[1].split() == ["bytes", "size", "median", "s", "bus", "bandwidth", "model", "s", "ratio", "repeats"]
    row = lines[3].split()
    assert row[0] == str(2**23) and row[1:3] == ["8", "MiB"] and float(row[3]) == pytest.approx(0.39)
    assert float(row[4]) == pytest.approx(2**23 * 8 / 0.39 / 1e6, abs=0.1) and row[5] == "Mbit/s"
    assert float(row[6]) == pytest.approx(0.3355, abs=1e-4) and float(row[7]) == pytest.approx(0.39 / 0.33554, abs=0.01)
    assert row[8] == "3"
    data = json.loads(_result().to_json())
    assert data["rate"] == "200mbit" and data["sizes"][1]["median_s"] == pytest.approx(0.39)
    assert data["sizes"][1]["model_s"] == pytest.approx(0.33554, abs=1e-5)


def test_the_workers_result_lines_are_read_from_a_log() -> None:
    log = ("noise\n" + allreduce_worker.MARK + json.dumps({"bytes": 8, "workers": 2, "seconds": [0.1]})
           + "\n[1,0]<stdout>:" + allreduce_worker.MARK + json.dumps({"bytes": 16, "workers": 2, "seconds": [0.2]}))
    assert [r["bytes"] for r in allreduce.parse_output(log)] == [8, 16]


def test_the_command_line_routes_allreduce_and_keeps_bench(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    calls = []

    def fake(**kw: object) -> allreduce.AllreduceResult:
        calls.append(kw)
        return _result()

    monkeypatch.setattr(allreduce, "measure", fake)
    monkeypatch.setattr(allreduce_cli.cli, "__defaults__", (fake,))
    assert cli.main(["bench", "allreduce", "--sizes", "1M,8M", "--np", "2", "--via", "gloo", "--hostfile", "/h"]) == 0
    assert calls[-1] == {"sizes": [2**20, 2**23], "np": 2, "hostfile": "/h", "via": "gloo", "repeat": 5,
                         "rate": None, "job": allreduce.QUIET}
    assert "bus bandwidth" in capsys.readouterr().out
    assert cli.main(["bench", "allreduce", "--repeat", "1", "--json", "--rate", "1gbit", "--env", "A=1"]) == 0
    assert calls[-1]["repeat"] == 1 and calls[-1]["np"] is None and calls[-1]["rate"] == "1gbit"
    assert calls[-1]["job"].env == {"A": "1"} and calls[-1]["job"].timeout == 900
    assert json.loads(capsys.readouterr().out)["via"] == "mpi"
    assert cli.main(["bench", "allreduce", "--sizes", "8X"]) == 2
    assert cli.main(["bench", "allreduce", "--np", "1,2"]) == 2
    assert len(calls) == 2
    a = cli.parse(["bench", "labs/fashion_mnist.py", "--np", "1,2"])  # bench of a script is unchanged
    assert a.script == "labs/fashion_mnist.py" and a.np == [1, 2] and a.repeat == 1
    with pytest.raises(cli.UsageError, match="allreducex not found"):
        cli.parse(["bench", "allreducex"])


def test_the_rate_comes_from_the_running_nodes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(contract.NODES_STATE, str(tmp_path))
    assert allreduce.link_rate() is None
    (tmp_path / "state.json").write_text(json.dumps({"count": 2, "slots": 1, "rate": "200mbit", "slurm": False,
                                                     "nodes": [], "made": {}, "daemons": {}}))
    assert allreduce.link_rate() == "200mbit"
    assert allreduce.link_rate("50mbit") == "50mbit"
    with pytest.raises(ValueError):
        allreduce.link_rate("fast")


_problem = nodes_problem


@pytest.fixture(scope="module")
def link(tmp_path_factory: pytest.TempPathFactory) -> Iterator[nodes.VirtualNodes]:
    """Two nodes of one slot, links of 200 Mbit/s each way."""
    problem = _problem()
    if problem:
        pytest.skip(problem)
    folder = tmp_path_factory.mktemp("ar") / "nodes"
    saved = os.environ.get(contract.NODES_STATE)
    os.environ[contract.NODES_STATE] = str(folder)
    try:
        with nodes.VirtualNodes(count=2, slots=1, rate="200mbit", folder=folder) as c:
            yield c
    finally:
        if saved is None:
            os.environ.pop(contract.NODES_STATE, None)
        else:
            os.environ[contract.NODES_STATE] = saved


SLOWER = ("measured 1.1-2.1x the model at 8 and 64 MiB on a loaded 2-core machine while raw TCP both ways at once "
          "ran at 186-190 Mbit/s on the same links: the transport, not the shaping (docs/performance.md)")


@pytest.mark.slow
# Gloo reaches the ring model within 20% from 8 MiB on; OpenMPI's TCP transport and gRPC do not (see SLOWER):
# for them the test holds what was measured, no faster than the link allows and at most 2.5 times the model.
# All three in make test-heavy (make test's budget): make test measures the same link with Gloo in lab 8's cells,
# in the browser, without holding it to the band.
@pytest.mark.heavy
@pytest.mark.parametrize(("via", "band"), [("gloo", (0.8, 1.2)), ("mpi", (0.8, 2.5)), ("mwms", (0.8, 2.5))])
def test_the_link_gives_the_ring_models_bandwidth(link: nodes.VirtualNodes, via: str, band: tuple[float, float],
                                                  tmp_path: Path) -> None:
    r = allreduce.measure([2**20, 2**23, 2**26], np=2, hostfile=link.hostfile, via=via, repeat=5,
                          job=allreduce.QUIET.but(log_dir=tmp_path / "logs"))
    print(r)
    assert r.rate == "200mbit" and r.workers == 2 and [s.bytes for s in r.sizes] == [2**20, 2**23, 2**26]
    for s in r.sizes[1:]:  # 8 MiB and more: the link's rate, not latency, sets the time
        assert band[0] <= s.ratio <= band[1], f"{s.bytes} bytes: {s.median:.3f} s against the model's {s.model:.3f} s"


@pytest.mark.heavy  # make test's budget: lab 8 measures the same knob on the link; the link's Gloo band stays
def test_fp16_compression_halves_the_time_on_a_slow_link(link: nodes.VirtualNodes) -> None:
    """On a 200 Mbit/s link the bytes set the all-reduce's time: float16 sends half of them."""
    # Gloo: the ring model (above)
    r = knobs.sweep("compression", hostfile=link.hostfile, work=knobs.Workload(steps=10), launcher="gloo")
    print(r)
    fp32, fp16 = r.variants
    assert r.rate == "200mbit" and len(r.hosts) == 2 and r.np == 2
    assert fp16.comm_s < 0.75 * fp32.comm_s, str(r)


@pytest.mark.heavy  # make test's budget: lab 8 measures the same knob on the link; the link's Gloo band stays
def test_without_fusion_many_small_tensors_cost_far_more(link: nodes.VirtualNodes) -> None:
    """256 tensors of 4 KiB a step: fused, one all-reduce; unfused, 256 of them, each with its own round trips."""
    r = knobs.sweep("fusion", hostfile=link.hostfile, work=knobs.Workload(steps=10), launcher="gloo")
    print(r)
    fused, unfused = r.variants
    assert unfused.comm_s > 1.3 * fused.comm_s, str(r)  # measured 1.8x and 6.6x (docs/performance.md)
