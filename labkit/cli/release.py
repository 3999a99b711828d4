"""``labkit release`` and ``labkit reset``: the command line of :mod:`labkit.course.release`."""

from __future__ import annotations

import sys
from pathlib import Path

from labkit.course import solutions, sources
from labkit.course.release import release, reset


def add_cli(sub) -> None:
    """Register ``labkit release`` and ``labkit reset``."""
    r = sub.add_parser("release", help="write the learner's version of the course")
    r.add_argument("out", help="folder to write (a course repository)")
    r.add_argument("--solutions", choices=solutions.MODES, default=None,
                   help="self-paced: the step solutions go into .labkit/solutions/ for `labkit solution` (not secret); "
                   "graded: no solution anywhere in the release (default: [tool.labkit.course] solutions in the "
                   "course's pyproject.toml, else the mode OUT was released with, else self-paced)")
    r.add_argument("--check", action="store_true", help="only report what is out of sync (exit 1 if anything)")
    r.set_defaults(func=_cli_release)
    s = sub.add_parser("reset", help="restore a lab starter, keeping your version as a timestamped backup")
    s.add_argument("script", help="e.g. labs/fashion_mnist.py")
    s.set_defaults(func=_cli_reset)


def _cli_release(a) -> int:
    try:
        root = sources.course_source()  # a wheel finds no source in itself
        mode = solutions.mode_of(root, a.solutions, Path(a.out))
        differ = release(a.out, check=a.check, root=root, mode=mode)
    except (ValueError, FileNotFoundError) as e:
        print(f"labkit release: {e}", file=sys.stderr)
        return 2
    if a.check:
        if differ:
            again = f"labkit release {a.out}" + (f" --solutions {a.solutions}" if a.solutions else "")
            print(f"{a.out} is out of sync (run `{again}`):\n  " + "\n  ".join(differ), file=sys.stderr)
            return 1
        print(f"{a.out} is in sync with the course source")
        return 0
    print(f"wrote {len(differ)} file(s) to {a.out}" if differ else f"{a.out} was already up to date")
    print(f"solutions: {mode}: " + ("the step solutions are in .labkit/solutions/ (`labkit solution LAB STEP`; not "
                                    "secret)" if mode == solutions.SELF_PACED else "none in the release"))
    return 0


def _cli_reset(a) -> int:
    try:
        saved = reset(a.script)
    except (ValueError, FileNotFoundError) as e:
        print(f"labkit reset: {e}", file=sys.stderr)
        return 2
    print(f"restored {a.script}; your version is in {saved}" if saved else f"{a.script} is already the starter")
    return 0
