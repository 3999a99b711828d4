"""Catching up: a step's solution as the change from the learner's script (`labkit solution`, the notebook
helper), what a self-paced and a graded release hold, the instructor's reveal to a workshop's class (on the
record), and the solution offered after a step failed the same way a few times."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from labkit.check import offer
from labkit.check.report import Report, StepResult
from labkit.cli import main as cli_main
from labkit.core import contract
from labkit.course import labs, release, solutions, sources
from labkit.records import checklog, classlog
from labkit.ui import solutions as ui_solutions
from labkit.workshop import classpage, classview, reveal
from labkit.workshop.state import State

ROOT = labs.ROOT
HOROVOD = labs.get("horovod")
NO_WORKSHOP: dict[str, str] = {}  # an environment without $LABKIT_SOLUTIONS_DIR


@pytest.fixture(autouse=True)
def _outside_a_workshop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(contract.SOLUTIONS_DIR, raising=False)


@pytest.fixture(scope="module")
def courses(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A self-paced and a graded release of the course source, made once."""
    base = tmp_path_factory.mktemp("releases")
    made = {}
    for mode in solutions.MODES:
        made[mode] = base / mode
        release.release(made[mode], root=ROOT, mode=mode)
    return made


def _starter(folder: Path, lab: labs.Lab = HOROVOD) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / lab.starter
    script.write_text((ROOT / "labs" / lab.starter).read_text())
    return script


# ----------------------------------------------------------------------------- the diff and --write


def test_the_solution_is_shown_as_the_change_from_the_learners_script(tmp_path: Path) -> None:
    script = _starter(tmp_path / "course" / "labs")
    script.write_text(script.read_text().replace("# TODO: Step 1: import Horovod's Keras API",
                                                 "import horovod.tensorflow.keras as hvd  # mine\n# was: TODO"))
    found = solutions.find(HOROVOD, 3, script, NO_WORKSHOP, cwd=tmp_path)
    assert found.where == "from the course source" and found.name == "fashion_mnist_after_step_03.py"
    change = solutions.diff(found, script)
    assert change.startswith("--- fashion_mnist.py (yours)\n+++ fashion_mnist_after_step_03.py (the solution)\n")
    assert "+    opt = hvd.DistributedOptimizer(opt)\n" in change
    assert "-    # TODO: Step 3: wrap the optimizer in a Horovod distributed optimizer\n" in change
    assert "-import horovod.tensorflow.keras as hvd  # mine\n" in change  # the learner's own line, as theirs
    assert "(version" not in change and "after_step_03.py --epochs" not in change  # the steps' code, no file noise
    assert "hvd.broadcast" not in change.split("\n+")[0]  # nothing of a later step
    text = solutions.header(found, script)
    assert "\n" not in text and text.startswith("horovod step 3 (average gradients with hvd.DistributedOptimizer)")
    assert solutions.diff(found, _same(tmp_path, found)) == ""


def _same(tmp_path: Path, found: solutions.Solution) -> Path:
    copy = tmp_path / "same" / HOROVOD.starter
    copy.parent.mkdir()
    copy.write_text(found.text)
    return copy


