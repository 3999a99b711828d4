"""labs/07_scale_out.ipynb runs; its Slurm cells submit to the tests' single-node Slurm cluster, and as root its
virtual-node cells run across two nodes, by hostfile, over ssh and as Slurm jobs."""

from __future__ import annotations

import os
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
    assert "Slurm: a cluster answers" in text and "#SBATCH --gpus-per-node=4" in text
    assert "allreduce on the engines: [3, 3]" in text
    assert "kind: MPIJob" in text and '"index": 3' in text
    assert "Traceback" not in text
    new = done.new_records(Path("runs") / "runs.jsonl")
    assert [r.launcher for r in new if r.launcher == "slurm"] == ["slurm", "slurm"]
    seen = [(r.launcher, r.strategy, r.status, r.workers) for r in new]
    assert all(r.status == "ok" and r.workers == 2 for r in new), seen
    # Horovod ranks started by mpirun in the allocation; tf.distribute workers with TF_CONFIG made from it.
    strategies = [str(r.strategy) for r in new if r.launcher == "slurm"]
    assert strategies[0] == "horovod" and "MultiWorkerMirrored" in strategies[1], strategies


@pytest.mark.slow
@pytest.mark.horovod
def test_notebook_runs_on_virtual_nodes_with_and_without_slurm(finished_notebooks) -> None:
    """As root: the hostfile run (2 nodes x 2 slots), one worker per node over ssh, and two Slurm jobs of
    2 nodes x 1 task, each rank on the host and local rank the layout gives."""
    if os.geteuid() != 0:
        pytest.skip("virtual nodes need root")
    done = finished_notebooks.run("07_scale_out.ipynb")
    assert "Not run:" not in outputs_text(done.nb)
    new = done.new_records(Path("runs") / "virtual_nodes.jsonl")
    placed = [(r.launcher, str(r.strategy), r.status,
               sorted((str(x.host), x.local_rank) for x in r.ranks or [])) for r in new]
    hostfile, one_each, slurm_mpirun, slurm_tf = placed
    assert hostfile[2] == "ok" and hostfile[3] == [("node1", 0), ("node1", 1), ("node2", 0), ("node2", 1)], placed
    assert one_each[2] == "ok" and "MultiWorkerMirrored" in one_each[1], placed
    assert [h for h, _ in one_each[3]] == ["node1", "node2"], placed
    assert slurm_mpirun[:3] == ("slurm", "horovod", "ok") and slurm_mpirun[3] == [("node1", 0), ("node2", 0)], placed
    assert slurm_tf[0] == "slurm" and "MultiWorkerMirrored" in slurm_tf[1] and slurm_tf[2] == "ok", placed
    assert [h for h, _ in slurm_tf[3]] == ["node1", "node2"], placed
