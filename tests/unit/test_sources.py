"""labkit.course.sources: starter and step-solution scripts generated from annotated templates."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import paths

from labkit.course import labs, sources

ROOT = paths.ROOT
BLANK_LINE_RULES = "E301,E302,E303,E304,E305,E306"  # pycodestyle's blank lines, as ruff checks them

TEMPLATE = """\
#!/usr/bin/env python
# {title} in {name}
common = 1
#% step 1
a = 1
#% else
# TODO: Step 1
#% end
#% step 2
b = 2
    #% step 3
c = 3
    #% else
# TODO: Step 3
    #% end
#% end
#% step 4
d = 4
#% end
tail = 0
"""


def kept(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.startswith("#!")]


def test_version_0_is_the_starter():
    assert kept(sources.render(TEMPLATE, 0)) == ["# {title} in {name}", "common = 1", "# TODO: Step 1", "tail = 0"]


def test_blocks_up_to_the_version_are_kept():
    assert kept(sources.render(TEMPLATE, 1)) == ["# {title} in {name}", "common = 1", "a = 1", "tail = 0"]
    assert kept(sources.render(TEMPLATE, 2)) == [
        "# {title} in {name}", "common = 1", "a = 1", "b = 2", "# TODO: Step 3", "tail = 0",
    ]
    assert kept(sources.render(TEMPLATE, 3)) == [
        "# {title} in {name}", "common = 1", "a = 1", "b = 2", "c = 3", "tail = 0",
    ]
    assert "d = 4" in sources.render(TEMPLATE, 99)


def test_nested_else_is_dropped_with_its_outer_block():
    # Step 3's else-part sits inside step 2: without step 2 neither part appears.
    assert "TODO: Step 3" not in sources.render(TEMPLATE, 1)


def test_markers_never_reach_the_output():
    for version in (0, 1, 2, 3, 99):
        assert "#%" not in sources.render(TEMPLATE, version)


def test_fields_are_filled():
    out = sources.render(TEMPLATE, 0, title="The lab", name="lab.py")
    assert "# The lab in lab.py" in out.splitlines()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("#% step 1\nx = 1\n", "not closed"),
        ("x = 1\n#% end\n", "without"),
        ("#% else\nx = 1\n", "without"),
        ("#% step 1\n#% step 2\n#% end\n", "not closed"),
    ],
)
def test_unbalanced_markers_raise(text, message):
    with pytest.raises(ValueError, match=message):
        sources.render(text, 1)


def test_committed_scripts_are_in_sync_with_their_templates():
    assert sources.generate(check=True) == []


def test_the_communication_lab_goes_on_from_the_horovod_solution():
    """Its step 1 is version 9 of the Horovod template: the last Horovod step and the --fp16-allreduce option;
    the Horovod lab's own scripts stay without it."""
    template = "solutions/source/fashion_mnist.py.tmpl"
    by_output = {t.output: t for t in sources.all_targets()}
    step = by_output["solutions/fashion_mnist_communication_after_step_01.py"]
    assert (step.template, step.version) == (template, labs.get("horovod").n_steps + 1)
    assert by_output["solutions/fashion_mnist_solution.py"].version == labs.get("horovod").n_steps
    body = sources.include((ROOT / template).read_text())
    text, horovod = sources.render(body, 9).splitlines(), sources.render(body, 8).splitlines()
    assert '    p.add_argument("--fp16-allreduce", action="store_true",' in text
    assert "        opt = hvd.DistributedOptimizer(opt, compression=hvd.Compression.fp16)" in text
    assert set(horovod) - set(text) == {"    opt = hvd.DistributedOptimizer(opt)"}  # now under `else:`
    assert [t.output for t in sources.all_targets() if t.version <= 8 and "fp16" in sources.expected(t)] == []


def test_every_target_has_the_generated_header():
    for t in sources.all_targets():
        text = sources.expected(t)
        first = text.splitlines()[:3]
        assert any(f"Generated from {t.template} (version {t.version})" in line for line in first), t.output


def write_template(root, text=TEMPLATE):
    (root / "solutions" / "source").mkdir(parents=True)
    (root / "solutions" / "source" / "t.py.tmpl").write_text(text)
    return [
        sources.Target("solutions/source/t.py.tmpl", 0, "labs/t.py", "starter"),
        sources.Target("solutions/source/t.py.tmpl", 1, "solutions/t_after_step_01.py", "after step 1"),
    ]


def test_generate_writes_then_checks(tmp_path):
    targets = write_template(tmp_path)
    assert sources.generate(check=True, root=tmp_path, targets=targets) == ["labs/t.py", "solutions/t_after_step_01.py"]
    assert not (tmp_path / "labs" / "t.py").exists()  # check only compares

    assert sources.generate(root=tmp_path, targets=targets) == ["labs/t.py", "solutions/t_after_step_01.py"]
    starter = (tmp_path / "labs" / "t.py").read_text()
    assert starter.startswith("#!/usr/bin/env python\n# Generated from solutions/source/t.py.tmpl (version 0)")
    assert "# starter in t.py" in starter and "# TODO: Step 1" in starter
    assert "a = 1" in (tmp_path / "solutions" / "t_after_step_01.py").read_text()
    assert sources.generate(check=True, root=tmp_path, targets=targets) == []
    assert sources.generate(root=tmp_path, targets=targets) == []  # up to date: nothing written


