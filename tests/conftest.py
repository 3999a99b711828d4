"""Fixtures every test folder shares (a real single-node Slurm cluster, the released course in a browser, leftover
processes) and the markers the folders give: every test of tests/browser is ``browser`` and ``slow``; a ``horovod``
test is skipped, saying why, where Horovod does not import."""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import paths

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
        assert not cluster.folder.exists(), f"the local cluster left its folder {cluster.folder}"
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
    from helpers import browser

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


ARTIFACTS = paths.ARTIFACTS


@pytest.fixture
def running() -> Callable[[str], bool]:
    """``running(text)``: is a process whose full command line contains ``text`` alive?"""
    return _running


def _horovod_problem() -> str | None:
    try:
        importlib.import_module("horovod.tensorflow")
    except Exception as e:  # noqa: BLE001 - an ImportError, or a build that fails to load its library
        return f"Horovod does not import here ({type(e).__name__}: {e}); `make setup` builds it"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    browser_dir = paths.TESTS / "browser"
    for item in items:
        if browser_dir in Path(item.fspath).parents:
            item.add_marker(pytest.mark.browser)
            item.add_marker(pytest.mark.slow)


_HOROVOD: list[str | None] = []  # whether Horovod imports, asked once, when the first horovod test is about to run


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a ``horovod`` test, saying why, where Horovod does not import. Asked at run time, not at collection:
    importing Horovod imports TensorFlow (seconds), which a run of tests without Horovod need not wait for."""
    if item.get_closest_marker("horovod") is None:
        return
    if not _HOROVOD:
        _HOROVOD.append(_horovod_problem())
    if _HOROVOD[0]:
        pytest.skip(_HOROVOD[0])


_STARTED = pytest.StashKey[float]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--budget", type=float, default=None, metavar="SECONDS",
                     help="the tier's wall-time budget: the summary says how the run compares (make test: 2100)")


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_STARTED] = time.monotonic()


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """The run's wall time against its tier's budget (the 30 slowest tests are pytest's ``--durations=30``)."""
    started = config.stash.get(_STARTED, None)
    if started is None:
        return
    wall = time.monotonic() - started
    line = f"wall time of the tests: {wall // 60:.0f} min {wall % 60:.0f} s"
    budget = config.getoption("--budget")
    if budget:
        over = wall > budget
        line += (f" ({'OVER' if over else 'within'} the budget of {budget // 60:.0f} min {budget % 60:.0f} s; "
                 "docs/testing.md says what to move to make test-heavy)")
        terminalreporter.write_sep("=", line, red=over, green=not over, bold=True)
    else:
        terminalreporter.write_sep("=", line, bold=True)

