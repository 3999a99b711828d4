"""``labkit bench knobs``: the variants of each knob, the job they run, its step lines read, the command line."""

from __future__ import annotations

import json

import pytest

from labkit.cli import knobs as knobs_cli
from labkit.cli import main as cli
from labkit.measure import knobs


def test_every_knob_starts_from_horovods_default_and_changes_one_thing() -> None:
    assert set(knobs.KNOBS) == {"fusion", "cycle", "compression"}
    for knob, variants in knobs.KNOBS.items():
        assert "default" in variants[0][0] and len(variants) >= 2
        changed = {k for _, env, _ in variants for k in env} | {a for _, _, args in variants for a in args}
        assert len(changed) == 1, knob  # one environment variable or one flag per knob
    assert knobs.KNOBS["fusion"][1][1] == {"HOROVOD_FUSION_THRESHOLD": "0"}
    assert knobs.KNOBS["compression"][1][2] == ["--fp16"]


def test_the_job_is_an_argument_list() -> None:
    argv = knobs.command(64, 16, 20, 20.0, ["--fp16"])
    assert argv[0] == "python" and argv[1].endswith("timeline_job.py")
    assert argv[2:] == ["--steps", "20", "--tensors", "64", "--kib", "16", "--compute-ms", "20", "--fp16"]


def test_medians_leave_out_the_first_steps() -> None:
    lines = [{"rank": 0, "step": i, "compute_s": 0.01, "comm_s": 9.0 if i < 3 else 0.1 * (i - 2)} for i in range(8)]
    text = "noise\n" + "".join("STEP " + json.dumps(x) + "\n" for x in lines)
    comm, step = knobs.medians(text)
    assert comm == pytest.approx(0.3) and step == pytest.approx(0.31)
    with pytest.raises(RuntimeError, match="no steps"):
        knobs.medians("nothing here")


def test_the_table_compares_each_variant_with_the_first() -> None:
    r = knobs.KnobResult("compression", 2, ["node1", "node2"], "200mbit", 4, 2048, 10)
    r.variants = [knobs.Variant("fp32 (default)", {}, [], 0.40, 0.45), knobs.Variant("fp16", {}, ["--fp16"], 0.2, 0.25)]
    text = str(r)
    assert "2 workers on node1, node2, link 200mbit" in text and "0.50x" in text and "400.0 ms" in text
    assert json.loads(r.to_json())["variants"][1]["comm_s"] == 0.2


def test_bad_sweeps_are_refused_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="unknown knob"):
        knobs.sweep("bandwidth")
    with pytest.raises(ValueError, match="at least 5 steps"):
        knobs.sweep("fusion", work=knobs.Workload(steps=2))


@pytest.mark.parametrize(("argv", "error"), [
    (["bench", "knobs"], "give --knob"),
    (["bench", "knobs", "--knob", "fusion", "--np", "1,2"], "give one worker count"),
    (["bench", "knobs", "--knob", "fusion", "--", "x"], "nothing goes after --"),
])
def test_bad_command_lines_are_usage_errors(argv: list[str], error: str, capsys: pytest.CaptureFixture) -> None:
    assert cli.main(argv) == 2
    assert error in capsys.readouterr().err


def test_the_command_line_routes_knobs_and_keeps_bench_and_allreduce(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture) -> None:
    seen = {}

    def fake(knob, **kw):
        seen.update(kw, knob=knob)
        r = knobs.KnobResult(knob, 2, [], None, 64, 16, kw["work"].steps)
        r.variants = [knobs.Variant("a (default)", {}, [], 0.1, 0.2)]
        return r

    monkeypatch.setattr(knobs_cli.knobs, "sweep", fake)
    parser = cli.parse(["bench", "knobs", "--knob", "cycle", "--steps", "7", "--np", "4", "--json"])
    assert knobs_cli.cli(parser, 4, run=fake) == 0
    assert seen["knob"] == "cycle" and seen["work"].steps == 7 and seen["np"] == 4
    assert seen["job"].timeout == 600 and seen["job"].quiet
    assert json.loads(capsys.readouterr().out)["knob"] == "cycle"
    assert cli.main(["bench", "allreduce", "--sizes", "x"]) == 2  # bench allreduce still routes
