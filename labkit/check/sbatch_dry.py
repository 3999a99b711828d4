"""A batch script's body run as a dry run: every launcher it calls records its call instead of starting anything.

:func:`run` copies the script where ``slurmd`` would keep it (``spool/slurm_script``: ``$0`` is that copy, as in a
real job) and runs it with ``bash`` in a scratch folder, the folder ``sbatch`` was run from (``SLURM_SUBMIT_DIR``),
with the allocation's ``SLURM_*`` variables (:meth:`labkit.launching.slurm_alloc.Allocation.environ`) and a folder
of *shims* first on ``PATH``: ``srun``, ``mpirun``, ``mpiexec``, ``horovodrun`` and ``python`` record their
arguments, environment and working folder (:class:`Call`) and return at once; ``sbatch``, ``module``, ``scontrol``
(``show hostnames`` answers the allocation's nodes), ``hostname`` (the first node's name) and a few more answer as
on the cluster's first node. A launcher or python named by its path (``/usr/bin/mpirun``) is named bare in the
copy that runs, so that its shim answers too. The scratch folder holds an empty ``fashion_mnist.py`` and a copy
of the learner's hostfile, so that a script that tests for them finds them, and a ``python`` reached some other
way (a variable holding its path) runs nothing.

The script runs as the learner, with the learner's rights: it is their own script, and the check runs where they
could run it themselves. It gets a few seconds (:data:`SECONDS`), in a process group of its own under a subreaper
(:mod:`labkit.check.reap`); when the time is up everything it started is killed, whatever signals it ignores, and
what was still running is named. ``HOME`` and ``TMPDIR`` point into the scratch folder, so that ordinary writes
(``mkdir -p ~/logs``) stay there; a script that writes elsewhere by full path can, as it could when run by hand.
The shims' records are JSON files outside the script's folder; a script could forge them, but only to fool its own
check.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from labkit.core import contract, proc, pycommand

SECONDS = 10.0  # the dry run's bound: the launchers return at once, so a script ends in well under a second (idle)
LAUNCHERS = ("srun", "mpirun", "mpiexec", "orterun", "horovodrun")
QUIET = ("module", "ml", "squeue", "scancel", "sacct", "salloc", "sinfo", "sbcast")
ANSWERS = ("sbatch", "scontrol", "hostname", "nvidia-smi")
KEPT = ("PATH", "USER", "LOGNAME", contract.JOB_IDS, contract.JOB_ID)  # of the caller's environment
OUTPUT_CHARS = 4000

SHIM = '''#!{python} -IS
# labkit's dry run of a batch script: this {tool} records how it was called, and starts nothing.
import json, os, sys, time

RECORDS, TOOL, NODES = {records!r}, {tool!r}, {nodes!r}
argv = sys.argv[1:]
record = {{"tool": TOOL, "argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "time": time.time()}}
name = os.path.join(RECORDS, "%020d-%d.json" % (time.monotonic_ns(), os.getpid()))
with open(name + ".part", "w") as f:
    json.dump(record, f)
os.replace(name + ".part", name)
if TOOL == "sbatch":
    print("Submitted batch job 4243")
elif TOOL == "scontrol" and argv[:2] == ["show", "hostnames"]:
    wanted = argv[2] if len(argv) > 2 else os.environ.get("SLURM_JOB_NODELIST", "")
    print("\\n".join(NODES if wanted == os.environ.get("SLURM_JOB_NODELIST") else wanted.split(",")))
elif TOOL == "hostname":
    print(NODES[0])
elif TOOL == "nvidia-smi":
    ids = [i for i in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if i]
    print("\\n".join("GPU %d: (a GPU of the dry run)" % k for k in range(len(ids))))
'''


@dataclass(frozen=True)
class Call:
    """One call of a shimmed command: what it was given and where."""

    tool: str
    argv: tuple[str, ...]
    env: dict[str, str] = field(repr=False)
    cwd: str

    def to_dict(self) -> dict[str, Any]:
        return {"tool": self.tool, "argv": list(self.argv), "cwd": self.cwd}


@dataclass
class BatchRun:
    """How the dry run went: the script's exit code, whether it ran out of time, what it called."""

    code: int | None = None
    timed_out: bool = False
    seconds: float = 0.0
    output: str = ""  # the tail of what it printed
    calls: list[Call] = field(default_factory=list)
    still_running: list[str] = field(default_factory=list)  # when the time was up
    left: list[str] = field(default_factory=list)  # running after the script ended (stopped)
    syntax: str = ""  # bash could not read the script
    bound: float = SECONDS  # the seconds it was given

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "timed_out": self.timed_out, "seconds": round(self.seconds, 2), "bound": self.bound,
                "output": self.output, "calls": [c.to_dict() for c in self.calls],
                "still_running": self.still_running, "left": self.left, "syntax": self.syntax}


