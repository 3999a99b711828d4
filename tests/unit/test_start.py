"""labkit.instrument.start: the one frame a probe runs a script in, and its command line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from labkit.instrument import start


class Seen:
    """A probe that writes down what the frame hands it."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def prepare(self, out: str) -> None:
        self.calls.append(("prepare", out))

    def failed(self, error: BaseException) -> None:
        self.calls.append(("failed", type(error).__name__))

    def finish(self, code: int) -> None:
        self.calls.append(("finish", code))


@pytest.mark.parametrize(("body", "code", "failed"), [
    ("import os, sys\nassert sys.argv[1:] == ['--x', '1'] and __name__ == '__main__'\n"
     "assert sys.path[0] == os.path.dirname(__file__)\n", 0, False),
    ("raise SystemExit(3)\n", 3, False),
    ("raise SystemExit('bye')\n", 1, False),
    ("raise RuntimeError('boom')\n", 1, True),
    ("raise KeyboardInterrupt\n", 130, True),  # Ctrl-C: the shell's code for SIGINT, as without the probe
])
def test_the_script_runs_as_main_and_its_end_is_handed_to_the_probe(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, code: int, failed: bool) -> None:
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    script = tmp_path / "train.py"
    script.write_text(body)
    probe = Seen()
    assert start.run(probe, "out", str(script), ["--x", "1"]) == code
    assert sys.argv == [str(script), "--x", "1"] and str(tmp_path) not in sys.path  # the next script's path is its own
    error = "KeyboardInterrupt" if code == 130 else "RuntimeError"
    assert probe.calls == [("prepare", "out"), *([("failed", error)] if failed else []), ("finish", code)]


def test_a_message_the_script_exits_with_is_printed_as_python_prints_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    monkeypatch.setattr(sys, "path", list(sys.path))
    script = tmp_path / "train.py"
    script.write_text("raise SystemExit('no data in ./data: run it from the lab folder')\n")
    assert start.run(Seen(), "out", str(script), []) == 1
    assert capsys.readouterr().err == "no data in ./data: run it from the lab folder\n"


@pytest.mark.parametrize("argv", [[], ["nope", "out", "--", "s.py"], ["tfdist", "out"], ["tfdist", "out", "--"],
                                  ["tfdist", "out", "--x", "--", "s.py"],
                                  ["horovod", "out", "--epochs", "x", "--", "s.py"],
                                  ["horovod", "out", "--budget", "soon", "--", "s.py"],
                                  ["horovod", "out", "--fit-bound", "--", "s.py"]])
def test_a_command_line_it_does_not_understand_is_a_usage_error(argv: list[str],
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert start.main(argv) == 2
    assert "usage: python -m labkit.instrument.start" in capsys.readouterr().err


def test_every_probe_in_the_table_parses_its_options() -> None:
    horovod = start.probe_class("horovod").parse(["--own-folders", "--epochs", "0", "--tolerate", "--x",
                                                  "--budget", "5", "--fit-bound", "2.5"])
    assert horovod is not None and (horovod.own_folders, horovod.max_epochs, horovod.budget, horovod.factor,
                                    horovod.tolerated) == (True, 0, 5.0, 2.5, ["--x"])
    assert start.probe_class("tfdist").parse([]) is not None
    assert start.probe_class("run").parse([]) is not None and start.probe_class("run").parse(["--x"]) is None


def test_a_script_command_is_wrapped_and_any_other_command_runs_as_it_is() -> None:
    py = sys.executable
    assert start.command("horovod", "o", [py, "t.py", "--a"], ["--epochs", "0"]) == [
        py, "-m", start.MODULE, "horovod", "o", "--epochs", "0", "--", "t.py", "--a"]
    # the interpreter's own options stay before the probe: python -u train.py is observed too
    assert start.command("run", "o", [py, "-u", "-X", "dev", "-Wignore", "t.py"]) == [
        py, "-u", "-X", "dev", "-Wignore", "-m", start.MODULE, "run", "o", "--", "t.py"]
    sibling = str(Path(py).with_name("python3.99"))  # another Python of this environment
    assert start.command("run", "o", [sibling, "t.py"])[:4] == [sibling, "-m", start.MODULE, "run"]
    other = "/nowhere/bin/python3"  # another Python, which has no labkit: it runs as it is, unobserved
    for given in (["bash", "go.sh"], [py, "-m", "pkg"], [py, "-c", "print(1)"], [py], [py, "-u"], [other, "t.py"],
                  [py, "--version"], [py, "-", "t.py"]):
        assert start.command("run", "o", given) == given
    with pytest.raises(KeyError, match="no probe 'nope'"):
        start.command("nope", "o", [py, "t.py"])


def test_only_a_probe_that_writes_its_stacks_is_sent_sigusr1_first() -> None:
    py = sys.executable
    assert start.dumps_stacks(start.command("horovod", "o", [py, "t.py"]))
    assert start.dumps_stacks(start.command("tfdist", "o", [py, "t.py"]))
    assert not start.dumps_stacks(start.command("run", "o", [py, "t.py"]))  # SIGUSR1 would kill a plain script
    assert start.dumps_stacks(start.command("horovod", "o", [py, "-u", "-X", "dev", "t.py"]))
    assert not start.dumps_stacks([py, "t.py"]) and not start.dumps_stacks([py, "-m", start.MODULE])


def test_a_wrapped_command_unwraps_to_the_one_given() -> None:
    py = sys.executable
    for given in ([py, "t.py", "--", "x"], ["bash", "go.sh"], [py, "-m", "pkg", "--", "a"], [py, "-X", "dev", "t.py"]):
        assert start.unwrap(start.command("horovod", "o", given, ["--epochs", "0"])) == given
        assert start.unwrap(start.command("run", "o", given)) == given


def test_an_error_of_the_script_shows_its_frames_and_one_of_the_starter_none(tmp_path) -> None:  # noqa: ANN001
    import subprocess
    import sys

    from labkit.instrument import start

    script = tmp_path / "bad.py"
    script.write_text("def f():\n    raise KeyError('x')\n\nf()\n")
    try:
        start.run(_Quiet(), str(tmp_path / "out"), str(script), [], reraise=True)
    except KeyError as e:
        shown = start.format_error(e)
    plain = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60).stderr
    assert shown == plain and 'line 4, in <module>' in shown and "start.py" not in shown
    absent = tmp_path / "absent.py"
    try:  # raised by runpy itself: no frame of a script to show
        start.run(_Quiet(), str(tmp_path / "out"), str(absent), [], reraise=True)
    except FileNotFoundError as e:
        shown = start.format_error(e)
    assert shown == f"FileNotFoundError: [Errno 2] No such file or directory: '{absent}'\n"


class _Quiet:
    def prepare(self, out: str) -> None: ...

    def failed(self, error: BaseException) -> None: ...

    def finish(self, code: int) -> None: ...


def test_an_error_that_never_reached_a_script_is_shown_whole() -> None:
    from labkit.instrument import start

    def prepare() -> None:
        raise OSError("no room for the record")

    try:
        prepare()
    except OSError as e:
        shown = start.format_error(e)
    assert "in prepare" in shown and shown.endswith("OSError: no room for the record\n")
