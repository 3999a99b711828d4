"""labkit.course.labs: one registry, consistent with the starters, the solutions and the notebooks."""

from __future__ import annotations

import re

import pytest

from labkit.course import labs

ROOT = labs.ROOT


@pytest.mark.parametrize("lab", list(labs.LABS.values()), ids=lambda lab: lab.name)
def test_registry_matches_the_files(lab: labs.Lab) -> None:
    starter = "".join((ROOT / "labs" / name).read_text() for name in lab.files)  # a file per step: all of them
    todo_steps = {int(n) for n in re.findall(r"TODO: Step (\d+)", starter)}
    first = labs.lineage(lab)[0] if lab.builds_on else lab  # a lab that continues others: the first one's TODOs
    assert todo_steps == set(range(1, first.n_steps + 1)), f"{lab.files} have TODOs for steps {sorted(todo_steps)}"
    for k in range(1, lab.n_steps + 1):  # each step's TODO is in the file the step asks for
        assert f"TODO: Step {k}" in (ROOT / "labs" / lab.step_file(k)).read_text() or lab.builds_on
    for k in range(1, lab.n_steps + 1):
        assert lab.solution(k).is_file()
    assert not (ROOT / "solutions" / f"{lab.stem}_after_step_{lab.n_steps + 1:02d}.py").exists()
    assert (ROOT / "labs" / lab.notebook).is_file()
    assert lab.timeout > 0 and all(lab.steps)


def test_a_lab_that_continues_another_shares_its_starter_not_its_solutions() -> None:
    stems = [lab.stem for lab in labs.LABS.values()]
    assert len(set(stems)) == len(stems), "two labs would write the same solution files"
    names = list(labs.LABS)
    continuing = [lab for lab in labs.LABS.values() if lab.builds_on]
    assert [lab.name for lab in continuing] == ["communication", "at-scale"]
    for lab in continuing:
        first, before = labs.lineage(lab)[0], labs.get(lab.builds_on)
        assert lab.starter == first.starter and names.index(before.name) < names.index(lab.name)
        assert labs.by_script(lab.starter) is first  # the script's own lab is the one it started in
    assert [x.name for x in labs.lineage(labs.get("at-scale"))] == ["horovod", "communication"]
    assert labs.get("communication").solution(1).name == "fashion_mnist_communication_after_step_01.py"
    assert labs.get("horovod").stem == "fashion_mnist"


def test_a_lab_with_a_file_per_step_names_each_steps_solution_after_its_file() -> None:
    lab = labs.get("scale-out")
    assert lab.files == ("cluster.sbatch", "cluster_hostfile")
    assert [lab.step_file(k) for k in (1, 2)] == ["cluster_hostfile", "cluster.sbatch"]
    assert lab.solution(1).name == "cluster_hostfile_after_step_01"
    assert lab.solution(2).name == "cluster_after_step_02.sbatch"
    assert labs.by_script("labs/cluster_hostfile") is lab and labs.by_script("cluster.sbatch") is lab
    assert labs.get("horovod").step_file(3) == "fashion_mnist.py" and labs.get("horovod").files == ("fashion_mnist.py",)


def test_unknown_lab_and_step_are_named() -> None:
    with pytest.raises(ValueError, match="unknown lab 'tpu'"):
        labs.get("tpu")
    with pytest.raises(ValueError, match="steps 1..8"):
        labs.get("horovod").solution(9)
    assert labs.by_script("labs/fashion_mnist_ps.py").name == "parameter-server"
    assert labs.by_script("other.py") is None


def _cells(notebook: str) -> list[tuple[str, str]]:
    import json

    return [(c["cell_type"], "".join(c["source"])) for c in json.loads((ROOT / "labs" / notebook).read_text())["cells"]]


@pytest.mark.parametrize("notebook", sorted(p.name for p in (ROOT / "labs").glob("*.ipynb")))
def test_every_predict_question_has_a_collapsed_answer(notebook: str) -> None:
    """An answer follows each question, in the same cell or a later one, before the next question."""
    cells, unanswered = _cells(notebook), []
    for i, (kind, source) in enumerate(cells):
        if kind != "markdown" or "**Predict" not in source:
            continue
        later = [source.rpartition("**Predict")[2]]
        for kind2, source2 in cells[i + 1:]:
            if kind2 == "markdown" and "**Predict" in source2:
                break
            later.append(source2)
        if not any("<details><summary>Answer</summary>" in s for s in later):
            unanswered.append(source.partition("**Predict")[2][:80])
    assert unanswered == [], f"{notebook}: questions without an answer: {unanswered}"


def test_each_horovod_step_asks_a_prediction_before_its_check() -> None:
    cells = _cells(labs.get("horovod").notebook)
    asked = {int(m.group(1)) for (k0, before), (k1, code) in zip(cells, cells[1:], strict=False)
             if k0 == "markdown" and "**Predict, then run.**" in before and k1 == "code"
             for m in [re.search(r"\bcheck\.horovod\((\d)", code)] if m}
    assert asked == set(range(1, labs.get("horovod").n_steps + 1))
