"""labkit.launching.slurm: batch scripts built without Slurm; real jobs on a single-node Slurm cluster (conftest.py).

Lab 7's notebook test submits the rest: a Horovod job started by mpirun in the allocation, a
multi-worker job with TF_CONFIG made from it, and ipyparallel engines as a Slurm job.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import paths

from labkit.core import contract
from labkit.launching import engines, launch, sbatch, slurm
from labkit.launching.jobspec import JobSpec
from labkit.launching.launchers import LaunchError
from labkit.records import runs
from labkit.records.runrecord import RunRecord

ROOT = paths.ROOT
SMALL = ["--epochs", "1", "--mode", "small", "--train-size", "512", "--test-size", "256", "--batch-size", "32"]


def test_batch_script_asks_for_what_was_given(tmp_path: Path) -> None:
    o = sbatch.SlurmOptions(nodes=2, tasks_per_node=4, gpus_per_task=1, partition="gpu", account="course42",
                           time="01:30:00")
    env = {"TF_USE_LEGACY_KERAS": "1", contract.JOB_ID: "j", contract.RUN_ID: "r"}
    text = slurm.batch_script(o, ["python", "train.py", "--epochs", "2"], env, "/logs/slurm-%j.out", tmp_path)
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    for want in ("--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=4", "--partition=gpu", "--account=course42",
                 "--time=01:30:00", "--output=/logs/slurm-%j.out"):
        assert f"#SBATCH {want}" in lines
    assert f"cd {tmp_path}" in lines and "export TF_USE_LEGACY_KERAS=1" in lines
    assert not any(contract.JOB_ID in line and line.startswith("export") for line in lines)  # comes with sbatch
    run = lines[-1]
    assert "mpirun" in run and "-np 8" in run and f"-x {contract.JOB_ID}" in run and run.endswith("--epochs 2")


def test_ranks_start_with_srun_or_with_a_tf_config_per_task(tmp_path: Path) -> None:
    srun = slurm.batch_script(sbatch.SlurmOptions(start="srun"), ["python", "t.py"], {}, "o", tmp_path)
    assert "srun --kill-on-bad-exit=1 --ntasks=2 --mpi=pmix python t.py" in srun
    tf = slurm.batch_script(sbatch.SlurmOptions(start="tf_config"), ["python", "t.py"], {}, "o", tmp_path)
    assert "-m labkit.launching.slurm -- python t.py" in tf and "TF_CONFIG" in tf


@pytest.mark.parametrize("options,message", [
    ({"nodes": 0}, "at least one node"),
    ({"time": "90 minutes"}, "not a Slurm time"),
    ({"partition": "gpu; rm -rf /"}, "--partition"),
    ({"gpus_per_task": 0}, "--gpus-per-task must be at least 1"),
    ({"start": "pdsh"}, "unknown start"),
])
def test_bad_options_are_named(options: dict[str, object], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        sbatch.SlurmOptions(**options).check()


def test_np_must_match_the_allocation() -> None:
    with pytest.raises(LaunchError, match="does not match"):
        slurm.Slurm(3, sbatch.SlurmOptions(nodes=1, tasks_per_node=2))


def test_tf_config_from_the_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm.shutil, "which", lambda name: None)  # no scontrol: expand the node list here
    env = {"SLURM_PROCID": "3", "SLURM_JOB_NODELIST": "node[07-08]", "SLURM_TASKS_PER_NODE": "2(x2)",
           "SLURM_JOB_ID": "1001"}
    conf = slurm.tf_config_from_slurm(env, base_port=20000)
    port = 20000 + 1 * 8
    assert conf["cluster"] == {"worker": [f"node07:{port}", f"node07:{port + 1}", f"node08:{port}",
                                          f"node08:{port + 1}"]}
    assert conf["task"] == {"type": "worker", "index": 3}
    assert slurm.tasks_per_node("3,2(x2),1") == [3, 2, 2, 1]
    with pytest.raises(LaunchError, match="not inside a Slurm step"):
        slurm.tf_config_from_slurm({})


def test_script_only_writes_the_batch_script_and_submits_nothing(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('training')\n")  # the command line checks that the script exists
    out = subprocess.run([sys.executable, "-m", "labkit.cli", "run", "--launcher", "slurm", "--nodes", "2",
                          "--tasks-per-node", "2", "--time", "00:10:00", "--script-only", str(tmp_path / "job.sbatch"),
                          "--", "python", "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --time=00:10:00" in text and "train.py" in text
    assert "sbatch" in out.stderr


def test_engines_on_slurm_get_one_mpi_world() -> None:
    cfg = engines.config(4, threads=1, job_id="abc", launcher="slurm",
                         slurm=sbatch.SlurmOptions(tasks_per_node=4, partition="debug", time="00:05:00"))
    template = cfg.SlurmEngineSetLauncher.batch_template
    assert "#SBATCH --ntasks={n}" in template and "#SBATCH --partition=debug" in template
    assert template.rstrip().endswith("srun --mpi=pmix {program_and_args}")
    assert cfg.SlurmEngineSetLauncher.environment[contract.JOB_ID] == "abc"


# ----------------------------------------------------------------------------- on a real Slurm cluster


def _last_record(tmp_path: Path) -> RunRecord:
    return runs.read(tmp_path / "runs" / "runs.jsonl")[-1]


@pytest.mark.slow
@pytest.mark.horovod
def test_horovod_solution_through_sbatch_and_srun_is_recorded_with_two_workers(tmp_path: Path,
                                                                                slurm: object) -> None:
    """Ranks started by srun (PMIx); mpirun inside the allocation is the bench test's default start."""
    script = ROOT / "solutions" / "fashion_mnist_solution.py"
    res = launch.run(["python", str(script), *SMALL], job=JobSpec(quiet=True, timeout=600, cwd=tmp_path),
                     launcher="slurm", slurm=slurm_options("srun"))
    assert res.ok, res.summary()
    assert (res.log_dir / "job.sbatch").is_file() and "Test accuracy:" in res.log(0)
    record = _last_record(tmp_path)
    assert record.status == "ok" and record.workers == 2 and record.launcher == "slurm"
    assert record.images_per_sec


