"""Starter and step-solution scripts, generated from one annotated template per lab.

A template is plain Python with block markers on lines of their own::

    #% step 3
    opt = hvd.DistributedOptimizer(opt)   # kept in versions >= 3
    #% else
    # TODO: Step 3: ...                    # kept in versions < 3
    #% end

A line ``#% include NAME`` is replaced by ``solutions/source/parts/NAME.py`` (the
WideResNet, the data helpers, the callbacks): the generated scripts are flat and
self-contained, while each shared part is written once.

Version 0 is the learner's starter, version N the solution after step N. A lab that continues another lab's
finished script (``Lab.builds_on``) goes on in that lab's template: its step k is the version after that lab's
last step plus k (the communication lab's step 1 is version 9 of the Horovod template), written under the lab's
own solution stem. A lab whose steps ask for different files, not all Python (lab 7's hostfile and batch script:
``Lab.step_files``), has a template per file, and the same markers in its comments.
``labkit gen`` writes every file; ``labkit gen --check`` fails when one is stale.

The templates belong to the course source, not to the package: :func:`course_source` finds
the checkout that ``labkit gen`` and ``labkit release`` work on (the one this labkit runs
from, else the current folder), and says clearly when a labkit installed from a wheel has none.
"""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from labkit.course import labs

ROOT = Path(__file__).resolve().parents[2]  # labkit/course/ -> the checkout
MARK = re.compile(r"^\s*#% (step (\d+)|else|end)\s*$")
INCLUDE = re.compile(r"^#% include (\w+)[ \t]*$", re.MULTILINE)  # the line only: blank lines after it stay
PARTS = "solutions/source/parts"


def is_course_source(folder: Path) -> bool:
    """True when ``folder`` holds the course source: templates, notebooks, the project file."""
    return (folder / "solutions" / "source").is_dir() and (folder / "labs").is_dir() and \
        (folder / "pyproject.toml").is_file()


def course_source(start: Path | None = None) -> Path:
    """The course source to work on: the checkout this labkit runs from, else ``start`` (the current
    folder) or a folder above it. A :class:`FileNotFoundError` that says what to do when there is none."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (ROOT, here, *here.parents):
        if is_course_source(folder):
            return folder
    raise FileNotFoundError(
        f"no course source in {here} or above it. This labkit is installed as a package "
        f"({Path(__file__).parents[1]}), which holds no course: run the command inside a checkout of the course "
        "source (the folder with solutions/source/, labs/ and pyproject.toml). A learner's course, written by "
        "`labkit release`, holds no templates and cannot be released again.")


def include(text: str, root: Path = ROOT) -> str:
    """The template with every ``#% include NAME`` line replaced by that part's text."""

    def part(m: re.Match) -> str:
        path = root / PARTS / f"{m.group(1)}.py"
        if not path.is_file():
            raise ValueError(f"'#% include {m.group(1)}': no such part {path}")
        return path.read_text().rstrip("\n")

    return INCLUDE.sub(part, text)


@dataclass(frozen=True)
class Target:
    template: str  # relative to ROOT
    version: int
    output: str  # relative to ROOT
    title: str


def render(text: str, version: int, **fields: str) -> str:
    """The template with blocks of steps <= ``version`` kept and the others' else-parts."""
    out: list[str] = []
    stack: list[tuple[bool, bool]] = []  # (in_else, keep_body)
    for n, line in enumerate(text.splitlines(keepends=True), 1):
        m = MARK.match(line)
        if not m:
            if all((not in_else) == keep for in_else, keep in stack):
                out.append(line)
            continue
        if m.group(2):
            stack.append((False, int(m.group(2)) <= version))
        elif not stack:
            raise ValueError(f"line {n}: '{m.group(1)}' without '#% step N'")
        elif m.group(1) == "else":
            stack[-1] = (True, stack[-1][1])
        else:
            stack.pop()
    if stack:
        raise ValueError("a '#% step' block is not closed by '#% end'")
    rendered = "".join(out)
    for key, value in fields.items():
        rendered = rendered.replace("{" + key + "}", value)
    return rendered


def _header(t: Target) -> str:
    return (
        f"# Generated from {t.template} (version {t.version}) by `labkit gen`.\n"
        "# Edit the template, not this file; `make gen` rewrites it.\n"
    )


