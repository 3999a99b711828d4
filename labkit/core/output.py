"""What a learner sees of a running job: Keras progress bars as one updating line, start-up
noise dropped, and, when a rank fails, the end of its traceback with advice for known failures.

Sinks take finished lines and progress updates: :class:`ConsoleSink` for a terminal
(progress redrawn in place, dropped when output is not a terminal), :class:`NotebookSink`
for a notebook cell (progress in one display that updates in place). Anything with the two
methods of :class:`Sink` can take their place (the widget bars of :mod:`labkit.core.progress`,
the dashboard of :mod:`labkit.ui.dashboard`).
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Callable
from typing import Protocol

from labkit.core import env as lkenv

TAG = re.compile(rb"\[\d+(?:,\d+)?\]<std(?:out|err)>:")  # horovodrun's per-line rank tags


NATIVE_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d")  # absl/glog lines: E0000 00:00:... file.cc:12]
TRACEBACK_GLUE = ("During handling of the above exception", "The above exception was the direct cause")


class Renderer:
    """Turns a byte stream with ``\\r``/``\\b`` progress updates into lines and progress.

    ``on_line(text)`` gets each finished line, ``on_progress(text)`` the current
    state of a line being redrawn (a Keras progress bar).
    """

    def __init__(self, on_line: Callable[[str], None], on_progress: Callable[[str], None] | None = None) -> None:
        self.emit = on_line
        self.on_progress = on_progress
        self.fold = False  # set when a failure is expected (a killed peer): tracebacks become one line
        self._in_traceback = False
        self.current: list[str] = []
        self.rewind = False
        self._pending = b""
        self._shown = ""

    def feed(self, chunk: bytes) -> None:
        data = self._pending + chunk
        try:
            text = data.decode("utf-8")
            self._pending = b""
        except UnicodeDecodeError as e:  # a multi-byte character split across chunks
            text, self._pending = data[: e.start].decode("utf-8"), data[e.start :]
        prev, erased = "", False
        for ch in text:
            if ch == "\n":
                self.on_line("".join(self.current))
                self.current, self.rewind, self._shown = [], False, ""
            elif ch == "\r":
                self.rewind = True
            elif ch == "\b":
                if prev != "\b":
                    self._show()  # the line is about to be erased and redrawn: show its last state
                erased = True
                if self.current:
                    self.current.pop()
            else:
                if self.rewind:
                    if prev != "\r" or not erased:
                        self._show()
                    self.current, self.rewind = [], False
                self.current.append(ch)
            if ch not in "\b\r":
                erased = False
            prev = ch
        if prev != "\b":
            self._show()

    def on_line(self, line: str) -> None:
        """A finished line; with ``fold`` set, a traceback is shown as its last line only (the log keeps it)."""
        if not self.fold:
            self.emit(line)
            return
        if NATIVE_LOG.match(line):
            pass  # TensorFlow's own error log of the same failure (gRPC, collectives)
        elif line.startswith("Traceback (most recent call last)"):
            self._in_traceback = True
        elif self._in_traceback and (not line.strip() or line[0] in " \t" or line.startswith(TRACEBACK_GLUE)):
            pass
        elif self._in_traceback:
            self._in_traceback = False
            self.emit(f"(expected) {line[:300]}  [traceback in the log]")
        else:
            self.emit(line)

    def _show(self) -> None:
        text = "".join(self.current)
        if text and text != self._shown and self.on_progress:
            self.on_progress(text)
        self._shown = text

    def close(self) -> None:
        if self.current:
            self.on_line("".join(self.current))
            self.current = []


class Sink(Protocol):
    """Where a launch sends the shown rank's output: each finished line, and each progress redraw."""

    def line(self, text: str) -> None: ...

    def progress(self, text: str) -> None: ...


class ConsoleSink:
    """Lines to a stream; progress as one redrawn line on a terminal, dropped elsewhere."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stdout
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.width = 0

    def line(self, text: str) -> None:
        if lkenv.is_noise(text):
            return
        pad = " " * max(0, self.width - len(text)) if self.tty else ""
        self.stream.write(("\r" if self.width else "") + text + pad + "\n")
        self.stream.flush()
        self.width = 0

    def progress(self, text: str) -> None:
        if not self.tty:
            return
        self.stream.write("\r" + text + " " * max(0, self.width - len(text)))
        self.stream.flush()
        self.width = len(text)


class NotebookSink:
    """Lines printed into the cell; progress in one display that updates in place."""

    def __init__(self) -> None:
        from IPython.display import display

        self._display = display
        self.handle = None

    def line(self, text: str) -> None:
        if lkenv.is_noise(text):
            return
        if self.handle is not None:  # the finished progress bar stays where it was drawn
            self.handle.update(_Plain(text))
            self.handle = None
        else:
            print(text, flush=True)

    def progress(self, text: str) -> None:
        if self.handle is None:
            self.handle = self._display(_Plain(text), display_id=True)
        else:
            self.handle.update(_Plain(text))


class _Plain:
    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def command_line(argv: list[str], env: dict[str, str] | None = None) -> str:
    """How a command is shown before its output: ``$ NAME=VALUE ... ARGV``, quoted as a shell would need."""
    assigns = "".join(f"{name}={shlex.quote(value)} " for name, value in (env or {}).items())
    return f"$ {assigns}{shlex.join(argv)}"


def in_notebook() -> bool:
    """True inside a Jupyter kernel."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        return False
    return shell is not None and hasattr(shell, "kernel")


# Known failures deep inside a rank, and what to do about them.
HINTS: list[tuple[str, str]] = [
    ("No module named 'horovod'", "Horovod is not installed in this environment: run `make setup`."),
    ("Horovod has not been built with", "Horovod lacks this feature: rebuild it with `make setup` "
     "(it builds with TensorFlow, MPI and Gloo)."),
    ("was not built with MPI", "Horovod was built without MPI: use launcher='gloo' or rebuild with `make setup`."),
    ("was not built with Gloo", "Horovod was built without Gloo: use launcher='mpirun' or rebuild with `make setup`."),
    ("keras.src", "tf.keras looks like Keras 3 here; Horovod needs Keras 2: set TF_USE_LEGACY_KERAS=1 before "
     "TensorFlow is imported (`make setup` installs a start-up hook that does it)."),
    ("Fashion-MNIST was not found", "The data set is missing: run `make setup` or `labkit data`."),
    ("There are not enough slots available", "More workers than cores: labkit adds --oversubscribe only "
     "without -H; give each host enough slots, e.g. -H localhost:4."),
]


def hints(text: str) -> list[str]:
    """Advice for the known failures found in ``text``."""
    return [advice for marker, advice in HINTS if marker in text]


def error_tail(text: str, lines: int = 15) -> str:
    """The end of a rank's log from its last traceback, or its last lines."""
    rows = [r for r in text.replace("\r", "\n").splitlines() if r.strip() and not lkenv.is_noise(r)]
    for i in range(len(rows) - 1, -1, -1):
        if rows[i].startswith("Traceback (most recent call last)"):
            tb = rows[i:]
            return "\n".join(tb[:3] + ["  ..."] + tb[-(lines - 4) :]) if len(tb) > lines else "\n".join(tb)
    return "\n".join(rows[-lines:])

