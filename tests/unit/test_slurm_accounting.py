"""labkit.nodes.slurm_accounting: the commands and files of a confined cluster's accounting, built without
starting anything; what a learner's name or a cap could slip into a root command is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from labkit.nodes import slurm_accounting as acc
from labkit.workshop import slurmlimits


def test_caps_become_qos_fields_and_none_clears_a_cap() -> None:
    assert acc.Caps(running_jobs=2, queued_jobs=8, nodes=2).qos_fields() == [
        "MaxJobsPerUser=2", "MaxSubmitJobsPerUser=8", "MaxTRESPerUser=node=2"]
    assert acc.Caps().qos_fields() == ["MaxJobsPerUser=-1", "MaxSubmitJobsPerUser=-1", "MaxTRESPerUser=node=-1,cpu=-1"]


@pytest.mark.parametrize("bad", [0, -1, 10**6, 1.5, "2 Flags=NoReserve", True])
def test_a_cap_that_is_not_a_small_whole_number_is_refused(bad: object) -> None:
    with pytest.raises(acc.AccountingError):
        acc.Caps(running_jobs=bad).qos_fields()  # type: ignore[arg-type]


def test_users_are_added_to_the_learners_account_with_the_capped_qos() -> None:
    argv = acc.users_command("add", ["learner01", "learner02"])
    assert argv[:4] == ["sacctmgr", "-i", "-n", "-P"]
    assert argv[4:] == ["add", "user", "learner01,learner02", f"account={acc.ACCOUNT}", f"cluster={acc.CLUSTER}",
                        f"qos={acc.QOS}", f"defaultqos={acc.QOS}"]
    assert not any("qos" in w for w in acc.users_command("add", ["instructor"], capped=False))
    assert acc.users_command("delete", ["learner01"])[4:] == ["delete", "user", "where", "name=learner01",
                                                              f"cluster={acc.CLUSTER}"]


@pytest.mark.parametrize("bad", [[], ["root where name=x"], ["a,b"], ["learner01", "x=y"], ["Learner"], ["-x"]])
def test_a_name_that_is_not_a_unix_name_never_reaches_sacctmgr(bad: list[str]) -> None:
    with pytest.raises(acc.AccountingError):
        acc.users_command("add", bad)


def test_the_database_is_root_s_alone_and_slurm_enforces_the_qos(tmp_path: Path) -> None:
    argv = acc.mariadb_argv(tmp_path)
    assert "--skip-networking" in argv and f"--socket={tmp_path}/db/run/mariadb.sock" in argv
    lines = acc.conf_lines(6819, tmp_path / "munge.sock")
    assert "AccountingStorageEnforce=associations,limits,qos,safe" in lines
    assert f"AccountingStoragePass={tmp_path}/munge.sock" in lines
    text = acc.dbd_conf(tmp_path, 6819, tmp_path / "munge.sock")
    assert "DbdAddr=127.0.0.1" in text and "StorageType=accounting_storage/mysql" in text


def test_a_workshop_s_job_limits_give_the_queue_four_jobs_per_running_one() -> None:
    caps = slurmlimits.JobLimits(minutes=10, running=3, nodes=2).caps()
    assert (caps.running_jobs, caps.queued_jobs, caps.nodes) == (3, 3 * slurmlimits.QUEUED_PER_RUNNING, 2)