def test_write_saves_a_new_file_and_never_overwrites(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    script = _starter(tmp_path / "course" / "labs")
    mine = script.read_text() + "# my work\n"
    script.write_text(mine)
    taken = script.with_name("fashion_mnist_after_step_05.py")
    taken.write_text("an earlier copy I edited\n")
    monkeypatch.chdir(script.parent)
    assert cli_main.main(["solution", "horovod", "5", "--write"]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[0].startswith("horovod step 5 (divide steps_per_epoch") and said[1] == "--- fashion_mnist.py (yours)"
    assert "-# my work" in said and said[-1].startswith("saved the whole solution as ")
    written = script.with_name("fashion_mnist_after_step_05-1.py")
    assert written.read_text() == solutions.source_text(HOROVOD, 5, ROOT)
    assert script.read_text() == mine and taken.read_text() == "an earlier copy I edited\n"  # nothing lost
    assert cli_main.main(["solution", "horovod", "5", "--write"]) == 0
    assert script.with_name("fashion_mnist_after_step_05-2.py").is_file() and script.read_text() == mine


def test_wrong_calls_say_what_is_wrong(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli_main.main(["solution", "horovod", "9", "nowhere.py"]) == 2
    assert "nowhere.py not found" in capsys.readouterr().err
    _starter(tmp_path)
    assert cli_main.main(["solution", "horovod", "9"]) == 2
    assert "the horovod lab has steps 1..8, got 9" in capsys.readouterr().err
    with pytest.raises(SystemExit) as wrong:  # argparse's one usage line
        cli_main.main(["solution", "horovd", "1"])
    assert wrong.value.code == 2 and "invalid choice: 'horovd'" in capsys.readouterr().err
    assert cli_main.main(["solution", "mirrored", "1"]) == 2  # no fashion_mnist_mirrored.py here
    assert "no fashion_mnist_mirrored.py in" in capsys.readouterr().err


def test_the_notebook_helper_shows_the_same_diff(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _starter(tmp_path / "course" / "labs")
    monkeypatch.chdir(script.parent)
    shown = ui_solutions.show("horovod", 2)
    found = solutions.find(HOROVOD, 2, script, NO_WORKSHOP)
    assert shown.diff == solutions.diff(found, script) and not shown.problem
    assert repr(shown).startswith("horovod step 2 ") and "SolutionView(" not in repr(shown)
    page = shown._repr_html_()
    assert "background:#dafbe1" in page and "verbose = 1 if hvd.rank() == 0 else 0" in page
    assert "&lt;" not in shown.header and "<script" not in page
    missing = ui_solutions.show("horovod", 2, script=tmp_path / "nope.py")
    assert "nope.py not found" in repr(missing) and "No solution shown." in missing._repr_html_()


# ----------------------------------------------------------------------------- self-paced and graded releases


def test_a_self_paced_release_reveals_every_step(courses: dict[str, Path], tmp_path: Path) -> None:
    course = courses[solutions.SELF_PACED]
    assert solutions.setting(course) == solutions.SELF_PACED
    shipped = sorted(p.name for p in (course / solutions.RELEASED).iterdir())
    assert shipped == sorted(Path(t.output).name for t in solutions.step_targets())
    assert len(shipped) == sum(lab.n_steps for lab in labs.LABS.values())
    work = course / "labs"
    for lab in labs.LABS.values():
        found = solutions.find(lab, lab.n_steps, work / lab.starter, NO_WORKSHOP, cwd=tmp_path)
        assert found.where == "from this course's solutions"
        assert found.text == solutions.source_text(lab, lab.n_steps, ROOT)
    assert release.release(course, check=True, root=ROOT) == []  # the mode it was made with is kept


def test_a_graded_release_holds_no_solution_text_and_cannot_reveal(courses: dict[str, Path], tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    course = courses[solutions.GRADED]
    assert solutions.setting(course) == solutions.GRADED
    assert not (course / solutions.RELEASED).exists() and not (course / "solutions").exists()
    texts = [p.read_text() for p in (ROOT / "solutions").glob("*.py")]
    texts += [solutions.source_text(lab, k, ROOT) for lab in labs.LABS.values() for k in range(1, lab.n_steps + 1)]
    heads = [f"{t.template} (version {t.version})" for t in sources.all_targets() if t.version > 0]
    leaks = []
    for path in (p for p in course.rglob("*") if p.is_file()):
        data = path.read_bytes().decode(errors="replace")
        leaks += [str(path.relative_to(course)) for t in texts if t in data]
        leaks += [f"{path.relative_to(course)}: {h}" for h in heads if h in data]
    assert leaks == [], "solution text in a graded release"
    script = course / "labs" / HOROVOD.starter
    with pytest.raises(solutions.NotAvailable, match="this course is graded.*Ask your instructor"):
        solutions.find(HOROVOD, 1, script, NO_WORKSHOP, cwd=tmp_path)  # even where labkit runs from the source
    monkeypatch.chdir(script.parent)
    assert cli_main.main(["solution", "horovod", "1"]) == 1
    assert "graded" in capsys.readouterr().err
    assert "graded" in ui_solutions.show("horovod", 1).problem


def test_a_graded_release_over_a_self_paced_one_removes_its_solutions(courses: dict[str, Path],
                                                                      tmp_path: Path) -> None:
    out = tmp_path / "repo"
    shutil.copytree(courses[solutions.SELF_PACED], out)
    differ = release.release(out, check=True, root=ROOT, mode=solutions.GRADED)
    assert ".labkit/solutions/ (a graded release holds no solutions)" in differ and "pyproject.toml" in differ
    release.release(out, root=ROOT, mode=solutions.GRADED)
    assert not (out / solutions.RELEASED).exists()
    assert release.release(out, check=True, root=ROOT) == []  # stays graded without being told again


def test_the_course_setting_chooses_the_mode(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "c"\n\n[tool.labkit.course]\nsolutions = "graded"\n'
                                             'other = 1\n\n[tool.x]\ny = 2\n')
    assert solutions.mode_of(tmp_path) == solutions.GRADED
    assert solutions.mode_of(tmp_path, solutions.SELF_PACED) == solutions.SELF_PACED  # the flag wins
    rewritten = solutions.with_mode((tmp_path / "pyproject.toml").read_text(), solutions.SELF_PACED)
    (tmp_path / "pyproject.toml").write_text(rewritten)
    assert solutions.setting(tmp_path) == solutions.SELF_PACED and "other = 1" in rewritten and "[tool.x]" in rewritten
    (tmp_path / "pyproject.toml").write_text('[tool.labkit.course]\nsolutions = "open"\n')
    with pytest.raises(ValueError, match="choose \"self-paced\""):
        solutions.mode_of(tmp_path)


# ----------------------------------------------------------------------------- the workshop's reveal


def _state(tmp_path: Path) -> State:
    st = State(tmp_path / "state", ["learner01"])
    st.folder.mkdir(mode=0o711)
    st.class_dir.mkdir(mode=0o751)
    return st


def test_a_reveal_publishes_one_step_read_only_and_is_recorded(tmp_path: Path, courses: dict[str, Path],
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    st = _state(tmp_path)
    done = reveal.reveal(st, "horovod", 5, "alice", source=ROOT)
    assert (done.lab, done.step, done.by) == ("horovod", 5, "alice")
    published = st.revealed_dir / "fashion_mnist_after_step_05.py"
    assert stat.S_IMODE(st.revealed_dir.stat().st_mode) == 0o755 and stat.S_IMODE(published.stat().st_mode) == 0o644
    assert published.stat().st_uid == os.geteuid() and reveal.revealed(st) == [published.name]
    # A learner in the workshop, whose course is graded: the revealed step and only that one.
    workshop = {contract.SOLUTIONS_DIR: str(st.revealed_dir)}
    script = courses[solutions.GRADED] / "labs" / HOROVOD.starter
    found = solutions.find(HOROVOD, 5, script, workshop)
    assert found.text == solutions.source_text(HOROVOD, 5, ROOT) and "revealed" in found.where
    with pytest.raises(solutions.NotAvailable, match=r"not been revealed.*workshop reveal horovod 4.*Step 5 is "):
        solutions.find(HOROVOD, 4, script, workshop)
    courses_own = courses[solutions.SELF_PACED] / "labs" / HOROVOD.starter
    with pytest.raises(solutions.NotAvailable, match="not been revealed"):  # in a workshop, only what is revealed
        solutions.find(HOROVOD, 6, courses_own, workshop)
    # The record: one line in the class folder, in the view, its page and `labkit class status`.
    reading = classlog.read(st.class_dir)
    assert [(r.lab, r.step, r.by) for r in reading.reveals] == [("horovod", 5, "alice")] and not reading.problems
    view = classview.build(reading.records, st.learners, reading.problems, reading.reveals)
    assert "horovod/5 divide steps_per_epoch and validation_steps by the number of workers: revealed by alice at" \
        in view.text()
    assert view.to_dict()["revealed"] == [done.to_dict()] and "revealed by alice" in classpage.html_page(view)
    monkeypatch.setenv(contract.WORKSHOP_STATE, str(st.folder))
    parser = cli_main.build_parser()
    args = parser.parse_args(["class", "status"])
    assert args.func(args) == 0
    assert "solutions revealed to the class:" in capsys.readouterr().out


def test_a_reveal_follows_no_link_and_names_a_bad_step(tmp_path: Path) -> None:
    st = _state(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    st.revealed_dir.symlink_to(elsewhere)
    with pytest.raises(reveal.RevealError, match="not a folder"):
        reveal.reveal(st, "horovod", 2, "alice", source=ROOT)
    assert list(elsewhere.iterdir()) == [] and not (st.class_dir / classlog.REVEALS).exists()  # nothing, no record
    st.revealed_dir.unlink()
    with pytest.raises(ValueError, match="steps 1..4, got 5"):
        reveal.reveal(st, "mirrored", 5, "alice", source=ROOT)
    (st.class_dir / classlog.REVEALS).symlink_to(elsewhere / "log")
    with pytest.raises(OSError):  # the record is never written through a link
        reveal.reveal(st, "mirrored", 1, "alice", source=ROOT)
    assert not (elsewhere / "log").exists()


def test_the_class_view_skips_a_bad_reveal_line(tmp_path: Path) -> None:
    st = _state(tmp_path)
    classlog.write_reveal(classlog.Reveal("horovod", 3, "alice", 1764077000.0), st.class_dir)
    with (st.class_dir / classlog.REVEALS).open("a") as f:
        f.write('{"lab": "horovod", "step": "three", "by": "bob", "time": 1}\nnot json\n')
    reading = classlog.read_reveals(st.class_dir)
    assert [r.step for r in reading.reveals] == [3] and len(reading.problems) == 2
    assert "line 2: step is not a whole number" in reading.problems[0]


def test_workshop_up_gives_learners_the_revealed_folder_and_a_graded_release() -> None:
    text = Path(reveal.__file__).with_name("lifecycle.py").read_text()
    assert "contract.SOLUTIONS_DIR: str(reveal.prepare(st.revealed_dir))" in text  # into every server's environment
    assert "mode=solutions.GRADED" in Path(reveal.__file__).with_name("readonly.py").read_text()


# ----------------------------------------------------------------------------- offered after repeated failures


def _failed(script: Path, message: str, step: int = 5) -> Report:
    steps = [StepResult(k, True, "fine") for k in range(1, step)] + [StepResult(step, False, message)]
    report = Report("horovod", str(script), steps)
    assert checklog.record_check(report, script.read_bytes()) is None  # as `labkit check` records it
    return report


def test_the_solution_is_offered_after_three_same_failures(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _starter(tmp_path / "course" / "labs")
    monkeypatch.chdir(script.parent)
    same = "validation_steps is not divided by hvd.size()\nrank 0 validated 157 batches"
    for k in range(2):
        script.write_text(script.read_text() + f"# try {k}\n")  # another version each time: failures still count
        assert offer.offer(_failed(script, same), HOROVOD) == ""
    report = _failed(script, same.replace("157", "158"))  # the same first line
    line = offer.offer(report, HOROVOD)
    assert line.startswith("Step 5 has failed 3 times in a row with the same message: `labkit solution horovod 5` ")
    assert "solutions.show('horovod', 5)" in line and "\n" not in line
    report.offer = line
    assert report.format().splitlines()[-1] == line and line in report._repr_html_().replace("&#x27;", "'")
    assert offer.offer(_failed(script, "another message"), HOROVOD) == ""  # a new way of failing starts again
    _failed(script, "fine", step=6)  # step 5 passed in a later check
    assert offer.repeated(checklog.read(checklog.checks_file(script)), "horovod", 5, script.name) == 0


def test_the_offer_names_the_script_and_who_to_ask(tmp_path: Path, courses: dict[str, Path],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    script = _starter(tmp_path / "course" / "labs")
    for _ in range(3):
        report = _failed(script, "no hvd.DistributedOptimizer", step=3)
    assert "`labkit solution horovod 3 " + str(script) + "`" in offer.offer(report, HOROVOD, cwd=tmp_path)
    graded = tmp_path / "graded"
    shutil.copytree(courses[solutions.GRADED], graded, ignore=shutil.ignore_patterns("*.ipynb", "docs", "labkit"))
    script = graded / "labs" / HOROVOD.starter
    for _ in range(3):
        report = _failed(script, "no hvd.DistributedOptimizer", step=3)
    line = offer.offer(report, HOROVOD)
    assert "ask your instructor" in line and "labkit solution" not in line
    monkeypatch.setenv(contract.SOLUTIONS_DIR, str(tmp_path / "revealed"))
    assert "ask your instructor" in offer.offer(report, HOROVOD)  # in a workshop, step 3 not revealed
    assert json.loads(Report("horovod", "x.py", [], offer="o").to_json())["offer"] == "o"
