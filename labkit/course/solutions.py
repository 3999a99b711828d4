"""A step's solution for the learner who is stuck: where the learner's tools find it, and the change from their script.

``labkit solution LAB STEP [SCRIPT]`` and ``labkit.ui.solutions.show(LAB, STEP)`` show the solution after a
step as a unified diff from the learner's own script; ``--write`` saves it next to the script as a new file.

Who may see solutions is the course's choice, ``[tool.labkit.course] solutions`` in the course's
``pyproject.toml`` (or ``labkit release --solutions``), written into the release's own ``pyproject.toml``:

* ``self-paced`` (the default): ``labkit release`` writes every step's solution into the release's hidden
  folder ``.labkit/solutions/``, where these tools read it. It is not a secret: a learner who opens the
  folder sees every solution. Self-paced means the learner decides when to look.
* ``graded``: the release holds no solution at all; these tools say so, and whom to ask.

In a workshop, ``$LABKIT_SOLUTIONS_DIR`` (set in every learner's server) names the folder where the
instructor's ``labkit workshop reveal LAB STEP`` publishes a step's solution to the class (root's,
read-only). There only revealed steps are shown, whatever the release holds. The course source itself (a
checkout with ``solutions/source/``) shows every step. Every step's solution is made from the lab's template as
``labkit gen`` makes ``solutions/``, but named and titled like the lab's starter: the change from the learner's
script is the steps' code.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labkit.core import contract
from labkit.course import labs, sources

RELEASED = Path(".labkit") / "solutions"  # a self-paced release's step solutions, by file name
SELF_PACED, GRADED = "self-paced", "graded"
MODES = (SELF_PACED, GRADED)
SETTING = "[tool.labkit.course] solutions"
MAX_BYTES = 1 << 20  # a solution file read from a shared folder (the step scripts are about 20 KB)
HEADER = re.compile(r"^# Generated from \S+ \(version \d+\) by `labkit gen`\.$")


class NotAvailable(LookupError):
    """This course does not give this step's solution to this learner; the message says whom to ask."""


@dataclass(frozen=True)
class Solution:
    lab: labs.Lab
    step: int
    text: str
    where: str  # for the learner: revealed by the instructor, from this course's solutions, from the course source

    @property
    def name(self) -> str:
        return file_name(self.lab, self.step)


def file_name(lab: labs.Lab, step: int) -> str:
    """``<stem>_after_step_NN.py``: the solution after ``step``, as ``labkit gen`` names it."""
    return lab.solution(step).name  # ValueError for a step the lab does not have


# ----------------------------------------------------------------------------- the course's setting


def _toml(path: Path) -> dict[str, Any]:
    import tomllib

    try:
        return tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def setting(root: Path) -> str | None:
    """``[tool.labkit.course] solutions`` of ``root/pyproject.toml``: self-paced, graded or None (not set);
    a ValueError names any other value."""
    value = _toml(root / "pyproject.toml").get("tool", {}).get("labkit", {}).get("course", {}).get("solutions")
    if value is not None and value not in MODES:
        raise ValueError(f"{SETTING} = {value!r} in {root / 'pyproject.toml'}: choose \"self-paced\" (the release "
                         "holds the step solutions, `labkit solution` shows them) or \"graded\" (it holds none)")
    return value


def mode_of(root: Path, asked: str | None = None, out: Path | None = None) -> str:
    """The release mode: ``asked`` (``labkit release --solutions``), else the course's setting, else what the
    release in ``out`` says it was made with (a graded course repository stays graded), else self-paced."""
    if asked is not None and asked not in MODES:
        raise ValueError(f"solutions {asked!r}: choose one of {', '.join(MODES)}")
    return asked or setting(root) or (setting(out) if out is not None else None) or SELF_PACED


