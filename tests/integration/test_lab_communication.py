"""Lab 8's exercise checked for real (4 probed 2-rank runs): the solution passes, and so does a correct script spelled
otherwise (a compressor class of its own, chosen in a variable, the option a BooleanOptionalAction); a script that
parses --fp16-allreduce but sends float32 (it rounds its gradients to float16 and back) and one without the option
fail, saying what to change. The judge's every message is tested on hand-made evidence in
tests/unit/test_lab_communication_units.py. The correct script spelled otherwise runs in
make test-heavy (make test keeps the solution, the wrong script and the one without the option)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import paths

from labkit import check
from labkit.check import Report, judging
from labkit.course import labs
from labkit.records.evidence import Evidence
from labkit.records.hvd_evidence import CommunicationEvidence

LAB = labs.get("communication")
SOLUTION = LAB.solution(1)
HOROVOD = labs.get(LAB.builds_on).solution()  # the Horovod lab's last step: no --fp16-allreduce
SNIPPETS = paths.FIXTURES / "communication"
MAIN = "def main(argv: list[str] | None = None) -> int:\n"
OPTION = '    p.add_argument("--fp16-allreduce", action="store_true",\n'
FP16 = "        opt = hvd.DistributedOptimizer(opt, compression=hvd.Compression.fp16)\n"
CHOSEN = """\
    if args.fp16_allreduce:
        opt = hvd.DistributedOptimizer(opt, compression=hvd.Compression.fp16)
    else:
        opt = hvd.DistributedOptimizer(opt)
"""


def _edit(text: str, *edits: tuple[str, str]) -> str:
    for old, new in edits:
        assert text.count(old) == 1, f"edit target not found once in the solution: {old!r}"
        text = text.replace(old, new)
    return text


def _with_class(snippet: str, text: str) -> str:
    """``text`` with the fixture's compressor class defined before main()."""
    return _edit(text, (MAIN, (SNIPPETS / snippet).read_text() + "\n\n" + MAIN))


def _script(kind: str, folder: Path) -> Path:
    solution = SOLUTION.read_text()
    texts = {
        "solution": lambda: solution,
        "own compressor": lambda: _with_class("half_on_the_wire.py", _edit(
            solution,
            (OPTION, '    p.add_argument("--fp16-allreduce", action=argparse.BooleanOptionalAction, default=False,\n'),
            (CHOSEN, "    compression = HalfOnTheWire if args.fp16_allreduce else hvd.Compression.none\n"
                     "    opt = hvd.DistributedOptimizer(opt, compression=compression)\n"))),
        "round trip": lambda: _with_class("round_trip.py", _edit(
            solution, (FP16, FP16.replace("hvd.Compression.fp16", "RoundTrip")))),
        "no option": lambda: HOROVOD.read_text(),
    }
    path = folder / kind.replace(" ", "_") / "fashion_mnist.py"
    path.parent.mkdir(parents=True)
    path.write_text(texts[kind]())
    return path


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Report, Evidence]]:
    """``checked(kind)``: the check of that script and its evidence, run once per module."""
    done: dict[str, tuple[Report, Evidence]] = {}
    folder = tmp_path_factory.mktemp("communication")

    def run(kind: str) -> tuple[Report, Evidence]:
        if kind not in done:
            out = folder / f"{kind.replace(' ', '_')}.json"
            report = check.run_check("communication", _script(kind, folder), fresh=True, evidence_out=out)
            done[kind] = report, judging.load(out)
        return done[kind]

    return run


def _finished_in_time(report: Report, running: Callable[[str], bool]) -> None:
    assert report.seconds is not None and report.seconds < LAB.timeout
    assert not running("labkit.instrument.start horovod")


@pytest.mark.slow
@pytest.mark.horovod
def test_the_solution_sends_float16_gradients_with_the_flag(checked, running) -> None:
    report, ev = checked("solution")
    assert report.passed, report.format()
    assert "all-reduced its" in report.steps[0].message and "as float16" in report.steps[0].message
    assert isinstance(ev, CommunicationEvidence)
    for rank in (0, 1):  # gradients in the step as float16; the metrics, averaged between steps, stay float32
        record = ev.allreduce[rank]
        assert set(record.gradients or {}) == {"float16"} and (record.gradients or {})["float16"] > 10, record
        assert set(record.other or {}) <= {"float32", "float64"} and record.other, record
    assert ev.args[-1] == "--fp16-allreduce"
    _finished_in_time(report, running)


@pytest.mark.slow
@pytest.mark.heavy  # a fourth probed run: make test keeps the solution, the wrong script and the missing option
@pytest.mark.horovod
def test_a_compressor_of_the_scripts_own_passes(checked, running) -> None:
    report, _ = checked("own compressor")
    assert report.passed, report.format()
    _finished_in_time(report, running)


@pytest.mark.slow
@pytest.mark.horovod
def test_gradients_rounded_to_float16_but_sent_as_float32_fail(checked, running) -> None:
    report, _ = checked("round trip")
    message = report.steps[0].message
    assert not report.passed and "with --fp16-allreduce the gradients were still all-reduced as float32: pass " \
        "`compression=hvd.Compression.fp16` to hvd.DistributedOptimizer when args.fp16_allreduce is set" in message
    _finished_in_time(report, running)


@pytest.mark.slow
@pytest.mark.horovod
def test_a_script_without_the_option_is_told_to_add_it_in_seconds(checked, running) -> None:
    report, _ = checked("no option")
    assert not report.passed and "add the --fp16-allreduce option to parse_args" in report.steps[0].message
    assert report.seconds is not None and report.seconds < 60  # argparse ends the run before training
    _finished_in_time(report, running)
