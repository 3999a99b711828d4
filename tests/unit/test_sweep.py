"""labkit.records.sweep: points, speedup, efficiency, the ceiling and the table, from run records."""

from __future__ import annotations

from typing import Any

import pytest

from labkit.records import sweep
from labkit.records.runrecord import RunRecord


def rec(workers: int, ips: float | None, ttt: float | None = None, status: str = "ok", acc: float = 0.8,
        **more: Any) -> RunRecord:
    """A run record as the observer writes it, with what a sweep reads."""
    return RunRecord(run_id=f"r{workers}-{ips}", workers=workers, images_per_sec=ips, time_to_target_s=ttt,
                     final_val_accuracy=acc, status=status, threads_per_worker=1, **more)



def test_speedup_and_efficiency_from_records() -> None:
    points = sweep.points_from_records([
        rec(1, 100.0, 50.0), rec(1, 120.0, 40.0), rec(1, 110.0, 45.0),  # median 110
        rec(2, 200.0, 30.0), rec(2, 209.0, 20.0),                      # median 204.5
        rec(4, 330.0),
    ])
    assert [p.workers for p in points] == [1, 2, 4]
    one, two, four = points
    assert one.images_per_sec == 110 and one.speedup == 1 and one.efficiency == 1
    assert two.images_per_sec == pytest.approx(204.5)
    assert two.speedup == pytest.approx(204.5 / 110) and two.efficiency == pytest.approx(204.5 / 220)
    assert four.efficiency == pytest.approx(330 / 440)
    assert one.time_to_target_s == 45 and two.time_to_target_s == 25 and four.time_to_target_s is None


def test_failed_runs_are_listed_not_averaged() -> None:
    points = sweep.points_from_records([rec(1, 100.0), rec(2, None, status="failed"), rec(2, 190.0)])
    assert points[1].images_per_sec == 190 and points[1].efficiency == pytest.approx(0.95)
    assert len(points[1].failures) == 1
    table = sweep.format_table(points)
    assert "failed" in table and "95%" in table and "1.90x" in table


def test_baseline_without_a_one_worker_run() -> None:
    points = sweep.points_from_records([rec(2, 200.0), rec(4, 300.0)])
    assert points[0].efficiency == 1 and points[1].speedup == pytest.approx(1.5)
    assert points[1].efficiency == pytest.approx(0.75)


def test_table_columns() -> None:
    table = sweep.format_table(sweep.points_from_records([rec(1, 100.0, 12.5), rec(2, 180.0)]))
    head, _, first, second = table.splitlines()
    for word in ("workers", "images/sec", "speedup", "efficiency", "time to acc."):
        assert word in head
    assert first.split()[:5] == ["1", "1", "100.0", "1.00x", "100%"] and "12.5 s" in first
    assert second.split()[:5] == ["2", "1", "180.0", "1.80x", "90%"] and second.split()[5] == "-"


def test_busy_machine_warning() -> None:
    points = sweep.points_from_records([rec(1, 100.0, cpu_cores=1.1), rec(2, 150.0, cpu_cores=0.4)])
    assert points[1].cpu_cores == 0.4
    (w,) = sweep.check_busy(points, cores=2)
    assert "at 2 worker(s) rank 0 got 0.40 cores of the 1" in w and "other processes" in w
    assert "0.40" in sweep.format_table(points).splitlines()[-1]


def test_conditions_say_which_comparison_is_fair() -> None:
    fixed = sweep.describe_conditions({"launcher": "mpirun", "cores": 2, "threads": 1, "repeat": 3, "args": []})
    assert "equal cores per worker" in fixed and "1 thread(s) each" in fixed
    shared = sweep.describe_conditions({"launcher": "mpirun", "cores": 8, "threads": None, "repeat": 1})
    assert "all 8 cores" in shared and "--threads 1" in shared


def test_ceiling_points_and_table() -> None:
    points = sweep.points_from_records([
        rec(1, 100.0), rec(2, 180.0), rec(2, 190.0, launcher="independent"), rec(2, 200.0, launcher="independent"),
        rec(2, None, status="failed", launcher="independent"),
    ])
    assert [p.workers for p in points] == [1, 2]  # the copies are not a point of their own
    assert points[1].ceiling_images_per_sec == 195.0 and points[1].ceiling_efficiency == pytest.approx(180 / 195)
    assert points[0].ceiling_images_per_sec is None
    head, _, first, second = sweep.format_table(points).splitlines()
    assert "ceiling" in head and "of ceiling" in head
    assert "195.0" in second and "92%" in second
