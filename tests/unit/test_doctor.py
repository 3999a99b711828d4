"""labkit.cli.doctor: the readiness report and its `labkit doctor` command."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from labkit.cli import doctor

REQUIRED = {"ready", "python", "tensorflow", "keras", "horovod", "mpirun", "gpus", "dataset", "problems"}


def fake_report(**changes):
    report = {
        "python": "3.11.7",
        "executable": "/opt/lab/.venv/bin/python",
        "cpus": 2,
        "tensorflow": "2.21.0",
        "keras": "tf-keras 2.21.0 (Keras 2)",
        "horovod": {"version": "0.28.1", "mpi": True, "gloo": True, "nccl": False},
        "mpirun": "/usr/bin/mpirun",
        "horovodrun": "/opt/lab/.venv/bin/horovodrun",
        "gpus": 0,
        "dataset": "/usr/share/datasets/fashion-mnist",
        "startup_hook": "/opt/lab/.venv/lib/python3.11/site-packages/labkit_env.pth",
        "problems": [],
        "ready": True,
    }
    report.update(changes)
    return report


def test_format_report_when_ready():
    text = doctor.format_report(fake_report())
    assert "Ready" in text
    assert "Not ready" not in text
    assert "2.21.0" in text and "0.28.1" in text
    assert "MPI yes | Gloo yes | NCCL no" in text
    assert "small mode" in text  # no GPU: the labs run small


def test_format_report_lists_every_problem():
    problems = ["mpirun not found: sudo apt-get install openmpi-bin", "Fashion-MNIST not found. How to get it"]
    text = doctor.format_report(fake_report(horovod=None, mpirun=None, dataset=None, problems=problems, ready=False))
    assert "Not ready" in text
    for problem in problems:
        assert f"  - {problem}" in text
    assert "Horovod" in text and "not usable" in text
    assert "not found" in text


def test_format_report_with_gpus():
    text = doctor.format_report(fake_report(gpus=4))
    assert "small mode" not in text


@pytest.fixture(scope="module")
def report():
    return doctor.collect()


def test_collect_has_every_key(report):
    assert REQUIRED <= set(report)
    assert isinstance(report["problems"], list)
    assert all(isinstance(p, str) and p for p in report["problems"])
    assert report["ready"] is (not report["problems"])
    assert isinstance(report["gpus"], int)
    json.dumps(report)  # plain data only


def test_collect_sees_this_environment(report):
    import tensorflow as tf

    assert report["python"] == ".".join(map(str, sys.version_info[:3]))
    assert report["tensorflow"] == tf.__version__
    assert report["keras"].startswith("tf-keras")
    from labkit.launching import launchers

    assert report["mpirun"] == shutil.which(launchers.tool("mpirun"))
    if report["horovod"] is None:
        assert any("Horovod" in p for p in report["problems"])
    else:
        assert set(report["horovod"]) == {"version", "mpi", "gloo", "nccl"}


def test_collect_reports_missing_data(tmp_path, monkeypatch):
    from labkit.instrument import data

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("LABKIT_DATA", raising=False)
    monkeypatch.setattr(data, "SYSTEM_DIR", tmp_path / "none")
    monkeypatch.setattr(doctor, "_horovod", lambda: (None, "Horovod skipped in this test"))
    r = doctor.collect()
    assert r["dataset"] is None
    assert r["ready"] is False
    assert any("Fashion-MNIST not found" in p and "LABKIT_DATA" in p for p in r["problems"])


def labkit_command() -> list[str]:
    script = Path(sys.executable).with_name("labkit")
    return [str(script)] if script.exists() else [sys.executable, "-m", "labkit.cli"]


@pytest.mark.slow  # several seconds: out of make test-fast
def test_doctor_json_command():
    out = subprocess.run(labkit_command() + ["doctor", "--json"], capture_output=True, text=True, timeout=180)
    report = json.loads(out.stdout)  # exactly one JSON object on stdout
    assert isinstance(report, dict)
    assert REQUIRED <= set(report)
    # Horovod may not be built yet: whatever the state, exit code and `ready` must agree.
    assert (out.returncode == 0) is report["ready"], out.stderr[-2000:]
    assert report["ready"] is (not report["problems"])


def test_main_prints_the_report_and_exits_1_unless_ready(monkeypatch, capsys):
    monkeypatch.setattr(doctor, "collect", lambda: fake_report(problems=["mpirun not found"], ready=False))
    assert doctor.main() == 1
    assert "  - mpirun not found" in capsys.readouterr().out
    monkeypatch.setattr(doctor, "collect", lambda: fake_report())
    assert doctor.main(as_json=True) == 0
    assert json.loads(capsys.readouterr().out)["ready"] is True


def test_doctor_says_what_needs_root_and_what_a_gloo_only_build_cannot_do():
    gloo_only = fake_report(horovod={"version": "0.28.1", "mpi": False, "gloo": True, "nccl": False}, mpirun=None)
    cannot = doctor.cannot_run(gloo_only, is_root=False)
    assert any("mpirun" in c and "without MPI" in c for c in cannot)
    assert any("virtual nodes" in c and "root" in c for c in cannot)
    assert any("workshop" in c for c in cannot)
    assert not any("mpirun" in c for c in doctor.cannot_run(fake_report(), is_root=False))
    text = doctor.format_report(fake_report(cannot_run=cannot, mpi="Open MPI 5.0.11"))
    assert "Not on this machine" in text and "except the above" in text


def test_doctor_says_root_in_a_container_needs_the_capabilities():
    lacking = doctor.cannot_run(fake_report(missing_capabilities=["NET_ADMIN", "SYS_ADMIN"]), is_root=True)
    assert any("labs 7 and 8" in c and "--cap-add NET_ADMIN,SYS_ADMIN" in c for c in lacking), lacking
    assert not any("--cap-add" in c for c in doctor.cannot_run(fake_report(missing_capabilities=[]), is_root=True))
