"""labs/07_scale_out.ipynb runs; its Slurm cells submit to the tests' single-node Slurm cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import paths
from helpers.notebooks import clean_code_cells, outputs_text

LABS = paths.LABS
NB = LABS / "07_scale_out.ipynb"


def test_committed_clean_with_short_cells() -> None:
    assert clean_code_cells(NB), "lab 7 has code cells"


@pytest.mark.slow
@pytest.mark.horovod
def test_notebook_runs_and_submits_to_slurm(finished_notebooks, slurm: object) -> None:
    done = finished_notebooks.run("07_scale_out.ipynb")  # once per session: the browser test may have run it
    nb = done.nb
    text = outputs_text(nb)
    assert "rank 4 -> node2, local rank 2" in text and "node1 slots=2" in text
    assert "merge" in text.lower() or "twice" in text.lower()  # the duplicate host was named
    assert "Slurm: a cluster answers" in text and "#SBATCH --gpus-per-task=1" in text
    assert "allreduce on the engines: [3, 3]" in text
    assert "kind: MPIJob" in text and '"index": 3' in text
    assert "Traceback" not in text
    new = done.new_records(Path("runs") / "runs.jsonl")
    assert [r["launcher"] for r in new if r["launcher"] == "slurm"] == ["slurm", "slurm"]
    assert all(r["status"] == "ok" and r["workers"] == 2 for r in new)
    # Horovod ranks started by mpirun in the allocation; tf.distribute workers with TF_CONFIG made from it.
    strategies = [str(r.get("strategy")) for r in new if r["launcher"] == "slurm"]
    assert strategies[0] == "horovod" and "MultiWorkerMirrored" in strategies[1], strategies
