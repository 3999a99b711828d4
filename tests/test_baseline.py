"""The learner's single-process starting point, labs/fashion_mnist.py, trains in small mode."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "labs" / "fashion_mnist.py"


@pytest.mark.slow
def test_baseline_trains_one_small_epoch(tmp_path):
    log_dir = tmp_path / "logs"
    env = {k: v for k, v in os.environ.items() if k != "LABKIT_MODE"}
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--epochs", "1", "--train-size", "3000", "--test-size", "500",
         "--batch-size", "32", "--log-dir", str(log_dir), "--mode", "small"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    output = out.stdout.replace("\r", "\n")
    assert out.returncode == 0, output[-3000:] + out.stderr[-3000:]
    assert "mode=small widen_factor=1 train=3000 test=500" in output
    rates = [float(r) for r in re.findall(r"Images/sec: ([0-9.]+)", output)]
    assert len(rates) == 1 and rates[0] > 0
    assert re.search(r"Cumulative training time: [0-9.]+", output)
    accuracy = re.search(r"Test accuracy: ([0-9.]+)", output)
    assert accuracy, output[-3000:]
    assert float(accuracy.group(1)) >= 0.5
    with open(log_dir / "training.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 and {"accuracy", "val_accuracy", "lr"} <= set(rows[0])
