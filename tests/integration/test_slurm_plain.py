"""labkit.launching.slurm_plain:
a batch script that needs no labkit on the nodes (``labkit run --launcher slurm --plain``).

Its text is checked, its shell is run with stand-ins for srun and mpirun (what each worker gets), and on
the tests' Slurm cluster (conftest.py) the Horovod solution runs from it with ``import labkit`` failing.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import bare_venv, paths

from labkit.launching import launch, sbatch, slurm
from labkit.launching.jobspec import JobSpec
from labkit.launching.launchers import LaunchError

ROOT = paths.ROOT
SOLUTION = ROOT / "solutions" / "fashion_mnist_solution.py"
TINY = ["--epochs", "1", "--train-size", "256", "--test-size", "128"]


def script(tmp_path: Path, start: str = "mpirun", command: list[str] | None = None, **options: object) -> str:
    """The plain script ``labkit run`` writes (through the launcher, as the command line does)."""
    out = tmp_path / "job.sbatch"
    res = launch.run(command or ["python", "train.py", "--epochs", "2"], job=JobSpec(quiet=True, cwd=tmp_path),
                     launcher="slurm", slurm=sbatch.SlurmOptions(nodes=1, tasks_per_node=2, start=start, plain=True,
                                                                 script_only=out, **options))
    assert res.returncode == 0
    return out.read_text()


def code_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if not line.lstrip().startswith("#") or line.startswith("#SBATCH")]


@pytest.mark.parametrize("start", sbatch.STARTS)
def test_the_script_uses_no_labkit_and_says_where_it_comes_from(tmp_path: Path, start: str) -> None:
    text = script(tmp_path, start)
    assert [line for line in code_lines(text) if "labkit" in line.lower()] == []
    head = text.splitlines()[:8]
    assert any("Written by labkit" in line for line in head)
    assert any(line.startswith("#   labkit run --launcher slurm --plain") and "-- python train.py --epochs 2" in line
               for line in head)
    assert "#SBATCH --ntasks-per-node=2" in text and "#SBATCH --job-name=train" in text
    assert subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True).returncode == 0
    for setting in ("export TF_USE_LEGACY_KERAS=1", "export OMPI_MCA_mpi_yield_when_idle=1", "OMP_NUM_THREADS=$THREADS",
                    'cd "$SLURM_SUBMIT_DIR"', "PYTHON=${PYTHON:-python}"):
        assert setting in text
    assert text.count("\n# -- ") >= 4  # sections a reader can find


def test_each_start_starts_the_ranks_its_way(tmp_path: Path) -> None:
    mpirun = script(tmp_path, "mpirun")
    assert 'mpirun -np "$SLURM_NTASKS"' in mpirun and "-x TF_USE_LEGACY_KERAS" in mpirun
    assert mpirun.rstrip().endswith('"$PYTHON" train.py --epochs 2')
    assert "--mpi=pmix" in script(tmp_path, "srun")
    tf = script(tmp_path, "tf_config")
    assert "scontrol show hostnames" in tf and "$SLURM_PROCID" in tf and "--mpi=none" in tf
    gpus = script(tmp_path, "mpirun", gpus_per_task=1)
    assert "#SBATCH --gpus-per-node=2" in gpus and "#SBATCH --gpus-per-task" not in gpus
    assert "CUDA_VISIBLE_DEVICES" not in gpus


@pytest.mark.slow  # 2 s or more: make test, not the 90 s of make test-fast
def test_the_command_line_writes_it(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('training')\n")
    argv = ["run", "--launcher", "slurm", "--plain", "--start", "tf_config", "--tasks-per-node", "3", "--script-only",
            "mw.sbatch", "--", "python", "train.py"]
    out = subprocess.run([sys.executable, "-m", "labkit.cli", *argv], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "mw.sbatch").read_text()
    assert "#SBATCH --ntasks-per-node=3" in text and "TF_CONFIG" in text and "sbatch mw.sbatch" in out.stderr
    assert [line for line in code_lines(text) if "labkit" in line.lower()] == []
    submitted = subprocess.run([sys.executable, "-m", "labkit.cli", "run", "--launcher", "slurm", "--plain", "--",
                                "python", "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert submitted.returncode == 2 and "--script-only" in submitted.stderr


def test_plain_needs_script_only(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="--script-only"):
        launch.run(["python", "t.py"], job=JobSpec(quiet=True, cwd=tmp_path), launcher="slurm",
                   slurm=sbatch.SlurmOptions(plain=True))


# ----------------------------------------------------------------------------- the shell, run with stand-ins

REPORT = """\
import json, os, sys
keys = ("TF_CONFIG", "TF_USE_LEGACY_KERAS", "OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS",
        "OMPI_MCA_mpi_yield_when_idle", "CUDA_VISIBLE_DEVICES", "SLURM_PROCID")
