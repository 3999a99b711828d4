"""A Slurm batch script that needs no labkit on the nodes, written as a person would write it.

    labkit run --launcher slurm --plain --script-only job.sbatch -- python fashion_mnist_solution.py --epochs 5

:class:`labkit.launching.slurm.Slurm` runs every rank under ``python -m labkit.launching.rank`` (logs, records, the
job's contract). With ``SlurmOptions(plain=True)`` it writes this script instead: it needs Slurm,
OpenMPI and a Python with TensorFlow, tf-keras and Horovod, nothing else, and sets in plain shell
what labkit sets for every rank (the README's table in "How labkit run launches"): the threads
per worker (the node's cores over its tasks, computed on the node), ``OMPI_MCA_mpi_yield_when_idle``,
``TF_USE_LEGACY_KERAS=1``, and for ``start="tf_config"`` each task's ``TF_CONFIG``, built from
``SLURM_JOB_NODELIST``, ``SLURM_NTASKS_PER_NODE`` and ``SLURM_PROCID`` exactly as
:func:`labkit.launching.slurm.tf_config_from_slurm` builds it. Paths are relative to the folder ``sbatch``
runs in; ``PYTHON=... sbatch FILE`` chooses the Python, ``THREADS=...`` the threads.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from labkit import __version__
from labkit.core import env as lkenv
from labkit.core import pycommand
from labkit.instrument.start import unwrap
from labkit.launching.launchers import mpirun_flags
from labkit.launching.sbatch import SlurmOptions

WRAPPER = "labkit.launching.rank"
RULE = "# " + "-" * 98
# Why each default of labkit.core.env.DEFAULTS is set (a default without a reason here gets none).
WHY = {"TF_USE_LEGACY_KERAS": "tf.keras must be Keras 2 (the tf-keras package), as Horovod needs: set before "
                              "TensorFlow loads",
       "TF_CPP_MIN_LOG_LEVEL": "Only errors from TensorFlow's C++ side"}
STARTS = {
    "mpirun": "OpenMPI's mpirun reads the allocation from Slurm and starts one Horovod rank per task.",
    "srun": "srun starts one Horovod rank per task (with this environment); MPI finds its peers through PMIx.",
    "tf_config": "srun starts one tf.distribute worker per task, each with its TF_CONFIG.",
}


def user_command(command: Sequence[str]) -> list[str]:
    """The command as the user gave it: without labkit's per-rank wrapper and run observer, ``python`` for this
    interpreter."""
    command = list(command)
    if WRAPPER in command and "--" in command:
        command = command[command.index("--") + 1:]
    return ["python" if c == sys.executable else c for c in unwrap(command)]


def section(title: str, *why: str) -> list[str]:
    """A section heading and the comment lines that say why."""
    return ["", f"{RULE[:4]} {title} {RULE[len(title) + 6:]}", *[f"# {line}" for line in why]]


def origin(o: SlurmOptions, command: Sequence[str], name: str) -> list[str]:
    """The labkit command that writes this script again."""
    flags = ["--nodes", str(o.nodes), "--tasks-per-node", str(o.tasks_per_node)]
    for flag, value in (("gpus-per-task", o.gpus_per_task), ("cpus-per-task", o.cpus_per_task),
                        ("partition", o.partition), ("account", o.account), ("time", o.time)):
        if value:
            flags += [f"--{flag}", str(value)]
    if o.start != "mpirun":
        flags += ["--start", o.start]
    return ["labkit", "run", "--launcher", "slurm", "--plain", *flags, "--script-only", name, "--", *command]


def head(o: SlurmOptions, command: Sequence[str], name: str, directives: Sequence[str]) -> list[str]:
    script = next((Path(c).name for c in command if c.endswith(".py")), command[0])
    kind = "tf.distribute workers" if o.start == "tf_config" else "Horovod ranks"
    nodes = f"{o.nodes} node{'s' if o.nodes > 1 else ''}"
    needs = ("Slurm and a Python with TensorFlow and tf-keras" if o.start == "tf_config" else
             "Slurm, OpenMPI and a Python with TensorFlow, tf-keras and Horovod")
    return [
        "#!/bin/bash",
        f"# {script} on {o.nodes * o.tasks_per_node} workers ({nodes} x {o.tasks_per_node} tasks), "
        f"{kind} started by {'mpirun' if o.start == 'mpirun' else 'srun'}.",
        "#",
        f"# Written by labkit {__version__} (the course kit's Slurm launcher, labkit/launching/slurm_plain.py) with:",
        f"#   {shlex.join(origin(o, command, name))}",
        f"# It needs no labkit on the nodes, only {needs},",
        "# at the same paths on every node. Edit it as you like; submit it from the folder the paths below",
        f"# are relative to: sbatch {shlex.quote(name)}",
        *directives,
    ]


def environment(o: SlurmOptions, extra: Mapping[str, str]) -> list[str]:
    """Every worker's settings, as labkit sets them (labkit.launching.launchers.worker_env), in plain shell."""
    lines = section("every worker's environment")
    for key, value in lkenv.DEFAULTS.items():
        lines += [f"# {WHY[key]}."] if key in WHY else []
        lines.append(f"export {key}={shlex.quote(value)}")
    names = list(lkenv.thread_env(1))
    lines += [
        "# Threads per worker: the node's allocated cores shared by its tasks (N workers with all cores",
        "# each fight over the same cores). --cpus-per-task sets them; so does THREADS=N sbatch ...",
        "THREADS=${THREADS:-${SLURM_CPUS_PER_TASK:-$(( SLURM_CPUS_ON_NODE / SLURM_NTASKS_PER_NODE ))}}",
        "if (( THREADS < 1 )); then THREADS=1; fi",
        "export " + " ".join(f"{n}=$THREADS" for n in names[:3]) + " \\",
        "       " + " ".join(f"{n}=$THREADS" for n in names[3:]),
        "# A rank waiting in MPI yields its core instead of spinning.",
        "export OMPI_MCA_mpi_yield_when_idle=1",
    ]
    if not o.gpus_per_task:
        lines += ["# No GPUs asked for: TensorFlow does not probe for CUDA.", "export CUDA_VISIBLE_DEVICES="]
    if extra:
        lines += ["# Set for this job."] + [f"export {k}={shlex.quote(v)}" for k, v in sorted(extra.items())]
    return lines


