"""One command-line grammar: every command answers a wrong call with ``labkit CMD: ...`` and exit 2,
before starting or writing anything; the commands that run a script take options before or after
SCRIPT and the script's own arguments after ``--``; every example in their --help parses."""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
from pathlib import Path

import pytest

from labkit.cli import main as cli
from labkit.course import labs
from labkit.grading import calibration

ROOT = labs.ROOT

BAD = {
    "run --np 0 -- true": "must be at least 1",
    "run --np x -- true": "is not a whole number",
    "run --timeout -1 -- true": "must be more than 0",
    "run --threads 0 -- true": "must be at least 1",
    "run --hosts bad:: -- true": "IPv6",
    "run --hosts no-such-host.invalid:2 -- true": "cannot resolve no-such-host.invalid",
    "run --launcher nope -- true": "invalid choice",
    "run nosuch.py --np 2": "labkit run: nosuch.py not found",
    "run --np 2 -- python nosuch.py --epochs 1": "labkit run: nosuch.py not found",
    "run --np 2 -- no-such-program": "labkit run: no-such-program not found",
    "run --np 2": "labkit run: give a SCRIPT",
    "run x.py --epochs 2": "the script's own arguments go after --",
    "cluster --workers 0 -- true": "must be at least 1",
    "cluster --ps -1 -- true": "must be 0 or more",
    "cluster --workers 2": "labkit cluster: give a SCRIPT",
    "cluster nosuch.py --workers 2": "labkit cluster: nosuch.py not found",
    "cluster --workers 2 --hosts no-such-host.invalid:2 -- true": "cannot resolve no-such-host.invalid",
    "bench nope.py": "labkit bench: nope.py not found",
    "bench x.py --np 0": "bad worker counts",
    "bench x.py --target 82": "between 0 and 1",
    "bench": "required: SCRIPT",
    "assess nope.py --np 2 -- --epochs 20": "labkit assess: nope.py not found",
    "check horovod nope.py": "labkit check: nope.py not found",
    "check horovod nope.py --step 0": "must be at least 1",
    "check horovod x.py -- --epochs 1": "nothing goes after --",
    "check nolab x.py": "invalid choice",
    "grade /nonexistent": "is not a folder",
    "grade labs --min-score -3": "must be 0 or more",
    "grade labs --classroom c.json": "GitHub Classroom was discontinued on 2026-08-28",
    "grade --report nope.json": "labkit grade: --report nope.json",
    "class gradebook --from /nonexistent --format canvas": "/nonexistent is not a folder",
    "class gradebook --format blackboard": "invalid choice",
    "k8s mpijob --workers 0": "must be at least 1",
    "reset nope.py": "is not a lab starter",
    "release": "required",
    "doctor --bogus": "labkit doctor: unrecognized arguments: --bogus",
    "data --nope": "unrecognized arguments: --nope",
    "gen extra": "unrecognized arguments: extra",
    "nocommand": "invalid choice",
}


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty current folder holding x.py, to see that a wrong call writes nothing."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("print('x')\n")
    return tmp_path


