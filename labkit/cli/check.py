"""``labkit check``: the command line of :mod:`labkit.check`."""

from __future__ import annotations

import json
import sys

from labkit.check import LABS, run_check
from labkit.core.cliargs import positive_float, positive_int


def add_cli(sub) -> None:
    """Register ``labkit check LAB SCRIPT [--step N] [--json] [--timeout S]``."""
    p = sub.add_parser("check", help="check a lab script step by step, by running it")
    p.add_argument("lab", choices=sorted(LABS), help="which lab")
    p.add_argument("script", help="the learner's script")
    p.add_argument("--step", type=positive_int, default=None, help="check steps 1..N (default: all)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    defaults = ", ".join(f"{name} {lab.timeout:.0f}" for name, lab in LABS.items())
    p.add_argument("--timeout", type=positive_float, default=None,
        help=f"seconds for the whole check (default: {defaults})")
    p.set_defaults(func=_cli)


def _cli(a) -> int:
    try:
        report = run_check(a.lab, a.script, a.step, a.timeout)
    except (ValueError, FileNotFoundError) as e:
        if a.json:
            print(json.dumps({"lab": a.lab, "script": a.script, "passed": False, "error": str(e)}))
        print(f"labkit check: {e}", file=sys.stderr)
        return 2
    print(report.to_json() if a.json else report.format())
    return 0 if report.passed else 1
