"""Pictures of what the ranks did, drawn from recorded check runs and a kill-and-resume report."""

from __future__ import annotations

from probe_cases import find

from labkit import views
from labkit.check import Report, judging
from labkit.faults import ResumeReport


def _gaps(case: str) -> dict[str, float | None]:
    evidence = judging.load(find("horovod", case).fixture)
    return {label.replace("\n", " "): gap for label, gap in views.weight_gaps(evidence)}


def test_weights_drift_apart_without_averaging_and_start_apart_without_broadcast() -> None:
    alone, averaged, done = _gaps("after_step_02"), _gaps("after_step_03"), _gaps("after_step_06")
    assert alone["initial weights"] > 0.1 and alone["after step 2"] > 0.1  # each rank its own model
    assert averaged["initial weights"] > 0.1  # averaged updates, but different starting points
    update = {c: views.update_gap(judging.load(find("horovod", c).fixture)) for c in ("after_step_02", "after_step_03")}
    assert update["after_step_02"] > 0.1 and update["after_step_03"] < 1e-3, update  # step 3 averages gradients
    assert done["initial weights"] > 0.1  # each rank draws its own random weights ...
    assert all(g is not None and g < 1e-4 for k, g in done.items() if k != "initial weights"), done  # ... then one


def test_rank_weights_plots_a_report_of_a_horovod_check() -> None:
    report = Report("horovod", "x.py", evidence=judging.load(find("horovod", "after_step_06").fixture))
    fig = views.rank_weights(report)
    [line] = fig.axes[0].get_lines()[:1]
    assert len(line.get_xdata()) == 5 and line.get_ydata()[0] > 0.1 and max(line.get_ydata()[1:]) < 1e-4


def test_resume_timeline_marks_the_kill() -> None:
    fig = views.resume_timeline(ResumeReport("worker.1", before=[1, 2], after=[2, 3]))
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "worker.1 killed" in texts and texts.count("2") == 2  # epoch 2 cut, then run again after the restart