def slurm_options(start: str) -> sbatch.SlurmOptions:
    return sbatch.SlurmOptions(nodes=1, tasks_per_node=2, start=start)


def test_the_output_path_survives_spaces_and_percent_signs() -> None:
    pattern = sbatch.output_pattern("/home/ann/course 100%/runs")
    assert pattern == "/home/ann/course 100%%/runs/slurm-%j.out"
    (line,) = [d for d in sbatch.directives(sbatch.SlurmOptions(), pattern) if "--output" in d]
    assert line == '#SBATCH --output="/home/ann/course 100%%/runs/slurm-%j.out"'
    with pytest.raises(LaunchError, match="double quote"):
        sbatch.directives(sbatch.SlurmOptions(), '/a"b/slurm-%j.out')


@pytest.mark.slow
def test_a_failing_job_returns_its_exit_status(tmp_path: Path, slurm: object) -> None:
    work = tmp_path / "my course 100%"  # the job's output goes to runs/logs/... under this folder
    work.mkdir()
    script = work / "fail.py"
    script.write_text("import sys\nprint('about to fail', flush=True)\nsys.exit(7)\n")
    out = subprocess.run([sys.executable, "-m", "labkit.cli", "run", "--launcher", "slurm", "--tasks-per-node", "2",
                          "--", "python", str(script)], cwd=work, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "about to fail" in out.stdout, out.stdout + out.stderr
    assert "#SBATCH --ntasks-per-node=2" in out.stdout  # the script was shown
    record = _last_record(work)
    assert record.status == "failed"
    assert list(Path(str(record.log_dir)).glob("slurm-*.out")), "Slurm wrote no output where it was told"


@pytest.mark.slow
@pytest.mark.horovod
@pytest.mark.heavy  # 19 s: make test's budget (docs/testing.md)
def test_bench_runs_through_slurm(tmp_path: Path, slurm: object) -> None:
    from labkit.measure import bench

    plan = bench.SweepPlan(nps=[2], launcher="slurm", args=SMALL, runs_file=tmp_path / "runs.jsonl", echo=False)
    sweep = bench.bench(ROOT / "solutions" / "fashion_mnist_solution.py", plan,
                        JobSpec(threads=1, cwd=tmp_path, timeout=600, quiet=True))
    assert [p.workers for p in sweep.points] == [2] and all(p.images_per_sec for p in sweep.points)
    (record,) = runs.read(tmp_path / "runs.jsonl")  # ranks started by mpirun inside the allocation
    assert record.launcher == "slurm" and record.workers == 2 and record.status == "ok"
    assert "mpirun" in (Path(str(record.log_dir)) / "job.sbatch").read_text()


def test_the_job_id_is_read_from_its_own_line() -> None:
    assert slurm.parse_job_id("sbatch: warning: can't honor --ntasks-per-node set to 4\n1234\n") == "1234"
    assert slurm.parse_job_id("77;cluster\n") == "77"
    assert slurm.parse_job_id("12") == "12" and slurm.parse_job_id("sbatch: error: 4 nodes") is None
