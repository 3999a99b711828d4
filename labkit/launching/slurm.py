"""Slurm: write a batch script, submit it, follow rank 0, return the job's exit status.

    labkit run --launcher slurm --nodes 2 --tasks-per-node 4 -- python fashion_mnist_solution.py

:class:`Slurm` writes ``LOG_DIR/job.sbatch`` (shown to the user), submits it with
:mod:`labkit.launching.slurm_wait` (which exits with the job's exit status), streams rank 0's log
while the job runs, and on an interrupt or timeout cancels the job with
``scancel`` and waits until the queue no longer holds it.

Inside the allocation the ranks start one of three ways (``start=``):

* ``"mpirun"`` (default): OpenMPI's mpirun, which reads the allocation from Slurm;
* ``"srun"``: one task per rank with ``srun --mpi=pmix`` (Horovod over MPI via PMIx);
* ``"tf_config"``: one task per tf.distribute worker with ``srun``; each task builds
  its ``TF_CONFIG`` from the allocation (:func:`tf_config_from_slurm`) before the
  script starts.

``SlurmOptions(plain=True)`` (``--plain``, with ``--script-only FILE``) writes a script that
needs no labkit on the nodes instead (:mod:`labkit.launching.slurm_plain`).

The script assumes what clusters share: the same path to this Python environment
and to the working folder on every node.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from labkit.core import contract, pipes, proc
from labkit.launching import slurm_plain
from labkit.launching.launchers import Command, Launcher, LaunchError, mpirun_flags, tool
from labkit.launching.sbatch import SlurmOptions, directives, output_pattern
from labkit.launching.slurm_wait import parse_job_id

BASE_PORT = 23456


def task_command(o: SlurmOptions, command: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """How the batch script starts ``command`` on every rank of the allocation."""
    if o.start == "mpirun":
        flags = [f for f in mpirun_flags(o.nodes * o.tasks_per_node, cores=1 << 30) if f != "--oversubscribe"]
        exports = [a for k in sorted(env) for a in ("-x", k)]
        return [tool("mpirun"), "-np", str(o.nodes * o.tasks_per_node), *flags, *exports, *command]
    srun = ["srun", "--kill-on-bad-exit=1", f"--ntasks={o.nodes * o.tasks_per_node}"]
    if o.start == "srun":
        return [*srun, "--mpi=pmix", *command]
    return [*srun, "--mpi=none", sys.executable, "-m", "labkit.launching.slurm", "--", *command]


def batch_script(o: SlurmOptions, command: Sequence[str], env: Mapping[str, str], output: str,
                 workdir: str | Path) -> str:
    """The whole sbatch script (a shell script: Slurm reads its ``#SBATCH`` lines)."""
    o.check()
    lines = ["#!/bin/bash", "# Written by labkit; submit with: sbatch THIS_FILE", *directives(o, output),
             "set -eo pipefail", f"cd {shlex.quote(str(workdir))}"]
    # The job's own settings; labkit's job contract comes with the submitting environment.
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(contract.strip(env).items()) if k.isidentifier()]
    why = {"mpirun": "# Horovod: mpirun reads the allocation from Slurm and starts one rank per task",
           "srun": "# Horovod: srun starts one rank per task; MPI finds its peers through PMIx",
           "tf_config": "# tf.distribute: one worker per task, each with a TF_CONFIG built from the allocation"}
    lines += [why[o.start], shlex.join(task_command(o, command, env)), ""]
    return "\n".join(lines)


def plain_batch_script(o: SlurmOptions, command: Sequence[str], env: Mapping[str, str], name: str) -> str:
    """The batch script ``name`` that runs ``command`` without labkit on the nodes
    (:mod:`labkit.launching.slurm_plain`)."""
    o.check()
    o = slurm_plain.job_name(o, command)
    return slurm_plain.plain_script(o, command, env, name, directives(o, "slurm-%j.out"), BASE_PORT)


# ----------------------------------------------------------------------------- TF_CONFIG inside an allocation


def expand_nodelist(nodelist: str) -> list[str]:
    """``node[01-03],gpu7`` as a list of names (``scontrol show hostnames`` when there is one)."""
    scontrol = shutil.which("scontrol")
    if scontrol:
        out = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.split()
    names: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?", nodelist):
        m = re.match(r"^(.*)\[(.*)\]$", part)
        if not m:
            names.append(part)
            continue
        for rng in m.group(2).split(","):
            lo, _, hi = rng.partition("-")
            for i in range(int(lo), int(hi or lo) + 1):
                names.append(f"{m.group(1)}{str(i).zfill(len(lo))}")
    return names


def tasks_per_node(spec: str) -> list[int]:
    """``SLURM_TASKS_PER_NODE`` (``2(x3),1``) as one count per node."""
    counts: list[int] = []
    for part in spec.split(","):
        m = re.match(r"^(\d+)(?:\(x(\d+)\))?$", part.strip())
        if not m:
            raise ValueError(f"cannot read SLURM_TASKS_PER_NODE={spec!r}")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def tf_config_from_slurm(environ: Mapping[str, str], base_port: int = BASE_PORT) -> dict[str, object]:
    """This task's ``TF_CONFIG``: every task of the step is a worker, rank order by node (block distribution)."""
    try:
        rank = int(environ["SLURM_PROCID"])
        nodes = expand_nodelist(environ.get("SLURM_STEP_NODELIST") or environ["SLURM_JOB_NODELIST"])
        counts = tasks_per_node(environ.get("SLURM_STEP_TASKS_PER_NODE") or environ["SLURM_TASKS_PER_NODE"])
    except KeyError as e:
        raise LaunchError(f"not inside a Slurm step: {e.args[0]} is not set") from None
    port = base_port + int(environ.get("SLURM_JOB_ID", "0")) % 1000 * 8
    workers = [f"{node}:{port + local}" for node, n in zip(nodes, counts, strict=False) for local in range(n)]
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": rank}}


