"""labkit.ui.notebook: quick mode, one training per unchanged script, finished scripts picked."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import paths

from labkit.course import labs
from labkit.launching import launch
from labkit.tfdist import cluster
from labkit.ui import notebook


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(notebook.QUICK_VAR, "1")


def test_args_are_the_learners_unless_quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(notebook.QUICK_VAR, raising=False)
    assert notebook.args("--epochs", "3", "--log-dir", "x") == ["--epochs", "3", "--log-dir", "x"]
    monkeypatch.setenv(notebook.QUICK_VAR, "1")
    assert notebook.args("--epochs", "3", "--log-dir", "x") == ["--epochs", "1", "--log-dir", "x", *notebook.TINY]
    assert notebook.args() == ["--epochs", "1", *notebook.TINY]


def test_an_unchanged_script_is_trained_once_in_quick_mode(quick: None, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(launch, "run", lambda command, **kw: calls.append(command) or len(calls))
    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    assert notebook.run(["python", str(script)], np=2) == notebook.run(["python", str(script)], np=2) == 1
    assert notebook.run(["python", str(script)], np=1) == 2  # other arguments: a new run
    script.write_text("print(2)\n")
    assert notebook.run(["python", str(script)], np=2) == 3  # edited: trained again
    monkeypatch.delenv(notebook.QUICK_VAR)
    assert notebook.run(["python", str(script)], np=2) == 4  # a learner's rerun always runs


def _starter(folder: Path, name: str = "fashion_mnist_mirrored.py") -> Path:
    """A copy of a lab's starter, as a learner's checkout holds it."""
    script = folder / "labs" / name
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text((labs.ROOT / "labs" / name).read_text())
    return script


def test_quick_mode_skips_launching_an_untouched_starter(quick: None, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    started = []

    class Done:
        def summary(self) -> str:
            return "finished"

    monkeypatch.setattr(cluster, "run", lambda command, tasks, job: started.append(command) or Done())
    starter = _starter(tmp_path)
    assert notebook.run_cluster(["python", str(starter)], workers=2) is None
    assert "still the starter" in capsys.readouterr().out and started == []
    starter.write_text(starter.read_text() + "print('mine')\n")
    assert notebook.run_cluster(["python", str(starter)], workers=2).summary() == "finished"
    assert started == [["python", str(starter)]]


def test_untouched_reads_the_code_not_the_comments(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A learner who keeps the TODO notes of a finished script has started; one who only deleted them has not."""
    script = _starter(tmp_path)
    text = script.read_text()
    assert "TODO: Step" in text
    script.write_text(text.replace("# TODO: Step", "# my notes, TODO: Step"))  # comments only: not started
    assert notebook.untouched(script) and not notebook.ready(script, "mirrored", 4)
    shown = capsys.readouterr().out
    assert "fashion_mnist_mirrored.py is still the starter: finish steps 1-4 of lab 3" in shown
    assert "reference results" in shown
    script.write_text(text + "\nEXTRA = 1  # TODO: Step 4 still to do\n")  # code changed, TODOs kept
    assert not notebook.untouched(script) and not notebook.ready(script, "mirrored", 4)  # but never checked
    assert "is still the starter" not in capsys.readouterr().out
    assert notebook.untouched(tmp_path / "labs" / "missing.py")


def test_untouched_finds_a_released_courses_pristine_starter(tmp_path: Path) -> None:
    """In a learner's course (no templates) the pristine copy in .labkit/starters decides."""
    from labkit.course import release as course

    course.release(tmp_path / "course")
    script = tmp_path / "course" / "labs" / "fashion_mnist_ps.py"
    assert notebook.untouched(script)
    script.write_text(script.read_text().replace("def main(", "def main_renamed(", 1))
    assert not notebook.untouched(script)


def test_args_keep_the_fewest_epochs_a_cell_needs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(notebook.QUICK_VAR, "1")
    assert notebook.args("--epochs", "3", fewest=3)[:2] == ["--epochs", "3"]
    assert notebook.args("--epochs", "2", fewest=3)[:2] == ["--epochs", "2"]  # never more than asked
    monkeypatch.delenv(notebook.QUICK_VAR)
    assert notebook.args("--epochs", "5", fewest=3) == ["--epochs", "5"]


def test_no_learner_cell_carries_test_plumbing() -> None:
    import json
    import re

    plumbing = re.compile(r"LABKIT_NB_QUICK|\bFAST\b|quick|\bDONE\b|test suite|by the tests|in_fast_mode")
    folder = paths.LABS
    found = [f"{nb.name} cell {i}: {m.group(0)}"
             for nb in sorted(folder.glob("*.ipynb"))
             for i, cell in enumerate(json.loads(nb.read_text())["cells"]) if cell["cell_type"] == "code"
             for m in [plumbing.search("".join(cell["source"]))] if m]
    assert found == []


def test_ranks_shows_the_command_and_every_rank(tmp_path: Path) -> None:
    from labkit.launching import launch

    bar = "1/4 [==>...]"
    (tmp_path / "rank.0.log").write_text(f"Epoch 1/1\n{bar}{chr(8) * len(bar)}4/4 [======] - loss: 1\n")
    (tmp_path / "rank.1.log").write_text("")
    result = launch.JobResult(0, ["mpirun", "-np", "2", "python", "my script.py"], tmp_path, 2, 1.0)
    shown = notebook.ranks(result)
    text = repr(shown)
    assert "$ mpirun -np 2 python 'my script.py'" in text
    assert "--- rank 0 ---\nEpoch 1/1\n4/4 [======] - loss: 1" in text and "rank 1: printed nothing" in text
    assert "<b>rank 1</b>" in shown._repr_html_() and "my script.py" in shown._repr_html_()


def test_python_runs_a_plain_process_without_start_up_noise(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint('I0000 00:00:1.5  7 cudart_stub.cc:31] Could not find cuda drivers', "
                      "file=sys.stderr, flush=True)\nprint('Images/sec: 12.5')\nsys.exit(int(sys.argv[1]))\n")
    done = notebook.python(script, "0", log=tmp_path / "logs" / "out.txt")
    shown = capsys.readouterr().out
    assert done.ok and done.text == "Images/sec: 12.5" and f"$ python {script} 0" in shown
    assert "cudart" not in shown and "cudart" in (tmp_path / "logs" / "out.txt").read_text()  # kept in the log
    failed = notebook.python(script, "3")
    assert not failed.ok and failed.returncode == 3 and "exit code 3" in capsys.readouterr().out
