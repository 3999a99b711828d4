"""``labkit solution LAB STEP [SCRIPT] [--write]``: a step's solution as the change from the learner's script."""

from __future__ import annotations

import sys
from pathlib import Path

from labkit.core.cliargs import positive_int
from labkit.course import labs, solutions

HELP = """\
Shows the solution after STEP of LAB as a unified diff from your script (default: the lab's script in the
current folder, or in labs/): lines with - are yours, + the solution's. --write saves the whole solution as a new
file next to your script (never over a file). Whether you may see it is your course's choice: a self-paced
course ships every step's solution, a graded one none; in a workshop your instructor reveals steps to the class
(`labkit workshop reveal LAB STEP`)."""


def add_cli(sub) -> None:
    """Register ``labkit solution``."""
    p = sub.add_parser("solution", help="a step's solution, as the change from your script", description=HELP)
    p.add_argument("lab", choices=list(labs.LABS), help="which lab")
    p.add_argument("step", type=positive_int, help="the step (its solution includes the steps before it)")
    p.add_argument("script", nargs="?", default=None, help="your script (default: the lab's, in this folder)")
    p.add_argument("--write", action="store_true",
                   help="also save the solution next to your script as a new file (<script>_after_step_NN.py)")
    p.set_defaults(func=_cli)


def _cli(a) -> int:
    lab = labs.get(a.lab)
    try:
        script = Path(a.script) if a.script else solutions.default_script(lab, step=a.step)
        if not script.is_file():
            raise FileNotFoundError(f"{script} not found: give your script, e.g. `labkit solution {lab.name} "
                                    f"{a.step} labs/{lab.step_file(a.step)}`")
        found = solutions.find(lab, a.step, script)
    except solutions.NotAvailable as e:
        print(f"labkit solution: {e}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError) as e:
        print(f"labkit solution: {e}", file=sys.stderr)
        return 2
    print(solutions.header(found, script))
    change = solutions.diff(found, script)
    print(change.rstrip("\n") if change else f"(no change: your {script.name} is already the solution after step "
                                             f"{a.step})")
    if a.write:
        saved = solutions.write_next_to(found, script)
        print(f"saved the whole solution as {saved}; your {script.name} is unchanged (to go on from the solution, "
              f"keep a copy of yours, then copy {saved.name} over {script.name})")
    return 0
