"""Shared test helpers: a real single-node Slurm cluster, and looking for leftover processes."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from labkit import slurm_local


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[slurm_local.LocalSlurm]:
    """munged + slurmctld + slurmd on the loopback address for the whole session (skipped without Slurm)."""
    problem = slurm_local.missing()
    if problem:
        pytest.skip(problem)
    cluster = slurm_local.LocalSlurm().start()
    saved = os.environ.get("SLURM_CONF")
    os.environ.update(cluster.env())
    try:
        yield cluster
    finally:
        cluster.stop()
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved


@pytest.fixture
def slurm(slurm_cluster: slurm_local.LocalSlurm) -> Iterator[slurm_local.LocalSlurm]:
    """The session's Slurm cluster; the test fails if it leaves anything in the queue."""
    yield slurm_cluster
    assert slurm_cluster.queue() == [], "a job was left in the Slurm queue"


def _running(needle: str) -> bool:
    import psutil

    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and needle in " ".join(p.info["cmdline"] or []):
                return True
        except psutil.Error:
            continue
    return False


@pytest.fixture
def running() -> Callable[[str], bool]:
    """``running(text)``: is a process whose full command line contains ``text`` alive?"""
    return _running
