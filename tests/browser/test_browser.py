"""Every notebook of the released course, run top to bottom in JupyterLab in a real browser, shows no error,
in two states: the untouched starters (a learner who just began) and every lab finished.

What fails: an error or a traceback in an output, text on stderr (JupyterLab shows it on red; ipyparallel
engines' native messages land there), TensorFlow's log lines, a cell still running at the timeout, a widget
that does not render, a plot missing where one is expected, JupyterLab's news prompt. With the starters, every
cell that needs a finished script says so and shows the course's reference results; with finished scripts, no
cell does. Screenshots of each notebook are kept in ``test-artifacts/browser/<state>/``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import browser, paths
from helpers.notebooks import outputs_text

LABS = paths.LABS
NOTEBOOKS = sorted(p.name for p in LABS.glob("*.ipynb"))
# Plots and widgets each notebook must show (at least), in both states unless STARTERS says otherwise.
EXPECT = {
    "01_baseline.ipynb": {"images": 1},  # the training curves from the run record
    "02_horovod.ipynb": {"images": 3, "widgets": 1},  # the ranks' weights at steps 3 and 4, one big vs two small
    "03_mirrored_strategy.ipynb": {"widgets": 1},
    "04_multi_worker.ipynb": {"images": 1, "widgets": 1},  # the kill-and-resume timeline
    "05_parameter_server.ipynb": {"images": 1},  # steps per worker, one worker slowed down
    # sweep, comparison, time to accuracy, learning rates, training curves; the live dashboard
    "06_scaling.ipynb": {"images": 6, "widgets": 1},
    # the link against the model, two knobs, fp16 accuracy, the straggler, elastic, the script at several link rates
    "08_communication.ipynb": {"images": 7},
    # rank 0's profiled steps (the course's reference with the starters); the large-batch experiment's reference
    "09_at_scale.ipynb": {"images": 2},
}
# With the starters nothing trains where a finished script is needed, so no progress widget there: the reference
# results instead (the kill-and-resume timeline, the scaling plots, curves instead of the live dashboard).
STARTERS = {"03_mirrored_strategy.ipynb": {}, "04_multi_worker.ipynb": {"images": 1},
            "06_scaling.ipynb": {"images": 6}}
# Cells that need a finished script, by notebook: how many say so (and show the reference results) with starters.
NEED_FINISHED = {"03_mirrored_strategy.ipynb": 1, "04_multi_worker.ipynb": 2, "05_parameter_server.ipynb": 2,
                 "06_scaling.ipynb": 4, "08_communication.ipynb": 2, "09_at_scale.ipynb": 1}
SAYS_STARTER = "is still the starter: finish"


def test_every_notebook_of_the_course_is_covered() -> None:
    assert len(NOTEBOOKS) >= 8 and set(EXPECT) <= set(NOTEBOOKS)


def test_what_a_learner_would_see_as_wrong_is_found() -> None:
    from helpers import browser

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
@pytest.mark.parametrize(("name", "state"), [pytest.param(name, state, marks=browser.tier(name, state))
                                            for name in NOTEBOOKS for state in browser.STATES])
def test_notebook_runs_in_the_browser_without_errors(name: str, state: str, request: pytest.FixtureRequest) -> None:

    runner = request.getfixturevalue("notebooks" if state == "starters" else "finished_notebooks")
    done = runner.run(name)
    assert done.screenshot.is_file() and done.screenshot.read_bytes()[:4] == b"\x89PNG"
    expect = (STARTERS if state == "starters" else {}).get(name, EXPECT.get(name, {}))
    found = done.problems(**expect)
    assert found == [], "\n".join(found)
    text = outputs_text(done.nb)
    if state == "starters":
        assert text.count(SAYS_STARTER) >= NEED_FINISHED.get(name, 0), text[-3000:]
        if NEED_FINISHED.get(name):
            assert "the course's reference results" in text
    else:
        assert SAYS_STARTER not in text, text[-3000:]
    assert "solutions/" not in text  # nothing runs or names a solution
    assert browser.leftovers(runner.course, "labkit.instrument.start") == []


def test_the_released_course_gets_the_final_solutions_only_when_finished(tmp_path: Path) -> None:
    from helpers import browser

    from labkit.course import labs
    from labkit.ui import notebook

    for state in browser.STATES:
        out = browser.released_course(tmp_path / state, state)
        assert not (out / "solutions").exists() and (out / ".venv" / "bin" / "python").exists()
        scripts = [out / "labs" / starter for starter in browser.final_solutions()]
        assert [notebook.untouched(s) for s in scripts] == [state == "starters"] * len(scripts), state
        needs = [(s, labs.by_script(s)) for s in scripts]  # finished: every step passed in the learner's checks
        assert [notebook.ready(s, lab.name, lab.n_steps) for s, lab in needs] == [state == "finished"] * len(needs)
    import os
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(out)}  # as lab_server gives it: the kernel imports the released labkit
    shown = subprocess.run([str(out / ".venv" / "bin" / "python"), "-c", "import labkit; print(labkit.__file__)"],
                           env=env, cwd=out / "labs", capture_output=True, text=True, timeout=120)
    assert shown.stdout.strip() == str(out / "labkit" / "__init__.py"), shown
