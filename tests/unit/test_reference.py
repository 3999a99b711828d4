"""labkit.measure.reference:
the course's reference results, made from real runs, read back as the notebooks read them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.course import labs
from labkit.figures import plot, views
from labkit.measure import reference

SHIPPED = labs.ROOT / "labs" / "reference"
# What the notebooks read, by reference name.
USED = ("mirrored", "kill-and-resume", "engines", "slowed-worker", "parameter-server", "horovod-sweep", "tf-sweep",
        "learning-rate")


def test_the_final_solution_of_each_lab_is_its_last() -> None:
    for lab in labs.LABS.values():
        found = reference.final_solution(lab)
        steps = sorted((labs.ROOT / "solutions").glob(f"{lab.stem}_after_step_[0-9][0-9].py"))
        assert found.is_file() and found in {labs.ROOT / "solutions" / f"{lab.stem}_solution.py", *steps[-1:],
                                             lab.solution()}


@pytest.fixture
def shipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The committed reference folder, read from a notebook's folder (cells run in labs/)."""
    if not (SHIPPED / reference.RECORDS).is_file():
        pytest.fail("labs/reference has no records: run `python -m labkit.measure.reference`")
    monkeypatch.chdir(tmp_path)
    return SHIPPED


def test_the_shipped_results_come_from_real_runs_of_every_reference(shipped: Path) -> None:
    results = json.loads((shipped / reference.RESULTS).read_text())
    made = results["made"]
    assert made["date"] and made["machine"] and made["epochs"] >= 2
    readme = (shipped / "README.md").read_text()
    assert made["date"] in readme and "python -m labkit.measure.reference" in readme
    for name in USED:
        if name == "kill-and-resume":
            report = reference.resume_report()
            assert report.after and not report.repeated and report.killed == "worker.1", report
            continue
        recs = reference.records(name)
        assert recs and all(r.status == "ok" for r in recs), (name, recs)
        # images/sec of every run but a parameter-server cluster's (its workers' steps are counted instead)
        assert all(r.images_per_sec or r.worker_steps for r in recs), (name, recs)
        assert all(r.epochs_run >= 2 for r in recs if r.launcher != "independent"), name
    assert all("/" not in str(r.script) for r in reference.records("horovod-sweep"))  # no machine paths


def test_the_notebooks_plots_draw_from_the_shipped_results(shipped: Path) -> None:
    hvd, tf = reference.sweep_of("horovod-sweep"), reference.sweep_of("tf-sweep")
    assert [p.workers for p in hvd.points] == [1, 2] and hvd.points[1].ceiling_images_per_sec
    assert "speedup" in str(hvd) and "efficiency" in str(hvd)
    assert set(plot.merged(hvd, tf)) == {"Horovod", "tf.distribute MultiWorkerMirroredStrategy"}
    for fig in (plot.scaling(hvd), plot.compare(hvd, tf), plot.time_to_accuracy(hvd, tf),
                views.curves(*reference.labelled("learning-rate").values()),
                views.curves(reference.record("horovod-sweep", workers=2)),
                views.worker_steps(reference.record("slowed-worker"), slowed="worker.1"),
                views.resume_timeline(reference.resume_report())):
        assert fig.axes
    assert set(reference.labelled("learning-rate")) == {"×2, warm-up", "×2, no warm-up", "not scaled"}


def test_show_says_when_and_what(shipped: Path, capsys: pytest.CaptureFixture) -> None:
    reference.show("mirrored")
    out = capsys.readouterr().out
    assert "the course's reference results (made on" in out and "1 device(s)" in out and "images/sec" in out
    with pytest.raises(LookupError, match="no reference records"):
        reference.records("nothing-of-that-name")


def test_the_reference_command_refuses_without_solutions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(labs, "ROOT", tmp_path)
    assert reference.main(["--out", str(tmp_path / "out")]) == 2
    assert "no solutions/" in capsys.readouterr().err and not (tmp_path / "out").exists()
