"""The suite's time report (tests/helpers/durations.py): a JUnit file grouped by what the tests pay for."""

from __future__ import annotations

from pathlib import Path

from helpers import durations

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="browser.test_browser" name="test_runs[starters-02_horovod.ipynb]" time="90.5"/>
<testcase classname="integration.test_multinode" name="test_mpirun" time="30.0"><failure message="x"/></testcase>
<testcase classname="unit.test_cli" name="test_help" time="0.5"/>
<testcase classname="integration.test_launch" name="test_run[mpirun]" time="12.0"><skipped message="no"/></testcase>
</testsuite></testsuites>
"""


def test_times_are_grouped_by_cost_and_listed_slowest_first(tmp_path: Path) -> None:
    path = tmp_path / "junit.xml"
    path.write_text(JUNIT)
    timed = durations.read(path)
    assert [t.outcome for t in timed] == ["passed", "failed", "passed", "skipped"]
    text = durations.table(timed)
    rows = text.splitlines()[2:]
    assert rows[0].startswith("| JupyterLab and chromium") and "1 min 30 s" in rows[0]
    assert rows[1].startswith("| virtual nodes") and "| 1 |" in rows[1]
    assert rows[-1] == "| all | 4 | 2 min 13 s | 100 % |"
    assert durations.slowest(timed, 2).splitlines()[1].endswith("integration.test_multinode::test_mpirun  (failed)")
