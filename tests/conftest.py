"""Shared test helpers: a real single-node Slurm cluster, leftover processes, judging recorded probe runs."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from labkit.check import Report, judging
from labkit.course import labs
from labkit.launching import slurm_local


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


def _runner(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, state: str):
    import browser

    problem = browser.missing()
    if problem:
        pytest.skip(problem)
    if not slurm_local.missing():
        request.getfixturevalue("slurm_cluster")
    return browser.Runner(tmp_path_factory.mktemp(f"jupyterlab-{state}"), ARTIFACTS / "browser", state)


@pytest.fixture(scope="session")
def notebooks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """The released course with its untouched starters (a learner who just began), its notebooks run in
    JupyterLab in a real browser (``notebooks.run(name)``), each once per session.

    Screenshots go to ``test-artifacts/browser/starters/``. The tests' Slurm cluster is started first when
    Slurm is installed, so that lab 7 submits to it.
    """
    runner = _runner(request, tmp_path_factory, "starters")
    try:
        yield runner
    finally:
        runner.close()


@pytest.fixture(scope="session")
def finished_notebooks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """The released course with every lab finished (the final solutions over the starters), run like
    :func:`notebooks`; screenshots in ``test-artifacts/browser/finished/``."""
    runner = _runner(request, tmp_path_factory, "finished")
    try:
        yield runner
    finally:
        runner.close()


ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"


@pytest.fixture
def running() -> Callable[[str], bool]:
    """``running(text)``: is a process whose full command line contains ``text`` alive?"""
    return _running


def judge_case(case) -> Report:  # a probe_cases.Case
    """Judge a recorded probe run (``tests/fixtures/probes``) as the check would, without running anything."""
    spec = labs.get(case.lab)
    evidence = judging.load(case.fixture)
    assert evidence.get("format") == judging.FORMAT, (
        f"{case.fixture} was recorded in another evidence format: run `make probe-fixtures`")
    module = judging.lab_module(case.lab)
    upto = min(case.step or spec.n_steps, evidence["covers"])
    return Report(case.lab, case.name, judging.judge(module.STEPS, evidence, upto, spec.steps))


def expect_case(report: Report, case) -> None:
    """Steps 1..case.passes pass; the next one fails, with case.hint in its message."""
    judged = len(report.steps)
    assert [s.passed for s in report.steps] == [s.step <= case.passes for s in report.steps], report.format()
    if case.passes < judged:
        assert report.first_failing_step == case.passes + 1, report.format()
        assert case.hint in report.steps[case.passes].message, report.format()


def real_check_matches_recording(case, tmp_path: Path, running: Callable[[str], bool], probe: str,
                                 step: int | None = None) -> Report:
    """Check ``case`` for real: it is judged as recorded, its evidence has the recorded shape, nothing is left."""
    from labkit import check

    out = tmp_path / "evidence.json"
    report = check.run_check(case.lab, case.script(tmp_path), step, fresh=True, evidence_out=out)
    expect_case(report, case)
    assert judging.shape(judging.load(out)) == judging.shape(judging.load(case.fixture)), (
        "the probe's evidence changed shape: run `make probe-fixtures`")
    assert not running(probe)
    return report
