"""A launcher's command line read as the launcher reads it: ``srun``, ``mpirun`` (``mpiexec``) and ``horovodrun``.

Each reader splits a command line into the launcher's options (by long name, the last one given winning) and the
command every rank runs, so that a line recorded in a dry run (:mod:`labkit.check.sbatch_dry`) can be judged: how
many ranks it starts, where, and running what. The option tables are the launchers' own: ``srun`` of Slurm 22.05
(``man srun``, through the same ``getopt_long`` reader as ``sbatch``: :mod:`labkit.launching.sbatch_read`),
OpenMPI 4.1's ``mpirun`` (one dash or two, ``--mca KEY VALUE`` taking two words, ``:`` between the apps of an MPMD
line) and Horovod 0.28's ``horovodrun`` (its argparse table). Nothing here runs anything.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from labkit.core import pycommand
from labkit.launching.sbatch_read import JOB_LONG, JOB_SHORT, BatchError, Option, parse_options

# srun's own options on top of those it shares with sbatch (Slurm 22.05, `man srun`).
SRUN_LONG: dict[str, str] = {
    **JOB_LONG,
    **dict.fromkeys((
        "accel-bind", "bcast-exclude", "cpu-bind", "epilog", "het-group", "jobid", "mpi", "msg-timeout",
        "prolog", "relative", "slurmd-debug", "task-epilog", "task-prolog", "threads", "wait"), "="),
    **dict.fromkeys((
        "bcast", "compress", "immediate", "kill-on-bad-exit", "resv-ports", "send-libs", "x11"), "?"),
    **dict.fromkeys((
        "disable-status", "exact", "label", "multi-prog", "no-allocate", "overlap", "preserve-env", "pty",
        "quit-on-interrupt", "unbuffered"), ""),
}
SRUN_SHORT: dict[str, str] = {
    **JOB_SHORT,
    "E": "preserve-env", "I": "immediate", "K": "kill-on-bad-exit", "l": "label", "r": "relative", "T": "threads",
    "u": "unbuffered", "X": "disable-status", "Z": "no-allocate",
}
# OpenMPI 4.1's mpirun: the options that take one value (spelled with one dash or two); the rest are flags.
MPIRUN_ONE = frozenset((
    "np", "n", "c", "N", "npernode", "npersocket", "H", "host", "hostfile", "machinefile", "default-hostfile",
    "map-by", "rank-by", "bind-to", "x", "wdir", "wd", "path", "prefix", "output-filename", "tmpdir", "app", "am",
    "tune", "preload-files", "launch-agent", "personality", "ompi-server", "report-pid", "report-uri", "timeout",
    "max-restarts", "max-vm-size", "cpus-per-proc", "cpus-per-rank", "stdin", "rankfile", "rf", "slot-list",
    "cpu-set", "hnp", "xterm", "debugger"))
MPIRUN_TWO = frozenset(("mca", "gmca"))
MPIRUN_NAMES = {"n": "np", "c": "np", "N": "npernode", "H": "host", "machinefile": "hostfile", "wd": "wdir"}
# Horovod 0.28's horovodrun (its argparse table): options with one value, and the one with two.
HOROVODRUN_ONE = frozenset((
    "np", "num-proc", "start-timeout", "output-filename", "config-file", "p", "ssh-port", "i", "ssh-identity-file",
    "min-np", "min-num-proc", "max-np", "max-num-proc", "slots-per-host", "elastic-timeout", "reset-limit",
    "mpi-args", "binding-args", "H", "hosts", "hostfile", "network-interfaces", "network-interface",
    "fusion-threshold-mb", "cycle-time-ms", "cache-capacity", "autotune-log-file", "autotune-warmup-samples",
    "autotune-steps-per-sample", "autotune-bayes-opt-max-samples", "autotune-gaussian-process-noise",
    "timeline-filename", "stall-check-warning-time-seconds", "stall-check-shutdown-time-seconds",
    "num-nccl-streams", "thread-affinity", "gloo-timeout-seconds", "log-level", "host-discovery-script"))
HOROVODRUN_TWO = frozenset(("blacklist-cooldown-range",))
HOROVODRUN_NAMES = {"num-proc": "np", "H": "hosts", "p": "ssh-port", "i": "ssh-identity-file"}
LAUNCHERS = ("srun", "mpirun", "mpiexec", "horovodrun")
SHELLS = ("bash", "sh", "dash", "zsh")


@dataclass(frozen=True)
class Launch:
    """One launcher's command line: its options and the command its ranks run (one per app of an MPMD line)."""

    tool: str  # srun, mpirun, horovodrun
    options: tuple[Option, ...]
    apps: tuple[tuple[str, ...], ...]

    @property
    def command(self) -> tuple[str, ...]:
        return self.apps[0] if self.apps else ()

    def get(self, name: str) -> str | None:
        """The value of the last option called ``name`` ("" for a flag given), None when not given."""
        found = next((o for o in reversed(self.options) if o.name == name), None)
        return None if found is None else found.value or ""


