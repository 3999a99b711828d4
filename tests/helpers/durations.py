"""Where a test run's time goes: the per-test times of a ``--junitxml`` file (setup, call and teardown, so a
shared fixture's cost lands on the first test that uses it), grouped by what the tests pay for.

    cd tests && ../.venv/bin/python -m helpers.durations ../test-artifacts/test.xml [--top 30]
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

# What each test module pays for, by module (the first match of its dotted path wins).
COSTS: list[tuple[str, str]] = [
    ("test_workshop", "a JupyterHub for a class (users, hub and proxy start-ups)"),
    ("browser.", "JupyterLab and chromium start-ups, the notebooks run in them"),
    ("test_image", "container images (mmdebstrap, podman)"),
    ("test_binder", "install paths into fresh environments"),
    ("test_wheel", "install paths into fresh environments"),
    ("test_multinode", "virtual nodes (namespaces, sshd, Slurm) and jobs across them"),
    ("test_nodes", "virtual nodes (namespaces, sshd, Slurm) and jobs across them"),
    ("test_allreduce", "virtual nodes (namespaces, sshd, Slurm) and jobs across them"),
    ("test_slurm", "the one-node Slurm cluster and jobs on it"),
    ("test_lab_", "TensorFlow start-ups and training epochs: real checks"),
    ("test_hostile_checks", "TensorFlow start-ups and training epochs: real checks"),
    ("test_grade", "TensorFlow start-ups and training epochs: real checks"),
    ("test_assessment", "TensorFlow start-ups and training epochs: real checks"),
    ("test_plain_scripts", "TensorFlow start-ups and training epochs: the scripts without labkit"),
    ("test_baseline", "TensorFlow start-ups and training epochs: the scripts without labkit"),
    ("integration.", "launches under every launcher (mpirun, horovodrun, Gloo, clusters, engines, bench)"),
    ("unit.", "no process of labkit's: unit tests"),
]


OUTCOMES = {"failure": "failed", "error": "error", "skipped": "skipped"}  # JUnit's element: pytest's word


@dataclass(frozen=True)
class Timed:
    module: str
    name: str
    seconds: float
    outcome: str  # passed, failed, error or skipped


def read(path: Path) -> list[Timed]:
    """Every test case of a JUnit file written by pytest."""
    timed = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome = next((OUTCOMES[c.tag] for c in case if c.tag in OUTCOMES), "passed")
        timed.append(Timed(case.get("classname", ""), case.get("name", ""), float(case.get("time") or 0), outcome))
    return timed


def cost_of(module: str) -> str:
    dotted = module if module.startswith("tests.") else f"tests.{module}"
    for needle, cost in COSTS:
        if needle in dotted:
            return cost
    return "other"


def table(timed: list[Timed]) -> str:
    """A markdown table: each cost, its tests, its minutes and its share of the whole."""
    seconds: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for t in timed:
        seconds[cost_of(t.module)] += t.seconds
        count[cost_of(t.module)] += 1
    total = sum(seconds.values()) or 1.0
    rows = ["| what the tests pay for | tests | time | share |", "| --- | ---: | ---: | ---: |"]
    for cost in sorted(seconds, key=seconds.get, reverse=True):
        s = seconds[cost]
        rows.append(f"| {cost} | {count[cost]} | {s // 60:.0f} min {s % 60:.0f} s | {100 * s / total:.0f} % |")
    rows.append(f"| all | {len(timed)} | {total // 60:.0f} min {total % 60:.0f} s | 100 % |")
    return "\n".join(rows)


def slowest(timed: list[Timed], top: int) -> str:
    lines = [f"{t.seconds:7.1f} s  {t.module}::{t.name}  ({t.outcome})"
             for t in sorted(timed, key=lambda t: t.seconds, reverse=True)[:top]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit", type=Path, nargs="+", help="JUnit files written by pytest --junitxml")
    parser.add_argument("--top", type=int, default=30, help="how many of the slowest tests to list")
    args = parser.parse_args(argv)
    timed = [t for path in args.junit for t in read(path)]
    print(table(timed))
    print()
    print(slowest(timed, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
