"""The tf.distribute notebooks run headless in fast mode and leave no process behind."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from labkit import notebook

LABS = Path(__file__).resolve().parent.parent / "labs"
NOTEBOOKS = ["03_mirrored_strategy.ipynb", "04_multi_worker.ipynb", "05_parameter_server.ipynb"]
MARK = "LABKIT_NB_TEST_MARK"


def _marked(value: str) -> list[int]:
    needle = f"{MARK}={value}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_without_outputs(name: str) -> None:
    import nbformat

    nb = nbformat.read(LABS / name, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{name} has outputs"


@pytest.mark.slow
@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_executes_in_fast_mode(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import nbformat
    from nbclient import NotebookClient

    mark = uuid.uuid4().hex
    monkeypatch.setenv(notebook.QUICK_VAR, "1")
    monkeypatch.setenv(MARK, mark)
    nb = nbformat.read(LABS / name, as_version=4)
    client = NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(LABS)}})
    client.execute()
    text = "\n".join(
        o.get("text", "") if isinstance(o.get("text", ""), str) else ""
        for c in nb.cells if c.cell_type == "code" for o in c.outputs
    )
    if name.startswith("04"):
        assert "nothing repeated: training resumed from the last backup" in text
        assert "exit codes: [0, 0]" in text
    assert _marked(mark) == [], "processes of the notebook are still running"
