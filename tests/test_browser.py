"""Every notebook of the course, run top to bottom in JupyterLab in a real browser, shows no error.

What fails: an error or a traceback in an output, text on stderr (JupyterLab shows it on red), a cell
still running at the timeout, a widget that does not render, a plot missing where one is expected.
Screenshots of each notebook are kept in ``test-artifacts/browser/``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

LABS = Path(__file__).resolve().parent.parent / "labs"
NOTEBOOKS = sorted(p.name for p in LABS.glob("*.ipynb"))
# Plots and widgets each notebook must show (at least).
EXPECT = {
    "01_baseline.ipynb": {"images": 1},  # the training curves from the run record
    "02_horovod.ipynb": {"images": 3, "widgets": 1},  # the ranks' weights at steps 3 and 4, one big vs two small
    "03_mirrored_strategy.ipynb": {"widgets": 1},
    "04_multi_worker.ipynb": {"images": 1, "widgets": 1},  # the kill-and-resume timeline
    "05_parameter_server.ipynb": {"images": 1},  # steps per worker, one worker slowed down
    "06_scaling.ipynb": {"images": 4, "widgets": 1},  # sweep, comparison, time to accuracy, learning rates
}



def test_every_notebook_of_the_course_is_covered() -> None:
    assert len(NOTEBOOKS) >= 8 and set(EXPECT) <= set(NOTEBOOKS)


def test_what_a_learner_would_see_as_wrong_is_found() -> None:
    import browser

    def cell(index: int, *outputs: dict, prompt: str = "[1]:", images: int = 0, widget_errors: int = 0) -> dict:
        return {"index": index, "source": "x = 1", "prompt": prompt, "outputs": list(outputs), "images": images,
                "widgets": 0, "widgetErrors": widget_errors}

    clean = {"cells": [cell(0, {"output_type": "stream", "name": "stdout", "text": "Epoch 1/1\n"}, images=1)]}
    assert browser.problems(clean, images=1) == []
    bad = {"timed_out": True, "cells": [
        cell(0, {"output_type": "stream", "name": "stderr", "text": "progress\n"}),
        cell(1, {"output_type": "error", "ename": "ValueError", "evalue": "no", "traceback": []}),
        cell(2, {"output_type": "stream", "name": "stdout", "text": "Traceback (most recent call last):\n  x\n"}),
        cell(3, {"output_type": "stream", "name": "stdout", "text": "INFO:tensorflow:Collective all_reduce\n"}),
        cell(4, {"output_type": "stream", "name": "stdout",
                 "text": "E0000 00:00:1795 cuda_executor.cc:1] failed call to cuInit\n"}),
        cell(5, prompt="[*]:", widget_errors=1)]}
    found = "\n".join(browser.problems(bad, images=1))
    for expected in ("stderr", "raised ValueError", "traceback", "INFO:tensorflow", "cuInit", "still running",
                     "did not render", "fewer than 1 plots"):
        assert expected in found, found


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_in_the_browser_without_errors(name: str, notebooks, running) -> None:  # noqa: ANN001
    done = notebooks.run(name)
    assert done.screenshot.is_file() and done.screenshot.read_bytes()[:4] == b"\x89PNG"
    found = done.problems(**EXPECT.get(name, {}))
    assert found == [], "\n".join(found)
    assert not running("labkit.probe") and not running("labkit.dprobe")
