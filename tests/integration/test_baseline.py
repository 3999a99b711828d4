"""The learner's single-process starting point, labs/fashion_mnist.py, trains in small mode without labkit."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import paths

SCRIPT = paths.LABS / "fashion_mnist.py"
NO_LABKIT = str(paths.HELPERS / "no_labkit.py")
ARGS = ["--epochs", "1", "--train-size", "3000", "--test-size", "500", "--batch-size", "32", "--mode", "small"]


def run_once(folder: Path) -> float:
    """Run the script in ``folder``, check its output and log, and return the test accuracy."""
    folder.mkdir()
    log_dir = folder / "logs"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LABKIT_")}
    out = subprocess.run([sys.executable, NO_LABKIT, str(SCRIPT), *ARGS, "--log-dir", str(log_dir)],
                         cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    output = out.stdout.replace("\r", "\n")
    assert out.returncode == 0, output[-3000:] + out.stderr[-3000:]
    assert "mode=small widen_factor=1 train=3000 test=500" in output
    rates = [float(r) for r in re.findall(r"Images/sec: ([0-9.]+)", output)]
    assert len(rates) == 1 and rates[0] > 0
    assert re.search(r"Cumulative training time: [0-9.]+", output)
    with open(log_dir / "training.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and {"accuracy", "val_accuracy", "lr"} <= set(rows[0])
    accuracy = re.search(r"Test accuracy: ([0-9.]+)", output)
    assert accuracy, output[-3000:]
    return float(accuracy.group(1))


@pytest.mark.slow
@pytest.mark.heavy  # 20 s on a clean clone: make test's budget (lab 1 trains the baseline in the browser there)
def test_baseline_trains_one_small_epoch(tmp_path):
    # One epoch of 94 steps from random weights is noisy: over 12 runs the test accuracy was
    # 0.58 +- 0.04 (lowest 0.50), so a sound script lands below 0.5 in about 2% of single runs.
    # One retry makes that rare, while a broken one (chance is 0.1) still fails twice.
    accuracies = [run_once(tmp_path / "run1")]
    if accuracies[0] < 0.5:
        accuracies.append(run_once(tmp_path / "run2"))
    assert max(accuracies) >= 0.5, accuracies