def with_mode(pyproject: str, mode: str) -> str:
    """``pyproject`` whose ``[tool.labkit.course]`` says ``solutions = "mode"`` (the table added if missing)."""
    line = f'solutions = "{mode}"  # written by `labkit release`: {_MEANING[mode]}'
    head = re.search(r"^\[tool\.labkit\.course\][ \t]*$", pyproject, re.MULTILINE)
    if head is None:
        return pyproject.rstrip("\n") + f"\n\n[tool.labkit.course]\n{line}\n"
    start = head.end()
    after = re.search(r"^\[", pyproject[start:], re.MULTILINE)
    end = start + after.start() if after else len(pyproject)
    body = pyproject[start:end]
    key = re.compile(r"^solutions[ \t]*=.*$", re.MULTILINE)
    body = key.sub(line, body, count=1) if key.search(body) else "\n" + line + body
    return pyproject[:start] + body + pyproject[end:]


_MEANING = {SELF_PACED: "the step solutions are in .labkit/solutions/ (`labkit solution LAB STEP`)",
            GRADED: "this course gives out no solutions"}


# ----------------------------------------------------------------------------- what a release holds


def step_targets() -> list[sources.Target]:
    """Every lab's step solutions (``<stem>_after_step_NN.py``), as ``labkit gen`` makes them."""
    return [t for t in sources.all_targets() if t.output.startswith("solutions/") and "_after_step_" in t.output]


def release_files(root: Path) -> dict[str, bytes]:
    """A self-paced release's step solutions, by relative path (``.labkit/solutions/NAME``), from the templates."""
    out = {}
    for lab in labs.LABS.values():
        for k in range(1, lab.n_steps + 1):
            out[str(RELEASED / file_name(lab, k))] = source_text(lab, k, root).encode()
    return out


def source_text(lab: labs.Lab, step: int, root: Path) -> str:
    """The solution after ``step`` of ``lab`` from the course source's template, as the learner's script: what
    ``labkit gen`` writes to ``solutions/``, but named and titled like the lab's starter, so that the change from
    the learner's script is the steps' code, not the file's name."""
    name = file_name(lab, step)
    target = next((t for t in step_targets() if Path(t.output).name == name), None)
    starter = next((t for t in sources.all_targets() if t.output == f"labs/{lab.step_file(step)}"), None)
    if target is None or starter is None or not (root / target.template).is_file():
        raise FileNotFoundError(f"no template for {name} in {root}: run this in the course source")
    return sources.expected(sources.Target(target.template, target.version, starter.output, starter.title), root)


# ----------------------------------------------------------------------------- finding a solution


def revealed_dir(environ: dict[str, str] | None = None) -> Path | None:
    """The workshop's folder of revealed solutions (``$LABKIT_SOLUTIONS_DIR``), or None outside a workshop."""
    value = (os.environ if environ is None else environ).get(contract.SOLUTIONS_DIR)
    return Path(value) if value else None


