"""The lab registry: every lab's name, steps, files, notebook, time budget and points, in one place.

Read by ``labkit check``, ``labkit grade``, ``labkit release``, ``labkit gen``, ``labkit reset``, the run
records and the notebooks' check cells; each lab's judges are the check package's
(:data:`labkit.check.judges.JUDGES`). ``docs/adding-a-lab.md`` says how a lab is added.

A lab's starter lives in ``labs/``; its step solutions ``solutions/<stem>_after_step_NN.py`` are generated from
one template, ``solutions/source/<stem>.py.tmpl``. A lab may continue the finished
script of another (``builds_on``): it shares that lab's starter and template, and its solutions carry a stem
of their own, so that both labs' step solutions live side by side. A lab whose steps ask for different files
(``step_files``, e.g. a hostfile and a batch script) names the file of each step; they live next to the starter,
and each step's solution is named after its own file (``solutions/<file's stem>_after_step_NN<file's suffix>``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # labkit/course/ -> the checkout


@dataclass(frozen=True)
class Lab:
    """One lab of the course."""

    name: str  # as in ``labkit check NAME``
    title: str
    steps: tuple[str, ...]  # what each step asks for, in order
    starter: str  # the learner's script, in labs/
    notebook: str
    timeout: float  # seconds a whole check may take
    points: int = 0  # what the lab is worth in a released course's grade, split over its steps (0: not graded)
    builds_on: str = ""  # the lab whose finished script this one continues ("": it starts from its own starter)
    solutions_stem: str = ""  # its solutions are solutions/<this>_after_step_NN.py (default: the starter's stem)
    step_files: tuple[str, ...] = ()  # the file each step asks for, next to the starter (default: the starter)

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    @property
    def stem(self) -> str:
        """The stem of the lab's solution files: the starter's, unless the lab names its own."""
        return self.solutions_stem or Path(self.starter).stem

    def solution(self, step: int | None = None, root: Path = ROOT) -> Path:
        """The solution after ``step`` (default: the last)."""
        k = self.n_steps if step is None else step
        if not 1 <= k <= self.n_steps:
            raise ValueError(f"the {self.name} lab has steps 1..{self.n_steps}, got {k}")
        own = Path(self.step_file(k))
        stem = self.stem if own.name == self.starter else own.stem
        return root / "solutions" / f"{stem}_after_step_{k:02d}{own.suffix}"

    def step_file(self, step: int) -> str:
        """The file step ``step`` asks the learner to write: the starter, unless the lab names one per step (and
        the starter for a step the lab does not have)."""
        return self.step_files[step - 1] if 1 <= step <= len(self.step_files) else self.starter

    @property
    def files(self) -> tuple[str, ...]:
        """Every file the learner writes for this lab, the starter first."""
        return tuple(dict.fromkeys((self.starter, *self.step_files)))

    def step_title(self, step: int) -> str:
        return self.steps[step - 1]


LABS: dict[str, Lab] = {lab.name: lab for lab in (
    Lab("horovod", "Horovod: from one process to many", (
        "initialise Horovod and pin one GPU per process by local rank",
        "print progress on rank 0 only",
        "average gradients with hvd.DistributedOptimizer",
        "broadcast the initial variables from rank 0",
        "divide steps_per_epoch and validation_steps by the number of workers",
        "average metrics with MetricAverageCallback before callbacks read them",
        "checkpoints on rank 0 only; resume from the latest, its epoch broadcast from rank 0",
        "the learning rate scaled by the number of workers, warmed up over the first epochs",
    ), "fashion_mnist.py", "02_horovod.ipynb", 300.0, 8),
    Lab("mirrored", "MirroredStrategy on one machine", (
        "several devices, one MirroredStrategy over them",
        "the model's variables created under the strategy (mirrored on every replica)",
        "the global batch: each replica gets --batch-size examples",
        "the trained model saved and loaded back",
    ), "fashion_mnist_mirrored.py", "03_mirrored_strategy.ipynb", 120.0, 4),
    Lab("multiworker", "MultiWorkerMirroredStrategy across processes", (
        "one MultiWorkerMirroredStrategy cluster, the model built under it",
        "the global batch, and each worker its own part of the data",
        "only the chief writes logs and the model",
        "no epoch repeated after a worker is killed and restarted (BackupAndRestore)",
        "the learning rate scaled by the number of replicas, warmed up over the first epochs",
    ), "fashion_mnist_multiworker.py", "04_multi_worker.ipynb", 360.0, 4),
    Lab("parameter-server", "ParameterServerStrategy with a coordinator", (
        "a ParameterServerStrategy from TF_CONFIG; workers and servers serve",
        "the model's variables on the parameter servers",
        "each worker builds its own input pipeline; the coordinator schedules the steps",
    ), "fashion_mnist_ps.py", "05_parameter_server.ipynb", 180.0, 3),
    Lab("communication", "What communication costs: gradients as float16 on the wire", (
        "the --fp16-allreduce option sends the gradients as float16",
    ), "fashion_mnist.py", "08_communication.ipynb", 150.0, 1,
        builds_on="horovod", solutions_stem="fashion_mnist_communication"),
    Lab("scale-out", "Scale out: a hostfile and a Slurm batch script for two GPU nodes", (
        "an OpenMPI hostfile that places 8 ranks, 4 on each of gpu01 and gpu02",
        "a Slurm batch script that runs fashion_mnist.py on all 8 GPUs, one rank per GPU, for 30 minutes at most",
    ), "cluster.sbatch", "07_scale_out.ipynb", 60.0,
        step_files=("cluster_hostfile", "cluster.sbatch")),
    Lab("at-scale",
        "What changes at scale: accumulation, synchronised BatchNorm, mixed precision, profiling, elasticity", (
        "--accumulate K: K batches per all-reduce and per update, the learning rate for the effective batch",
        "--sync-bn: BatchNorm's statistics over the global batch, its moving statistics the same on every worker",
        "--precision bf16: the layers compute in bfloat16, the variables and the model's output stay float32",
        "--profile-dir DIR: rank 0, and only rank 0, profiles a few training steps into DIR",
        "--elastic: the job goes on when a worker leaves, from the last committed state, and grows when it returns",
    ), "fashion_mnist.py", "09_at_scale.ipynb", 420.0, 5,
        builds_on="communication", solutions_stem="fashion_mnist_at_scale"),
)}


def get(name: str) -> Lab:
    """The lab called ``name``; a clear error for an unknown one."""
    if name not in LABS:
        raise ValueError(f"unknown lab {name!r}: choose one of {', '.join(LABS)}")
    return LABS[name]


def lineage(lab: Lab) -> list[Lab]:
    """The labs whose finished scripts ``lab`` continues, in order, the one that starts the script first (none
    for a lab that starts from its own starter): lab 9 continues lab 8, which continues lab 2."""
    chain: list[Lab] = []
    while lab.builds_on:
        lab = get(lab.builds_on)
        if lab in chain:
            raise ValueError(f"the labs {', '.join(x.name for x in chain)} continue each other in a circle")
        chain.insert(0, lab)
    return chain


def by_script(path: str | Path) -> Lab | None:
    """The lab whose starter has this file name, if any (the first: a lab that continues another's script comes
    after it), else the lab that asks for a file of this name in one of its steps."""
    name = Path(path).name
    return next((lab for lab in LABS.values() if lab.starter == name),
                next((lab for lab in LABS.values() if name in lab.files), None))


def by_file_name(path: str | Path) -> tuple[Lab | None, str | None]:
    """The lab and step a lab file's name tells (``fashion_mnist_ps_after_step_02.py``: parameter-server, "2";
    ``fashion_mnist_solution.py``: horovod, "solution"): the lab whose starter's or solutions' stem is the longest
    the name starts with, and no lab for a name of no lab's."""
    name = Path(path).stem
    found = re.search(r"_after_step_(\d+)$", name)
    step = str(int(found.group(1))) if found else ("solution" if name.endswith("_solution") else None)
    matches = [(len(stem), lab) for lab in LABS.values() for stem in {lab.stem, Path(lab.starter).stem}
               if name == stem or name.startswith(stem + "_")]
    return (max(matches, key=lambda m: m[0])[1] if matches else None), step
