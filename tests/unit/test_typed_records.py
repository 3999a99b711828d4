"""Typed records read from JSON (labkit.records.typed) and the probes' evidence read through them."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers.probe_cases import CASES

from labkit.check import judging, lab_communication, lab_horovod, lab_multiworker, tfdist
from labkit.course import labs
from labkit.records import evidence, hvd_evidence, hvd_probe, tfdist_evidence, tfdist_probe, typed


@dataclass(frozen=True)
class Inner:
    n: int
    x: float = 0.0


@dataclass(frozen=True)
class Outer:
    name: str
    inner: Inner
    items: list[Inner] = field(default_factory=list)
    by_rank: dict[int, str] = field(default_factory=dict)
    maybe: bool | None = None


def test_a_record_is_built_with_every_field_checked() -> None:
    got = typed.parse(Outer, {"name": "a", "inner": {"n": 1, "x": 2}, "items": [{"n": 3}], "by_rank": {"1": "z"},
                              "unknown": "ignored"})
    assert got == Outer("a", Inner(1, 2.0), [Inner(3)], {1: "z"})
    assert isinstance(got.inner.x, float)


@pytest.mark.parametrize("data, where", [
    ({"name": "a"}, "the field 'inner' is missing"),
    ({"name": "a", "inner": {"n": "1"}}, "rec.inner.n: expected int, got '1'"),
    ({"name": "a", "inner": {"n": True}}, "rec.inner.n: expected int, got True"),
    ({"name": "a", "inner": {"n": 1}, "items": {"n": 1}}, "rec.items: expected a list"),
    ({"name": "a", "inner": {"n": 1}, "items": [{"n": 1}, 5]}, "rec.items[1]: expected an object (Inner)"),
    ({"name": "a", "inner": {"n": 1}, "by_rank": {"one": "z"}}, "rec.by_rank key: expected an integer"),
    ({"name": "a", "inner": {"n": 1}, "maybe": "yes"}, "rec.maybe: expected bool"),
    ([1, 2], "rec: expected an object (Outer)"),
])
def test_a_wrong_record_names_the_field_never_a_key_error(data: object, where: str) -> None:
    with pytest.raises(typed.RecordError) as e:
        typed.parse(Outer, data, "rec")
    assert where in str(e.value)


def test_every_recorded_horovod_run_reads_as_typed_evidence() -> None:
    cases = [c for c in CASES if c.lab in ("horovod", "communication", "at-scale")]
    assert len(cases) >= 20
    for case in cases:
        ev = judging.load(case.fixture)
        assert isinstance(ev, hvd_evidence.RunEvidence) and ev.np == 2 and set(ev.states) <= {0, 1}
        for run in ev.runs():
            assert all(isinstance(e, hvd_probe.Epoch) for st in run.states.values() for e in st.epochs)
            assert all(isinstance(end, hvd_evidence.RankEnd) for end in run.ranks.values())


def _tampered(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data))
    return path


def test_a_tampered_rank_record_is_named_and_fails_step_1(tmp_path: Path) -> None:
    """A script may write into the probe's folder: what it wrote is read once, at the file, and named with the
    field that is wrong; the rank's record is left out, and step 1 fails saying so: no judge meets a KeyError."""
    good = judging.load(next(c for c in CASES if c.lab == "horovod" and c.name == "after_step_08").fixture)
    assert isinstance(good, hvd_evidence.HorovodEvidence)
    state = typed.dump(good.state(1))
    unreadable: list[str] = []
    path = _tampered(tmp_path / "probe.1.json", {**state, "epochs": [{"train_batches": "many"}]})
    assert evidence.record(hvd_probe.RankRecord, path, unreadable) is None
    assert unreadable == ["probe.1.json.epochs[0].train_batches: expected int, got 'many'"]
    assert evidence.record(hvd_probe.RankRecord, _tampered(tmp_path / "probe.0.json", state)) == good.state(1)
    (tmp_path / "probe.2.json").write_text('{"milestones": ["start"')  # cut short by a kill: left out, not named
    assert evidence.record(hvd_probe.RankRecord, tmp_path / "probe.2.json", unreadable) is None
    assert len(unreadable) == 1
    # A record of the second checkpoint run, tampered with: every step fails, at step 1, naming it.
    assert good.resume is not None and good.resume.second is not None
    second = dataclasses.replace(good.resume.second, unreadable=unreadable[0])
    tampered = dataclasses.replace(good, resume=hvd_evidence.Resume(good.resume.first, second))
    results = judging.judge(lab_horovod, tampered, 8, labs.get("horovod").steps)
    assert [r.passed for r in results] == [False] * 8
    assert "could not be read (probe.1.json.epochs[0].train_batches: expected int, got 'many')" in results[0].message
    assert "fix step 1" in results[1].message


def test_a_tampered_allreduce_record_is_named(tmp_path: Path) -> None:
    _tampered(tmp_path / "allreduce.0.json", {"gradients": {"float16": 26}, "other": {"float32": 4}})
    _tampered(tmp_path / "allreduce.1.json", {"gradients": {"float16": "all"}})
    unreadable: list[str] = []
    got = lab_communication.read(tmp_path, 2, unreadable)
    assert got == {0: hvd_probe.Allreduced({"float16": 26}, {"float32": 4})}
    assert unreadable == ["allreduce.1.json.gradients.float16: expected int, got 'all'"]


