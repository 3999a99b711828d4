"""The one way labkit observes a rank: ``python -m labkit.instrument.start PROBE OUT [OPTIONS] -- SCRIPT [ARGS...]``.

``PROBE`` names an entry of :data:`PROBES`: ``run`` (:mod:`labkit.instrument.observe`, the run record every
recorded launch keeps), ``horovod`` (:mod:`labkit.instrument.probe`, the Horovod checks) or ``tfdist``
(:mod:`labkit.instrument.dprobe`, the tf.distribute checks). ``OPTIONS`` are the probe's own, before ``--``.
Launchers build the argument list with :func:`command` (a ``python SCRIPT`` command wrapped; any other command
runs as it is, unobserved).

This module owns the frame every probe runs in (:func:`run`): the script runs as ``__main__`` with its own
command line and its folder first on ``sys.path``, its ``SystemExit`` becomes the exit code, any other exception is
handed to the probe; a check's probe ends the process through :func:`labkit.instrument.leave.leave` (its exit
functions, no teardown), the run observer as Python ends a script. A probe adds only its own parts (:class:`Probe`);
it never edits the script.
"""

from __future__ import annotations

import importlib
import os
import runpy
import shutil
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

from labkit.core import pycommand
from labkit.instrument.leave import leave

MODULE = "labkit.instrument.start"
INTERRUPTED = 130  # the exit code of a script stopped by Ctrl-C (SIGINT), as a shell reports it


@dataclass(frozen=True)
class Entry:
    """A probe in :data:`PROBES`: its class, ``"module:Class"``, imported only when it is started; whether it writes
    its Python stacks on SIGUSR1 (the rank wrapper, :mod:`labkit.launching.rank`, then sends that signal before
    stopping the rank, so that a rank that never ends can be told where it was)."""

    target: str
    stacks: bool
    fast_exit: bool = True  # ends through labkit.instrument.leave (exit functions, no teardown) once it wrote




# Plug-ins register here.
PROBES: dict[str, Entry] = {
    # A learner's own run ends as Python ends it: threads joined, files closed, every exit hook run.
    "run": Entry("labkit.instrument.observe:RunProbe", stacks=False, fast_exit=False),
    "horovod": Entry("labkit.instrument.probe:HorovodProbe", stacks=True),
    "tfdist": Entry("labkit.instrument.dprobe:DistributeProbe", stacks=True),
}


class Probe(Protocol):
    """What a probe adds to :func:`run`, called in this order."""

    def prepare(self, out: str) -> None:
        """Before the script runs: its record under ``out`` (as given), stack dumps and library patches."""

    def failed(self, error: BaseException) -> None:
        """The script raised ``error`` (:func:`format_error` shows it as Python would)."""

    def finish(self, code: int) -> None:
        """The script ended with exit code ``code`` (its output flushed): the final record."""


class ProbeClass(Protocol):
    """A class named in :data:`PROBES`: its options for the usage line, and a probe made from them."""

    OPTIONS: str

    def parse(self, options: list[str]) -> Probe | None:
        """The probe the options between ``OUT`` and ``--`` ask for; None when they are not understood."""


def probe_class(name: str) -> ProbeClass:
    """The class :data:`PROBES` names ``name`` (KeyError for an unknown one)."""
    module, _, cls = PROBES[name].target.partition(":")
    return getattr(importlib.import_module(module), cls)


def is_this_python(program: str) -> bool:
    """Whether ``program`` is this interpreter, or another of its environment (``.venv/bin/python3``): only those
    have labkit to start a probe with; any other Python runs its command as it is."""
    found = program if os.sep in program else shutil.which(program)
    return bool(found) and os.path.dirname(os.path.abspath(found)) == os.path.dirname(os.path.abspath(sys.executable))


def command(name: str, out: str, script_command: Sequence[str], options: Sequence[str] = ()) -> list[str]:
    """The argument list that runs ``script_command`` (``python [OPTIONS] SCRIPT ARGS...``, this environment's
    Python) under the probe ``name`` with its ``options``, writing to ``out``. Any other command (``python -m ...``,
    another Python, a shell, a program) comes back unchanged: it runs unobserved."""
    if name not in PROBES:
        raise KeyError(f"no probe {name!r}: one of {', '.join(PROBES)}")
    argv = list(script_command)
    parts = pycommand.split(argv) if argv and is_this_python(argv[0]) else None
    if parts is None:
        return argv
    head, script = parts
    return [*head, "-m", MODULE, name, out, *options, "--", *script]