def main(argv: list[str] | None = None) -> int:
    """``python -m labkit.launching.slurm -- CMD``: run CMD with this task's TF_CONFIG (inside ``srun``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--"]:
        argv = argv[1:]
    if not argv:
        print("usage: python -m labkit.launching.slurm -- CMD [ARGS...]", file=sys.stderr)
        return 2
    conf = tf_config_from_slurm(os.environ)
    env = dict(os.environ, TF_CONFIG=json.dumps(conf))
    env[contract.TASK] = f"worker.{conf['task']['index']}"
    os.execvpe(argv[0], argv, env)
    return 0  # pragma: no cover


# ----------------------------------------------------------------------------- the launcher


def reachable(timeout: float = 15) -> bool:
    """True when a Slurm controller answers here (``sinfo`` works)."""
    if not shutil.which("sinfo"):
        return False
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return out.returncode == 0 and bool(out.stdout.strip())


def queued(job_id: str) -> bool:
    """True while Slurm still holds the job (pending, running or completing)."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30)
    return out.returncode == 0 and bool(out.stdout.strip())


def cancel(job_id: str, timeout: float = 60) -> bool:
    """``scancel`` a job Slurm still holds and wait until the queue no longer shows it; True when gone."""
    if not shutil.which("scancel") or not queued(job_id):
        return True
    subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    return proc.wait_until(lambda: not queued(job_id), timeout=timeout, every=0.5)


class Slurm(Launcher):
    """Submit the job and wait for it (:mod:`labkit.launching.slurm_wait`); ``np`` must equal nodes x tasks per node."""

    name = "slurm"

    def __init__(self, np: int | None = None, options: SlurmOptions | None = None, **kw: object) -> None:
        self.options = options or SlurmOptions(tasks_per_node=np or 2)
        total = self.options.nodes * self.options.tasks_per_node
        if np is not None and np != total:
            raise LaunchError(f"--np {np} does not match --nodes {self.options.nodes} x --tasks-per-node "
                              f"{self.options.tasks_per_node} = {total}")
        super().__init__(total, **kw)
        self.script_only = Path(self.options.script_only) if self.options.script_only else None
        self.script_path = Path("job.sbatch")
        self.job_id: str | None = None
        self.log_dir: Path | None = None
        self._follow: threading.Event | None = None

    def preflight(self) -> None:
        self.options.check()
        if self.options.plain and not self.script_only:
            raise LaunchError("--plain writes a batch script that runs without labkit, for you to submit: "
                              "add --script-only FILE")
        if self.script_only:
            return
        missing = [t for t in ("sbatch", "squeue", "scontrol", "scancel") if not shutil.which(t)]
        if missing:
            raise LaunchError(f"Slurm's {', '.join(missing)} not found: run this on a Slurm login node, or "
                              "write the batch script only with --script-only FILE and submit it there.")
        super().preflight()

    def script(self, command: Sequence[str], env: Mapping[str, str], log_dir: Path, workdir: str | Path) -> str:
        if self.options.plain:
            return plain_batch_script(self.options, command, env, (self.script_only or Path("job.sbatch")).name)
        return batch_script(self.options, command, env, output_pattern(log_dir), workdir)

    def commands(self, command: Sequence[str], env: Mapping[str, str]) -> list[Command]:
        return [("sbatch", [sys.executable, "-m", "labkit.launching.slurm_wait", str(self.script_path)], {})]

    def start(self, job: proc.Job, command: Sequence[str], env: Mapping[str, str], log_dir: Path,
              on_output: Callable[[bytes], None] | None = None, on_end: Callable[[], None] | None = None,
              cwd: str | Path | None = None) -> list[proc.Proc]:
        text = self.script(command, env, log_dir, Path(cwd or ".").resolve())
        self.script_path = self.script_only or (log_dir / "job.sbatch")
        self.script_path.write_text(text)
        self.log_dir = log_dir
        if self.script_only:
            return []

        seen = bytearray()

        def on_sbatch(chunk: bytes) -> None:
            seen.extend(chunk)
            if self.job_id is None:
                self.job_id = parse_job_id(seen.decode(errors="replace"))

        (p,) = [job.spawn(argv, env={**env, **extra}, cwd=cwd, log=log_dir / "sbatch.out", on_output=on_sbatch,
                          name=name) for name, argv, extra in self.commands(command, env)]
        show = int(env.get(contract.SHOW_RANK, "0") or 0)
        self._follow = threading.Event()
        threading.Thread(target=pipes.follow, args=(log_dir / f"rank.{show}.log", on_output, self._follow, on_end),
                         daemon=True).start()
        return [p]

    def stop(self) -> None:
        """Stop following the output; cancel the job if Slurm still holds it, and wait until it is gone."""
        if self._follow is not None:
            time.sleep(0.3)  # the last lines
            self._follow.set()
        if self.job_id is None and self.log_dir is not None and (self.log_dir / "sbatch.out").exists():
            self.job_id = parse_job_id((self.log_dir / "sbatch.out").read_text(errors="replace"))
        if self.job_id:
            cancel(self.job_id)


if __name__ == "__main__":
    sys.exit(main())