def test_every_recorded_tf_distribute_run_reads_as_typed_evidence() -> None:
    kinds = {"mirrored": tfdist_evidence.Mirrored, "multiworker": tfdist_evidence.MultiWorker,
             "parameter-server": tfdist_evidence.ParameterServer}
    cases = [c for c in CASES if c.lab in kinds]
    assert {c.lab for c in cases} == set(kinds)
    for case in cases:
        ev = judging.load(case.fixture)
        assert isinstance(ev, kinds[case.lab])
        assert all(isinstance(t, tfdist_probe.Task) for t in ev.records.values())
        assert all(s.cls for t in ev.records.values() for s in t.strategies)  # "class" in the JSON


def test_a_tampered_task_record_or_event_is_named_and_fails_step_1(tmp_path: Path) -> None:
    good = judging.load(next(c for c in CASES if c.lab == "multiworker").fixture)
    assert isinstance(good, tfdist_evidence.MultiWorker)
    for name, task in good.records.items():
        _tampered(tmp_path / f"{name}.json", typed.dump(task))
    worker = typed.dump(good.records["worker.1"])
    _tampered(tmp_path / "worker.1.json", {**worker, "fits": [{"replicas": "two"}]})
    (tmp_path / "worker.0.events.jsonl").write_text('{"kind": "fit_begin", "pid": 7, "t": 1.0}\n{"kind": "epoch_b\n'
                                                    '{"kind": "epoch_end", "pid": 7, "epoch": "one"}\n')
    unreadable: list[str] = []
    records = tfdist.records(tmp_path, unreadable)
    events = tfdist.events(tmp_path, "worker.0", unreadable)
    assert set(records) == set(good.records) - {"worker.1"}
    assert [e.kind for e in events] == ["fit_begin"]  # the line cut short is left out, not named
    assert unreadable == ["worker.1.json.fits[0].replicas: expected int, got 'two'",
                          "worker.0.events.jsonl line 3.epoch: expected int, got 'one'"]
    tampered = dataclasses.replace(good, records=records, unreadable=unreadable[0])
    results = judging.judge(lab_multiworker, tampered, 3, labs.get("multiworker").steps)
    assert not results[0].passed and "worker.1.json.fits[0].replicas: expected int, got 'two'" in results[0].message


def test_a_record_keeps_the_keys_it_does_not_declare_side_by_side() -> None:
    """An epoch's metrics are whatever the script's logs held: kept under their own names, next to the fields."""
    from labkit.records.observation import EpochNote

    data = {"epoch": 2, "end": 5.0, "wall_s": 1.5, "train_s": 1.25, "steps": 8, "batch_per_step": 16, "cpu_s": 2.0,
            "loss": 0.5, "val_accuracy": 0.75}
    note = typed.parse(EpochNote, data)
    assert note.metrics == {"loss": 0.5, "val_accuracy": 0.75} and note.train_s == 1.25
    assert typed.dump(note) == data
    with pytest.raises(typed.RecordError, match="record.loss: expected float"):
        typed.parse(EpochNote, {**data, "loss": "low"})


def test_a_horovod_run_kept_as_evidence_is_saved_with_the_keys_it_always_had() -> None:
    """What a run did not have stays out of its JSON: the OOM kills, a rank's stop and what it left running, the
    checkpoint runs, ``partial``; the nested runs have no ``format`` or ``covers``."""
    from labkit.records.still_running import Frame, StillRunning, Where

    stopped = StillRunning(Where("own", "term", at=Frame("/x/s.py", 5, "main", "pass")), 30.0)
    run = hvd_evidence.Run(np=2, ranks={0: hvd_evidence.RankEnd(exit=0),
                                        1: hvd_evidence.RankEnd(1, "", "", False, stopped, ["sleep 9"])})
    plain = typed.dump(hvd_evidence.kept(run, hvd_evidence.HorovodEvidence, partial=True))
    assert set(plain) == {"lab", "np", "batch", "states", "weights", "ranks", "timed_out", "interrupted", "returncode",
                          "start_error", "partial", "format", "covers"}
    assert plain["ranks"][0] == {"exit": 0, "error": "", "log_tail": "", "stalled": False}
    assert plain["ranks"][1]["running_at_end"] == {"where": {"kind": "own", "trigger": "term", "at": {
        "file": "/x/s.py", "line": 5, "function": "main", "code": "pass"}}, "after": 30.0}
    assert plain["ranks"][1]["left_running"] == ["sleep 9"]
    later = typed.dump(hvd_evidence.kept(run, hvd_evidence.HorovodEvidence, resume=hvd_evidence.Resume(run),
                                         lr_run=run, oom_kills=1))
    assert "partial" not in later and later["oom_kills"] == 1 and set(later["resume"]) == {"first"}
    assert "format" not in later["resume"]["first"] and "oom_kills" not in later["resume"]["first"]
    ev = evidence.from_json(hvd_evidence.HorovodEvidence)(json.loads(json.dumps(later)))
    assert ev.runs() == [ev, run, run] and ev.processes_left() == [("0", []), ("1", ["sleep 9"])] * 3
    assert ev.end(1).running_at_end == stopped and ev.cut_short() is False and ev.record_error() is None