def _probe_at(argv: Sequence[str]) -> int | None:
    """Where the probe's name is in a command :func:`command` made (after the interpreter's options and
    ``-m MODULE``); None for any other command."""
    argv, i = list(argv), 1
    while i < len(argv) - 2:
        if argv[i:i + 2] == ["-m", MODULE]:
            return i + 2 if "--" in argv[i + 4:] else None
        if argv[i] in pycommand.VALUED:
            i += 2
        elif argv[i].startswith("-") and argv[i] not in ("-m", "-c", "-", "--"):
            i += 1
        else:
            return None
    return None


def unwrap(argv: Sequence[str]) -> list[str]:
    """The command :func:`command` wrapped, as it was given (any other command unchanged)."""
    argv, at = list(argv), _probe_at(argv)
    if at is None:
        return argv
    return [*argv[:at - 2], *argv[argv.index("--", at + 2) + 1:]]


def dumps_stacks(argv: Sequence[str]) -> bool:
    """Whether ``argv`` starts a probe that writes its stacks on SIGUSR1 (see :class:`Entry`)."""
    at = _probe_at(argv)
    entry = PROBES.get(argv[at]) if at is not None else None
    return bool(entry and entry.stacks)


def format_error(error: BaseException) -> str:
    """``error`` as Python prints an exception a script did not catch: from the script's own frames on, without
    the frames of whoever called :func:`run` and of ``runpy`` above them (none at all for an error of ``runpy``'s
    own: a script not found). An error that never passed through ``runpy`` is shown whole."""
    tb = error.__traceback__
    while tb is not None and not _in_runpy(tb):  # the caller's frames, down to runpy.run_path
        tb = tb.tb_next
    if tb is None:
        tb = error.__traceback__
    while tb is not None and _in_runpy(tb):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(error), error, tb))


def _in_runpy(tb: TracebackType) -> bool:
    return tb.tb_frame.f_globals.get("__name__") == "runpy"  # runpy may be frozen: no file to compare


def run(probe: Probe, out: str, script: str, args: list[str], reraise: bool = False) -> int:
    """Run ``script`` as ``__main__`` with ``args`` under ``probe``; the exit code it ended with. With ``reraise``
    (a long-lived process that runs one script after another: an ipyparallel engine) an exception of the script
    reaches the caller once the probe has had it."""
    script = os.path.abspath(script)  # before the probe may change the working folder
    probe.prepare(out)
    sys.argv = [script, *args]
    folder = os.path.dirname(script)
    sys.path.insert(0, folder)
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)  # as Python prints sys.exit("message")
    except BaseException as e:  # noqa: BLE001 - everything is reported to the checker
        probe.failed(e)
        code = INTERRUPTED if isinstance(e, KeyboardInterrupt) else 1
        if reraise:
            sys.stdout.flush()
            probe.finish(code)
            raise
    finally:
        if folder in sys.path:  # a long-lived process runs the next script without this one's folder
            sys.path.remove(folder)
    sys.stdout.flush()  # the script's output comes before what the probe adds
    probe.finish(code)
    return code


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    name, rest = (argv[0], argv[1:]) if argv else ("", [])
    if name not in PROBES:
        return _usage("|".join(PROBES), "[OPTIONS]")
    kind = probe_class(name)
    cut = rest.index("--", 1) if "--" in rest[1:] else 0  # OUT, the probe's options, "--", SCRIPT, ARGS
    probe = kind.parse(rest[1:cut]) if 0 < cut < len(rest) - 1 else None
    if probe is None:
        return _usage(name, kind.OPTIONS)
    code = run(probe, rest[0], rest[cut + 1], rest[cut + 2:])
    if PROBES[name].fast_exit:
        leave(code)
    return code


def _usage(name: str, options: str) -> int:
    print(f"usage: python -m labkit.instrument.start {name} OUTDIR {options + ' ' if options else ''}"
          "-- SCRIPT [ARGS...]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
