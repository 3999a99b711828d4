"""The Horovod checker passes correct scripts (however written) and fails wrong ones at the right step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import _running

from labkit import check, launch
from labkit.check import _horovod

ROOT = Path(__file__).resolve().parent.parent
SOL = ROOT / "solutions"
SEED = next(iter(sorted((ROOT.parent / "shared" / "seeds").glob("004_*.txt"))), None)

pytestmark = [pytest.mark.slow, pytest.mark.horovod]


def _no_leftovers() -> None:
    """No probe or rank process of a check is still running."""
    assert not _running("labkit.probe")


def _variant(tmp_path: Path, name: str, edits: list[tuple[str, str]], base: str = "fashion_mnist_after_step_06.py"
             ) -> Path:
    text = (SOL / base).read_text()
    for old, new in edits:
        assert old in text, f"edit target missing: {old!r}"
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text)
    return path


def _seed_script(start: str, end: str, tmp_path: Path, name: str) -> Path:
    """A script exactly as printed in the original lab (read from the course material)."""
    if SEED is None:
        pytest.skip("course material not present")
    s = SEED.read_text()
    i = s.index(start) + len(start)
    path = tmp_path / name
    path.write_text(s[i : s.index(end, i)].strip("\n") + "\n")
    return path


@pytest.mark.parametrize("k", range(1, 6))
def test_after_step_passes_its_step_and_fails_the_next(k: int) -> None:
    report = check.horovod(k + 1, script=SOL / f"fashion_mnist_after_step_{k:02d}.py")
    assert [s.passed for s in report.steps[:k]] == [True] * k, report.format()
    assert report.first_failing_step == k + 1, report.format()
    _no_leftovers()


def test_final_solution_passes_all_steps_fast() -> None:
    report = check.horovod(script=SOL / "fashion_mnist_solution.py")
    assert report.passed, report.format()
    assert len(report.steps) == 6
    # The bar is 60 s on an idle 2-core machine; leave room for a busy CI box.
    assert report.seconds is not None and report.seconds < 120


WRONG = {
    "pin_by_rank": (1, [("gpus[hvd.local_rank()]", "gpus[hvd.rank()]")], "hvd.local_rank()"),
    "broadcast_from_rank1": (4, [("BroadcastGlobalVariablesCallback(0)", "BroadcastGlobalVariablesCallback(1)")],
                             "rank 0"),
    "validation_not_tripled": (5, [("3 * validation_steps // hvd.size()", "validation_steps // hvd.size()")],
                               "validation_steps"),
    "metric_average_after_reader": (6, [
        ("    callbacks.append(hvd.callbacks.MetricAverageCallback())\n", ""),
        ("    callbacks.append(StopAtAccuracy(args.target_accuracy, args.patience, verbose))\n",
         "    callbacks.append(StopAtAccuracy(args.target_accuracy, args.patience, verbose))\n"
         "    callbacks.append(hvd.callbacks.MetricAverageCallback())\n"),
    ], "read val_"),
    "crash_on_rank1": (1, [("    args = parse_args(argv)\n",
                            "    args = parse_args(argv)\n    if hvd.rank() == 1:\n"
                            "        raise RuntimeError('boom on rank 1')\n")], "rank 1 crashed"),
}


@pytest.mark.parametrize("name", sorted(WRONG))
def test_wrong_script_fails_at_the_right_step(name: str, tmp_path: Path) -> None:
    step, edits, hint = WRONG[name]
    script = _variant(tmp_path, f"{name}.py", edits)
    report = check.horovod(script=script)
    assert report.first_failing_step == step, report.format()
    failing = report.steps[step - 1].message
    assert hint in failing, failing
    assert all(s.passed for s in report.steps[: step - 1]), report.format()
    _no_leftovers()


def test_deadlock_is_reported_within_the_timeout(tmp_path: Path) -> None:
    script = _variant(tmp_path, "deadlock.py", [(
        "    args = parse_args(argv)\n",
        "    args = parse_args(argv)\n    if hvd.rank() == 0:\n"
        "        hvd.allreduce(tf.constant(1.0), name='only_rank_0')\n",
    )])
    report = check.horovod(script=script, timeout=90)
    assert not report.passed
    text = report.format()
    assert "deadlock" in text or "stuck" in text, text
    assert report.seconds is not None and report.seconds < 100
    _no_leftovers()


def test_syntax_error_fails_step_1_without_running(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import horovod.tensorflow.keras as hvd\ndef main(:\n    pass\n")
    report = check.horovod(script=bad)
    assert report.first_failing_step == 1
    assert "line 2" in report.steps[0].message
    assert report.seconds is not None and report.seconds < 5


def test_variant_written_differently_passes(tmp_path: Path) -> None:
    """CUDA_VISIBLE_DEVICES pinning, int() verbose, and an explicit broadcast after compile."""
    script = _variant(tmp_path, "variant.py", [
        ("    gpus = tf.config.list_physical_devices(\"GPU\")\n    if gpus:\n"
         "        tf.config.experimental.set_memory_growth(gpus[hvd.local_rank()], True)\n"
         "        tf.config.set_visible_devices(gpus[hvd.local_rank()], \"GPU\")\n",
         "    os.environ[\"CUDA_VISIBLE_DEVICES\"] = str(hvd.local_rank())\n"),
        ("verbose = 1 if hvd.rank() == 0 else 0", "verbose = int(hvd.rank() == 0)"),
        ("    callbacks.append(hvd.callbacks.BroadcastGlobalVariablesCallback(0))\n", ""),
        ("    model.compile(loss=\"categorical_crossentropy\", optimizer=opt, metrics=[\"accuracy\"])\n",
         "    model.compile(loss=\"categorical_crossentropy\", optimizer=opt, metrics=[\"accuracy\"])\n"
         "    import horovod.tensorflow as hvd_tf\n"
         "    hvd_tf.broadcast_variables(model.variables, root_rank=0)\n"),
    ])
    report = check.horovod(script=script)
    assert report.passed, report.format()


def test_original_lab_solution_passes_and_starter_fails_step_1(tmp_path: Path) -> None:
    solution = _seed_script("fashion_mnist_solution.py\n", "参考资料", tmp_path, "fashion_mnist_solution.py")
    report = check.horovod(script=solution)
    assert report.passed, report.format()
    starter = _seed_script("fashion_mnist.py:\n", "基准", tmp_path, "fashion_mnist.py")
    report = check.horovod(script=starter)
    assert report.first_failing_step == 1, report.format()
    assert "hvd.init()" in report.steps[0].message


def test_cli_json_contract(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "labkit.cli", "check", "horovod", str(SOL / "fashion_mnist_after_step_02.py"),
         "--step", "3", "--json"],
        capture_output=True, text=True, timeout=300,
    )
    data = json.loads(out.stdout)
    assert out.returncode == 1
    assert data["lab"] == "horovod" and data["passed"] is False and data["first_failing_step"] == 3
    assert [s["step"] for s in data["steps"]] == [1, 2, 3]
    assert {"step", "passed", "message"} <= set(data["steps"][0])


def test_evaluate_reports_missing_ranks_as_failures(tmp_path: Path) -> None:
    """A run where rank 1 left no record fails step 1 with a message about rank 1 (no MPI needed)."""
    job = launch.JobResult(1, ["x"], tmp_path, 2, 1.0, rank_exit={1: 1}, rank_errors={1: "ImportError: nope"})
    (tmp_path / "probe.0.json").write_text(json.dumps({"milestones": ["start", "fit_start"], "error": None}))
    run = _horovod.Run(tmp_path, job)
    results = _horovod.evaluate(run, 3)
    assert [r.passed for r in results] == [False, False, False]
    assert "rank 1" in results[0].message and "ImportError" in results[0].message
    assert "fix step 1" in results[2].message
