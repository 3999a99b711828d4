"""labkit.launching.slurm_wait: submitting and following a job, on Slurm's recorded answers and on stand-in commands.

The real cluster runs it in test_slurm.py and test_launch.py (every Slurm job the launcher submits).
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labkit.launching import slurm, slurm_wait

RUNNING = ("JobId=42 JobName=labkit UserId=root(0) GroupId=root(0) Priority=1 JobState=RUNNING Reason=None "
           "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 ExitCode=0:0 RunTime=00:00:03 TimeLimit=UNLIMITED")


def _ended(state: str, code: str) -> str:
    return RUNNING.replace("JobState=RUNNING", f"JobState={state}").replace("ExitCode=0:0", f"ExitCode={code}")


def test_scontrol_and_sacct_answers_are_read() -> None:
    assert slurm_wait.parse_job(RUNNING) == ("RUNNING", 0, 0)
    assert slurm_wait.parse_job(_ended("FAILED", "3:0")) == ("FAILED", 3, 0)
    assert slurm_wait.parse_job("slurm_load_jobs error: Invalid job id specified") is None
    assert slurm_wait.parse_sacct("CANCELLED by 0|0:15\n") == ("CANCELLED", 0, 15)
    assert slurm_wait.parse_sacct("") is None


@pytest.mark.parametrize("ended,status", [(("COMPLETED", 0, 0), 0), (("FAILED", 3, 0), 3),
                                          (("CANCELLED", 0, 15), 143), (("TIMEOUT", 0, 0), 1),
                                          (("NODE_FAIL", 0, 0), 1)])
def test_exit_status_is_the_one_sbatch_wait_gives(ended: tuple[str, int, int], status: int) -> None:
    assert slurm_wait.status(*ended) == status


def test_wait_looks_often_at_first_then_less_and_stops_at_the_end() -> None:
    answers = [("PENDING", 0, 0)] * 3 + [("RUNNING", 0, 0)] * 6 + [("COMPLETED", 0, 0)]
    slept: list[float] = []
    assert slurm_wait.wait("42", look=lambda _: answers.pop(0), sleep=slept.append) == ("COMPLETED", 0)
    assert not answers and len(slept) == 9
    assert slept[0] == slurm_wait.FIRST and slept[-1] == slurm_wait.MOST
    assert all(a <= b for a, b in zip(slept, slept[1:], strict=False))


def test_a_job_slurm_forgets_is_lost_not_waited_for_forever() -> None:
    answers = [("RUNNING", 0, 0), None, ("RUNNING", 0, 0)] + [None] * 3
    assert slurm_wait.wait("42", look=lambda _: answers.pop(0), sleep=lambda _: None, lost_after=3) == ("LOST", 1)
    assert not answers  # one miss between answers does not count


def _tool(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_main_submits_prints_the_id_and_exits_with_the_jobs_status(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm_wait, "FIRST", 0.01)
    count = tmp_path / "looks"
    _tool(tmp_path, "sbatch", '[ "$1" = --parsable ] && [ -f "$2" ] && echo "77;cluster" || exit 9\n')
    _tool(tmp_path, "scontrol", f'echo x >> {count}\nif [ $(wc -l < {count}) -lt 3 ]; then echo "{RUNNING}"; '
                                f'else echo "{_ended("FAILED", "5:0")}"; fi\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    (tmp_path / "job.sbatch").write_text("#!/bin/bash\ntrue\n")
    assert slurm_wait.main([str(tmp_path / "job.sbatch")]) == 5
    out = capsys.readouterr().out
    assert slurm.parse_job_id(out) == "77" and "job 77 FAILED, exit status 5" in out
    assert len(count.read_text().split()) == 3


def test_a_refused_submission_says_why(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _tool(tmp_path, "sbatch", 'echo "sbatch: error: invalid partition specified: gpu" >&2; exit 1\n')
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert slurm_wait.main([str(tmp_path / "job.sbatch")]) == 1
    assert "invalid partition specified: gpu" in capsys.readouterr().err


def test_the_launcher_submits_through_the_waiter() -> None:
    ((name, argv, _),) = slurm.Slurm(2).commands(["python", "t.py"], {})
    assert argv[1:3] == ["-m", "labkit.launching.slurm_wait"] and argv[-1].endswith("job.sbatch")


def test_stopping_the_waiter_cancels_the_job(tmp_path: Path) -> None:
    cancelled = tmp_path / "cancelled"
    _tool(tmp_path, "sbatch", 'echo 88\n')
    _tool(tmp_path, "scontrol", f'echo "{RUNNING}"\n')
    _tool(tmp_path, "scancel", f'echo "$@" > {cancelled}\n')
    (tmp_path / "job.sbatch").write_text("#!/bin/bash\nsleep 100\n")
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    waiter = subprocess.Popen([sys.executable, "-m", "labkit.launching.slurm_wait", str(tmp_path / "job.sbatch")],
                              env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert waiter.stdout is not None and waiter.stdout.readline().strip() == "88"
        time.sleep(0.3)
        waiter.send_signal(signal.SIGTERM)
        assert waiter.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        waiter.kill()
    assert cancelled.read_text().split() == ["88"]
    assert "job 88 cancelled" in waiter.stderr.read()
