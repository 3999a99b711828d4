"""A lab is declared once (labkit.course.labs.LABS) and judged by the module the check package's table gives it:
everything else (the generated files, the grading table, the notebook's check function, the run records' lab)
follows from the declaration."""

from __future__ import annotations

import pytest

import labkit.check
from labkit.check import judges
from labkit.course import labs, release, sources
from labkit.records import runs

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


def test_every_declared_lab_has_its_judges_and_no_judges_lack_a_lab() -> None:
    assert list(judges.JUDGES) == list(labs.LABS)
    for name, module in judges.JUDGES.items():
        assert len(module.STEPS) == labs.get(name).n_steps, name
        assert callable(module.collect), name


def test_each_lab_has_a_check_function_named_after_it() -> None:
    for name, lab in labs.LABS.items():
        fn = getattr(labkit.check, name.replace("-", "_"))
        assert lab.title in (fn.__doc__ or "")
        assert name.replace("-", "_") in labkit.check.__all__
    with pytest.raises(AttributeError):
        labkit.check.no_such_lab  # noqa: B018
    with pytest.raises(AttributeError):
        labkit.check.__wrapped__  # noqa: B018


def test_the_grading_table_lists_the_labs_worth_points_in_order() -> None:
    table = tomllib.loads(release.grading_table())["tool"]["labkit"]["grading"]
    graded = [lab for lab in labs.LABS.values() if lab.points]
    assert table["labs"] == [lab.name for lab in graded]
    assert table["points"] == {lab.name: lab.points for lab in graded}
    assert "scale-out" not in table["labs"]  # worth no points: checked, not graded


def test_a_new_lab_declared_once_is_generated_graded_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    new = labs.Lab("profiling", "Profile your own step", ("trace a few steps", "read compute against all-reduce"),
                   "fashion_mnist_profile.py", "10_profiling.ipynb", 200.0, 5)
    monkeypatch.setattr(labs, "LABS", {**labs.LABS, new.name: new})
    outputs = [t.output for t in sources.lab_targets(new)]
    assert outputs == ["labs/fashion_mnist_profile.py", "solutions/fashion_mnist_profile_after_step_01.py",
                       "solutions/fashion_mnist_profile_after_step_02.py"]
    assert {t.template for t in sources.lab_targets(new)} == {"solutions/source/fashion_mnist_profile.py.tmpl"}
    assert tomllib.loads(release.grading_table())["tool"]["labkit"]["grading"]["points"]["profiling"] == 5
    assert runs.lab_and_step("solutions/fashion_mnist_profile_after_step_02.py") == ("profiling", "2")
    assert runs.lab_and_step("fashion_mnist_after_step_02.py") == ("horovod", "2")
    assert labkit.check.profiling.__name__ == "profiling"
    with pytest.raises(ValueError, match="has no judges"):
        judges.of("profiling")  # declared, not yet judged: said plainly


def test_a_lab_that_continues_another_is_generated_from_its_template() -> None:
    targets = sources.lab_targets(labs.get("communication"))
    assert {t.template for t in targets} == {"solutions/source/fashion_mnist.py.tmpl"}
    assert [t.version for t in targets] == [labs.get("horovod").n_steps + 1]
    # Lab 9 continues lab 8, which continues lab 2: its steps come after both labs' steps, in lab 2's template.
    targets = sources.lab_targets(labs.get("at-scale"))
    assert {t.template for t in targets} == {"solutions/source/fashion_mnist.py.tmpl"}
    assert [t.version for t in targets] == [10, 11, 12, 13, 14]
    assert runs.lab_and_step("fashion_mnist_at_scale_after_step_02.py") == ("at-scale", "2")


@pytest.mark.parametrize(("name", "expected"), [
    ("fashion_mnist_ps_after_step_03.py", ("parameter-server", "3")),
    ("fashion_mnist_communication_after_step_01.py", ("communication", "1")),
    ("fashion_mnist_multiworker.py", ("multiworker", None)),
    ("fashion_mnist_original.py", ("horovod", None)),
    ("my_own_script.py", (None, None)),
    ("fashion_mnistic.py", (None, None)),
])
def test_a_file_name_tells_its_lab_and_step(name: str, expected: tuple) -> None:
    assert runs.lab_and_step(name) == expected
