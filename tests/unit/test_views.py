"""Pictures of what the ranks did, drawn from recorded check runs and a kill-and-resume report."""

from __future__ import annotations

import pytest
from helpers.probe_cases import find

from labkit.check import Report, judging
from labkit.figures import views
from labkit.records import runrecord
from labkit.records.runrecord import RunRecord
from labkit.tfdist.faults import ResumeReport


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


def _rec(workers: int, rate: float, accs: list[float]) -> RunRecord:
    eps = [{"epoch": i + 1, "elapsed_s": 10.0 * (i + 1), "val_accuracy": a, "accuracy": a - 0.02,
            "images_per_sec": rate} for i, a in enumerate(accs)]
    return runrecord.parse({"run_id": f"r{workers}", "workers": workers, "batch_per_worker": 32, "epochs": eps,
                            "target_accuracy": 0.8, "images_per_sec": rate, "duration_s": 12.0 * len(accs)})


def test_curves_draw_accuracy_against_time_and_throughput_per_epoch() -> None:
    fig = views.curves(_rec(1, 500.0, [0.6, 0.7, 0.81]), _rec(2, 900.0, [0.65, 0.79]))
    acc, rate = fig.axes
    assert list(acc.get_lines()[0].get_xdata()) == [10.0, 20.0, 30.0]
    assert list(acc.get_lines()[0].get_ydata()) == [0.6, 0.7, 0.81]
    assert list(rate.get_lines()[-1].get_ydata()) == [900.0, 900.0]


def test_compare_runs_labels_each_bar() -> None:
    fig = views.compare_runs({"1 × 2 threads": _rec(1, 700.0, [0.7]), "2 × 1 thread": _rec(2, 780.0, [0.7])})
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert labels == ["700", "780"]


def test_a_run_without_record_is_a_clear_error() -> None:
    import pytest

    class Unrecorded:
        record = None

    with pytest.raises(ValueError, match="no record"):
        views.curves(Unrecorded())


def test_worker_steps_count_each_workers_steps() -> None:
    rec = RunRecord(run_id="ps", worker_step_times={"0": [1.0, 1.5, 2.0, 2.5], "1": [2.2]})
    fig = views.worker_steps(rec, slowed="worker.1")
    assert [t.get_text() for t in fig.axes[1].texts] == ["4", "1"]
    assert fig.axes[0].get_legend().get_texts()[1].get_text() == "worker 1 (slowed)"
    import pytest

    with pytest.raises(ValueError, match="not a ParameterServerStrategy run"):
        views.worker_steps(RunRecord(run_id="mirrored"))


def test_learning_rates_are_scaled_warmed_up_and_decayed() -> None:
    from labkit.figures import scaling_model, views

    lr = scaling_model.learning_rate
    assert lr(0, 4) == pytest.approx(0.01) and lr(3, 4) == pytest.approx(0.04)  # warm-up from base to base x 4
    assert lr(1.5, 4) == pytest.approx(0.025) and lr(15, 4) == pytest.approx(0.004) and lr(35, 1) == pytest.approx(1e-5)
    fig = views.learning_rates(workers=(1, 2))
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["1 worker(s)", "2 worker(s)"]


def test_efficiency_falls_with_slow_links_and_big_gradients() -> None:
    from labkit.figures.scaling_model import efficiency

    assert efficiency(0.05, 68e6, 1, 1.25e9) == 1.0
    slow, fast = efficiency(0.05, 68e6, 8, 1.25e9), efficiency(0.05, 68e6, 8, 100e9)
    assert 0 < slow < 0.5 < fast < 1
    assert efficiency(0.05, 68e6, 2, 1.25e9) > slow  # more workers send more of the gradient


def test_a_ring_allreduce_pays_one_latency_per_step_of_the_ring() -> None:
    from labkit.figures.scaling_model import efficiency, ring_allreduce_s

    # N workers: N-1 steps of reduce-scatter and N-1 of all-gather, each a latency and 1/N of the bytes
    assert ring_allreduce_s(0, 8, 1e9, latency_s=1e-3) == pytest.approx(14e-3)
    assert ring_allreduce_s(8e6, 4, 1e9, latency_s=0) == pytest.approx(2 * 3 / 4 * 8e6 / 1e9)
    assert ring_allreduce_s(8e6, 4, 1e9, latency_s=1e-3) == pytest.approx(6e-3 + 12e-3)
    assert ring_allreduce_s(8e6, 1, 1e9) == 0.0
    # a tiny gradient on 8 workers: latency is all that costs, 14 of them (one latency would give 1 / 1.1)
    assert efficiency(0.01, 0, 8, 1e9, latency_s=1e-3) == pytest.approx(0.01 / (0.01 + 14e-3))
