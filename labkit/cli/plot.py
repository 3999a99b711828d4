"""``labkit plot``: the command line of :mod:`labkit.figures.plot`."""

from __future__ import annotations

import sys

from labkit.figures.plot import save_all
from labkit.records import runs


def add_cli(sub) -> None:
    """Register ``labkit plot``."""
    p = sub.add_parser("plot", help="plot throughput, speedup and time to accuracy from run records",
                       description="Write PNG plots of run records. Example: labkit plot runs/runs.jsonl --out plots")
    p.add_argument("runs", nargs="?", default=None, help="records file (default: $LABKIT_RUNS_FILE or runs/runs.jsonl)")
    p.add_argument("--out", default="plots", help="folder for the PNG files (default: %(default)s)")
    p.add_argument("--script", default=None, help="only records of scripts whose name contains this")
    p.add_argument("--bench", default=None, help="only records of this benchmark sweep id")
    p.set_defaults(func=_cli)


def _cli(a) -> int:

    records = runs.read(a.runs)
    if a.script:
        records = [r for r in records if a.script in str(r.script)]
    if a.bench:
        records = [r for r in records if r.extra.get("bench") == a.bench]
    if not records:
        print(f"labkit plot: no records in {runs.runs_file(a.runs)}", file=sys.stderr)
        return 1
    for path in save_all(records, a.out):
        print(path)
    return 0
