"""labkit.launching.launch: real jobs through every launcher, by the same generic tests.

The ``launcher`` fixture runs each test under mpirun, horovodrun, horovodrun --gloo
and Slurm (a real single-node cluster, see conftest.py), in the manner of
ipyparallel's launcher tests.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from labkit.core import output, proc
from labkit.launching import launch, sbatch
from labkit.launching.jobspec import JobSpec

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")]

JOB = """
    import os, sys, time
    rank = int(os.environ["LABKIT_RANK"])
    print(f"hello from {rank} threads={os.environ['TF_NUM_INTRAOP_THREADS']}", flush=True)
    {extra}
"""


@pytest.fixture(params=["mpirun", "horovodrun", "gloo", "slurm"])
def launcher(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Keyword arguments for ``launch.run`` choosing one launcher."""
    if request.param in ("horovodrun", "gloo") and not Path(launchers_tool("horovodrun")).exists():
        pytest.skip("Horovod is not installed")
    if request.param == "slurm":
        request.getfixturevalue("slurm")
        return {"launcher": "slurm", "slurm": sbatch.SlurmOptions(nodes=1, tasks_per_node=2, start="srun")}
    return {"launcher": request.param}


def launchers_tool(name: str) -> str:
    from labkit.launching.launchers import tool

    return tool(name)


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    return path


def test_two_ranks_log_every_rank_and_stream_rank0(tmp_path: Path, launcher: dict[str, Any]) -> None:
    script = _script(tmp_path, JOB.replace("{extra}", ""))
    out = io.StringIO()
    res = launch.run(["python", str(script)],
                     job=JobSpec(log_dir=tmp_path / "logs", sink=output.ConsoleSink(out), timeout=90,
                                 cwd=tmp_path), np=2, **launcher)
    assert res.ok, res.summary()
    assert "hello from 0 threads=1" in out.getvalue() and "hello from 1" not in out.getvalue()
    if launcher["launcher"] != "slurm":  # the command that really ran comes first (Slurm shows its batch script)
        first = out.getvalue().splitlines()[0]
        assert first.startswith("$ ") and str(script) in first and "labkit" not in first, first  # as typed
        assert "labkit.launching.rank" in (tmp_path / "logs" / "command.txt").read_text()  # as run
    assert "hello from 1" in res.log(1)
    assert res.rank_exit == {0: 0, 1: 0}


def test_failing_rank_is_named_with_its_error(tmp_path: Path, launcher: dict[str, Any]) -> None:
    extra = "if rank == 1:\n        raise ValueError('bad data on this rank')"
    script = _script(tmp_path, JOB.replace("{extra}", extra))
    res = launch.run(["python", str(script)],
                     job=JobSpec(log_dir=tmp_path / "logs", quiet=True, timeout=90, cwd=tmp_path), np=2, **launcher)
    assert not res.ok and res.returncode != 0
    assert 1 in res.rank_errors and "ValueError: bad data on this rank" in res.rank_errors[1]
    assert "rank 1" in res.summary()


def test_timeout_kills_every_process(tmp_path: Path, launcher: dict[str, Any],
                                     running: Callable[[str], bool]) -> None:
    extra = "import subprocess\n    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(301)'])\n" \
            "    time.sleep(300)"
    script = _script(tmp_path, JOB.replace("{extra}", extra))
    t = time.perf_counter()
    # 5 s: the ranks (plain Python, no TensorFlow) and their children start in about one
    res = launch.run(["python", str(script)],
                     job=JobSpec(log_dir=tmp_path / "logs", quiet=True, timeout=5, cwd=tmp_path), np=2, **launcher)
    assert res.timed_out and not res.ok and res.returncode != 0
    assert time.perf_counter() - t < 60
    assert not running(str(script)) and not running("time.sleep(301)")


def test_interrupt_kills_every_process(tmp_path: Path, launcher: dict[str, Any],
                                       running: Callable[[str], bool]) -> None:
    script = _script(tmp_path, JOB.replace("{extra}", "time.sleep(300)"))
    # Ctrl-C raises KeyboardInterrupt even when the suite was started in the background (which ignores SIGINT).
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    logs, stop = tmp_path / "logs", threading.Event()

    def interrupt_once_both_ranks_run() -> None:  # Ctrl-C while every rank sleeps
        if proc.wait_until(lambda: stop.is_set() or _started(logs, 2), 60) and not stop.is_set():
            time.sleep(0.5)
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt_once_both_ranks_run, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch.run(["python", str(script)], job=JobSpec(log_dir=logs, quiet=True, timeout=120, cwd=tmp_path), np=2,
                       **launcher)
    finally:
        stop.set()
        signal.signal(signal.SIGINT, before)
    assert not running(str(script))


def _started(logs: Path, ranks: int) -> bool:
    """Every rank has printed its greeting into its log."""
    return all("hello from" in _text(logs / f"rank.{r}.log") for r in range(ranks))


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.is_file() else ""


def test_job_dies_with_a_parent_killed_outright(tmp_path: Path, running: Callable[[str], bool]) -> None:
    """SIGKILL of the Python that launched the job (no cleanup code runs) still ends every rank."""
    script = _script(tmp_path, JOB.replace("{extra}", "time.sleep(300)"))
    parent = subprocess.Popen([sys.executable, "-c", (
        "from labkit.launching import launch\nfrom labkit.launching.jobspec import JobSpec\n"
        f"launch.run(['python', {str(script)!r}], np=2, job=JobSpec(log_dir={str(tmp_path / 'logs')!r}, quiet=True))"
    )])
    assert proc.wait_until(lambda: (tmp_path / "logs" / "rank.1.log").exists(), 60)
    time.sleep(2)
    parent.kill()
    parent.wait()
    assert proc.wait_until(lambda: not running(str(script)), 20)


@pytest.mark.horovod
def test_horovod_allreduce_over_mpi_and_gloo(tmp_path: Path) -> None:
    script = _script(tmp_path, """
        import horovod.tensorflow as hvd
        import tensorflow as tf
        hvd.init()
        print("sum", float(hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum)), flush=True)
    """)
    for name in ("mpirun", "gloo"):
        res = launch.run(["python", str(script)], job=JobSpec(log_dir=tmp_path / name, quiet=True, timeout=120), np=2,
                         launcher=name)
        assert res.ok, res.summary()
        assert "sum 3.0" in res.log(0) and "sum 3.0" in res.log(1)


def test_cli_run_reports_bad_launcher() -> None:
    out = subprocess.run([sys.executable, "-m", "labkit.cli", "run", "--launcher", "pbs", "--", "true"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_stop_when_ends_a_job_early_with_its_reason(tmp_path: Path, running: Callable[[str], bool]) -> None:
    """The caller's ``stop_when`` is asked with the job's observation folder; its reason stops every rank then."""
    script = _script(tmp_path, JOB.replace("{extra}", "time.sleep(120)"))
    asked: list[Path] = []

    def stop_when(observed: Path) -> str | None:
        asked.append(observed)
        return "seen enough" if len(asked) > 10 else None

    result = launch.run([sys.executable, str(script)],
                        job=JobSpec(timeout=60, quiet=True, cwd=tmp_path, stop_when=stop_when), np=2)
    assert result.stopped == "seen enough" and not result.ok and not result.timed_out, result.summary()
    assert result.duration < 30, result.duration
    assert asked[0].name == "observed" and asked[0].parent == result.log_dir
    assert "stopped after" in result.summary() and "seen enough" in result.summary()
    assert result.record and result.record.status == "stopped" and result.record.error == "seen enough"
    assert not running(str(script))
