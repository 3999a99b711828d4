"""``labkit grade``: the command line of :mod:`labkit.grading.grade`, writing its results in the forms CI reads
(:mod:`labkit.grading.reports`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from labkit.core.cliargs import nonnegative_float, positive_float
from labkit.course import labs
from labkit.grading import grade, reports


def add_cli(sub) -> None:
    """Register ``labkit grade``."""
    p = sub.add_parser("grade", help="grade a learner's checkout: every lab, one test case per step",
                       description="Check every lab of a learner's checkout and write the results for CI. "
                       "Exit 0 when every step passes or the score reaches --min-score.")
    p.add_argument("path", nargs="?", default=None, help="folder with the lab scripts (default: labs)")
    p.add_argument("--lab", action="append", choices=list(labs.LABS), help="grade only this lab (repeatable)")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML here")
    p.add_argument("--classroom", metavar="FILE", help="write the GitHub Classroom result here (and FILE.b64)")
    p.add_argument("--summary", metavar="FILE", help="append a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--timeout", type=positive_float, default=None, help="seconds per lab (default: the lab's own)")
    p.add_argument("--min-score", type=nonnegative_float, default=None, help="exit 0 when the score reaches this")
    p.set_defaults(func=_cli)


def _cli(a) -> int:
    try:
        folder = Path(a.path or "labs")
        config = grade.load_config(folder)
        path = a.path or config.get("path") or "labs"
        say = None if a.json else (lambda text: print(text, file=sys.stderr, flush=True))
        result = grade.grade(path, a.lab, a.timeout, config, progress=say)
    except (ValueError, FileNotFoundError) as e:
        print(f"labkit grade: {e}", file=sys.stderr)
        return 2
    if a.junit:
        Path(a.junit).write_text(reports.junit_xml(result))
    if a.classroom:
        Path(a.classroom).write_text(json.dumps(reports.classroom(result), indent=1) + "\n")
        Path(a.classroom + ".b64").write_text(reports.classroom_b64(result) + "\n")
    if os.environ.get("GITHUB_OUTPUT"):
        with open(os.environ["GITHUB_OUTPUT"], "a") as f:
            f.write(f"result={reports.classroom_b64(result)}\nscore={result.score:g}\nmax_score={result.max_score:g}\n")
    if a.summary:
        with open(a.summary, "a") as f:
            f.write(reports.summary_markdown(result))
    print(json.dumps(result.to_dict()) if a.json else reports.text(result))
    floor = a.min_score if a.min_score is not None else config.get("min_score")
    return 0 if result.passed or (floor is not None and result.score >= float(floor)) else 1
