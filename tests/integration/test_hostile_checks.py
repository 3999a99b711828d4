"""Checks of scripts that misbehave: they must say what really happened and leave nothing running.

Each hostile script is a solution with a small text edit, written to ``tmp_path`` (never
``solutions/`` or ``labs/``): an endless loop, ignored signals, a child left running, a flood of
output, a checker killed outright, a script that deletes its own folder, and a correct
multi-worker script that feeds fit a ``DatasetCreator``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from helpers import paths

from labkit import check
from labkit.check import ending, hvd_runs, lab_horovod
from labkit.core import proc, stacks
from labkit.launching import launch, rank
from labkit.launching.jobspec import JobSpec
from labkit.records.tfdist_evidence import MultiWorker

ROOT = paths.ROOT
HVD6 = ROOT / "solutions" / "fashion_mnist_after_step_06.py"
HVD7 = ROOT / "solutions" / "fashion_mnist_after_step_07.py"
MW4 = ROOT / "solutions" / "fashion_mnist_multiworker_after_step_04.py"
AFTER_ARGS = "    args = parse_args(argv)\n"


def derive(source: Path, folder: Path, name: str, old: str, new: str) -> Path:
    """``source`` with ``old`` replaced by ``new`` (exactly once), written to ``folder/name``."""
    text = source.read_text()
    assert text.count(old) == 1, f"{old!r} is not once in {source.name}"
    path = folder / name
    path.write_text(text.replace(old, new))
    return path


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


@pytest.mark.slow  # waits for a stopped rank
def test_a_stopped_process_tells_where_it_was(tmp_path: Path) -> None:
    """SIGTERM makes the interpreter write its stacks (from C, even in a busy loop), then it dies as before."""
    script = tmp_path / "spin.py"
    script.write_text("def spin():\n    n = 0\n    while True:\n        n += 1\n\n\nspin()\n")
    runner = (f"import runpy; from labkit.core import stacks; stacks.install({str(tmp_path / 'st')!r}); "
              f"runpy.run_path({str(script)!r})")
    p = subprocess.Popen([sys.executable, "-c", runner])
    try:
        time.sleep(3)
        p.terminate()
        assert p.wait(20) == -signal.SIGTERM  # still killed by the signal
    finally:
        p.kill()
    where = stacks.where(tmp_path / "st", "<string>")
    assert where is not None and where["kind"] == "own" and where["trigger"] == "term", where
    # the loop's body or its jump back to the test, whichever the interpreter was at
    assert (where["at"]["line"], where["at"]["code"]) in ((3, "while True:"), (4, "n += 1")), where
    assert where["at"]["function"] == "spin"


@pytest.mark.slow  # several seconds: out of make test-fast
def test_signals_ignored_still_leave_a_stack_from_the_timer(tmp_path: Path) -> None:
    script = tmp_path / "deaf.py"
    script.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      "signal.signal(signal.SIGUSR1, signal.SIG_IGN)\ntime.sleep(1000)\n")
    runner = (f"import runpy; from labkit.core import stacks; stacks.install({str(tmp_path / 'st')!r}, budget=2); "
              f"runpy.run_path({str(script)!r})")
    with proc.Job() as job:
        p = job.spawn([sys.executable, "-c", runner])
        assert p.wait(4) is None  # sleeping, deaf to SIGTERM
        p.signal(signal.SIGTERM)
        assert p.wait(1) is None
    assert not p.alive()  # stopped anyway (SIGKILL after the grace)
    where = stacks.where(tmp_path / "st", "<string>")
    assert where is not None and where["trigger"] == "timer" and where["at"]["line"] == 4, where
    assert "time.sleep(1000)" in stacks.describe(where["at"])


def test_an_exit_is_told_without_internal_values() -> None:
    assert "None" not in ending.exit_text(None) and "SIGKILL" in ending.exit_text(None)
    assert "out-of-memory killer: the machine ran out of memory" in ending.exit_text(137, oom=True)
    assert "SIGKILL" in ending.exit_text(-9) and "SIGTERM" in ending.exit_text(143)
    assert "segmentation fault" in ending.exit_text(139) and ending.exit_text(3) == "it exited with code 3"


def _evidence(**rank0: object) -> dict:
    states = {str(r): {"milestones": ["start", "patched", "hvd_init", "fit_start", "train_begin"], "error": None,
                       "data": {"train": 192, "test": 64}} for r in range(2)}
    ranks = {"0": {"exit": 143, "stalled": False, **rank0}, "1": {"exit": 143, "stalled": False}}
    return {"np": 2, "batch": 16, "timed_out": True, "start_error": None, "states": states, "ranks": ranks}


def test_an_endless_epoch_is_told_from_a_deadlock() -> None:
    """Training that still moves when time runs out is an epoch that never ends, not a hang."""
    fit = {"file": "/x/script.py", "line": 9, "function": "main", "code": "model.fit(ds)"}
    moving = {"where": {"kind": "training", "at": fit}, "after": 60.0,
              "progress": {"phase": "training", "epoch": 0, "batch": 900, "age": 0.5}}
    with pytest.raises(check.judging.Failed) as e:
        hvd_runs.need(lab_horovod.evidence(_evidence(running_at_end=moving)), "epoch0_end")
    assert "epoch never ends" in str(e.value) and "steps_per_epoch" in str(e.value) and "deadlock" not in str(e.value)
    stuck = {**moving, "where": {"kind": "collective", "at": fit},
             "progress": {"phase": "training", "epoch": 0, "batch": 1, "age": 50.0}}
    with pytest.raises(check.judging.Failed, match="deadlock"):
        hvd_runs.need(lab_horovod.evidence(_evidence(running_at_end=stuck)), "epoch0_end")
    tracing = {**moving, "where": {"kind": "tracing", "at": fit}, "progress": {}}
    with pytest.raises(check.judging.Failed, match="not a hang"):
        hvd_runs.need(lab_horovod.evidence(_evidence(running_at_end=tracing)), "epoch0_end")


def test_the_rank_to_blame_is_the_one_whose_fate_explains_the_others() -> None:
    """A crash of its own comes first; then a rank busy in its own code, before a crash it caused."""
    loop = {"where": {"kind": "own", "at": {"file": "/x/s.py", "line": 5, "function": "main", "code": "pass"}},
            "after": 30.0}
    ev = _evidence(running_at_end=loop)
    ev["states"]["1"]["error"] = {"type": "ValueError", "message": "bad shape", "traceback": ""}
    with pytest.raises(check.judging.Failed, match="rank 1 crashed"):
        hvd_runs.need(lab_horovod.evidence(ev), "epoch0_end")
    ev["states"]["1"]["error"]["message"] = "Horovod has been shut down. This was caused by an exception"
    with pytest.raises(check.judging.Failed, match="rank 0 never reached .* busy in its own code at s.py:5"):
        hvd_runs.need(lab_horovod.evidence(ev), "epoch0_end")


def test_a_rank_that_vanished_is_not_told_as_exit_code_none() -> None:
    ev = _evidence()
    ev["timed_out"] = False
    ev["ranks"]["0"]["exit"] = None
    ev["states"]["0"]["milestones"] = ["start"]
    with pytest.raises(check.judging.Failed) as e:
        lab_horovod.step_1(lab_horovod.evidence(ev))
    assert "None" not in str(e.value) and "killed before it could report" in str(e.value), str(e.value)


LINGER = textwrap.dedent("""
    import os, subprocess
    if os.environ.get("OMPI_COMM_WORLD_RANK") == "0":
        subprocess.Popen(["sleep", "1237"])  # inherits the output pipe
    print("done", flush=True)
