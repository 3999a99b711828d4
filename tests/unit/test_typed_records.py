"""Typed records read from JSON (labkit.records.typed) and the Horovod probe's evidence read through them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from helpers.probe_cases import CASES

from labkit.check import judging, lab_horovod, lab_multiworker
from labkit.course import labs
from labkit.records import hvd_probe, tfdist_probe, typed


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
    cases = [c for c in CASES if c.lab in ("horovod", "communication")]
    assert len(cases) >= 20
    for case in cases:
        ev = hvd_probe.read(judging.load(case.fixture), case.fixture.name)
        assert ev.np == 2 and set(ev.states) <= {0, 1}
        for st in ev.states.values():
            assert all(isinstance(e, hvd_probe.Epoch) for e in st.epochs)


def test_a_tampered_rank_record_fails_step_1_naming_the_field() -> None:
    """A script may write into the probe's folder: what it wrote is named, and no judge meets a KeyError."""
    ev = judging.load(next(c for c in CASES if c.lab == "horovod" and c.name == "after_step_08").fixture)
    ev["states"]["1"]["epochs"] = [{"train_batches": "many"}]
    results = judging.judge(lab_horovod, json.loads(json.dumps(ev)), 8, labs.get("horovod").steps)
    assert [r.passed for r in results] == [False] * 8
    assert "states.1.epochs[0].train_batches: expected int, got 'many'" in results[0].message
    assert "fix step 1" in results[1].message


def test_every_recorded_tf_distribute_run_reads_as_typed_evidence() -> None:
    read = {"mirrored": tfdist_probe.mirrored, "multiworker": tfdist_probe.multi_worker,
            "parameter-server": tfdist_probe.parameter_server}
    cases = [c for c in CASES if c.lab in read]
    assert {c.lab for c in cases} == set(read)
    for case in cases:
        ev = read[case.lab](judging.load(case.fixture))
        assert all(isinstance(t, tfdist_probe.Task) for t in ev.records.values())
        assert all(s.cls for t in ev.records.values() for s in t.strategies)  # "class" in the JSON


def test_a_tampered_task_record_fails_step_1_naming_the_field() -> None:
    ev = judging.load(next(c for c in CASES if c.lab == "multiworker").fixture)
    ev["records"]["worker.1"]["fits"] = [{"replicas": "two"}]
    results = judging.judge(lab_multiworker, ev, 3, labs.get("multiworker").steps)
    assert not results[0].passed and "records.worker.1.fits[0].replicas: expected int, got 'two'" in results[0].message


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
