#!/usr/bin/env python3
"""Classroom 50 autograder for this course: grades every lab with labkit and writes ``result.json``.

Where it goes: the instructor's Classroom 50 config repository, as ``CLASSROOM/autograders/ASSIGNMENT/autograder.py``
with the course's graded release next to it as ``grader/`` (``labkit release --solutions graded .../grader``;
Classroom 50 bundles an assignment folder's files with its autograder). The grader, its setup and the points
then come from the instructor, and only ``labs/`` from the learner. As the classroom's default
(``gh teacher autograder set-default ORG CLASSROOM --from course/autograder.py``, a file alone) set GRADER_URL
below to a git URL of that release instead. With neither it grades with the learner's own copy of labkit and
says so: a learner could then change their points.

The contract it follows (Classroom 50's "Advanced Autograding" wiki page and ``schemas/result-v1.schema.json``):
the runner starts it once per submission in the learner's checkout, with CLASSROOM, ASSIGNMENT, SUBMISSION_TAG,
COMMIT_URL, RELEASE_URL, REVIEW_URL, USERNAME/OWNER and ASSIGNMENT_TYPE in the environment; it writes
``./result.json`` (schema ``classroom50/result/v1``: whole-number ``score`` and ``max-score``, and ``tests``, each
with ``test-name``, ``passed``, ``score``, ``max-score``; extra fields such as ``output`` are kept) and may write
``./release-body.md``; exit 0 when grading ran (passed or not), non-zero for a failure of the grading itself.

Classroom 50 counts whole points: each lab's points (``[tool.labkit.grading.points]``) are shared over its steps
in whole points, the largest remainders first, so a lab keeps its total (3 points over 4 steps: 1, 1, 1, 0).

Standard library only; Python 3.10 or later.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# A git URL of the course's graded release to grade with (cloned at its default branch), instead of grader/.
GRADER_URL = ""
OUTPUT_LIMIT = 2000  # characters of a check's message kept in a test's output
SCHEMA = "classroom50/result/v1"


def whole_points(maxima: list[float]) -> list[int]:
    """``maxima`` (one lab's step points) as whole numbers with the same total, rounded: the floors, then one
    more point to the steps with the largest remainders (the earlier step first on a tie)."""
    if all(abs(m - round(m)) < 1e-9 for m in maxima):
        return [round(m) for m in maxima]
    total = round(sum(maxima))
    floors = [math.floor(m + 1e-9) for m in maxima]
    order = sorted(range(len(maxima)), key=lambda k: (-(maxima[k] - floors[k]), k))
    for k in order[: max(0, total - sum(floors))]:
        floors[k] += 1
    return floors


def tests_of(grade: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One Classroom 50 test per case of a ``labkit grade --save`` result, in whole points."""
    cases = [c for c in grade.get("cases", []) if isinstance(c, dict)]
    maxima: dict[str, list[float]] = {}
    for c in cases:
        maxima.setdefault(str(c["lab"]), []).append(float(c["max_points"]))
    whole = {lab: iter(whole_points(points)) for lab, points in maxima.items()}
    tests = []
    for c in cases:
        top = next(whole[str(c["lab"])])
        passed = bool(c["passed"])
        message = str(c.get("message", ""))
        tests.append({"test-name": f"{c['lab']} step {c['step']}: {c['title']}", "passed": passed,
                      "score": top if passed else 0, "max-score": top,
                      "output": message if len(message) <= OUTPUT_LIMIT else message[: OUTPUT_LIMIT - 3] + "..."})
    return tests


def result_json(grade: Mapping[str, Any], env: Mapping[str, str], now: datetime.datetime | None = None) -> dict:
    """The ``result.json`` of a submission: its identity from the runner's environment, the tests from ``grade``."""
    tests = tests_of(grade)
    when = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "classroom": env.get("CLASSROOM", ""),
        "assignment": env.get("ASSIGNMENT", ""),
        "submission": env.get("SUBMISSION_TAG", ""),
        "commit": env.get("COMMIT_URL", ""),
        "release": env.get("RELEASE_URL", ""),
        "review": env.get("REVIEW_URL") or env.get("COMMIT_URL", ""),
        "datetime": when,
        "score": sum(t["score"] for t in tests),
        "max-score": sum(t["max-score"] for t in tests),
        "tests": tests,
    }
    owner = env.get("OWNER") or env.get("USERNAME")
    if owner:  # the runner stamps owner and assignment_type itself; set here for a run outside it
        result["owner"] = owner
        result["assignment_type"] = env.get("ASSIGNMENT_TYPE") or "individual"
    return result


def _grader(scratch: Path) -> tuple[Path, bool]:
    """The course to grade with, and whether it is the instructor's (not the learner's own copy)."""
    if GRADER_URL:
        target = scratch / "grader-clone"
        subprocess.run(["git", "clone", "--quiet", "--depth", "1", GRADER_URL, str(target)], check=True)
        return target, True
    bundled = Path(__file__).resolve().parent / "grader"
    if (bundled / "pyproject.toml").is_file():
        return bundled, True
    return Path.cwd(), False


def main() -> int:
    checkout = Path.cwd()
    scratch = Path(tempfile.mkdtemp(prefix="labkit-", dir=os.environ.get("RUNNER_TEMP") or None))
    grader, trusted = _grader(scratch)
    if not trusted:
        print("::warning::labkit: no grader/ next to autograder.py: grading with the learner's own labkit and "
              "points (see the autograder's docstring)", flush=True)
    work, out = scratch / "work", scratch / "out"
    out.mkdir()
    # The grader's files, with the learner's labs/ over them: never the learner's labkit, Makefile or points.
    shutil.copytree(grader, work, symlinks=True, ignore=shutil.ignore_patterns(".git", ".venv"))
    if (checkout / "labs").is_dir():
        shutil.copytree(checkout / "labs", work / "labs", symlinks=True, dirs_exist_ok=True)
    # The checks run the learner's code: with HOME, PATH and LANG only (no token of the runner's).
    env = {"HOME": os.environ.get("HOME", "/tmp"), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "LANG": "C.UTF-8", **({"LABKIT_CACHE": os.environ["LABKIT_CACHE"]} if "LABKIT_CACHE" in os.environ else {})}
    if subprocess.run(["make", "setup"], cwd=work, env=env).returncode != 0:
        print("::error::labkit: `make setup` failed (see above)", flush=True)
        return 1
    saved = out / "grade.json"
    graded = subprocess.run([str(work / ".venv" / "bin" / "labkit"), "grade", "--save", str(saved),
                             "--summary", str(out / "summary.md")], cwd=work, env=env)
    if graded.returncode not in (0, 1) or not saved.is_file():
        print(f"::error::labkit: grading failed (exit code {graded.returncode})", flush=True)
        return 1
    result = result_json(json.loads(saved.read_text()), os.environ)
    (checkout / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    (checkout / "release-body.md").write_text((out / "summary.md").read_text())
    print(f"labkit: {result['score']}/{result['max-score']} points", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
