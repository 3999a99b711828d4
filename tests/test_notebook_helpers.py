"""labkit.notebook: quick mode, one training per unchanged script, finished scripts picked."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit import cluster, launch, notebook


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


def test_quick_mode_skips_launching_an_unfinished_starter(quick: None, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture) -> None:
    started = []

    class Done:
        def summary(self) -> str:
            return "finished"

    monkeypatch.setattr(cluster, "run", lambda command, **kw: started.append(command) or Done())
    starter, solution = tmp_path / "starter.py", tmp_path / "solution.py"
    starter.write_text("# TODO: Step 1: ...\n")
    solution.write_text("print('done')\n")
    assert notebook.run_cluster(["python", str(starter)], workers=2) is None
    assert "has steps left" in capsys.readouterr().out and started == []
    assert notebook.run_cluster(["python", str(solution)], workers=2).summary() == "finished"
    assert started == [["python", str(solution)]]


def test_pick_takes_a_finished_script_or_a_solution(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    mine, sol = tmp_path / "mine.py", tmp_path / "sol.py"
    sol.write_text("")
    assert notebook.pick(str(mine), [str(tmp_path / "nope.py"), str(sol)]) == str(sol)
    assert "does not exist" in capsys.readouterr().out
    mine.write_text("# TODO: Step 3\n")
    assert notebook.pick(str(mine), [str(sol)]) == str(sol)
    mine.write_text("done\n")
    assert notebook.pick(str(mine), [str(sol)]) == str(mine)


def test_no_learner_cell_carries_test_plumbing() -> None:
    import json
    import re

    plumbing = re.compile(r"LABKIT_NB_FAST|\bFAST\b|quick|\bDONE\b|test suite|by the tests|in_fast_mode")
    labs = Path(__file__).resolve().parent.parent / "labs"
    found = [f"{nb.name} cell {i}: {m.group(0)}"
             for nb in sorted(labs.glob("*.ipynb"))
             for i, cell in enumerate(json.loads(nb.read_text())["cells"]) if cell["cell_type"] == "code"
             for m in [plumbing.search("".join(cell["source"]))] if m]
    assert found == []


def test_ranks_shows_the_command_and_every_rank(tmp_path: Path) -> None:
    from labkit import launch

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