@pytest.mark.parametrize("line", list(BAD))
def test_a_wrong_call_is_one_usage_line_and_exit_2(line: str, scratch: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    try:
        code = cli.main(line.split())
    except SystemExit as e:  # argparse's own errors
        code = e.code
    err = capsys.readouterr().err
    name = line.split()[0]
    assert code == 2, err
    assert BAD[line] in err, err
    assert err.startswith(f"labkit {name}" if name != "nocommand" else "labkit: "), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "['" not in err, err
    assert sorted(p.name for p in scratch.iterdir()) == ["x.py"]  # nothing started, no runs/ written


SAME = {  # options before or after SCRIPT, the script's own arguments after --: one meaning
    "run": ["run x.py --np 2 --threads 1 -- --epochs 2", "run --np 2 x.py --threads 1 -- --epochs 2",
            "run --np 2 --threads 1 -- python x.py --epochs 2"],
    "cluster": ["cluster x.py --workers 2 -- --epochs 2", "cluster --workers 2 x.py -- --epochs 2",
                "cluster --workers 2 -- python x.py --epochs 2"],
    "bench": ["bench x.py --np 1,2 --threads 1 -- --epochs 2 --np 5",
              "bench --np 1,2 x.py --threads 1 -- --epochs 2 --np 5"],
    "assess": ["assess x.py --np 2 -- --epochs 20", "assess --np 2 x.py -- --epochs 20"],
    "check": ["check horovod x.py --step 2", "check --step 2 horovod x.py", "check horovod --step 2 x.py"],
}


@pytest.mark.parametrize("command", list(SAME))
def test_options_go_before_or_after_the_script(command: str, scratch: Path) -> None:
    whole = command in ("run", "cluster")  # these also take a whole command after --: compare what runs
    keys = ("command", "np", "threads", "workers") if whole else ("script", "args", "np", "threads", "step")
    seen = []
    for line in SAME[command]:
        a = cli.parse(shlex.split(line))
        seen.append({k: getattr(a, k, None) for k in keys})
    assert all(s == seen[0] for s in seen), seen
    a = cli.parse(shlex.split(SAME[command][0]))
    if command in ("run", "cluster"):
        assert a.command == ["python", "x.py", "--epochs", "2"]
    elif command == "bench":
        assert a.np == [1, 2] and a.args == ["--epochs", "2", "--np", "5"]  # after --: the script's
    elif command == "assess":
        assert a.np == 2 and a.args == ["--epochs", "20"]


def _examples() -> dict[str, list[str]]:
    """Every example in the --help of the commands that run a script: the lines of its ``examples:`` block."""
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = {}
    for name in cli.RUNS_A_SCRIPT:
        help_text = sub.choices[name].format_help()
        block = help_text.partition("\nexamples:\n")[2].partition("\n\n")[0]
        out[name] = [line.strip() for line in block.splitlines() if line.strip()]
        assert all(line.startswith(f"labkit {name} ") for line in out[name]), out[name]
    return out


EXAMPLES = _examples()


def test_every_command_that_runs_a_script_shows_examples() -> None:
    assert all(EXAMPLES[name] for name in ("run", "cluster", "bench", "assess")), EXAMPLES
    assert any("--np 2 -- --epochs 20" in e for e in EXAMPLES["assess"])  # the one issue 21 names


@pytest.fixture
def course(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A course folder with the files the examples name, a records file and this machine's calibration."""
    for name in ("fashion_mnist.py", "fashion_mnist_multiworker.py"):
        (tmp_path / "labs").mkdir(exist_ok=True)
        shutil.copy2(ROOT / "labs" / name, tmp_path / "labs" / name)
    records = tmp_path / "labs" / "runs" / "scaling.jsonl"
    records.parent.mkdir()
    records.write_text(json.dumps({"run_id": "r1", "script": "/elsewhere/solution.py", "status": "ok"}) + "\n")
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))
    cal = calibration.Calibration(50.0, [50.0], "2026-11-25T10:00:00+0000", "labkit assess --calibrate --np 2",
                                  calibration.conditions(2, 1))
    calibration.cache_file().parent.mkdir()
    calibration.cache_file().write_text(json.dumps({"workers=2,threads=1": cal.__dict__}))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("example", [e for v in EXAMPLES.values() for e in v])
def test_each_help_example_runs(example: str, course: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Examples that train are parsed and checked (nothing starts); the others run for real."""
    argv = shlex.split(example.split("  #")[0])[1:]
    a = cli.parse(argv)
    if getattr(a, "calibrate", False):  # measures the machine: parsed only
        assert a.script is None and a.np == 2
    else:
        script = getattr(a, "script", None) or next(c for c in a.command if c.endswith(".py"))
        assert (course / script).is_file() and a.func
    if "--records" in argv:  # judging recorded runs trains nothing: run it
        assert cli.main(argv) == 1
        assert "no recorded run of labs/fashion_mnist.py (1 record(s) of other scripts do not count)" in \
            capsys.readouterr().out
    assert sorted(p.name for p in course.iterdir()) == ["cache", "labs"]  # parsing started nothing


def test_an_unexpected_error_is_one_line_unless_asked(capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from labkit.cli import doctor

    def broken(as_json: bool = False) -> int:
        raise RuntimeError("something broke")

    monkeypatch.setattr(doctor, "main", broken)
    assert cli.main(["doctor"]) == 1
    err = capsys.readouterr().err
    assert "labkit doctor: RuntimeError: something broke" in err and "--traceback" in err
    with pytest.raises(RuntimeError):
        cli.main(["--traceback", "doctor"])
