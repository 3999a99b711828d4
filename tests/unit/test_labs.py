"""labkit.course.labs: one registry, consistent with the starters, the solutions and the notebooks."""

from __future__ import annotations

import re

import pytest

from labkit.course import labs

ROOT = labs.ROOT


@pytest.mark.parametrize("lab", list(labs.LABS.values()), ids=lambda lab: lab.name)
def test_registry_matches_the_files(lab: labs.Lab) -> None:
    starter = (ROOT / "labs" / lab.starter).read_text()
    todo_steps = {int(n) for n in re.findall(r"TODO: Step (\d+)", starter)}
    assert todo_steps == set(range(1, lab.n_steps + 1)), f"{lab.starter} has TODOs for steps {sorted(todo_steps)}"
    for k in range(1, lab.n_steps + 1):
        assert lab.solution(k).is_file()
    assert not (ROOT / "solutions" / f"{lab.stem}_after_step_{lab.n_steps + 1:02d}.py").exists()
    assert (ROOT / "labs" / lab.notebook).is_file()
    assert lab.timeout > 0 and all(lab.steps)


def test_unknown_lab_and_step_are_named() -> None:
    with pytest.raises(ValueError, match="unknown lab 'tpu'"):
        labs.get("tpu")
    with pytest.raises(ValueError, match="steps 1..8"):
        labs.get("horovod").solution(9)
    assert labs.by_script("labs/fashion_mnist_ps.py").name == "parameter-server"
    assert labs.by_script("other.py") is None