open(f"worker.{os.environ.get('SLURM_PROCID', '0')}.json", "w").write(json.dumps({k: os.environ.get(k) for k in keys}))
print("args", sys.argv[1:])
"""
# srun and mpirun stand-ins: skip their options, run the command once per task with SLURM_PROCID set.
STAND_IN = """\
#!/bin/bash
while [[ $1 == -* ]]; do
  case $1 in -np|-x|--bind-to|--map-by) shift 2;; --mca) shift 3;; *) shift;; esac
done
for (( rank = 0; rank < SLURM_NTASKS; rank++ )); do SLURM_PROCID=$rank "$@" || exit $?; done
"""
SCONTROL = """\
#!/bin/bash
[[ "$*" == "show hostnames node[07-08]" ]] && printf 'node07\\nnode08\\n'
"""


def run_with_stand_ins(tmp_path: Path, start: str, **job: str) -> dict[int, dict[str, str | None]]:
    text = script(tmp_path, start, ["python", "report.py", "--x", "1"])
    (tmp_path / "report.py").write_text(REPORT)
    tools = tmp_path / "bin"
    tools.mkdir(exist_ok=True)
    for name, body in (("srun", STAND_IN), ("mpirun", STAND_IN), ("scontrol", SCONTROL)):
        (tools / name).write_text(body)
        (tools / name).chmod(stat.S_IRWXU)
    env = {**os.environ, "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable,
           "SLURM_SUBMIT_DIR": str(tmp_path), **job}
    out = subprocess.run(["bash", "-c", text], env=env, cwd="/", capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "args ['--x', '1']" in out.stdout
    n = int(job["SLURM_NTASKS"])
    return {r: json.loads((tmp_path / f"worker.{r}.json").read_text()) for r in range(n)}


def test_each_task_gets_the_tf_config_labkit_would_give_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = {"SLURM_JOB_ID": "1001", "SLURM_JOB_NODELIST": "node[07-08]", "SLURM_NTASKS_PER_NODE": "2",
           "SLURM_NTASKS": "4", "SLURM_CPUS_PER_TASK": "3"}
    seen = run_with_stand_ins(tmp_path, "tf_config", **job)
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)  # labkit expands the node list itself
    for rank, worker in seen.items():
        want = slurm.tf_config_from_slurm({**job, "SLURM_PROCID": str(rank), "SLURM_TASKS_PER_NODE": "2(x2)"})
        assert json.loads(worker["TF_CONFIG"] or "{}") == want
        assert worker["OMP_NUM_THREADS"] == worker["TF_NUM_INTRAOP_THREADS"] == "3"


def test_every_rank_gets_labkits_settings(tmp_path: Path) -> None:
    seen = run_with_stand_ins(tmp_path, "mpirun", SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="2", SLURM_CPUS_ON_NODE="5")
    for worker in seen.values():
        assert worker["TF_USE_LEGACY_KERAS"] == "1" and worker["OMPI_MCA_mpi_yield_when_idle"] == "1"
        assert worker["OMP_NUM_THREADS"] == "2" and worker["CUDA_VISIBLE_DEVICES"] == ""  # 5 cores // 2 tasks
        assert worker["TF_CONFIG"] is None


# ----------------------------------------------------------------------------- on a real Slurm cluster


@pytest.mark.slow
@pytest.mark.horovod
def test_the_horovod_solution_runs_from_the_plain_script_without_labkit(tmp_path: Path, slurm: object) -> None:
    work = tmp_path / "work"
    work.mkdir()
    text = script(work, "mpirun", ["python", str(SOLUTION), *TINY])
    job_env = bare_venv.environ(tmp_path / "venv")
    bare_venv.create(tmp_path / "venv")
    probe = subprocess.run(["python", "-c", "import labkit"], env=job_env, cwd=work, capture_output=True, text=True,
                           timeout=120)
    assert probe.returncode != 0 and "No module named 'labkit'" in probe.stderr  # what the job inherits
    (work / "job.sbatch").write_text(text)
    # Submitted and waited for from here (labkit.launching.slurm_wait); the job inherits job_env, as sbatch
    # passes it on.
    waited = subprocess.run([sys.executable, "-m", "labkit.launching.slurm_wait", "job.sbatch"], env=job_env, cwd=work,
                            capture_output=True, text=True, timeout=900)
    (output,) = work.glob("slurm-*.out")
    log = output.read_text(errors="replace")
    assert waited.returncode == 0, waited.stdout + waited.stderr + log
    assert "Test accuracy:" in log and "labkit" not in log.lower()
    assert not (work / "runs" / "runs.jsonl").exists()  # nothing of labkit ran in the job
