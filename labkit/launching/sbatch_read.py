"""A Slurm batch script read as ``sbatch`` reads it: what it asks Slurm for.

The other side of :mod:`labkit.launching.sbatch`, which writes ``#SBATCH`` lines: :func:`read_request` reads any
batch script's lines with Slurm's meaning (long and short options, ``--opt=value``, ``--opt value``, ``-N2``,
``-N 2``, unique prefixes of long options as ``getopt_long`` takes them, Slurm's time formats), and stops where
``sbatch`` stops: at the first line that is neither blank nor a comment (the ``#SBATCH`` lines after it are ignored,
and named). A script ``sbatch`` would refuse raises :class:`BatchError` with what to change. The allocation Slurm
would grant the request is :mod:`labkit.launching.slurm_alloc`'s. Nothing here runs anything.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

# The job options sbatch and srun share (Slurm 22.05, `man sbatch`, `man srun`), each with whether it takes a value:
# "=" it must, "?" it may (only as --opt=value), "" it takes none. `--tasks-per-node` is the older spelling of
# `--ntasks-per-node`.
JOB_LONG: dict[str, str] = {
    **dict.fromkeys((
        "account", "acctg-freq", "bb", "bbf", "begin", "chdir", "cluster-constraint", "clusters", "comment",
        "constraint", "container", "core-spec", "cores-per-socket", "cpu-freq", "cpus-per-gpu", "cpus-per-task",
        "deadline", "delay-boot", "dependency", "distribution", "error", "exclude", "export", "extra-node-info",
        "gid", "gpu-bind", "gpu-freq", "gpus", "gpus-per-node", "gpus-per-socket", "gpus-per-task", "gres",
        "gres-flags", "hint", "input", "job-name", "licenses", "mail-type", "mail-user", "mcs-label", "mem",
        "mem-bind", "mem-per-cpu", "mem-per-gpu", "mincpus", "network", "nodefile", "nodelist", "nodes",
        "ntasks", "ntasks-per-core", "ntasks-per-gpu", "ntasks-per-node", "ntasks-per-socket", "open-mode",
        "output", "partition", "power", "prefer", "priority", "profile", "qos", "reservation", "signal",
        "sockets-per-node", "switches", "thread-spec", "threads-per-core", "time", "time-min", "tmp", "uid",
        "wckey", "tasks-per-node"), "="),
    **dict.fromkeys((
        "exclusive", "nice", "no-kill", "propagate"), "?"),
    **dict.fromkeys((
        "contiguous", "help", "hold", "overcommit", "oversubscribe", "quiet", "reboot", "spread-job",
        "test-only", "usage", "use-min-nodes", "verbose", "version"), ""),
}
JOB_SHORT: dict[str, str] = {
    "A": "account", "B": "extra-node-info", "b": "begin", "C": "constraint", "c": "cpus-per-task", "D": "chdir",
    "d": "dependency", "e": "error", "F": "nodefile", "G": "gpus", "H": "hold", "h": "help", "i": "input",
    "J": "job-name", "k": "no-kill", "L": "licenses", "M": "clusters", "m": "distribution", "N": "nodes",
    "n": "ntasks", "O": "overcommit", "o": "output", "p": "partition", "Q": "quiet", "q": "qos", "S": "core-spec",
    "s": "oversubscribe", "t": "time", "V": "version", "v": "verbose", "W": "wait", "w": "nodelist", "x": "exclude",
}
# sbatch's own on top of them.
SBATCH_LONG: dict[str, str] = {
    **JOB_LONG,
    **dict.fromkeys((
        "array", "batch", "export-file", "kill-on-invalid-dep", "wait-all-nodes", "wrap"), "="),
    **dict.fromkeys(("get-user-env",), "?"),
    **dict.fromkeys((
        "ignore-pbs", "no-requeue", "parsable", "requeue", "wait"), ""),
}
SBATCH_SHORT: dict[str, str] = {**JOB_SHORT, "a": "array"}
ALIASES = {"tasks-per-node": "ntasks-per-node"}
UNLIMITED = ("infinite", "unlimited")


class BatchError(ValueError):
    """``sbatch`` would refuse the script, or Slurm the request; the message says what to change."""


@dataclass(frozen=True)
class Option:
    """One option of an ``#SBATCH`` line (or of a launcher's command line), by its long name."""

    name: str
    value: str | None
    line: int  # 0: not from a file
    given: str  # as written, for messages


