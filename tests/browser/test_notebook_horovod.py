"""labs/02_horovod.ipynb runs in small mode and leaves the learner's script untouched."""

from __future__ import annotations

import re

import pytest
from helpers import paths
from helpers.notebooks import clean_code_cells, outputs_text

LABS = paths.LABS
NB = LABS / "02_horovod.ipynb"


def test_committed_clean_with_short_cells() -> None:
    code = clean_code_cells(NB)
    # every one of the seven steps has a check cell
    assert [f"check.horovod({k}" in "".join(c.source for c in code) for k in range(1, 8)] == [True] * 7


@pytest.mark.slow
@pytest.mark.horovod
def test_notebook_runs_and_leaves_the_learners_script_untouched(notebooks) -> None:
    labs = notebooks.labs  # the released course, its starters untouched
    before = (labs / "fashion_mnist.py").read_bytes()
    text = outputs_text(notebooks.run("02_horovod.ipynb").nb)
    # The untouched starter trains, and its check says what to do first.
    assert "job finished OK" in text and "Images/sec" in text
    assert "Horovod was not initialised" in text and "hvd.init()" in text
    assert "unrecognized arguments: --checkpoint-dir" in text  # step 7's runs: the starter has no such option
    assert "rank 0 of 2: sum of ranks = 1" in text and "rank 1 of 2: sum of ranks = 1" in text
    assert "average [0.5], sum [1.]" in text and "broadcast from 1 [1.], allgather [0. 1.]" in text
    assert "local rank 1" in text and "--- rank 1 ---" in text  # every rank shown, and the real command
    assert re.search(r"^\$ \S*mpirun -np 2 ", text, re.M), text[-3000:]
    assert "engine set stopped" not in text and "cuInit" not in text  # engines stop quietly, and show no CUDA noise
    assert (labs / "fashion_mnist.py").read_bytes() == before
    assert (labs / "fashion_mnist_original.py").exists()