def exported(o: SlurmOptions, extra: Mapping[str, str]) -> list[str]:
    """The variables mpirun must pass on to ranks on other nodes."""
    names = ["PATH", *lkenv.DEFAULTS, *lkenv.thread_env(1), "OMPI_MCA_mpi_yield_when_idle"]
    return names + (["CUDA_VISIBLE_DEVICES"] if not o.gpus_per_task else []) + sorted(extra)


def _rows(items: Sequence[str], n: int) -> list[Sequence[str]]:
    return [items[i:i + n] for i in range(0, len(items), n)]


def start(o: SlurmOptions, command: Sequence[str], extra: Mapping[str, str], base_port: int) -> list[str]:
    """The section that starts the ranks."""
    run = ('"$PYTHON" ' if command[0] in pycommand.NAMES else shlex.quote(command[0]) + " ") + shlex.join(command[1:])
    lines = section("start the workers", STARTS[o.start])
    if o.start == "mpirun":
        flags = [f for f in mpirun_flags(o.nodes * o.tasks_per_node, cores=1 << 30, as_root=False)
                 if f != "--oversubscribe"]
        return lines + [
            "# No binding (the threads are limited above); shared memory within a node, TCP across nodes;",
            "# -x passes the settings above on to the ranks on other nodes.",
            "# OpenMPI refuses to run as root unless told to (containers and CI run as root).",
            "if (( $(id -u) == 0 )); then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi",
            'mpirun -np "$SLURM_NTASKS" \\',
            f"    {shlex.join(flags)} \\",
            *[f"    {' '.join(f'-x {n}' for n in names)} \\" for names in _rows(exported(o, extra), 5)],
            f"    {run}",
        ]
    srun = 'srun --kill-on-bad-exit=1 --ntasks="$SLURM_NTASKS"'
    if o.start == "srun":
        return lines + [f"{srun} --mpi=pmix {run}"]
    return lines + [
        "# Every task is a worker, in rank order: the first node's tasks, then the next node's ..., each",
        "# task of a node on its own port (the ports move with the job id, so two jobs on a node do not clash).",
        f"PORT=$(( {base_port} + SLURM_JOB_ID % 1000 * 8 ))",
        "WORKERS=()",
        'for node in $(scontrol show hostnames "$SLURM_JOB_NODELIST"); do',
        "    for (( i = 0; i < SLURM_NTASKS_PER_NODE; i++ )); do",
        '        WORKERS+=("\\"$node:$(( PORT + i ))\\"")',
        "    done",
        "done",
        'TF_WORKERS="[$(IFS=,; echo "${WORKERS[*]}")]"',
        "export TF_WORKERS",
        "# A task's index is its SLURM_PROCID, known only inside the task: each task completes its",
        "# TF_CONFIG, then becomes the script.",
        f"{srun} --mpi=none bash -c \\",
        "    'export TF_CONFIG=\"{\\\"cluster\\\": {\\\"worker\\\": $TF_WORKERS}, "
        "\\\"task\\\": {\\\"type\\\": \\\"worker\\\", \\\"index\\\": $SLURM_PROCID}}\"",
        "     exec \"$@\"' worker \\",
        f"    {run}",
    ]


def plain_script(o: SlurmOptions, command: Sequence[str], env: Mapping[str, str], name: str,
                 directives: Sequence[str], base_port: int) -> str:
    """The whole script, called ``name``, for ``command`` (as the user gave it, or wrapped by labkit for its
    ranks); the settings of ``env`` that are not labkit's own are kept."""
    command = user_command(command)
    if not command:
        raise ValueError("nothing to run: give a command, e.g. python train.py")
    standard = {*lkenv.DEFAULTS, *lkenv.thread_env(1), "OMPI_MCA_mpi_yield_when_idle", "CUDA_VISIBLE_DEVICES"}
    extra = {k: v for k, v in env.items() if k not in standard and not k.startswith("LABKIT_") and k.isidentifier()}
    lines = [*head(o, command, name, directives), "", "set -euo pipefail"]
    lines += section("where", "The script's paths are relative to the folder sbatch was run in.")
    lines.append('cd "$SLURM_SUBMIT_DIR"')
    if command[0] in pycommand.NAMES:
        lines += section("the Python",
                         "A Python with TensorFlow, tf-keras and Horovod, at the same path on every node: a virtual",
                         "environment on a shared file system, or one from `module load`. PYTHON=... sbatch ... "
                         "chooses another.")
        lines.append(f"PYTHON=${{PYTHON:-{command[0]}}}")
    lines += environment(o, extra) + start(o, command, extra, base_port)
    return "\n".join(lines) + "\n"


def job_name(o: SlurmOptions, command: Sequence[str]) -> SlurmOptions:
    """``o`` named after the script when it has the default name."""
    script = next((Path(c).stem for c in user_command(command) if c.endswith(".py")), None)
    if o.job_name != "labkit" or not script:
        return o
    return dataclasses.replace(o, job_name="".join(c if c.isalnum() or c in "._-" else "_" for c in script))
