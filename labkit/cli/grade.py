"""``labkit grade``: the command line of :mod:`labkit.grading.grade`, writing its results in the forms CI reads
(:mod:`labkit.grading.reports`).

In a GitHub Actions job (``GITHUB_ACTIONS=true``) or with ``--annotations`` it also prints one ``::error``
line per failing step, at the learner's file (and line, when the check's message shows it), and prints the
results table with the runner's workflow commands paused, so that nothing a learner's script makes a message
say is read as one. ``--save FILE`` keeps the whole result; ``--report FILE`` writes the reports from a saved
result without grading again, so that a CI job can grade in a step that holds no token and no runner file
(``$GITHUB_OUTPUT``, ``$GITHUB_ENV``...) and report in the next one.
"""

from __future__ import annotations

import json
import os
import sys
from argparse import SUPPRESS
from pathlib import Path

from labkit.core.cliargs import nonnegative_float, positive_float
from labkit.course import labs
from labkit.grading import grade, reports

RETIRED_CLASSROOM = (
    "labkit grade: --classroom is retired: GitHub Classroom was discontinued on 2026-08-28 and no service reads "
    "its result object any more. Use --junit FILE (JUnit XML for GitHub and GitLab test reports), --summary FILE "
    "(Markdown, e.g. $GITHUB_STEP_SUMMARY) and the job's outputs score= and max_score= (written to $GITHUB_OUTPUT); "
    "for Classroom 50 see course/autograder.py, for Canvas and Moodle `labkit class gradebook` (docs/grading.md)")


def add_cli(sub) -> None:
    """Register ``labkit grade``."""
    p = sub.add_parser("grade", help="grade a learner's checkout: every lab, one test case per step",
                       description="Check every lab of a learner's checkout and write the results for CI. "
                       "Exit 0 when every step passes or the score reaches --min-score.")
    p.add_argument("path", nargs="?", default=None, help="folder with the lab scripts (default: labs)")
    p.add_argument("--lab", action="append", choices=list(labs.LABS), help="grade only this lab (repeatable)")
    p.add_argument("--junit", metavar="FILE", help="write JUnit XML here")
    p.add_argument("--summary", metavar="FILE", help="append a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY)")
    p.add_argument("--save", metavar="FILE", help="write the whole result here as JSON (for --report)")
    p.add_argument("--report", metavar="FILE", help="grade nothing: write the reports (--junit, --summary, "
                   "annotations, $GITHUB_OUTPUT) from a result saved with --save or --json; exit 0 once written")
    p.add_argument("--annotations", action="store_true",
                   help="print GitHub ::error annotations at the failing steps' files (on by default when "
                   "GITHUB_ACTIONS=true)")
    p.add_argument("--classroom", metavar="FILE", help=SUPPRESS)  # retired with GitHub Classroom: exits 2, says why
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--timeout", type=positive_float, default=None, help="seconds per lab (default: the lab's own)")
    p.add_argument("--min-score", type=nonnegative_float, default=None, help="exit 0 when the score reaches this")
    p.set_defaults(func=_cli)


def _load(path: str) -> grade.Result:
    try:
        return grade.Result.from_dict(json.loads(Path(path).read_text()))
    except OSError as e:
        raise FileNotFoundError(f"--report {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise ValueError(f"--report {path}: {e}") from None


def _cli(a) -> int:
    if a.classroom:
        print(RETIRED_CLASSROOM, file=sys.stderr)
        return 2
    config: dict = {}
    try:
        if a.report:
            if a.path or a.lab or a.save:
                raise ValueError("--report writes the reports of a saved result: give no PATH, --lab or --save")
            result = _load(a.report)
        else:
            folder = Path(a.path or "labs")
            config = grade.load_config(folder)
            path = a.path or config.get("path") or "labs"
            say = None if a.json else (lambda text: print(text, file=sys.stderr, flush=True))
            result = grade.grade(path, a.lab, a.timeout, config, progress=say)
    except (ValueError, FileNotFoundError) as e:
        print(f"labkit grade: {e}", file=sys.stderr)
        return 2
    _write(a, result)
    if a.report:
        return 0
    floor = a.min_score if a.min_score is not None else config.get("min_score")
    return 0 if result.passed or (floor is not None and result.score >= float(floor)) else 1


def _write(a, result: grade.Result) -> None:
    """Every output asked for, then the table (or JSON) on stdout and the annotations."""
    if a.save:
        Path(a.save).write_text(json.dumps(result.to_dict(), indent=1) + "\n")
    if a.junit:
        Path(a.junit).write_text(reports.junit_xml(result))
    if os.environ.get("GITHUB_OUTPUT"):
        with open(os.environ["GITHUB_OUTPUT"], "a") as f:
            f.write(f"score={result.score:g}\nmax_score={result.max_score:g}\n")
    if a.summary:
        with open(a.summary, "a") as f:
            f.write(reports.summary_markdown(result))
    github = reports.in_github_actions()
    if a.json:
        print(json.dumps(result.to_dict()))  # one line; JSON escapes every line break of a message
    else:
        table = reports.text(result)
        print(reports.guarded(table) if github else table)
    notes = reports.annotations(result) if a.annotations or github else []
    if notes:  # after the JSON, on stderr: stdout stays one JSON object (the runner reads both streams)
        print("\n".join(notes), file=sys.stderr if a.json else sys.stdout, flush=True)