def own_template(lab: labs.Lab) -> list[Target]:
    """The starter and step solutions of a lab with a template of its own (``solutions/source/<stem>.py.tmpl``):
    version 0 is the starter in ``labs/``, version k the solution after step k."""
    template = f"solutions/source/{lab.stem}.py.tmpl"
    return [Target(template, 0, f"labs/{lab.starter}", f"{lab.name} lab, starting point"),
            *(Target(template, k, f"solutions/{lab.solution(k).name}", f"{lab.name} lab, after step {k}")
              for k in range(1, lab.n_steps + 1))]


def expected(t: Target, root: Path = ROOT) -> str:
    """The full text ``t.output`` should have."""
    body = render(include((root / t.template).read_text(), root), t.version, name=Path(t.output).name, title=t.title)
    lines = body.splitlines(keepends=True)
    # Keep a shebang first so the file stays executable.
    if lines and lines[0].startswith("#!"):
        return lines[0] + _header(t) + "".join(lines[1:])
    return _header(t) + body


def generate(check: bool = False, root: Path | None = None, targets: list[Target] | None = None) -> list[str]:
    """Write (or with ``check`` only compare) every target of ``root`` (default: :func:`course_source`);
    return the stale/written paths."""
    root = root or course_source()
    changed = []
    for t in targets or all_targets():
        path = root / t.output
        text = expected(t, root)
        if not path.exists() or path.read_text() != text:
            changed.append(t.output)
            if not check:
                if path.exists() and t.output.startswith("labs/"):
                    # A learner may have edited the starter: keep their version.
                    backup = path.with_name(f"{path.name}.{time.strftime('%Y%m%d-%H%M%S')}.bak")
                    shutil.copy2(path, backup)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    return changed


def continued(lab: labs.Lab) -> list[Target]:
    """The step solutions of a lab that continues another lab's finished script, from the template of the lab
    that chain starts from: its step k is the version after every earlier lab's steps, plus k."""
    chain = labs.lineage(lab)
    before, base = sum(earlier.n_steps for earlier in chain), chain[0]
    template = own_template(base)[0].template
    return [Target(template, before + k, f"solutions/{lab.stem}_after_step_{k:02d}.py",
                   f"{lab.name} lab, after step {k}") for k in range(1, lab.n_steps + 1)]


def step_file_targets(lab: labs.Lab) -> list[Target]:
    """The files of a lab whose steps ask for different files (``Lab.step_files``, e.g. lab 7's hostfile and batch
    script): one template each, ``solutions/source/<file>.tmpl``; version 0 is the starter in ``labs/``, version k
    the file after step k, for each step that asks for it."""
    out = []
    for name in dict.fromkeys(lab.step_files):
        template = f"solutions/source/{name}.tmpl"
        out.append(Target(template, 0, f"labs/{name}", f"{lab.name} lab, starting point"))
        out += [Target(template, k, f"solutions/{lab.solution(k).name}", f"{lab.name} lab, after step {k}")
                for k in range(1, lab.n_steps + 1) if lab.step_file(k) == name]
    return out


def lab_targets(lab: labs.Lab) -> list[Target]:
    """Every file ``labkit gen`` writes for ``lab``, as its declaration says."""
    if lab.builds_on:
        return continued(lab)
    return step_file_targets(lab) if lab.step_files else own_template(lab)


# The Horovod lab's finished script under the name the benchmarks and docs use.
SOLUTION = Target("solutions/source/fashion_mnist.py.tmpl", labs.get("horovod").n_steps,
                  "solutions/fashion_mnist_solution.py", "Horovod lab solution, with learning-rate scaling and warm-up")


def all_targets() -> list[Target]:
    """Every file ``labkit gen`` writes, as the labs declared now (:data:`labkit.course.labs.LABS`) say: read when
    asked, so a lab declared after this module was imported is generated, released, reset and graded too."""
    return [*(t for lab in labs.LABS.values() for t in lab_targets(lab)), SOLUTION]



def backup(path: str | Path) -> Path:
    """Copy a learner's script to ``<stem>_original<suffix>`` (or a timestamped name if taken).

    A version already kept under either name is not copied again: its backup is returned.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    target = path.with_name(f"{path.stem}_original{path.suffix}")
    if target.exists():
        data = path.read_bytes()
        stamped = sorted(path.parent.glob(f"{path.stem}_[0-9]*-[0-9]*{path.suffix}"))
        same = next((p for p in [target, *stamped] if p.read_bytes() == data), None)
        if same is not None:  # this version is kept already: no second copy
            return same
        target = path.with_name(f"{path.stem}_{time.strftime('%Y%m%d-%H%M%S')}{path.suffix}")
    shutil.copy2(path, target)
    return target
