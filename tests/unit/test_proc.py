"""labkit.core.proc: the one process layer starts, logs, and stops everything a job started."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from labkit.core import contract, pipes, proc

SPAWNS_AND_DETACHES = textwrap.dedent("""
    import os, subprocess, sys, time
    # a grandchild in its own session (like a daemon): only the job's mark finds it
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    print("started", flush=True)
    time.sleep(300)
""")


def test_spawn_logs_streams_and_returns_the_exit_code(tmp_path: Path) -> None:
    seen: list[bytes] = []
    ended: list[bool] = []
    with proc.Job() as job:
        p = job.spawn([sys.executable, "-c", "print('hi'); import sys; sys.exit(3)"], log=tmp_path / "out.log",
                      on_output=seen.append, on_end=lambda: ended.append(True))
        assert p.wait(30) == 3
    assert b"hi" in b"".join(seen) and ended == [True]
    assert (tmp_path / "out.log").read_text().strip() == "hi"


def test_every_child_carries_the_job_mark_and_none_unsets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TF_CONFIG", "{}")
    code = f"import os; print(os.environ.get('{contract.JOB_ID}'), os.environ.get('TF_CONFIG'), os.environ['X'])"
    with proc.Job("job42") as job:
        p = job.spawn([sys.executable, "-c", code], env={"TF_CONFIG": None, "X": "1"}, log=tmp_path / "o")
        p.wait(30)
    assert p.output().split() == ["job42", "None", "1"]


@pytest.mark.slow  # several seconds: out of make test-fast
def test_stop_kills_the_session_and_detached_descendants(tmp_path: Path) -> None:
    job = proc.Job()
    p = job.spawn([sys.executable, "-c", SPAWNS_AND_DETACHES], log=tmp_path / "o")
    assert proc.wait_until(lambda: "started" in p.output(), 30)
    assert p.wait(0.5) is None  # still running: a timeout
    assert len(proc.marked(job.id)) >= 2
    job.stop(grace=1)
    assert proc.marked(job.id) == [] and not p.alive()


def test_a_shell_string_is_refused() -> None:
    with pytest.raises(TypeError, match="list"):
        proc.Job().spawn("echo hi")
    with pytest.raises(ValueError, match="nothing to run"):
        proc.Job().spawn([])


def test_children_die_with_a_parent_killed_outright(tmp_path: Path) -> None:
    """SIGKILL of the Python that started the job (no cleanup runs) still ends its children."""
    flag = tmp_path / "child.pid"
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from labkit.core import proc
        job = proc.Job()
        p = job.spawn([sys.executable, "-c", "import os, time; open({str(flag)!r}, 'w').write(str(os.getpid()));"
                       " time.sleep(300)"])
        time.sleep(300)
    """)])
    assert proc.wait_until(lambda: flag.exists() and flag.read_text(), 30)
    pid = int(flag.read_text())
    parent.kill()
    parent.wait()
    assert proc.wait_until(lambda: not _alive(pid), 10)


def test_follow_feeds_what_is_appended(tmp_path: Path) -> None:
    import threading

    path = tmp_path / "grows.log"
    got: list[bytes] = []
    stop = threading.Event()
    t = threading.Thread(target=pipes.follow, args=(path, got.append, stop), kwargs={"every": 0.05})
    t.start()
    time.sleep(0.2)
    path.write_bytes(b"one\n")
    assert proc.wait_until(lambda: b"one" in b"".join(got), 5, every=0.05)
    with open(path, "ab") as f:
        f.write(b"two\n")
    stop.set()
    t.join(5)
    assert b"".join(got) == b"one\ntwo\n"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_a_job_inside_a_job_keeps_the_outer_mark(tmp_path: Path) -> None:
    """What an inner job leaves behind (a detached daemon) is still found by the outer job."""
    outer = proc.Job()
    inner_env = outer.env()
    inner = proc.Job()
    env = inner.env(base=inner_env)
    assert env[contract.JOB_ID] == inner.id and env[contract.JOB_IDS].split(":") == [outer.id, inner.id]
    p = inner.spawn([sys.executable, "-c", SPAWNS_AND_DETACHES], env={contract.JOB_IDS: inner_env[contract.JOB_IDS]},
                    log=tmp_path / "o")
    assert proc.wait_until(lambda: "started" in p.output(), 30)
    assert len(proc.marked(outer.id)) >= 2  # the outer job sees the inner job's processes
    outer.stop(grace=1)
    assert proc.marked(inner.id) == []


def test_what_an_ended_process_left_running_is_named_and_stopped(tmp_path: Path) -> None:
    """A child that outlives its parent (holding its output pipe) is not waited for: it is named, then stopped."""
    code = "import subprocess; subprocess.Popen(['sleep', '1239']); print('started', flush=True)"
    start = time.monotonic()
    with proc.Job() as job:
        p = job.spawn([sys.executable, "-c", code], log=tmp_path / "o")
        assert proc.wait_until(lambda: not p.alive(), 30)
        assert len(job.orphans()) == 1
    assert job.left_behind == ["sleep 1239"] and proc.marked(job.id) == []
    assert time.monotonic() - start < 20


@pytest.mark.slow  # several seconds: out of make test-fast
def test_a_running_job_has_no_orphans(tmp_path: Path) -> None:
    job = proc.Job()
    p = job.spawn([sys.executable, "-c", SPAWNS_AND_DETACHES], log=tmp_path / "o")
    assert proc.wait_until(lambda: "started" in p.output(), 30)
    assert job.orphans() == []  # the detached grandchild belongs to a process still running
    job.stop(grace=1)
    assert job.left_behind == [] and proc.marked(job.id) == []