class Tail:
    """The last ``chars`` characters of a stream, however much it prints (a script may print without end)."""

    def __init__(self, chars: int) -> None:
        self.chars = chars
        self.data = bytearray()

    def add(self, chunk: bytes) -> None:
        self.data += chunk
        if len(self.data) > 2 * self.chars:
            del self.data[:-self.chars]

    def text(self) -> str:
        return self.data[-self.chars:].decode(errors="replace")


def write_shims(folder: Path, records: Path, nodes: list[str]) -> None:
    """The shims, executable, in ``folder``; each records into ``records``."""
    folder.mkdir(parents=True, exist_ok=True)
    records.mkdir(parents=True, exist_ok=True)
    for tool in (*LAUNCHERS, *pycommand.NAMES, *QUIET, *ANSWERS):
        path = folder / tool
        path.write_text(SHIM.format(python=sys.executable, tool=tool, records=str(records), nodes=list(nodes)))
        path.chmod(0o755)


def environ(allocation_env: dict[str, str], shims: Path, cwd: Path) -> dict[str, str | None]:
    """The script's environment: the allocation's variables, the shims first on PATH, HOME and TMPDIR in the
    scratch folder; every other variable of the caller's unset (None)."""
    mine: dict[str, str | None] = {k: None for k in os.environ if k not in KEPT}
    tmp = cwd / "tmp"
    tmp.mkdir(exist_ok=True)
    mine.update(allocation_env)
    mine.update(PATH=f"{shims}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}", HOME=str(cwd),
                TMPDIR=str(tmp), SHELL="/bin/bash", LANG="C.UTF-8", TERM="dumb", PWD=str(cwd))
    return mine


# A launcher or python named by its path (/usr/bin/mpirun): the copy the dry run runs names it bare, so that the
# shim answers (a real mpirun would look for the nodes, and a real python run the script).
BY_PATH = re.compile(r"(?<![\w$.-])(?:\.?/[\w.+-]+)*/(" + "|".join(re.escape(t) for t in (*LAUNCHERS, *pycommand.NAMES))
                     + r")(?=[\s;|&)]|$)")


def bare_launchers(text: str) -> str:
    """``text`` with every launcher and python named by its path named bare (``/usr/bin/mpirun`` -> ``mpirun``)."""
    return BY_PATH.sub(r"\1", text)


def syntax_error(script: Path) -> str:
    """bash's own complaint when it cannot read ``script`` (``bash -n``), else ''."""
    try:
        done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=10,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"bash could not read it: {e}"
    return done.stderr.strip() if done.returncode else ""


def read_calls(records: Path) -> list[Call]:
    """The shims' records, in the order they were called."""
    calls = []
    for path in sorted(records.glob("*.json")):
        try:
            row = json.loads(path.read_text())
            calls.append(Call(str(row["tool"]), tuple(str(a) for a in row["argv"]),
                              {str(k): str(v) for k, v in dict(row["env"]).items()}, str(row["cwd"])))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return calls


def _running(job: proc.Job) -> list[str]:
    names = []
    for p in job.members():
        try:
            cmd = " ".join(p.cmdline()) or p.name()
        except psutil.Error:
            continue
        if "labkit.check.reap" not in cmd:
            names.append(cmd)
    return list(dict.fromkeys(names))


def run(script: Path, allocation_env: dict[str, str], nodes: list[str], work: Path, hostfile: Path | None = None,
        timeout: float | None = None) -> BatchRun:
    """Run ``script``'s body with ``bash`` as a dry run in ``work`` (see the module's docstring), for ``timeout``
    seconds at most (default: :data:`SECONDS`)."""
    timeout = SECONDS if timeout is None else timeout
    cwd, shims, records, spool = work / "submit", work / "shims", work / "records", work / "spool"
    for folder in (cwd, spool):
        folder.mkdir(parents=True, exist_ok=True)
    copy = spool / "slurm_script"
    copy.write_text(bare_launchers(script.read_text(errors="replace")))
    syntax = syntax_error(copy)
    if syntax:
        return BatchRun(syntax=syntax.replace(str(copy), script.name))
    write_shims(shims, records, nodes)
    (cwd / "fashion_mnist.py").write_text("")
    if hostfile is not None and hostfile.is_file():
        shutil.copyfile(hostfile, cwd / hostfile.name)
    env = environ({**allocation_env, "SLURM_SUBMIT_DIR": str(cwd)}, shims, cwd)
    report = work / "reap.json"
    argv = [sys.executable, "-m", "labkit.check.reap", str(report), "--", "bash", str(copy)]
    out = BatchRun(bound=timeout)
    said = Tail(OUTPUT_CHARS)
    start = time.monotonic()
    with proc.Job() as job:
        p = job.spawn(argv, env=env, cwd=cwd, on_output=said.add, name="batch script")
        out.code = p.wait(timeout)
        if out.code is None:
            out.timed_out = True
            out.still_running = _running(job)
    out.seconds = time.monotonic() - start
    try:
        done = json.loads(report.read_text())
        out.code, out.left = int(done["code"]), [str(c) for c in done["left"]]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    out.output = said.text().replace(str(copy), script.name)
    out.calls = read_calls(records)
    return out
