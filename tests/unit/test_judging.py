"""The one judging loop: order, caching, scripts that do not parse, the evidence format, the CLI contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.probe_cases import CASES

from labkit import check
from labkit.check import judging, lab_horovod, lr_rule
from labkit.course import labs
from labkit.records import typed
from labkit.records.evidence import Evidence, EvidenceError
from labkit.records.tfdist_evidence import ParameterServer


def test_judge_stops_at_the_first_failure_and_adds_the_run_error() -> None:
    def ok(ev: ParameterServer) -> str:
        return "fine"

    def bad(ev: ParameterServer) -> str:
        raise judging.Failed("change this")

    results = judging.judge(SimpleNamespace(STEPS=[ok, bad, ok]), ParameterServer(run_error="boom"), 3,
                            ["one", "two", "three"])
    assert [r.passed for r in results] == [True, False, False]
    assert results[0].message == "one: fine"
    assert "two: change this" in results[1].message and "boom" in results[1].message
    assert "fix step 2 first" in results[2].message


def test_evidence_missing_a_field_fails_the_step_with_a_reason() -> None:
    def needs(ev: ParameterServer) -> str:
        return ev.records["worker.0"].task

    [r] = judging.judge(SimpleNamespace(STEPS=[needs]), ParameterServer(), 1, ["step"])
    assert not r.passed and "did not record" in r.message and "worker.0" in r.message


def test_a_record_a_process_wrote_that_could_not_be_read_fails_step_1_naming_it() -> None:
    """What a script wrote into the probe's folder is named (the file and the field), and no judge runs."""
    judged: list[int] = []
    unreadable = ParameterServer(unreadable="chief.0.json.fits[0].replicas: expected int, got 'two'")
    results = judging.judge(SimpleNamespace(STEPS=[judged.append] * 3), unreadable, 3, ["one", "two", "three"])
    assert [r.passed for r in results] == [False] * 3 and judged == []
    assert results[0].message == ("one: the run's record could not be read (chief.0.json.fits[0].replicas: expected "
                                  "int, got 'two'); was a file in the check's folder changed?")
    assert "fix step 1 first" in results[2].message


def test_a_missing_script_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        check.run_check("mirrored", tmp_path / "nope.py")
    with pytest.raises(ValueError, match="steps 1..4"):
        check.run_check("mirrored", tmp_path / "nope.py", 7)


