"""Local cluster launcher: TF_CONFIG per task, logs, streaming, kill/restart, nothing left behind."""

from __future__ import annotations

import io
import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

from labkit.core import output, proc, tfconfig
from labkit.launching import engines, launch
from labkit.launching.jobspec import JobSpec
from labkit.records import runs
from labkit.tfdist import cluster
from labkit.tfdist.cluster import Tasks

TASK = textwrap.dedent(
    """
    import json, os, sys, time
    cfg = json.loads(os.environ["TF_CONFIG"])
    me = f"{cfg['task']['type']}.{cfg['task']['index']}"
    print("hello from", me, "of", sorted(cfg["cluster"]), flush=True)
    mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
    if mode == "fail" and me == "worker.1":
        sys.exit(3)
    if mode == "serve" and cfg["task"]["type"] != "chief":
        time.sleep(600)  # a server: runs until stopped
    if mode == "hang":
        time.sleep(600)
    if mode == "child":
        import subprocess
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        time.sleep(600)
    print("done", me, flush=True)
    """
)


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "task.py"
    path.write_text(TASK)
    return path


def _sink() -> output.ConsoleSink:
    return output.ConsoleSink(io.StringIO())


def test_every_task_gets_its_tf_config_and_a_log(script: Path, tmp_path: Path) -> None:
    sink = _sink()
    r = cluster.run(["python", str(script)], tasks=Tasks(workers=2),
                    job=JobSpec(log_dir=tmp_path / "logs", sink=sink, timeout=60))
    assert r.ok, r.summary()
    assert "hello from worker.1" in r.log("worker.1")
    assert "done worker.0" in r.log("worker.0")
    shown = sink.stream.getvalue()
    assert "hello from worker.0" in shown and "worker.1" not in shown  # only the chief is streamed
    first = shown.splitlines()[0]  # the command that really ran for the task shown, with its TF_CONFIG
    assert first.startswith("$ TF_CONFIG=") and '"index": 0' in first and str(script) in first, first
    spec = json.loads((tmp_path / "logs" / "cluster.json").read_text())["cluster"]
    assert all(tfconfig.port_is_free(p) for p in tfconfig.ports(spec))


def test_a_failing_task_fails_the_run_and_stops_the_rest(script: Path, tmp_path: Path) -> None:
    c = cluster.Cluster(["python", str(script), "fail"], tasks=Tasks(workers=3),
                        job=JobSpec(log_dir=tmp_path / "logs", quiet=True))
    c.start()
    r = c.wait(timeout=60)
    assert not r.ok and "worker.1" in r.errors
    assert r.returncodes["worker.1"] == 3
    assert proc.marked(c.job_id) == []


def test_parameter_servers_are_stopped_when_the_chief_ends(script: Path, tmp_path: Path) -> None:
    c = cluster.Cluster(["python", str(script), "serve"], tasks=Tasks(workers=1, ps=1, chief=True),
                        job=JobSpec(log_dir=tmp_path / "l", quiet=True))
    c.start()
    r = c.wait(timeout=60)
    assert r.ok, r.summary()
    assert "done chief.0" in r.log("chief.0")
    assert proc.marked(c.job_id) == []


@pytest.mark.slow  # 2 s or more: make test, not the 90 s of make test-fast
def test_timeout_kills_everything_including_grandchildren(script: Path, tmp_path: Path) -> None:
    c = cluster.Cluster(["python", str(script), "child"], tasks=Tasks(workers=2),
                        job=JobSpec(log_dir=tmp_path / "logs", quiet=True))
    c.start()
    time.sleep(1.5)
    assert len(proc.marked(c.job_id)) >= 4
    r = c.wait(timeout=1)
    assert r.timed_out and not r.ok
    assert proc.marked(c.job_id) == []


