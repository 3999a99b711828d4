"""labkit.launch: command builders (no MPI needed), output rendering, and real 2-rank jobs."""

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
from pathlib import Path

import pytest

from labkit import launch
from labkit.rank import rank_from_env

needs_mpi = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun not installed")


def test_default_threads_split_cores() -> None:
    assert launch.default_threads(1, cores=8) == 8
    assert launch.default_threads(2, cores=8) == 4
    assert launch.default_threads(3, cores=2) == 1
    with pytest.raises(ValueError):
        launch.default_threads(0)


def test_worker_env_limits_threads_and_keeps_legacy_keras() -> None:
    env = launch.worker_env(2, threads=3, gpus=0)
    assert env["TF_USE_LEGACY_KERAS"] == "1"
    assert env["TF_NUM_INTRAOP_THREADS"] == env["OMP_NUM_THREADS"] == "3"
    assert env["OMPI_MCA_mpi_yield_when_idle"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert "CUDA_VISIBLE_DEVICES" not in launch.worker_env(2, threads=1, gpus=2)


def test_gpu_count_reads_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: Tesla (UUID: a)'\necho 'GPU 1: Tesla (UUID: b)'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert launch.gpu_count() == 2
    assert "CUDA_VISIBLE_DEVICES" not in launch.worker_env(2)
    monkeypatch.setenv("PATH", "/nonexistent")
    assert launch.gpu_count() == 0


def test_mpirun_command_is_a_list_exporting_env() -> None:
    cmd = launch.mpirun_command(["python", "t.py"], 2, {"A": "1", "B": "2"}, cores=2, as_root=False)
    assert cmd[:3] == ["mpirun", "-np", "2"]
    assert "--allow-run-as-root" not in cmd and "--oversubscribe" not in cmd
    assert cmd[cmd.index("-x") + 1] == "A" and "B" in cmd
    assert cmd[-2:] == ["python", "t.py"]
    over = launch.mpirun_command(["x"], 4, {}, cores=2, as_root=True)
    assert "--oversubscribe" in over and "--allow-run-as-root" in over
    hosts = launch.mpirun_command(["x"], 4, {}, hosts="a:2,b:2", cores=2, as_root=False)
    assert hosts[hosts.index("-H") + 1] == "a:2,b:2" and "--oversubscribe" not in hosts
    with pytest.raises(ValueError):
        launch.mpirun_command(["x"], 0, {})


def test_horovodrun_and_gloo_commands() -> None:
    assert launch.horovodrun_command(["p"], 2) == ["horovodrun", "-np", "2", "-H", "localhost:2", "--mpi", "p"]
    assert "--gloo" in launch.horovodrun_command(["p"], 3, gloo=True)


def test_build_command_wraps_each_rank_and_rejects_bad_input(tmp_path: Path) -> None:
    cmd = launch.build_command(["python", "t.py"], 2, "mpirun", {"X": "1"}, tmp_path)
    i = cmd.index("labkit.rank")
    assert cmd[i + 1] == str(tmp_path) and cmd[i + 2] == "--"
    assert cmd[-2:] == [sys.executable, "t.py"]
    with pytest.raises(launch.LaunchError, match="unknown launcher"):
        launch.build_command(["t"], 2, "slurm")
    with pytest.raises(launch.LaunchError, match="nothing to run"):
        launch.build_command([], 2)


def test_preflight_explains_missing_mpirun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch.shutil, "which", lambda name: None)
    with pytest.raises(launch.LaunchError, match="apt-get install openmpi-bin"):
        launch.preflight("mpirun")


def test_preflight_explains_keras3(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_USE_LEGACY_KERAS", "0")
    with pytest.raises(launch.LaunchError, match="Keras 3"):
        launch.preflight("gloo")


def test_renderer_turns_progress_bars_into_one_line() -> None:
    lines, progress = [], []
    r = launch.Renderer(lines.append, progress.append)
    # What a Keras 2 progress bar writes: backspaces + carriage return redraws.
    r.feed(b"Epoch 1/1\n 1/3 [=>...]")
    r.feed(b"\b" * 11 + b"\r 2/3 [==>..]" + b"\b" * 12 + b"\r 3/3 [====] - 1s\n")
    r.feed("done é".encode()[:-1])
    r.feed("done é".encode()[-1:] + b"\n")
    assert lines == ["Epoch 1/1", " 3/3 [====] - 1s", "done é"]
    assert progress[:2] == [" 1/3 [=>...]", " 2/3 [==>..]"], progress
    assert not any("\b" in x or "\r" in x for x in lines + progress)


def test_failure_summary_adds_a_hint_for_known_errors(tmp_path: Path) -> None:
    res = launch.JobResult(1, ["x"], tmp_path, 2, 1.0, rank_exit={1: 1},
                           rank_errors={1: "ModuleNotFoundError: No module named 'horovod'"})
    text = res.summary()
    assert "--- rank 1 (exit 1) ---" in text and "hint: Horovod is not installed" in text


def test_console_sink_drops_progress_and_noise_off_a_terminal() -> None:
    buf = io.StringIO()
    sink = launch.ConsoleSink(buf)
    sink.progress("1/3 [=>..]")
    sink.line("I0000 00:00:1 cudart_stub.cc:31] Could not find cuda drivers")
    sink.line("Images/sec: 10.0")
    assert buf.getvalue() == "Images/sec: 10.0\n"


def test_rank_from_env() -> None:
    assert rank_from_env({"OMPI_COMM_WORLD_RANK": "3"}) == 3
    assert rank_from_env({"HOROVOD_RANK": "1", "OMPI_COMM_WORLD_RANK": "3"}) == 1
    assert rank_from_env({}) == 0


def _running(needle: str) -> bool:
    """Is a process whose full command line contains ``needle`` alive? (ps would truncate it)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if needle.encode() in f.read():
                        return True
            except OSError:
                continue
    return False


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(body))
    return path


JOB = """
    import os, sys, time
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("HOROVOD_RANK", "0")))
    print(f"hello from {rank} threads={os.environ['TF_NUM_INTRAOP_THREADS']}", flush=True)
    {extra}
