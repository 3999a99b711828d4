"""labkit.core.contract: one typed object between a launcher and its children; every LABKIT_ name in one module."""

from __future__ import annotations

import re

from helpers import paths

from labkit.core import contract

ROOT = paths.ROOT


def test_round_trip_through_the_environment() -> None:
    job = contract.JobEnv(job_id="j", run_id="r", launcher="slurm", np=4, threads=2, show_rank=0, task="worker.1")
    env = job.to_env()
    assert env[contract.NP] == "4" and env[contract.TASK] == "worker.1" and contract.SHRINK not in env
    assert contract.JobEnv.from_env(env) == job


def test_malformed_numbers_read_as_unset() -> None:
    got = contract.JobEnv.from_env({contract.NP: "two", contract.THREADS: "", contract.RUN_ID: "x"})
    assert got.np is None and got.threads is None and got.run_id == "x"


def test_strip_removes_the_contract_only() -> None:
    env = {contract.JOB_ID: "j", contract.RUN_ID: "r", "PATH": "/bin", contract.DATA: "/d"}
    assert contract.strip(env) == {"PATH": "/bin", contract.DATA: "/d"}


def test_no_other_module_spells_a_labkit_variable() -> None:
    spelled = re.compile(r"""["']LABKIT_[A-Z_]+["']""")
    offenders = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "labkit").rglob("*.py"))
                 if p.name != "contract.py" and spelled.search(p.read_text())]
    assert offenders == []


def test_signs_and_digits_that_are_not_numbers_read_as_unset() -> None:
    assert contract.JobEnv.from_env({contract.NP: "--2"}).np is None
    assert contract.JobEnv.from_env({contract.NP: "²"}).np is None
    assert contract.JobEnv.from_env({contract.NP: "-1"}).np == -1