def tool_of(argv0: str) -> str:
    """The launcher ``argv0`` names (``mpiexec`` is OpenMPI's ``mpirun``)."""
    name = Path(argv0).name
    return "mpirun" if name in ("mpirun", "mpiexec", "orterun") else name


def _dash_options(words: Sequence[str], one: frozenset[str], two: frozenset[str], names: dict[str, str],
                  tool: str) -> tuple[list[Option], list[str]]:
    """Options of a launcher that spells them with one dash or two; the words after them (the command)."""
    options: list[Option] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            return options, list(words[i + 1:])
        if not word.startswith("-") or word == "-":
            return options, list(words[i:])
        given, eq, value = word.lstrip("-").partition("=")
        count = 2 if given in two else 1 if given in one else 0
        if count and not eq:
            if i + count >= len(words):
                raise BatchError(f"{tool} {word} needs {'two values' if count == 2 else 'a value'}")
            value = " ".join(words[i + 1:i + 1 + count])
            i += count
        options.append(Option(names.get(given, given), value if (count or eq) else None, 0, word))
        i += 1
    return options, []


def read_launch(argv: Sequence[str]) -> Launch:
    """``argv`` (the launcher first) as its launcher reads it; a :class:`BatchError` when it would refuse it."""
    tool = tool_of(argv[0])
    words = list(argv[1:])
    if tool == "srun":
        options, command = parse_options(words, SRUN_LONG, SRUN_SHORT, stop_at_command=True, tool="srun")
        return Launch(tool, tuple(options), (tuple(command),) if command else ())
    if tool == "mpirun":
        options, apps = [], []
        while True:
            more, rest = _dash_options(words, MPIRUN_ONE, MPIRUN_TWO, MPIRUN_NAMES, tool)
            options += more
            app = rest[:rest.index(":")] if ":" in rest else rest
            if app:
                apps.append(tuple(app))
            if ":" not in rest:
                break
            words = rest[rest.index(":") + 1:]
        return Launch(tool, tuple(options), tuple(apps))
    if tool == "horovodrun":
        options, command = _dash_options(words, HOROVODRUN_ONE, HOROVODRUN_TWO, HOROVODRUN_NAMES, tool)
        return Launch(tool, tuple(options), (tuple(command),) if command else ())
    raise BatchError(f"{argv[0]} is not a launcher labkit reads: srun, mpirun, mpiexec or horovodrun")


# ----------------------------------------------------------------------------- the command a rank runs


def unwrap(command: Sequence[str]) -> list[str]:
    """The program a command really runs: through ``env [VAR=value ...]``, ``sh -c 'STRING'`` (its last command)
    and ``exec``."""
    words = list(command)
    for _ in range(5):
        if not words:
            return words
        head = Path(words[0]).name
        if head == "env":
            words = words[1:]
            while words and (("=" in words[0] and not words[0].startswith("-")) or words[0].startswith("-")):
                words = words[1:]
        elif head in SHELLS and len(words) >= 3 and words[1] == "-c":
            try:
                words = shlex.split(re.split(r"&&|;|\n", words[2])[-1])
            except ValueError:
                return words
        elif head == "exec":
            words = words[1:]
        else:
            return words
    return words


def python_script(command: Sequence[str]) -> str | None:
    """The script a ``python [options] SCRIPT ...`` command runs (or an executable ``SCRIPT.py`` run directly);
    None when it runs no script (``python -c``, ``python -m``, another program)."""
    words = unwrap(command)
    if not words:
        return None
    if words[0].endswith(".py"):
        return words[0]
    parts = pycommand.split(words, strict=False) if pycommand.is_python(words[0]) else None
    return parts[1][0] if parts else None


def is_launcher(command: Sequence[str]) -> bool:
    words = unwrap(command)
    return bool(words) and Path(words[0]).name in LAUNCHERS
