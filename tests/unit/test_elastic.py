"""Horovod Elastic: the launcher's command and discovery files, the job's epoch lines read back, bad input refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labkit.core import contract, proc
from labkit.launching import hosts, launchers, table
from labkit.measure import elastic


def test_the_elastic_launcher_discovers_its_hosts_from_the_job_folder(tmp_path: Path) -> None:
    assert table.get("elastic", np=4, host_list=hosts.parse_hosts("a:2,b:2")).name == "elastic"
    launcher = launchers.Elastic(4, hosts.parse_hosts("a:2,b:2"))
    env = {contract.LOG_DIR: str(tmp_path)}
    ((name, argv, _),) = launcher.commands(["python", "train.py"], env)
    assert name == "launcher" and argv[-3:] == ["--gloo", "python", "train.py"]
    i = argv.index("-np")
    assert argv[i:i + 7] == ["-np", "4", "--min-np", "1", "--max-np", "4", "--host-discovery-script"]
    assert argv[i + 7] == str(tmp_path.resolve() / "discover_hosts.sh")
    assert launchers.Elastic.files(env) == (tmp_path.resolve() / "hosts.now", tmp_path.resolve() / "discover_hosts.sh")


def test_on_this_host_alone_the_elastic_launcher_names_the_loopback_interface(tmp_path: Path) -> None:
    env = {contract.LOG_DIR: str(tmp_path)}
    ((_, here, _),) = launchers.Elastic(2, hosts.parse_hosts("localhost:2")).commands(["python", "t.py"], env)
    ((_, away, _),) = launchers.Elastic(4, hosts.parse_hosts("a:2,b:2")).commands(["python", "t.py"], env)
    assert here[here.index("--gloo"):] == ["--gloo", "--network-interface", "lo", "python", "t.py"]
    assert "--network-interface" not in away


def test_the_elastic_launcher_needs_hosts(tmp_path: Path) -> None:
    with proc.Job() as job, pytest.raises(launchers.LaunchError, match="needs a host list"):
        launchers.Elastic(2).start(job, ["python", "x.py"], {contract.LOG_DIR: str(tmp_path)}, tmp_path)
    assert not (tmp_path / "hosts.now").exists()


def test_rank_zeros_epochs_are_read_in_the_order_they_ended(tmp_path: Path) -> None:
    lines = [{"epoch": 0, "size": 2, "rank": 0, "end": 1.0}, {"epoch": 0, "size": 2, "rank": 1, "end": 1.1},
             {"epoch": 2, "size": 1, "rank": 0, "end": 3.0}, {"epoch": 1, "size": 2, "rank": 0, "end": 2.0}]
    text = "".join("ELASTIC " + json.dumps(x) + "\n" for x in lines) + "ELASTIC {broken\nnoise\n"
    (tmp_path / elastic.EVENTS).write_text(text)
    got = elastic.read_epochs(tmp_path)
    assert [(e["epoch"], e["size"]) for e in got] == [(0, 2), (1, 2), (2, 1)]
    report = elastic.ElasticReport(got, True, "ok")
    assert report.sizes() == [2, 2, 1] and report.completed() == {0, 1, 2} and "workers" in str(report)
    assert elastic.read_epochs(tmp_path / "none") == []


def test_bad_plans_are_refused_before_anything_starts(tmp_path: Path) -> None:
    one = tmp_path / "one"
    one.write_text("node1 slots=2\n")
    two = tmp_path / "two"
    two.write_text("node1 slots=1\nnode2 slots=1\n")
    with pytest.raises(ValueError, match="at least 2 hosts"):
        elastic.leave_and_return(one)
    with pytest.raises(ValueError, match="less than epochs"):
        elastic.leave_and_return(two, epochs=5, leave_after=3, away=3)
