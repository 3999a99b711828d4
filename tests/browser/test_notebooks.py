"""The lab notebooks run from top to bottom (in the browser test's JupyterLab), and are committed clean."""

from __future__ import annotations

import nbformat
import pytest
from helpers import paths
from helpers.notebooks import outputs_text

LABS = paths.LABS
NOTEBOOKS = {
    # notebook: text that must appear in its outputs
    "00_start_here.ipynb": ["labkit doctor", "b was computed on", "CPU:", "GFLOP/s"],
    "01_baseline.ipynb": ["Images/sec:", "Test accuracy:", "images/sec", "test accuracy:"],
}


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_is_committed_clean(name):
    nb = nbformat.read(LABS / name, as_version=4)
    nbformat.validate(nb)
    assert nb.nbformat == 4
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, "clear the outputs before committing"
            assert len(cell.source.splitlines()) <= 15, "long code belongs in labkit"


@pytest.mark.parametrize("name", sorted(p.name for p in LABS.glob("*.ipynb")))
def test_notebook_opens_with_what_it_takes_and_gives(name: str) -> None:
    """Objectives, the time on a CPU and on a GPU machine, and what the learner has at the end."""
    first = nbformat.read(LABS / name, as_version=4).cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# ")
    time_part = first.source.partition("**Time:**")[2].partition("**At the end**")[0]
    assert "CPU" in time_part and "GPU" in time_part, "say how long the cells compute on a CPU and on a GPU"
    assert "**At the end**" in first.source and ("**You will**" in first.source or "you will" in first.source)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_runs(name, notebooks):
    text = outputs_text(notebooks.run(name).nb)
    for expected in NOTEBOOKS[name]:
        assert expected in text, f"{expected!r} not in the outputs of {name}"
    assert "Traceback" not in text
