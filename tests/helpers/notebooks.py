"""Reading the course's notebooks: their code cells (checked clean as committed) and the text of their outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat


def clean_code_cells(path: Path) -> list:
    """The code cells of a notebook, after checking it is valid and committed without outputs or long cells."""
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code), "clear the outputs before committing"
    assert all(len(c.source.splitlines()) <= 15 for c in code), "long code belongs in labkit"
    return code


def outputs_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                parts.append(out.text)
            elif out.output_type in ("execute_result", "display_data"):
                parts.append(str(out.get("data", {}).get("text/plain", "")))
    return "".join(parts)
