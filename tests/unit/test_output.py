"""labkit.core.output: progress bars as one line, noise dropped, failures with hints."""

from __future__ import annotations

import io
from pathlib import Path

from labkit.core import output
from labkit.launching import launch


def test_renderer_turns_progress_bars_into_one_line() -> None:
    lines: list[str] = []
    progress: list[str] = []
    r = output.Renderer(lines.append, progress.append)
    # What a Keras 2 progress bar writes: backspaces + carriage return redraws.
    r.feed(b"Epoch 1/1\n 1/3 [=>...]")
    r.feed(b"\b" * 11 + b"\r 2/3 [==>..]" + b"\b" * 12 + b"\r 3/3 [====] - 1s\n")
    r.feed("done é".encode()[:-1])
    r.feed("done é".encode()[-1:] + b"\n")
    assert lines == ["Epoch 1/1", " 3/3 [====] - 1s", "done é"]
    assert progress[:2] == [" 1/3 [=>...]", " 2/3 [==>..]"], progress
    assert not any("\b" in x or "\r" in x for x in lines + progress)


def test_failure_summary_adds_a_hint_for_known_errors(tmp_path: Path) -> None:
    res = launch.JobResult(1, ["x"], tmp_path, 2, 1.0, rank_exit={1: 1},
                           rank_errors={1: "ModuleNotFoundError: No module named 'horovod'"})
    text = res.summary()
    assert "--- rank 1 (exit 1) ---" in text and "hint: Horovod is not installed" in text


def test_console_sink_drops_progress_and_noise_off_a_terminal() -> None:
    buf = io.StringIO()
    sink = output.ConsoleSink(buf)
    sink.progress("1/3 [=>..]")
    sink.line("I0000 00:00:1 cudart_stub.cc:31] Could not find cuda drivers")
    sink.line("Images/sec: 10.0")
    assert buf.getvalue() == "Images/sec: 10.0\n"


def test_error_tail_keeps_the_traceback_end() -> None:
    text = "noise\n" * 50 + "Traceback (most recent call last):\n" + "  frame\n" * 30 + "ValueError: boom\n"
    tail = output.error_tail(text)
    assert tail.startswith("Traceback") and tail.endswith("ValueError: boom") and "  ..." in tail


def test_expected_tracebacks_fold_into_their_last_line() -> None:
    lines: list[str] = []
    r = output.Renderer(lines.append)
    tb = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n    main()\n\n"
          "During handling of the above exception, another exception occurred:\n\n"
          "Traceback (most recent call last):\n  File \"x.py\", line 2\nUnavailableError: peer is gone\n")
    r.feed(("Epoch 2/3\n" + tb).encode())
    assert lines[0] == "Epoch 2/3" and "Traceback (most recent call last):" in lines  # unexpected: shown whole
    lines.clear()
    r.fold = True
    r.feed(("before\n" + tb + "after\n").encode())
    assert lines == ["before", "(expected) UnavailableError: peer is gone  [traceback in the log]", "after"]


def test_command_line_is_shown_as_a_shell_would_run_it() -> None:
    line = output.command_line(["python", "my script.py", "--epochs", "2"], {"TF_CONFIG": '{"task": {"index": 0}}'})
    assert line == """$ TF_CONFIG='{"task": {"index": 0}}' python 'my script.py' --epochs 2"""
    assert output.command_line(["mpirun", "-np", "2"]) == "$ mpirun -np 2"