@pytest.mark.parametrize("lab", sorted(n for n, lab in labs.LABS.items() if lab.starter.endswith(".py")))
def test_a_script_that_does_not_parse_fails_step_1_without_running(lab: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import tensorflow as tf\ndef main(:\n    pass\n")
    report = check.run_check(lab, bad)
    assert report.first_failing_step == 1 and "line 2" in report.steps[0].message
    assert len(report.steps) == labs.get(lab).n_steps
    assert report.seconds is not None and report.seconds < 5


class _Lab:
    """A lab module whose run is faked: it records how often it ran and how far."""

    def __init__(self, results: list[bool], partial_below: int = 0) -> None:
        self.calls: list[int] = []
        self.STEPS = [self._step(ok) for ok in results]
        self.partial_below = partial_below  # a run covering fewer steps than this is cut short

    EVIDENCE = Evidence  # a lab that keeps nothing but what every evidence has

    @staticmethod
    def _step(ok: bool):
        def judge(ev: Evidence) -> str:
            if not ok:
                raise judging.Failed("no")
            return "ok"
        return judge

    def upto(self, step: int) -> int:
        return 4 if step >= 4 else 3

    def collect(self, script: Path, upto: int, timeout: float, work: Path) -> Evidence:
        self.calls.append(upto)
        return Evidence(partial=upto < self.partial_below)


def test_an_unchanged_script_is_judged_again_without_running(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _Lab([True, False, True, True])
    monkeypatch.setattr(judging, "lab_module", lambda lab: fake)
    monkeypatch.setattr(judging, "_CACHE", {})
    script = tmp_path / "s.py"
    script.write_text("print('hi')\n")
    assert check.run_check("multiworker", script, 1).passed
    assert check.run_check("multiworker", script, 3).first_failing_step == 2
    report = check.run_check("multiworker", script, 4)  # fails at step 2: the kill run is not needed
    assert [s.step for s in report.steps] == [1, 2, 3, 4] and fake.calls == [3]
    script.write_text("print('changed')\n")
    check.run_check("multiworker", script, 2)
    assert fake.calls == [3, 3]
    check.run_check("multiworker", script, 2, fresh=True)
    assert fake.calls == [3, 3, 3]


def test_a_failing_run_cut_short_is_run_again_in_full_for_a_wider_step(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Step 1 alone ends the ranks at fit (the Horovod lab): its failure is the verdict for step 1, but a check of
    step 3 runs in full, so that what the notebook draws from it (the ranks' weights) is there."""
    fake = _Lab([False, True, True, True], partial_below=3)
    fake.upto = lambda step: 1 if step <= 1 else 3  # type: ignore[method-assign]
    monkeypatch.setattr(judging, "lab_module", lambda lab: fake)
    monkeypatch.setattr(judging, "_CACHE", {})
    script = tmp_path / "s.py"
    script.write_text("print('hi')\n")
    assert check.run_check("multiworker", script, 1).first_failing_step == 1
    assert check.run_check("multiworker", script, 1).first_failing_step == 1  # judged again, not run
    report = check.run_check("multiworker", script, 3)
    assert report.evidence is not None and report.evidence.covers == 3
    assert report.first_failing_step == 1 and not report.evidence.partial and fake.calls == [1, 3]


def test_a_run_that_passes_step_3_is_run_again_for_step_4(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _Lab([True, True, True, True])
    monkeypatch.setattr(judging, "lab_module", lambda lab: fake)
    monkeypatch.setattr(judging, "_CACHE", {})
    script = tmp_path / "s.py"
    script.write_text("print('hi')\n")
    check.run_check("multiworker", script, 3)
    assert check.run_check("multiworker", script, 4).passed
    assert check.run_check("multiworker", script, 2).passed
    assert fake.calls == [3, 4]


def test_every_case_has_a_fixture_in_the_current_format() -> None:
    def current(fixture: Path) -> bool:
        try:
            return judging.load(fixture).schema == judging.FORMAT
        except EvidenceError:
            return False

    stale = [str(c.fixture) for c in CASES if not c.fixture.exists() or not current(c.fixture)]
    assert stale == [], f"record them again with `make probe-fixtures`: {stale}"


def test_every_fixture_loads_as_its_labs_evidence_and_saves_as_it_was() -> None:
    """Each recorded run is read as its lab's typed evidence (no field of it lost: what is saved again is what was
    recorded, but for what an older probe did not write yet), and judged the same from either."""
    fixtures = sorted(Path(CASES[0].fixture).parents[1].rglob("*.json"))
    assert len(fixtures) >= 80
    for fixture in fixtures:
        raw = json.loads(fixture.read_text())
        ev = judging.load(fixture)
        assert isinstance(ev, judging.lab_module(raw["lab"]).EVIDENCE), fixture
        assert ev.schema == raw["format"] and ev.covers == raw["covers"]
        ours = judging.shape(ev)
        if "base_lr" not in raw:  # recorded before the multi-worker check kept it
            ours.pop("base_lr", None)
        assert ours == judging.shape(raw), fixture
        if raw["lab"] in ("horovod", "at-scale"):  # their ranks' records have every field the probe writes now
            assert json.loads(json.dumps(typed.dump(ev))) == raw, fixture


def test_evidence_saved_and_loaded_is_the_same_record(tmp_path: Path) -> None:
    for case in (c for c in CASES if c.name == "after_step_04"):
        ev = judging.load(case.fixture)
        judging.save(ev, tmp_path / "again.json")
        assert judging.load(tmp_path / "again.json") == ev
        assert judging.load(tmp_path / "again.json", case.lab) == ev


@pytest.mark.parametrize(("content", "says"), [
    (None, "the evidence file cannot be read"),
    ("{not json", "not an evidence file"),
    ("[1, 2]", "a JSON object was expected, it holds list"),
    ('{"lab": "horovod", "format": 1, "np": 2}', "evidence format 1, and this labkit reads format 2: record it again"),
    ('{"lab": "no-such-lab", "format": 2}', "unknown lab 'no-such-lab'"),
    ('{"format": 2, "np": 2}', "names no lab"),
    ('{"lab": "horovod", "format": 2}', "evidence: the field 'np' is missing"),
    ('{"lab": "horovod", "format": 2, "np": 2, "states": {"1": {"epochs": [{"train_batches": "many"}]}}}',
     "evidence.states.1.epochs[0].train_batches: expected int, got 'many'"),
    ('{"lab": "mirrored", "format": 2, "records": {"local.0": {"fits": [{"replicas": "two"}]}}}',
     "evidence.records.local.0.fits[0].replicas: expected int, got 'two'"),
    ('{"lab": "scale-out", "format": 2, "hostfile": {"file": "h", "map": {"nodes": 3}}}',
     "evidence.hostfile.map.nodes: expected a list"),
])
def test_a_saved_evidence_file_that_is_not_one_is_refused_naming_the_file(tmp_path: Path, content: str | None,
                                                                          says: str) -> None:
    """A corrupt or ill-typed evidence file never reaches a judge: loading it says which file, and what is wrong."""
    path = tmp_path / "bad-evidence.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(EvidenceError) as e:
        judging.load(path)
    assert str(e.value).startswith(f"{path}: ") and says in str(e.value), str(e.value)


def test_evidence_of_another_lab_is_refused() -> None:
    fixture = next(c.fixture for c in CASES if c.lab == "mirrored")
    with pytest.raises(EvidenceError, match="evidence of the 'mirrored' lab, not of the horovod lab"):
        judging.load(fixture, "horovod")


def test_a_collect_that_returns_no_evidence_is_a_clear_error(tmp_path: Path) -> None:
    lab = SimpleNamespace(__name__="lab_plain", collect=lambda script, upto, timeout, work: {"plain": "dict"})
    with pytest.raises(TypeError, match="lab_plain.collect returned a dict, not its evidence"):
        judging.collect(lab, tmp_path / "s.py", 1, 5.0, tmp_path / "work")


def test_shape_keeps_the_keys_not_the_values() -> None:
    assert judging.shape({"a": {"b": [1], "c": None}, "d": 1.5}) == {"a": {"b": "list", "c": "value"}, "d": "value"}
    assert judging.shape({"a": 1}) != judging.shape({"a": 1, "b": 2})
    assert judging.shape({"a": {"b": {"c": 1}}}, depth=2) == {"a": {"b": "dict"}}
    assert judging.shape(Evidence(covers=3)) == {"covers": "value", "format": "value"}  # typed: its JSON's shape


def test_cli_json_contract(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def main(:\n")
    out = subprocess.run([sys.executable, "-m", "labkit.cli", "check", "horovod", str(bad), "--step", "3", "--json"],
                         capture_output=True, text=True, timeout=120)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert out.returncode == 1
    assert data["lab"] == "horovod" and data["passed"] is False and data["first_failing_step"] == 1
    assert [s["step"] for s in data["steps"]] == [1, 2, 3]
    assert {"step", "passed", "message"} <= set(data["steps"][0])
    missing = subprocess.run([sys.executable, "-m", "labkit.cli", "check", "horovod", str(tmp_path / "no.py")],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no.py not found" in missing.stderr and "Traceback" not in missing.stderr


# The learning-rate step (Horovod step 8, multi-worker step 5) on rates made up here: every rule can fail.
WORDS = lr_rule.Words("rank", "workers", "hvd.size()", "SCALE-HINT", "WARMUP-HINT")


def _hvd_warmup(base: float, n: int, warmup: int, epochs: int, steps: int) -> list[list[float]]:
    """Horovod's LearningRateWarmupCallback, batch by batch, then the scaled rate."""
    out = []
    for e in range(epochs):
        out.append([base * n / n * ((e + (b + 1) / steps) * (n - 1) / warmup + 1) if e < warmup else base * n
                    for b in range(steps)])
    return out


@pytest.mark.parametrize("rates", [
    _hvd_warmup(0.02, 2, 3, 6, 6),
    _hvd_warmup(0.02, 2, 5, 6, 6),
    [[0.02] * 4, [0.03] * 4, [0.04] * 4, [0.04] * 4],  # a per-epoch ramp (LearningRateScheduler)
    [[0.02, 0.025, 0.03, 0.035], [0.04, 0.04, 0.004, 0.004]],  # reached, then a schedule's own decay
])
def test_a_scaled_warmed_up_rate_passes(rates: list[list[float]]) -> None:
    message = lr_rule.judge({"rank 0": rates, "rank 1": [list(ep) for ep in rates]}, 0.02, 2, WORDS)
    assert "0.04" in message and "every rank" in message


@pytest.mark.parametrize(("rates", "other", "says"), [
    ([[0.02] * 4] * 3, None, "never rose above --base-lr"),  # the step-7 script
    ([[0.04] * 4] * 3, None, "no warm-up"),
    ([[0.02] * 4, [0.03] * 4, [0.035] * 4], None, "still rising"),
    ([[0.02] * 4, [0.03] * 4, [0.03] * 4], None, "rose to 0.03 at most"),
    ([[0.04, 0.06, 0.08], [0.08] * 3], None, "above"),  # scaled twice
    ([[0.02, 0.03, 0.025, 0.04], [0.04] * 4], None, "fell"),
    ([[0.02, 0.03, 0.04], [0.04] * 3], [[0.02, 0.03, 0.04], [0.08] * 3], "rank 1 trained with"),
    ([[0.02, None, 0.04], [0.04] * 3], None, "could not be read"),
    ([[], []], None, "no training batch"),
])
def test_each_rule_of_the_learning_rate_step_can_fail(rates: list, other: list | None, says: str) -> None:
    with pytest.raises(judging.Failed, match=says) as e:
        lr_rule.judge({"rank 0": rates, "rank 1": other or [list(ep) for ep in rates]}, 0.02, 2, WORDS)
    if says in ("never rose above --base-lr", "no warm-up"):
        assert ("SCALE-HINT" in str(e.value)) == (says != "no warm-up") and "WARMUP-HINT" in str(e.value)


def test_step_8_explains_horovods_momentum_correction_crash() -> None:
    tb = ('File ".../horovod/_keras/callbacks.py", line 154, in _adjust_learning_rate\n'
          "    self.backend.set_value(self.model.optimizer.momentum,\nAttributeError: 'float' object has no attribute "
          "'dtype'")
    ev = {"np": 2, "batch": 16, "timed_out": False, "start_error": None, "weights": {},
          "states": {str(r): {"milestones": ["start", "fit_start"], "error": {
              "type": "AttributeError", "message": "'float' object has no attribute 'dtype'", "traceback": tb}}
              for r in range(2)},
          "ranks": {str(r): {"exit": 1, "error": "", "log_tail": ""} for r in range(2)}}
    with pytest.raises(judging.Failed, match="momentum_correction=False"):
        lab_horovod.STEPS[2](lab_horovod.evidence(ev))
    ev["states"]["0"]["error"]["traceback"] = ev["states"]["1"]["error"]["traceback"] = "elsewhere"
    with pytest.raises(judging.Failed) as e:
        lab_horovod.STEPS[2](lab_horovod.evidence(ev))
    assert "momentum_correction" not in str(e.value)


def test_the_ranks_temporary_files_go_with_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a rank leaves in its temporary folder (AutoGraph's modules when the check kills it, MPI's session
    folder, a tree deeper than Python's recursion) is removed with the check's scratch folder."""
    seen: list[Path] = []

    class Leaving(_Lab):
        def collect(self, script: Path, upto: int, timeout: float, work: Path) -> Evidence:
            import os
            import tempfile

            tmp = Path(os.environ["TMPDIR"])
            seen.extend([tmp, work])
            made = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.mkstemp()[1])"],
                                  capture_output=True, text=True, check=True).stdout.strip()
            assert Path(made).parent == tmp and tempfile.gettempdir() != str(tmp)
            fd = os.open(tmp, os.O_RDONLY)
            for _ in range(1200):  # deeper than Python's recursion limit
                os.mkdir("d", dir_fd=fd)
                fd, old = os.open("d", os.O_RDONLY, dir_fd=fd), fd
                os.close(old)
            os.close(fd)
            return Evidence()

    monkeypatch.setattr(judging, "lab_module", lambda lab: Leaving([True]))
    monkeypatch.setattr(judging, "_CACHE", {})
    before = os.environ.get("TMPDIR")
    script = tmp_path / "s.py"
    script.write_text("print('hi')\n")
    assert check.run_check("multiworker", script, 1).passed
    assert seen and not any(p.exists() for p in seen) and len(str(seen[0])) < 40
    assert os.environ.get("TMPDIR") == before
