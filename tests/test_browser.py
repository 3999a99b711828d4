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
    "06_scaling.ipynb": {"images": 3, "widgets": 1},
}

pytestmark = [pytest.mark.slow, pytest.mark.horovod]


def test_every_notebook_of_the_course_is_covered() -> None:
    assert len(NOTEBOOKS) >= 8 and set(EXPECT) <= set(NOTEBOOKS)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_in_the_browser_without_errors(name: str, notebooks, running) -> None:  # noqa: ANN001
    done = notebooks.run(name)
    assert done.screenshot.is_file() and done.screenshot.read_bytes()[:4] == b"\x89PNG"
    found = done.problems(**EXPECT.get(name, {}))
    assert found == [], "\n".join(found)
    assert not running("labkit.probe") and not running("labkit.dprobe")