@dataclass(frozen=True)
class Directives:
    """What ``sbatch`` reads of a script: its options, and the ``#SBATCH`` lines it ignores (after a command)."""

    options: tuple[Option, ...]
    ignored: tuple[int, ...]  # line numbers of #SBATCH lines after the first command
    first_command: int  # the line of the first command (0: none)


def long_name(given: str, table: dict[str, str], tool: str = "sbatch") -> str:
    """The option ``given`` (without its dashes) names, as ``getopt_long`` matches: exactly or by a unique prefix."""
    if given in table:
        return given
    matches = sorted(name for name in table if name.startswith(given))
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise BatchError(f"--{given} is ambiguous (it could be {', '.join('--' + m for m in matches)}): "
                         "write the option in full")
    raise BatchError(f"--{given} is not an option {tool} knows: check its spelling (`man {tool}`)")


def parse_options(words: Sequence[str], long: dict[str, str], short: dict[str, str], line: int = 0,
                  stop_at_command: bool = False, tool: str = "sbatch") -> tuple[list[Option], list[str]]:
    """Options from ``words`` as ``getopt_long`` reads them; with ``stop_at_command`` the first word that is not an
    option ends them and the rest is returned as the command (a launcher's line), else every word must be one."""
    options: list[Option] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            return options, list(words[i + 1:])
        if word.startswith("--"):
            given, eq, value = word[2:].partition("=")
            name = long_name(given, long, tool)
            kind = long[name]
            if not eq and kind == "=":
                if i + 1 >= len(words):
                    raise BatchError(f"--{name} needs a value, like --{name}=VALUE")
                i += 1
                value = words[i]
            elif eq and not kind:
                raise BatchError(f"--{name} takes no value: write --{name} alone")
            options.append(Option(ALIASES.get(name, name), value if (eq or kind == "=") else None, line, word))
        elif word.startswith("-") and len(word) > 1:
            letter, attached = word[1], word[2:]
            if letter not in short:
                raise BatchError(f"-{letter} is not an option {tool} knows: check its spelling (`man {tool}`)")
            name = short[letter]
            kind = long[name]
            if kind == "=" and not attached:
                if i + 1 >= len(words):
                    raise BatchError(f"-{letter} needs a value, like -{letter} VALUE")
                i += 1
                attached = words[i]
            elif not kind and attached:  # flags run together, like -Qv
                words = [*words[:i + 1], "-" + attached, *words[i + 1:]]
                attached = ""
            value = attached.lstrip("=") if kind == "=" or (kind == "?" and attached) else None
            options.append(Option(ALIASES.get(name, name), value, line, word))
        elif stop_at_command:
            return options, list(words[i:])
        else:
            raise BatchError(f"{word!r} is not an option: an #SBATCH line holds options only")
        i += 1
    return options, []


def read_directives(text: str) -> Directives:
    """The ``#SBATCH`` options of a batch script, as ``sbatch`` reads them: only those before the first command."""
    options: list[Option] = []
    ignored: list[int] = []
    first = 0
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        is_directive = line.startswith("#SBATCH")
        if first:
            if is_directive:
                ignored.append(n)
            continue
        if line and not line.startswith("#"):
            first = n
            continue
        if not is_directive:
            continue
        rest = line[len("#SBATCH"):]
        if rest and not rest[0].isspace():
            continue  # "#SBATCHX ..." is a comment to sbatch
        try:
            words = shlex.split(rest, comments=True)
        except ValueError as e:
            raise BatchError(f"line {n}: {line!r}: {e}") from None
        try:
            options += parse_options(words, SBATCH_LONG, SBATCH_SHORT, n)[0]
        except BatchError as e:
            raise BatchError(f"line {n} ({line}): {e}") from None
    return Directives(tuple(options), tuple(ignored), first)


# ----------------------------------------------------------------------------- values


def whole(option: Option, least: int = 1) -> int:
    """A whole-number value, at least ``least``."""
    value = option.value or ""
    if not value.isdecimal() or int(value) < least:
        raise BatchError(f"line {option.line}: {option.given} {option.value or ''}: give a whole number >= {least}")
    return int(value)


