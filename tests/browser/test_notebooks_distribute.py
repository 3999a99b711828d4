"""The tf.distribute notebooks run in quick mode and leave no process behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import browser, paths
from helpers.notebooks import outputs_text

LABS = paths.LABS
NOTEBOOKS = ["03_mirrored_strategy.ipynb", "04_multi_worker.ipynb", "05_parameter_server.ipynb"]
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_without_outputs(name: str) -> None:
    import nbformat

    nb = nbformat.read(LABS / name, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{name} has outputs"


@pytest.mark.slow
def test_lab_3_shows_where_each_strategy_keeps_a_variable(notebooks) -> None:
    """The relatives of MirroredStrategy (no script of the learner's involved): in the starters' run."""
    text = outputs_text(notebooks.run("03_mirrored_strategy.ipynb").nb)
    assert "MirroredVariable: 2 copy on CPU:0, CPU:1" in text and "AggregatingVariable: 1 copy on CPU:0" in text
    assert "['CPU:0', 'CPU:1'] [ 9. 21. 33. 45.]" in text


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(name, marks=browser.tier(name, "finished")) for name in NOTEBOOKS])
def test_notebook_runs_and_leaves_nothing_running(name: str, finished_notebooks) -> None:
    done = finished_notebooks.run(name)  # every lab finished: the cells run the learner's own scripts
    nb = done.nb
    text = "\n".join(
        o.get("text", "") if isinstance(o.get("text", ""), str) else ""
        for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )
    if name.startswith("03"):  # the relatives: where each strategy keeps a variable; replication by hand
        assert "MirroredVariable: 2 copy on CPU:0, CPU:1" in text and "AggregatingVariable: 1 copy on CPU:0" in text
        assert "['CPU:0', 'CPU:1'] [ 9. 21. 33. 45.]" in text
    if name.startswith("04"):
        assert "nothing repeated: training resumed from the last backup" in text
        assert "exit codes: [0, 0]" in text
    if name.startswith("05"):  # with worker 1 slowed down, worker 0 ran more of the steps
        slowed = [r for r in done.new_records(Path("runs") / "runs.jsonl") if r.extra.get("slowed")]
        assert all("fashion_mnist_ps.py" in str(r.script) for r in slowed), slowed  # the learner's script
        assert slowed and slowed[-1].extra["slowed"] == {"task": "worker.1", "share": 0.2}, slowed
        steps = slowed[-1].worker_steps or {}
        assert steps["0"] > steps["1"] and steps["0"] + steps["1"] >= slowed[-1].epochs_run, steps
    from helpers import browser

    left = browser.leftovers(finished_notebooks.course, "fashion_mnist_mirrored.py", "fashion_mnist_multiworker",
                             "fashion_mnist_ps", "labkit.instrument.start tfdist")  # of this course only
    assert left == [], f"processes of {name} are still running: {left}"
