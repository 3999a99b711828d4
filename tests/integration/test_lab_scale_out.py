"""Lab 7's exercise checked for real, without root and without TensorFlow: hostfiles through OpenMPI's own mapper
(mpirun --do-not-launch), batch scripts read as sbatch reads them and run with bash and the launchers' stand-ins.
Correct variants pass, wrong ones fail at the right step with what to change, and a hostile batch script is stopped
within its bound with nothing left running."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from helpers import paths

from labkit import check
from labkit.check import lab_scale_out, sbatch_dry, scale_out_ranks
from labkit.check.scale_out_evidence import ScaleOutEvidence
from labkit.launching import slurm
from labkit.launching.sbatch import SlurmOptions

pytestmark = pytest.mark.skipif(not scale_out_ranks.mpirun_path(), reason="needs OpenMPI's mpirun")

GOOD_HOSTFILE = "gpu01 slots=4\ngpu02 slots=4\n"
HEAD = ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\n#SBATCH --gpus-per-node=4\n"
        "#SBATCH --time=00:30:00\n")


def _files(tmp_path: Path, hostfile: str = GOOD_HOSTFILE, batch: str | None = None) -> Path:
    (tmp_path / "cluster_hostfile").write_text(hostfile)
    script = tmp_path / "cluster.sbatch"
    script.write_text(batch if batch is not None else (paths.ROOT / "labs" / "cluster.sbatch").read_text())
    return script


def _check(script: Path, step: int) -> check.Report:
    return check.run_check("scale-out", script, step, fresh=True)


# ----------------------------------------------------------------------------- step 1: the hostfile


@pytest.mark.parametrize("hostfile", [
    GOOD_HOSTFILE,
    "# the lab's cluster\ngpu01 slots=4   # four GPUs\n\ngpu02 slots = 4\n",
    "gpu01\n" * 4 + "gpu02\n" * 4,  # one line per slot
    "gpu01 max_slots=4\ngpu02 slots=4 max_slots=8\n",
    "gpu01 count=4\nGPU02 slots=4\n",
], ids=["slots", "comments", "a-line-per-slot", "max_slots", "count-and-case"])
def test_every_hostfile_openmpi_reads_as_4_and_4_passes(tmp_path: Path, hostfile: str) -> None:
    report = _check(_files(tmp_path, hostfile), 1)
    assert report.passed, report.format()
    assert "ranks 0-3 on gpu01 and 4-7 on gpu02" in report.steps[0].message.lower()
    assert "OpenMPI's mapper" in report.steps[0].message


@pytest.mark.parametrize(("hostfile", "said"), [
    ("gpu01 slots=8\n", "puts ranks 0-7 on gpu01"),
    ("gpu01 slots=4\n", "finds only 4 slots"),
    ("gpu01 slots=6\ngpu02 slots=2\n", "Give each node slots=4"),
    ("gpu01 slots=4\ngpu2 slots=4\n", "gpu2, which is not a node"),
    ("gpu01 slots=4\ngpu02 slots=4\ngpu03 slots=4\n", "gpu03, which is not a node"),
    ("gpu01:4\ngpu02:4\n", "write `gpu01 slots=4`"),
    ("gpu01 slot=4\ngpu02 slot=4\n", "OpenMPI cannot read cluster_hostfile"),
    ("gpu01 slots=2\ngpu01 slots=2\ngpu02 slots=4\n", "slots= on more than one line"),
    (None, "names no host"),  # the starter
], ids=["one-node", "too-few", "uneven", "typo", "a-third-node", "host-colon-slots", "slot-not-slots",
        "slots-twice", "starter"])
def test_a_wrong_hostfile_fails_step_1_with_what_to_change(tmp_path: Path, hostfile: str | None, said: str) -> None:
    text = hostfile if hostfile is not None else (paths.ROOT / "labs" / "cluster_hostfile").read_text()
    report = _check(_files(tmp_path, text), 2)
    assert report.first_failing_step == 1 and said in report.steps[0].message, report.format()
    assert report.steps[1].message.startswith("not checked")


def test_without_mpirun_labkit_reads_the_hostfile_itself_and_says_so(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (lab_scale_out, scale_out_ranks):
        monkeypatch.setattr(module, "mpirun_path", lambda: None)
    report = _check(_files(tmp_path, batch=HEAD + "mpirun python fashion_mnist.py\n"), 2)
    assert report.passed, report.format()
    assert "labkit's reading of the hostfile: there is no mpirun here" in report.steps[0].message
    assert "no mpirun here: labkit placed the ranks itself" in report.steps[1].message


# ----------------------------------------------------------------------------- step 2: the batch script


PASSING = {
    "the-solution": (paths.ROOT / "solutions" / "cluster_after_step_02.sbatch").read_text(),
    "mpirun-np-8": HEAD + "mpirun -np 8 python fashion_mnist.py --epochs 10\n",
    "srun-pmix": HEAD + "srun --mpi=pmix python fashion_mnist.py\n",
    "horovodrun-hosts": HEAD + "horovodrun -np 8 -H gpu01:4,gpu02:4 python fashion_mnist.py\n",
    "short-options": "#!/bin/bash\n#SBATCH -N2 -n 8\n#SBATCH --gres=gpu:4 -t 30 # half an hour\nmodule load openmpi\n"
                     "set -euo pipefail\ncd \"$SLURM_SUBMIT_DIR\"\n"
                     "HOSTS=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | sed 's/$/:4/' | paste -sd, -)\n"
                     "horovodrun -np \"$SLURM_NTASKS\" -H \"$HOSTS\" python3 -u fashion_mnist.py\n",
    "mpirun-by-its-path": HEAD + "/usr/bin/mpirun --bind-to core --map-by slot python fashion_mnist.py\n",
}


@pytest.mark.parametrize("name", list(PASSING))
def test_every_correct_batch_script_passes(tmp_path: Path, name: str) -> None:
    report = _check(_files(tmp_path, batch=PASSING[name]), 2)
    assert report.passed, report.format()
    assert "starts 8 ranks, ranks 0-3 on gpu01 and 4-7 on gpu02, local ranks 0-3 on each" in report.steps[1].message


def test_the_plain_batch_script_labkit_writes_passes(tmp_path: Path) -> None:
    """launching/slurm_plain's script for 2 nodes x 4 GPUs (asked per node), as lab 7's Slurm section writes it."""
    o = SlurmOptions(nodes=2, tasks_per_node=4, gpus_per_task=1, time="00:30:00", partition="gpu")
    text = slurm.plain_batch_script(o, ["python", "fashion_mnist.py", "--epochs", "10"], {}, "cluster.sbatch")
    report = _check(_files(tmp_path, batch=text), 2)
    assert report.passed, report.format()


FAILING = {
    "mpirun-np-4": (HEAD + "mpirun -np 4 python fashion_mnist.py\n", "starts 4 ranks: ranks 0-3 on gpu01"),
    "no-launcher": (HEAD + "python fashion_mnist.py\n", "starts one process, on gpu01"),
    "one-node": ("#!/bin/bash\n#SBATCH --nodes=1 --ntasks-per-node=8 --gpus-per-node=4 --time=30\n"
                 "mpirun python fashion_mnist.py\n", "ask Slurm for 2 nodes and 4 tasks on each"),
    "gpus-per-task": ("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=4 --gpus-per-task=1 --time=30\n"
                      "mpirun python fashion_mnist.py\n", "--gpus-per-task=1 binds 1 GPU to each task"),
    "horovodrun-alone": (HEAD + "horovodrun -np 8 python fashion_mnist.py\n", "horovodrun does not read Slurm's job"),
    "too-many-ranks": (HEAD + "mpirun -np 16 python fashion_mnist.py\n", "more ranks than there are slots"),
    "no-time": ("#!/bin/bash\n#SBATCH --nodes=2 --ntasks-per-node=4 --gpus-per-node=4\n"
                "mpirun python fashion_mnist.py\n", "no time limit"),
    "bash-cannot-read": (HEAD + "if mpirun python fashion_mnist.py; then\n", "bash cannot read cluster.sbatch"),
    "stops-first": (HEAD + "set -e\ncd /no/such/folder\nmpirun python fashion_mnist.py\n", "exit code 1"),
    "the-starter": ((paths.ROOT / "labs" / "cluster.sbatch").read_text(), "starts one process, on gpu01"),
}


@pytest.mark.parametrize("name", list(FAILING))
def test_a_wrong_batch_script_fails_step_2_with_what_to_change(tmp_path: Path, name: str) -> None:
    text, said = FAILING[name]
    report = _check(_files(tmp_path, batch=text), 2)
    assert report.steps[0].passed and report.first_failing_step == 2, report.format()
    assert said in report.steps[1].message, report.format()


# ----------------------------------------------------------------------------- a hostile batch script


def _alive(token: str) -> list[str]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if token in " ".join(p.info["cmdline"] or []):
                found.append(" ".join(p.info["cmdline"]))
        except psutil.Error:
            continue
    return found


HOSTILE = {
    "endless-loop": "while true; do :; done\n",
    "sleeps": "sleep {token}\n",
    "forks-ignores-term-and-escapes": "trap '' TERM INT HUP\nfor i in $(seq 20); do sleep {token} & done\n"
                                      "env -i setsid sleep {token} &\n"
                                      "( trap '' TERM; while true; do sleep 0.2; done ) &\nwait\n",
    "launches-then-waits": "mpirun python fashion_mnist.py\nsleep {token}\n",
}


@pytest.mark.slow  # each waits out its bound (about 2 s): make test, not make test-fast
@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_batch_script_is_stopped_within_its_bound_and_leaves_nothing(
        tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    token = f"1000.{uuid.uuid4().int % 10**8}"  # a sleep of its own, to find what it left
    monkeypatch.setattr(sbatch_dry, "SECONDS", 2.0)
    script = _files(tmp_path, batch=HEAD + HOSTILE[name].format(token=token))
    start = time.monotonic()
    report = _check(script, 2)
    took = time.monotonic() - start
    assert report.first_failing_step == 2, report.format()
    assert "still running after 2 s of the dry run" in report.steps[1].message, report.format()
    assert took < 2.0 + 15, f"the check took {took:.1f} s"  # the bound, and the mapper's and Python's start on 2 cores
    deadline = time.monotonic() + 5
    while _alive(token) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive(token) == []


def test_what_a_script_leaves_running_is_stopped_when_it_ends(tmp_path: Path) -> None:
    token = f"1000.{uuid.uuid4().int % 10**8}"
    script = _files(tmp_path, batch=HEAD + f"env -i setsid sleep {token} &\nmpirun python fashion_mnist.py\n")
    report = _check(script, 2)
    assert report.passed, report.format()
    ev = report.evidence
    assert isinstance(ev, ScaleOutEvidence) and ev.batch is not None and ev.batch.run is not None
    assert any(token in c for c in ev.batch.run.left)
    assert _alive(token) == []


# ----------------------------------------------------------------------------- the command line and the cache


@pytest.mark.slow  # 2 s or more: make test, not the 90 s of make test-fast
def test_the_command_line_checks_either_file(tmp_path: Path) -> None:
    script = _files(tmp_path, batch=PASSING["srun-pmix"])
    done = subprocess.run([sys.executable, "-m", "labkit.cli", "check", "scale-out", str(tmp_path / "cluster_hostfile"),
                           "--step", "1", "--json"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert done.returncode == 0 and report["passed"] and len(report["steps"]) == 1, done.stdout + done.stderr
    done = subprocess.run([sys.executable, "-m", "labkit.cli", "check", "scale-out", str(script)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0 and "all steps pass" in done.stdout, done.stdout + done.stderr
    assert (tmp_path / "runs" / "checks.jsonl").is_file()  # recorded next to the checked file


def test_an_edited_hostfile_is_judged_again(tmp_path: Path) -> None:
    script = _files(tmp_path, batch=PASSING["mpirun-np-8"])
    assert check.run_check("scale-out", script, 1).passed
    (tmp_path / "cluster_hostfile").write_text("gpu01 slots=8\n")
    assert not check.run_check("scale-out", script, 1).passed  # not the first check's evidence, cached