def read_shared(path: Path) -> str | None:
    """The text of ``path`` when it is a regular file (no symbolic link followed, a FIFO never waited for)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, MAX_BYTES + 1)
        return None if len(data) > MAX_BYTES else data.decode(errors="replace")
    finally:
        os.close(fd)


def course_root(start: Path) -> Path | None:
    """The course folder at or above ``start``: the nearest one holding ``pyproject.toml`` and ``labs/``."""
    start = start.resolve()
    return next((f for f in (start, *start.parents) if (f / "pyproject.toml").is_file() and (f / "labs").is_dir()),
                None)


def course_of(script: Path | None = None, cwd: Path | None = None) -> Path:
    """The course whose choice decides: the script's (the folder above it holding ``labs/``), else the current
    folder's, else the one labkit runs from. Only that course is looked in: a learner's script in a graded
    release sees no solution, whichever labkit shows it."""
    found = [course_root(script.resolve().parent) if script else None, course_root(cwd or Path.cwd()), labs.ROOT]
    return next(f for f in found if f is not None).resolve()


def _revealed_steps(lab: labs.Lab, folder: Path) -> list[int]:
    return [k for k in range(1, lab.n_steps + 1) if read_shared(folder / file_name(lab, k)) is not None]


def find(lab: labs.Lab, step: int, script: Path | None = None, environ: dict[str, str] | None = None,
         cwd: Path | None = None) -> Solution:
    """The solution after ``step`` of ``lab`` that this learner may see; :class:`NotAvailable` says why not."""
    name = file_name(lab, step)
    folder = revealed_dir(environ)
    if folder is not None:  # a workshop: the steps the instructor revealed, and only those
        text = read_shared(folder / name)
        if text is not None:
            return Solution(lab, step, text, "revealed to the class by your instructor")
        later = [k for k in _revealed_steps(lab, folder) if k > step]
        hint = (f" Step {later[0]} is revealed: `labkit solution {lab.name} {later[0]}` holds this step's changes "
                "too." if later else "")
        raise NotAvailable(f"the solution of step {step} of the {lab.name} lab has not been revealed to the class. "
                           f"Ask your instructor: they can reveal it to everyone with `labkit workshop reveal "
                           f"{lab.name} {step}`.{hint}")
    root = course_of(script, cwd)
    text = read_shared(root / RELEASED / name)
    if text is not None:
        return Solution(lab, step, text, "from this course's solutions")
    if sources.is_course_source(root):
        return Solution(lab, step, source_text(lab, step, root), "from the course source")
    if setting(root) == GRADED:
        raise NotAvailable(f"this course is graded: its release holds no solutions. Ask your instructor or tutor "
                           f"about step {step} of the {lab.name} lab (the check's message says what it expects).")
    raise NotAvailable(f"this copy of the course ({root}) holds no solution of step {step} of the {lab.name} lab (no "
                       f"{RELEASED / name}). Ask your instructor, or the course's author for a release made with "
                       "`labkit release --solutions self-paced`.")


# ----------------------------------------------------------------------------- the change from the learner's script


def default_script(lab: labs.Lab, cwd: Path | None = None, step: int | None = None) -> Path:
    """The lab's script in the current folder (or in its ``labs/``): the file ``step`` asks for, when the lab's
    steps ask for different files."""
    here = cwd or Path.cwd()
    name = lab.starter if step is None else lab.step_file(step)
    for candidate in (here / name, here / "labs" / name):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no {name} in {here}: give your script, e.g. `labkit solution {lab.name} "
                            f"{step or 'STEP'} labs/{name}`")


def _comparable(solution: str, mine: str) -> str:
    """``solution`` with its generated header line replaced by the learner's own (``labkit gen`` writes the
    version into it), so that the diff shows what the steps change, not which version made the file."""
    sol, own = solution.splitlines(keepends=True), mine.splitlines(keepends=True)
    for i, line in enumerate(sol[:3]):
        if HEADER.match(line.rstrip("\n")):
            match = next((o for o in own[:3] if HEADER.match(o.rstrip("\n"))), None)
            if match is not None:
                sol[i] = match
            break
    return "".join(sol)


def diff(solution: Solution, script: Path) -> str:
    """The unified diff from ``script`` to the solution (empty when they are the same)."""
    mine = script.read_text(errors="replace")
    theirs = _comparable(solution.text, mine)
    lines = difflib.unified_diff(mine.splitlines(keepends=True), theirs.splitlines(keepends=True),
                                 fromfile=f"{script.name} (yours)", tofile=f"{solution.name} (the solution)")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def header(solution: Solution, script: Path) -> str:
    """One line: which step, what it asks, against which script, and where the solution comes from."""
    return (f"{solution.lab.name} step {solution.step} ({solution.lab.step_title(solution.step)}): the solution "
            f"after step {solution.step}, {solution.where}, as changes to your {script.name} "
            "(- your lines, + the solution's)")


def free_name(path: Path) -> Path:
    """``path``, or ``stem-1.py``, ``stem-2.py`` ... when it is taken: never an existing file."""
    candidate, k = path, 1
    while candidate.exists() or candidate.is_symlink():
        candidate = path.with_name(f"{path.stem}-{k}{path.suffix}")
        k += 1
    return candidate


def write_next_to(solution: Solution, script: Path) -> Path:
    """Save the solution as a new file next to ``script`` (``<stem>_after_step_NN.py``, or ``-1``, ``-2`` ...);
    never over an existing file, the learner's script least of all."""
    while True:
        target = free_name(script.resolve().parent / solution.name)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except FileExistsError:  # taken between the look and the open: the next name
            continue
        with os.fdopen(fd, "w") as f:
            f.write(solution.text)
        return target