def node_range(option: Option) -> int:
    """``--nodes=N`` or ``N-M`` (Slurm grants up to M on an idle cluster)."""
    lo, _, hi = (option.value or "").partition("-")
    if not lo.isdecimal() or (hi and not hi.isdecimal()) or int(lo) < 1 or (hi and int(hi) < int(lo)):
        raise BatchError(f"line {option.line}: {option.given} {option.value}: give a node count like 2 or 2-2")
    return int(hi or lo)


def gpu_count(option: Option) -> int:
    """``[type:]N`` of --gpus*, or the GPUs of ``--gres`` (``gpu``, ``gpu:4``, ``gpu:a100:4``, among other gres)."""
    value = option.value or ""
    if option.name == "gres":
        total = 0
        for item in value.split(","):
            parts = item.split(":")
            if parts[0] != "gpu":
                continue
            count = parts[-1] if len(parts) > 1 and parts[-1].isdecimal() else "1"
            total += int(count)
        return total
    count = value.rsplit(":", 1)[-1]
    if not count.isdecimal():
        raise BatchError(f"line {option.line}: {option.given} {value}: give a number of GPUs like 4 or a100:4")
    return int(count)


def seconds(value: str) -> int | None:
    """A Slurm time limit in seconds (None: unlimited): minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS."""
    text = value.strip().lower()
    if text in UNLIMITED or text == "0":
        return None
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text)
    if not m:
        raise BatchError(f"--time={value}: not a Slurm time; write minutes (30), HH:MM:SS (00:30:00) or D-HH:MM:SS")
    days, a, b, c = m.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        return ((int(days) * 24 + int(a)) * 60 + int(b or 0)) * 60 + int(c or 0)
    if c is not None:  # HH:MM:SS
        return (int(a) * 60 + int(b)) * 60 + int(c)
    if b is not None:  # MM:SS
        return int(a) * 60 + int(b)
    return int(a) * 60  # minutes


def minutes_text(secs: int | None) -> str:
    if secs is None:
        return "no time limit"
    return f"{secs // 60} min" + (f" {secs % 60} s" if secs % 60 else "")


# ----------------------------------------------------------------------------- the request and the allocation


@dataclass(frozen=True)
class BatchRequest:
    """What a batch script asks Slurm for (None: not asked)."""

    nodes: int | None = None
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    cpus_per_task: int = 1
    gpus_per_node: int | None = None  # --gpus-per-node or --gres=gpu:N
    gpus_per_task: int | None = None
    gpus: int | None = None  # --gpus / -G: for the whole job
    ntasks_per_gpu: int | None = None
    gpu_bind: str | None = None
    time: int | None = None  # seconds; None: none asked (with time_given) or unlimited
    time_given: bool = False
    job_name: str = ""
    ignored: tuple[int, ...] = ()  # #SBATCH lines after the first command
    options: tuple[Option, ...] = field(default=(), repr=False)

    def given(self, name: str) -> Option | None:
        """The last option called ``name`` (Slurm takes the last one given)."""
        return next((o for o in reversed(self.options) if o.name == name), None)


def read_request(text: str) -> BatchRequest:
    """What the batch script ``text`` asks for; a :class:`BatchError` when ``sbatch`` would refuse it."""
    if not text.startswith("#!"):
        raise BatchError("sbatch refuses a batch script whose first line does not start with #! and the path of a "
                         "shell: make the first line #!/bin/bash")
    d = read_directives(text)
    last = {o.name: o for o in d.options}
    get = last.get
    gpn = [o for o in d.options if o.name in ("gpus-per-node", "gres")]
    return BatchRequest(
        nodes=node_range(get("nodes")) if get("nodes") else None,
        ntasks=whole(get("ntasks")) if get("ntasks") else None,
        ntasks_per_node=whole(get("ntasks-per-node")) if get("ntasks-per-node") else None,
        cpus_per_task=whole(get("cpus-per-task")) if get("cpus-per-task") else 1,
        gpus_per_node=gpu_count(gpn[-1]) if gpn else None,
        gpus_per_task=gpu_count(get("gpus-per-task")) if get("gpus-per-task") else None,
        gpus=gpu_count(get("gpus")) if get("gpus") else None,
        ntasks_per_gpu=whole(get("ntasks-per-gpu")) if get("ntasks-per-gpu") else None,
        gpu_bind=get("gpu-bind").value if get("gpu-bind") else None,
        time=seconds(get("time").value or "") if get("time") else None,
        time_given=get("time") is not None,
        job_name=(get("job-name").value or "") if get("job-name") else "",
        ignored=d.ignored,
        options=d.options,
    )