"""


@needs_mpi
@pytest.mark.slow
def test_two_ranks_log_every_rank_and_stream_rank0(tmp_path: Path) -> None:
    script = _script(tmp_path, JOB.replace("{extra}", ""))
    out = io.StringIO()
    res = launch.run(["python", str(script)], np=2, log_dir=tmp_path / "logs", sink=launch.ConsoleSink(out), timeout=60)
    assert res.ok, res.summary()
    assert "hello from 0 threads=1" in out.getvalue() and "hello from 1" not in out.getvalue()
    assert "hello from 1" in res.log(1)
    assert res.rank_exit == {0: 0, 1: 0}


@needs_mpi
@pytest.mark.slow
def test_failing_rank_is_named_with_its_error(tmp_path: Path) -> None:
    extra = "if rank == 1:\n        raise ValueError('bad data on this rank')"
    script = _script(tmp_path, JOB.replace("{extra}", extra))
    res = launch.run(["python", str(script)], np=2, log_dir=tmp_path / "logs", quiet=True, timeout=60)
    assert not res.ok and res.returncode != 0
    assert 1 in res.rank_errors and "ValueError: bad data on this rank" in res.rank_errors[1]
    assert "rank 1" in res.summary()


@needs_mpi
@pytest.mark.slow
def test_timeout_kills_every_process(tmp_path: Path) -> None:
    extra = "import subprocess\n    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n" \
            "    time.sleep(300)"
    script = _script(tmp_path, JOB.replace("{extra}", extra))
    t = time.perf_counter()
    res = launch.run(["python", str(script)], np=2, log_dir=tmp_path / "logs", quiet=True, timeout=8)
    assert res.timed_out and not res.ok and res.returncode != 0
    assert time.perf_counter() - t < 30
    job_id = (tmp_path / "logs" / "command.txt").read_text()  # the job existed
    assert job_id
    assert not _running(str(script)) and not _running("time.sleep(300)")


@needs_mpi
@pytest.mark.slow
def test_interrupt_kills_every_process(tmp_path: Path) -> None:
    script = _script(tmp_path, JOB.replace("{extra}", "time.sleep(300)"))
    timer = threading.Timer(6, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        launch.run(["python", str(script)], np=2, log_dir=tmp_path / "logs", quiet=True, timeout=120)
    timer.cancel()
    assert not _running(str(script))


@needs_mpi
@pytest.mark.slow
def test_job_dies_with_a_parent_killed_outright(tmp_path: Path) -> None:
    """SIGKILL of the Python that launched the job (no cleanup code runs) still ends every rank."""
    script = _script(tmp_path, JOB.replace("{extra}", "time.sleep(300)"))
    parent = subprocess.Popen([sys.executable, "-c", (
        "from labkit import launch\n"
        f"launch.run(['python', {str(script)!r}], np=2, log_dir={str(tmp_path / 'logs')!r}, quiet=True)"
    )])
    deadline = time.time() + 60
    while time.time() < deadline and not (tmp_path / "logs" / "rank.1.log").exists():
        time.sleep(0.5)
    time.sleep(2)
    parent.kill()
    parent.wait()
    for _ in range(40):
        if not _running(str(script)):
            break
        time.sleep(0.5)
    assert not _running(str(script))


@needs_mpi
@pytest.mark.slow
@pytest.mark.horovod
def test_horovod_allreduce_over_mpi_and_gloo(tmp_path: Path) -> None:
    script = _script(tmp_path, """
        import horovod.tensorflow as hvd
        import tensorflow as tf
        hvd.init()
        print("sum", float(hvd.allreduce(tf.constant(float(hvd.rank() + 1)), op=hvd.Sum)), flush=True)
    """)
    for launcher in ("mpirun", "gloo"):
        res = launch.run(["python", str(script)], np=2, launcher=launcher, log_dir=tmp_path / launcher,
                         quiet=True, timeout=120)
        assert res.ok, res.summary()
        assert "sum 3.0" in res.log(0) and "sum 3.0" in res.log(1)


def test_cli_run_reports_bad_launcher() -> None:
    out = subprocess.run([sys.executable, "-m", "labkit.cli", "run", "--launcher", "slurm", "--", "true"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "invalid choice" in out.stderr
