"""The lab scripts are plain TensorFlow + Horovod / tf.distribute: they run with labkit not importable."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import paths

from labkit.launching import launchers
from labkit.launching.jobspec import JobSpec
from labkit.tfdist import cluster
from labkit.tfdist.cluster import Tasks

ROOT = paths.ROOT
NO_LABKIT = str(paths.HELPERS / "no_labkit.py")
SMALL = ["--epochs", "1", "--mode", "small", "--train-size", "512", "--test-size", "256", "--batch-size", "32"]
SCRIPTS = sorted([*ROOT.glob("labs/*.py"), *ROOT.glob("solutions/*.py")])


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_lab_scripts_import_only_tensorflow_horovod_and_the_standard_library(path: Path) -> None:
    allowed = {"tensorflow", "horovod", "numpy", *sys.stdlib_module_names}
    assert _imports(path) <= allowed, f"{path.name} imports {_imports(path) - allowed}"
    head = path.read_text()[:1500]
    assert "TF_USE_LEGACY_KERAS=1" in head, f"{path.name} does not say it needs TF_USE_LEGACY_KERAS=1"


def _clean_env(**extra: str) -> dict[str, str]:
    """No labkit variables: nothing asks for observation, the script is on its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABKIT_")}
    env.pop("TF_USE_LEGACY_KERAS", None)  # the script sets it itself before TensorFlow loads
    return {**env, **extra}


@pytest.mark.slow  # starts TensorFlow
def test_missing_data_says_how_to_get_it(tmp_path: Path) -> None:
    # An empty home (no Keras cache) and a proxy that refuses: the download fails at once.
    env = _clean_env(HOME=str(tmp_path), https_proxy="http://127.0.0.1:9", http_proxy="http://127.0.0.1:9")
    out = subprocess.run([sys.executable, NO_LABKIT, str(ROOT / "labs" / "fashion_mnist.py"), *SMALL],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "Fashion-MNIST could not be loaded" in out.stderr, out.stderr[-2000:]
    assert "dataset-fashion-mnist" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
@pytest.mark.horovod
def test_final_horovod_solution_runs_under_mpirun_without_labkit(tmp_path: Path) -> None:
    """...and, as lab 2 says at step 5, each rank validates on its own random batches: with 2 ranks and the
    factor 3, each runs 1.5 passes over its own shuffled copy of the test set, so each sees every test image."""
    script = ROOT / "solutions" / "fashion_mnist_solution.py"
    (_, command, _), = launchers.MPIRun(2).commands(
        [sys.executable, NO_LABKIT, "--record-validation", str(tmp_path / "val"), str(script), *SMALL,
         "--log-dir", "logs"], {})
    out = subprocess.run(command, cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count("Test accuracy:") == 1  # rank 0 only
    assert (tmp_path / "logs" / "training.csv").is_file()
    assert not list(tmp_path.glob("runs")), "a run without labkit must not write labkit records"
    steps = 3 * (256 // 32) // 2  # --test-size 256, --val-batch-size 32, 2 ranks
    seen = [json.loads((tmp_path / f"val.{r}.json").read_text())[:steps] for r in range(2)]
    assert all(len(s) == steps for s in seen), [len(s) for s in seen]
    assert seen[0][0] != seen[1][0] and seen[0] != seen[1]  # different batches on each rank
    images = {x for s in seen for batch in s for x in batch}
    assert len(images) > 0.95 * 256  # (a few test images may share a pixel sum)
    assert all({x for batch in s for x in batch} == images for s in seen)  # each rank saw every test image


@pytest.mark.slow
@pytest.mark.parametrize("name,workers,ps,chief", [
    ("fashion_mnist_mirrored_after_step_04.py", 1, 0, False),
    ("fashion_mnist_multiworker_after_step_04.py", 2, 0, False),
    ("fashion_mnist_ps_after_step_03.py", 2, 1, True),
])
def test_final_distribute_solutions_run_without_labkit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       name: str, workers: int, ps: int, chief: bool) -> None:
    for key in [k for k in os.environ if k.startswith("LABKIT_")]:
        monkeypatch.delenv(key)
    command = [sys.executable, NO_LABKIT, str(ROOT / "solutions" / name), *SMALL]
    result = cluster.Cluster(command, tasks=Tasks(workers=workers, ps=ps, chief=chief),
                             job=JobSpec(cwd=tmp_path, quiet=True, record=False,
                                         log_dir=tmp_path / "logs")).start().wait(timeout=600)
    assert result.ok, result.summary()
    assert "Test accuracy:" in result.log("chief.0" if chief else "worker.0")
    assert not (tmp_path / "runs" / "runs.jsonl").exists()
