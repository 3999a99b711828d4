"""The answers' claims about the course's reference results hold for the results shipped in labs/reference.

A learner whose script has not yet passed its lab's steps sees the reference results, and right below them a
collapsed answer that says what to expect. Each test here reads the shipped results as the notebook does and
checks one answer's claim, quoted, so that results made again (``python -m labkit.measure.reference``) that
teach another lesson fail here, and the answer or the results must change.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.course import labs
from labkit.measure import reference, text_figures
from labkit.records import sweep

LABS = labs.ROOT / "labs"


@pytest.fixture(autouse=True)
def shipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if not (LABS / "reference" / reference.RECORDS).is_file():
        pytest.fail("labs/reference has no records: run `python -m labkit.measure.reference`")
    monkeypatch.chdir(tmp_path)  # read as a released course reads them (labs/reference from the package's root)


def answer(notebook: str, starts: str) -> str:
    """The collapsed answer of ``notebook`` that follows the cell whose text contains ``starts``."""
    cells = [text_figures.shown("".join(c["source"])) for c in json.loads((LABS / notebook).read_text())["cells"]]
    at = next(i for i, c in enumerate(cells) if starts in c)
    return next(c for c in cells[at:] if "<summary>Answer</summary>" in c)


def point(name: str, workers: int) -> sweep.Point:
    return next(p for p in reference.sweep_of(name).points if p.workers == workers)


def speedup(name: str) -> float:
    one, two = point(name, 1), point(name, 2)
    assert one.images_per_sec and two.images_per_sec
    return two.images_per_sec / one.images_per_sec


def test_lab6_horovod_scales_close_to_linear_and_to_its_ceiling() -> None:
    text = answer("06_scaling.ipynb", "what speedup and\nefficiency do you expect from the Horovod script")
    assert "speedup of about 1.75-1.9 (efficiency 88-95%)" in text and '"of ceiling" 93-98%' in text
    assert "reference results (one run each, idle\nmachine) 1.75 (88%) and 93% of the ceiling" in text
    s, two = speedup("horovod-sweep"), point("horovod-sweep", 2)
    assert 1.75 <= s <= 1.9 + 0.05, s
    assert two.ceiling_images_per_sec and 0.93 <= two.images_per_sec / two.ceiling_images_per_sec <= 1.0, two


def test_lab6_multiworker_scales_clearly_worse_than_horovod() -> None:
    text = answer("06_scaling.ipynb", "will `MultiWorkerMirroredStrategy` scale as\nwell as Horovod did?")
    assert "around 1.4-1.5 for 2 workers (efficiency 70-77%)" in text
    assert "reference results 1.40 (70%), against Horovod's 1.75" in text
    tf = speedup("tf-sweep")
    assert 1.35 <= tf <= 1.55, tf
    assert speedup("horovod-sweep") - tf >= 0.2, (speedup("horovod-sweep"), tf)


def cell(notebook: str, starts: str) -> str:
    return next(t for t in (text_figures.shown("".join(c["source"]))
                            for c in json.loads((LABS / notebook).read_text())["cells"]) if starts in t)


def test_lab6_every_sweep_run_reaches_the_target_and_time_to_it_gains_less_than_throughput() -> None:
    text = cell("06_scaling.ipynb", "### Reading the plots")
    assert "Horovod's 2 workers reached 82% in 40 s against 64 s for one worker" in text
    assert "MultiWorkerMirrored's 2 workers took longer than\n  one (45 s against 41 s)" in text
    assert "they needed 7 epochs, the single worker 5" in text
    for name in ("horovod-sweep", "tf-sweep"):
        for p in reference.sweep_of(name).points:
            assert p.time_to_target_s is not None, (name, p)
    hvd1, hvd2 = point("horovod-sweep", 1).time_to_target_s, point("horovod-sweep", 2).time_to_target_s
    assert hvd1 and hvd2 and 1 < hvd1 / hvd2 < speedup("horovod-sweep"), (hvd1, hvd2)
    assert round(hvd1) == 64 and round(hvd2) == 40, (hvd1, hvd2)
    tf1, tf2 = (reference.record("tf-sweep", workers=n) for n in (1, 2))
    assert tf1.time_to_target_s and tf2.time_to_target_s
    assert tf2.time_to_target_s > tf1.time_to_target_s, (tf1.time_to_target_s, tf2.time_to_target_s)
    assert (tf1.epochs_to_target, tf2.epochs_to_target) == (5, 7)


def test_lab6_the_unscaled_rate_starts_and_ends_lowest() -> None:
    text = answer("06_scaling.ipynb", "Which change hurts the most in the first epochs")
    assert "Not scaling hurts most in the first epochs" in text and "its curve starts\nlowest" in text
    assert "the unscaled run started lowest (58% after epoch 1, against 59% and 62%)" in text
    assert "ended lowest\n(71% after epoch 6, against 77% without warm-up and 80% with it)" in text
    acc = {label: rec.val_accuracy for label, rec in reference.labelled("learning-rate").items()}
    first, last = ({k: round(100 * v[i]) for k, v in acc.items()} for i in (0, -1))
    assert first == {"not scaled": 58, "×2, no warm-up": 59, "×2, warm-up": 62}, first
    assert last == {"not scaled": 71, "×2, no warm-up": 77, "×2, warm-up": 80}, last


def test_lab4_the_restarted_cluster_resumes_at_the_epoch_that_was_cut() -> None:
    text = answer("04_multi_worker.ipynb", "Which\nepochs will the report list as completed before the kill")
    assert "`epochs completed before the kill: [1]`" in text and "[2, 3]" in text and "nothing repeated" in text
    report = reference.resume_report()
    assert report.completed_before == [1] and report.after == [2, 3] and not report.repeated, report


def test_lab3_a_second_logical_device_on_the_same_cores_is_not_twice_as_fast() -> None:
    text = answer("03_mirrored_strategy.ipynb", 'reference.show("mirrored")')
    assert "About as fast, give or take some tens of percent (and not twice as fast)" in text
    one = reference.record("mirrored", label="1 device(s)").images_per_sec
    two = reference.record("mirrored", label="2 device(s)").images_per_sec
    assert 0.6 <= two / one <= 1.5, (one, two)


def test_lab5_the_fast_worker_takes_more_steps_and_every_step_runs() -> None:
    text = answer("05_parameter_server.ipynb", 'reference.record("slowed-worker")')
    assert "worker 0's bar to be several times taller than worker 1's" in text
    rec = reference.record("slowed-worker")
    steps = {k: len(v) for k, v in (rec.worker_step_times or {}).items()}
    assert steps["0"] >= 2 * steps["1"], steps
    assert "188 with the default batch of 32 on 6,000 images" in text
    assert sum(steps.values()) >= 188 * rec.epochs_run, (steps, rec.epochs_run)


def communication() -> dict:
    return json.loads((LABS / "reference" / "communication.json").read_text())


def test_lab6_the_step_time_and_the_model_use_the_reference_single_worker() -> None:
    one = point("horovod-sweep", 1).images_per_sec
    assert one
    step_ms = 1000 * 32 / one
    text = answer("06_scaling.ipynb", "what speedup and\nefficiency do you expect from the Horovod script")
    assert f"a step of about {round(step_ms)} ms of compute" in text and f"at the {round(one)} images/sec" in text
    from labkit.figures.scaling_model import efficiency

    loss = {n: round(100 * (1 - efficiency(32 / one, 0.18e6 * 4, n, 5e9))) for n in (2, 8)}  # the cell's own case
    model = cell("06_scaling.ipynb", "The\nsmall model on this machine loses little")
    said = f"about {loss[2]}% at 2 workers and {loss[8]}% at 8 (with the reference's step of\n{round(step_ms)} ms"
    assert said in model


def test_lab6_threads_none_against_one_thread_quotes_the_reference_runs() -> None:
    one, two = point("horovod-sweep", 1).images_per_sec, point("horovod-sweep", 2).images_per_sec
    both = reference.record("mirrored", label="1 device(s)").images_per_sec
    assert one and two
    text = cell("06_scaling.ipynb", "one worker with one thread trained")
    assert f"one worker with one thread trained {round(one)} images/sec" in text
    assert f"each\n{round(two):,}: a speedup of {two / one:.2f} (efficiency {round(100 * two / one / 2)}%)" in text
    assert f"trained about {round(both, -1):,.0f} images/sec" in text
    assert f"a speedup of only about {two / both:.2f} (efficiency about {round(100 * two / both / 2)}%)" in text


def test_lab3_a_second_logical_device_quotes_its_gain() -> None:
    one = reference.record("mirrored", label="1 device(s)").images_per_sec
    two = reference.record("mirrored", label="2 device(s)").images_per_sec
    text = answer("03_mirrored_strategy.ipynb", 'reference.show("mirrored")')
    gain = round(100 * (two / one - 1))
    assert f"one device trained {round(one):,} images/sec and two\ndevices {round(two):,}: {gain}% more" in text


def test_lab8_fusion_quotes_the_reference_ratio() -> None:
    fused, unfused = (v for v in communication()["knobs"]["fusion"]["variants"])
    assert unfused["env"]["HOROVOD_FUSION_THRESHOLD"] == "0"
    text = answer("08_communication.ipynb", "Unfused?")
    assert f"about {unfused['comm_s'] / fused['comm_s']:.1f} times" in text
    assert f"({round(1000 * unfused['comm_s'])} ms against {round(1000 * fused['comm_s'])} ms a step" in text


def test_lab8_fp16_ended_below_both_float32_runs_as_the_text_says() -> None:
    """The figures are rendered from the results (``make gen``); the words around them are checked here."""
    f32, f16, again = (v["val_accuracy"] for v in communication()["compression"]["variants"])
    text = answer("08_communication.ipynb", "Does it cost accuracy?")
    assert "float16 ended below both float32 runs" in text
    assert f16[-1] < min(f32[-1], again[-1]), (f16[-1], f32[-1], again[-1])
    assert "stayed inside the float32 runs' band after epoch" in text
    assert any(min(a, b) <= h <= max(a, b) for a, h, b in zip(f32, f16, again, strict=True))


def test_lab8_the_compression_cell_trains_as_many_times_as_it_says() -> None:
    from labkit.measure import compression

    assert len(compression.VARIANTS) == 3
    assert "trains your Horovod script three times" in cell("08_communication.ipynb", "**Does it cost accuracy?**")