""")


def test_a_rank_ends_when_its_own_process_ends(tmp_path: Path, running) -> None:
    """A child left running (holding the output pipe) is stopped and named, not waited for."""
    script = tmp_path / "linger.py"
    script.write_text(LINGER)
    start = time.monotonic()
    result = launch.run([sys.executable, str(script)],
                        job=JobSpec(timeout=60, quiet=True, record=False, log_dir=tmp_path / "logs",
                                    cwd=tmp_path), np=2)
    took = time.monotonic() - start
    assert result.ok and took < 20, (result.summary(), took)
    assert json.loads((tmp_path / "logs" / "rank.0.left").read_text()) == ["sleep 1237"]
    assert not (tmp_path / "logs" / "rank.1.left").exists()
    assert not running("sleep 1237")


@pytest.mark.slow
def test_an_output_flood_is_capped_and_the_launch_ends(tmp_path: Path, running) -> None:
    script = tmp_path / "flood.py"
    script.write_text("import sys\nline = 'x' * 1023 + '\\n'\nwhile True:\n    sys.stdout.write(line * 1024)\n")
    rss = psutil.Process().memory_info().rss
    start = time.monotonic()
    result = launch.run([sys.executable, str(script)],
                        job=JobSpec(timeout=10, quiet=True, record=False, log_dir=tmp_path / "logs",
                                    cwd=tmp_path), np=2)
    took = time.monotonic() - start
    # Past its head a flood is read slowly (rank.FLOOD_RATE): the ranks wait on their pipes, the launcher keeps a
    # core and stops them on time. Before, two flooding ranks took the cores and were stopped after 11-64 s.
    assert result.timed_out and took < 20, took
    for r in range(2):
        size = (tmp_path / "logs" / f"rank.{r}.log").stat().st_size
        assert size <= rank.LOG_HEAD + rank.LOG_TAIL + 200, size
        assert size > rank.LOG_HEAD // 4, size  # it did flood
    assert (tmp_path / "logs" / "launcher.out").stat().st_size <= rank.LOG_HEAD + 4096  # rank 0's copy stops too
    assert psutil.Process().memory_info().rss - rss < 200 << 20
    assert not running(str(script))


@pytest.mark.slow
@pytest.mark.horovod
def test_a_checker_killed_outright_leaves_no_rank(tmp_path: Path, running) -> None:
    """SIGKILL of the checking Python (no cleanup runs): mpirun dies with it, the ranks notice and stop."""
    script = derive(HVD6, tmp_path, "orphan.py", AFTER_ARGS, AFTER_ARGS + "    while True:\n        pass\n")
    checker = subprocess.Popen([sys.executable, "-c", f"from labkit import check; "
                                f"check.run_check('horovod', {str(script)!r}, 1, 120, fresh=True)"])
    try:
        assert proc.wait_until(lambda: running(f"-- {script}"), 60), "the ranks did not start"
        time.sleep(3)
        checker.kill()
        checker.wait(10)
        assert proc.wait_until(lambda: not running(str(script)), 20), "a rank was left running"
    finally:
        checker.kill()


@pytest.mark.slow
@pytest.mark.horovod
def test_an_endless_loop_is_reported_at_its_line_not_as_a_deadlock(tmp_path: Path, running) -> None:
    script = derive(HVD6, tmp_path, "loop.py", AFTER_ARGS,
                    AFTER_ARGS + "    if hvd.rank() == 0:\n        spins = 0\n        while True:\n"
                    "            spins += 1\n")
    # The loop starts before the model is built: the rank is stopped by its bound on reaching fit (a few times
    # TensorFlow's import), told at its line, long before the check's 300 s budget.
    report = check.run_check("horovod", script, 1, fresh=True)
    msg = report.format()
    assert not report.passed and "deadlock" not in msg, msg
    lines = (line_of(script, "while True:"), line_of(script, "spins += 1"))  # the loop, wherever it was in it
    assert any(f"loop.py:{n} (main)" in msg for n in lines) and "busy in its own code" in msg, msg
    assert "rank 0" in msg and "never finished" in msg and "a correct script calls model.fit within" in msg, msg
    assert report.seconds is not None and report.seconds < 150, report.seconds  # the bound grows with the load
    assert not running(str(script))


@pytest.mark.slow
@pytest.mark.horovod
def test_a_rank_deaf_to_signals_is_stopped_and_reported(tmp_path: Path, running) -> None:
    script = derive(HVD6, tmp_path, "deaf.py", AFTER_ARGS,
                    AFTER_ARGS + "    import signal\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                    "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n    time.sleep(1000)\n")
    report = check.run_check("horovod", script, 1, fresh=True)  # the sleep starts before the model: the fit bound
    msg = report.format()
    assert not report.passed and "deadlock" not in msg, msg
    assert f"deaf.py:{line_of(script, 'time.sleep(1000)')} (main): `time.sleep(1000)`" in msg, msg
    assert "a correct script calls model.fit within" in msg, msg
    assert report.seconds is not None and report.seconds < 150, report.seconds  # the bound grows with the load
    assert not running(str(script))


@pytest.mark.slow
@pytest.mark.heavy  # two step-7 checks; make test stops a lingering child in test_a_rank_ends_when_its_own_process_ends
@pytest.mark.horovod
def test_a_child_left_running_is_named_and_stopped_not_waited_for(tmp_path: Path, running) -> None:
    """The step-7 solution plus a background child passes step 7 in about the solution's own time.

    Both are checked here, one after the other, with room for a busy machine (900 s): what is
    compared is the time, not the machine's speed.
    """
    script = derive(HVD7, tmp_path, "linger7.py", "    hvd.init()\n",
                    "    hvd.init()\n    if hvd.rank() == 0:\n        import subprocess\n"
                    "        subprocess.Popen(['sleep', '1238'])\n")
    plain = check.run_check("horovod", HVD7, 7, timeout=900, fresh=True)
    report = check.run_check("horovod", script, 7, timeout=900, fresh=True)
    assert plain.passed and report.passed, report.format()
    assert any("rank 0 left `sleep 1238` running" in n and "stopped" in n for n in report.notes), report.notes
    assert "sleep 1238" in report.format() and report.to_dict()["notes"] and not plain.notes
    assert report.seconds is not None and plain.seconds is not None
    assert report.seconds < 1.3 * plain.seconds + 20, (report.seconds, plain.seconds)
    assert not running("sleep 1238")


@pytest.mark.slow
@pytest.mark.horovod
def test_a_script_that_deletes_its_own_folder_is_still_judged(tmp_path: Path, running) -> None:
    end = "    loss, accuracy = model.evaluate(test_ds, steps=test_steps, verbose=verbose)\n"
    script = derive(HVD6, tmp_path, "delete.py", end,
                    end + "    import shutil\n    shutil.rmtree(os.getcwd(), ignore_errors=True)\n")
    report = check.run_check("horovod", script, 6, fresh=True)
    assert report.passed, report.format()
    assert not running(str(script))


DATASET_CREATOR = (
    "    def train_input(ctx: tf.distribute.InputContext) -> tf.data.Dataset:\n"
    "        ds = tf.data.Dataset.from_tensor_slices((x_train, y_train))\n"
    "        ds = ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id).shuffle(len(x_train)).repeat()\n"
    "        return ds.batch(ctx.get_per_replica_batch_size(global_batch), drop_remainder=True).map(\n"
    "            standardize(mean, std))\n\n"
    "    train_ds = tf.keras.utils.experimental.DatasetCreator(train_input)\n"
    "    steps_per_epoch = math.ceil(")


@pytest.mark.slow
def test_a_dataset_creator_given_to_fit_is_sampled_and_passes(tmp_path: Path, running) -> None:
    script = derive(MW4, tmp_path, "creator.py", "    steps_per_epoch = math.ceil(", DATASET_CREATOR)
    report = check.run_check("multiworker", script, 3, fresh=True)
    assert report.passed, report.format()
    assert isinstance(report.evidence, MultiWorker)
    fits = [r.fits[-1] for r in report.evidence.records.values()]
    assert all(f.input == "DatasetCreator" and f.batches and f.batches.per_replica_batch for f in fits), fits
    assert not running(str(script))