def test_regenerating_over_an_edited_starter_keeps_a_backup(tmp_path):
    targets = write_template(tmp_path)
    sources.generate(root=tmp_path, targets=targets)
    starter = tmp_path / "labs" / "t.py"
    edited = starter.read_text().replace("# TODO: Step 1", "a = 1  # my work")
    starter.write_text(edited)

    assert sources.generate(check=True, root=tmp_path, targets=targets) == ["labs/t.py"]
    assert sources.generate(root=tmp_path, targets=targets) == ["labs/t.py"]
    assert starter.read_text() == sources.expected(targets[0], tmp_path)
    backups = list((tmp_path / "labs").glob("t.py.*.bak"))
    assert len(backups) == 1
    assert backups[0].read_text() == edited


def test_solutions_are_overwritten_without_backup(tmp_path):
    targets = write_template(tmp_path)
    sources.generate(root=tmp_path, targets=targets)
    solution = tmp_path / "solutions" / "t_after_step_01.py"
    solution.write_text("stale\n")
    assert sources.generate(root=tmp_path, targets=targets) == ["solutions/t_after_step_01.py"]
    assert solution.read_text() == sources.expected(targets[1], tmp_path)
    assert not list(tmp_path.rglob("*.bak"))


def test_backup_keeps_each_version_of_a_learners_script_once(tmp_path):
    script = tmp_path / "fashion_mnist.py"
    script.write_text("v1\n")
    first = sources.backup(script)
    assert first.name == "fashion_mnist_original.py" and first.read_text() == "v1\n"
    assert sources.backup(script) == first  # unchanged: nothing new
    script.write_text("v2\n")
    second = sources.backup(script)
    assert second.name.startswith("fashion_mnist_2") and second.read_text() == "v2\n"
    second = second.rename(tmp_path / "fashion_mnist_20260101-120000.py")  # as kept by an earlier session
    assert sources.backup(script) == second  # v2 is kept already: no copy per notebook run
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["fashion_mnist.py", first.name, second.name])
    assert script.read_text() == "v2\n" and first.read_text() == "v1\n"


def test_an_include_keeps_the_blank_lines_around_it(tmp_path):
    parts = tmp_path / sources.PARTS
    parts.mkdir(parents=True)
    (parts / "helpers.py").write_text("def helper():\n    return 1\n\n\n")
    template = "import os\n\n\n#% include helpers\n\n\ndef main():\n    return helper()\n"
    assert sources.include(template, tmp_path) == (
        "import os\n\n\ndef helper():\n    return 1\n\n\ndef main():\n    return helper()\n")
    inside = "def args():\n    p = 1\n#% include helpers\n    return p\n"  # an include inside a block
    assert sources.include(inside, tmp_path) == "def args():\n    p = 1\ndef helper():\n    return 1\n    return p\n"


def test_generated_scripts_have_the_blank_lines_a_person_would_write(tmp_path):
    """What `labkit gen` writes passes pycodestyle's blank-line rules (two lines between top-level defs...)."""
    python = [t for t in sources.all_targets() if t.output.endswith(".py")]  # lab 7's hostfile and batch script are not
    for t in python:
        (tmp_path / Path(t.output).name).write_text(sources.expected(t))
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--preview", "--select",
                          BLANK_LINE_RULES, "--output-format", "concise", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert len(list(tmp_path.glob("*.py"))) == len(python)


def test_git_marks_every_generated_script_as_generated():
    outputs = [t.output for t in sources.all_targets()]
    if shutil.which("git") is None:
        pytest.skip("git is not installed here")
    out = subprocess.run(["git", "check-attr", "linguist-generated", "--", *outputs, "labkit/course/sources.py"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        pytest.skip(f"not a git checkout: {out.stderr.strip()}")
    marked = {line.split(": ")[0]: line.split(": ")[-1] for line in out.stdout.splitlines()}
    assert [p for p in outputs if marked.get(p) != "true"] == []
    assert marked["labkit/course/sources.py"] != "true"  # hand-written code is not folded away


def test_the_course_source_is_the_checkout_or_the_folder_it_is_run_in(tmp_path, monkeypatch):
    assert sources.course_source(tmp_path) == ROOT  # this checkout first
    monkeypatch.setattr(sources, "ROOT", tmp_path / "site-packages")  # as installed from a wheel
    course = tmp_path / "course"
    for folder in ("solutions/source", "labs/figures"):
        (course / folder).mkdir(parents=True)
    (course / "pyproject.toml").write_text("[project]\n")
    assert sources.course_source(course / "labs" / "figures") == course
    released = tmp_path / "released"  # a learner's course: no templates
    (released / "labs").mkdir(parents=True)
    (released / "pyproject.toml").write_text("[project]\n")
    with pytest.raises(FileNotFoundError, match="no course source"):
        sources.course_source(released)
    monkeypatch.chdir(released)
    with pytest.raises(FileNotFoundError, match="checkout of the course source"):
        sources.generate(check=True)