def test_stop_when_ends_the_run_with_its_reason(script: Path, tmp_path: Path) -> None:
    asked: list[Path] = []

    def stop_when(observed: Path) -> str | None:
        asked.append(observed)
        return "seen enough" if len(asked) > 5 else None

    c = cluster.Cluster(["python", str(script), "hang"], tasks=Tasks(workers=2),
                        job=JobSpec(log_dir=tmp_path / "logs", quiet=True, stop_when=stop_when))
    c.start()
    r = c.wait(timeout=60)
    assert r.stopped == "seen enough" and not r.ok and not r.timed_out and r.duration < 30, r.summary()
    assert asked[0] == tmp_path / "logs" / "observed" and "stopped after" in r.summary()
    assert r.record and r.record.status == "stopped" and r.record.error == "seen enough"
    assert proc.marked(c.job_id) == []


def test_kill_and_restart_one_task(script: Path, tmp_path: Path) -> None:
    with cluster.Cluster(["python", str(script), "hang"], tasks=Tasks(workers=2),
                         job=JobSpec(log_dir=tmp_path / "logs", quiet=True)) as c:
        c.start()
        c.wait_for_output(r"hello from worker\.1", "worker", 1, timeout=30)
        c.kill_task("worker", 1)
        assert c.alive() == ["worker.0"]
        assert c.restart_dead() == ["worker.1"]
        c.wait_for_output(r"hello from worker\.1", "worker", 1, timeout=30, count=2)
        assert "restarted" in c.output("worker", 1)
        assert c.tasks[("worker", 1)].starts == 2
    assert proc.marked(c.job_id) == []


def test_wait_for_output_raises_when_the_task_exits(script: Path, tmp_path: Path) -> None:
    with cluster.Cluster(["python", str(script)], tasks=Tasks(workers=1),
                         job=JobSpec(log_dir=tmp_path / "logs", quiet=True)) as c:
        c.start()
        with pytest.raises(launch.LaunchError, match="exited before"):
            c.wait_for_output("never printed", timeout=30)


def test_cli_runs_a_cluster(script: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from labkit.cli import main as cli

    code = cli.main(["cluster", "--workers", "2", "--log-dir", str(tmp_path / "logs"), "--", sys.executable,
                     str(script)])
    assert code == 0
    assert "cluster finished OK" in capsys.readouterr().err


def test_hosts_must_match_tasks(script: Path) -> None:
    with pytest.raises(tfconfig.ClusterError):
        cluster.run(["python", str(script)], tasks=Tasks(workers=2, hosts=["localhost:1"]))


@pytest.mark.slow
def test_run_on_ipyparallel_engines(script: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = engines.run_on_engines(script, [], workers=2, timeout=120, cwd=tmp_path)
    assert out["ok"], out
    assert "hello from worker.1" in out["outputs"]["worker.1"]
    assert "hello from worker.0" in capsys.readouterr().out
    (record,) = runs.read(tmp_path / "runs" / "runs.jsonl")  # recorded like any run labkit starts
    assert (record.launcher, record.status, record.workers) == ("ipyparallel", "ok", 2)
    assert record.duration_s and record.duration_s > 0 and record.script == str(script.resolve())


def test_tasks_on_other_hosts_start_over_ssh_with_their_tf_config(tmp_path: Path) -> None:
    from labkit.launching import hosts

    tasks = Tasks(workers=2, host_list=hosts.parse_hosts("localhost:1,node7:1"))
    c = cluster.Cluster(["python", "train.py"], tasks, JobSpec(log_dir=tmp_path / "logs", quiet=True, record=False))
    cmds = c.commands()
    assert cmds["worker.0"][-1] == "train.py"  # this machine: started directly
    remote = cmds["worker.1"]
    assert remote[:2] == ["ssh", "-tt"] and "node7" in remote
    assert "TF_CONFIG=" in remote[-1] and '"index": 1' in remote[-1] and "node7:" in remote[-1]
    assert c.spec["worker"][0].startswith("localhost:")
