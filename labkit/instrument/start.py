"""The one way labkit observes a rank: ``python -m labkit.instrument.start PROBE OUT [OPTIONS] -- SCRIPT [ARGS...]``.

``PROBE`` names an entry of :data:`PROBES`: ``run`` (:mod:`labkit.instrument.observe`, the run record every
recorded launch keeps), ``horovod`` (:mod:`labkit.instrument.probe`, the Horovod checks) or ``tfdist``
(:mod:`labkit.instrument.dprobe`, the tf.distribute checks). ``OPTIONS`` are the probe's own, before ``--``.
Launchers build the argument list with :func:`command` (a ``python SCRIPT`` command wrapped; any other command
runs as it is, unobserved).

This module owns the frame every probe runs in (:func:`run`): the script runs as ``__main__`` with its own
command line and its folder first on ``sys.path``, its ``SystemExit`` becomes the exit code, any other exception is
handed to the probe, and the process ends through :func:`labkit.instrument.leave.leave`. A probe adds only its own
parts (:class:`Probe`); it never edits the script.
"""

from __future__ import annotations

import importlib
import os
import runpy
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from labkit.instrument.leave import leave

MODULE = "labkit.instrument.start"


@dataclass(frozen=True)
class Entry:
    """A probe in :data:`PROBES`: its class, ``"module:Class"``, imported only when it is started; whether it writes
    its Python stacks on SIGUSR1 (the rank wrapper, :mod:`labkit.launching.rank`, then sends that signal before
    stopping the rank, so that a rank that never ends can be told where it was)."""

    target: str
    stacks: bool


# Plug-ins register here.
PROBES: dict[str, Entry] = {
    "run": Entry("labkit.instrument.observe:RunProbe", stacks=False),
    "horovod": Entry("labkit.instrument.probe:HorovodProbe", stacks=True),
    "tfdist": Entry("labkit.instrument.dprobe:DistributeProbe", stacks=True),
}


class Probe(Protocol):
    """What a probe adds to :func:`run`, called in this order."""

    def prepare(self, out: str) -> None:
        """Before the script runs: its record under ``out`` (as given), stack dumps and library patches."""

    def failed(self, error: BaseException) -> None:
        """The script raised ``error`` (called while it is handled: ``traceback.format_exc()`` shows it)."""

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


def is_python(program: str) -> bool:
    """Whether ``program`` is a Python interpreter (``python``, ``python3``, ``/path/to/python3.12``)."""
    name = os.path.basename(program)
    return name.startswith("python") and all(c.isdigit() or c == "." for c in name[len("python"):])


def command(name: str, out: str, script_command: Sequence[str], options: Sequence[str] = ()) -> list[str]:
    """The argument list that runs ``script_command`` (``python SCRIPT ARGS...``) under the probe ``name`` with its
    ``options``, writing to ``out``. Any other command (``python -m ...``, a shell, a program) comes back unchanged:
    it runs unobserved.

        >>> command("run", "obs", ["python", "train.py", "--epochs", "1"])
        ['python', '-m', 'labkit.instrument.start', 'run', 'obs', '--', 'train.py', '--epochs', '1']
        >>> command("run", "obs", ["bash", "go.sh"])
        ['bash', 'go.sh']
    """
    if name not in PROBES:
        raise KeyError(f"no probe {name!r}: one of {', '.join(PROBES)}")
    argv = list(script_command)
    if len(argv) < 2 or not is_python(argv[0]) or argv[1].startswith("-"):
        return argv
    return [argv[0], "-m", MODULE, name, out, *options, "--", *argv[1:]]


def unwrap(argv: Sequence[str]) -> list[str]:
    """The command :func:`command` wrapped, as it was given (any other command unchanged).

        >>> unwrap(command("run", "obs", ["python", "train.py", "--epochs", "1"]))
        ['python', 'train.py', '--epochs', '1']
    """
    argv = list(argv)
    if len(argv) > 3 and argv[1:3] == ["-m", MODULE] and "--" in argv[3:]:
        return [argv[0], *argv[argv.index("--", 3) + 1:]]
    return argv


def dumps_stacks(argv: Sequence[str]) -> bool:
    """Whether ``argv`` starts a probe that writes its stacks on SIGUSR1 (see :class:`Entry`)."""
    entry = PROBES.get(argv[3]) if len(argv) > 3 and list(argv[1:3]) == ["-m", MODULE] else None
    return bool(entry and entry.stacks)


def run(probe: Probe, out: str, script: str, args: list[str], reraise: bool = False) -> int:
    """Run ``script`` as ``__main__`` with ``args`` under ``probe``; the exit code it ended with. With ``reraise``
    (a long-lived process that runs one script after another: an ipyparallel engine) an exception of the script
    reaches the caller once the probe has had it."""
    script = os.path.abspath(script)  # before the probe may change the working folder
    probe.prepare(out)
    sys.argv = [script, *args]
    sys.path.insert(0, os.path.dirname(script))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if e.code is not None and not isinstance(e.code, int):
            print(e.code, file=sys.stderr)  # as Python prints sys.exit("message")
    except BaseException as e:  # noqa: BLE001 - everything is reported to the checker
        probe.failed(e)
        code = 1
        if reraise:
            sys.stdout.flush()
            probe.finish(code)
            raise
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
    return run(probe, rest[0], rest[cut + 1], rest[cut + 2:])


def _usage(name: str, options: str) -> int:
    print(f"usage: python -m labkit.instrument.start {name} OUTDIR {options + ' ' if options else ''}"
          "-- SCRIPT [ARGS...]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    leave(main())
