"""The learner's version of the course, and starters as they were handed out.

``labkit release OUT`` writes the course a learner gets, from the single source:
the package, the starters, the notebooks with outputs cleared, the setup, the
grading configuration, its CI files (``.github/workflows/grade.yml``, ``.gitlab-ci.yml``),
and pristine copies of the starters (for
``labkit reset`` and for telling a lab that was never started), but no tests and
no ``solutions/``. The step solutions go in as the course chooses
(:mod:`labkit.course.solutions`): self-paced (the default) writes them into the
hidden ``.labkit/solutions/`` for ``labkit solution``; graded leaves them out.
``labkit release --check OUT`` fails when ``OUT`` is out of sync.
``labkit reset SCRIPT`` restores a starter and keeps the learner's version as a
timestamped backup, never overwriting an earlier one.
"""

from __future__ import annotations

import ast
import json
import shutil
import time
from pathlib import Path

from labkit.course import labs, solutions, sources

STARTERS = Path(".labkit") / "starters"  # pristine starters inside a released course
WORKFLOW = Path("course") / "workflows" / "grade.yml"  # the template course repositories use
# The CI files a released course holds, from their templates: source in the course -> path in the release.
CI_FILES = {WORKFLOW: ".github/workflows/grade.yml",
            Path("course") / "workflows" / "gitlab-ci.yml": ".gitlab-ci.yml"}
# What a learner's course holds, besides labs/ (rendered below) and the starters' copies.
COPIED = ("labkit", ".importlinter", "scripts", "patches", "binder", "k8s", "Makefile", "README.md", ".gitignore",
          "course", "docs",
          "jupyter", "labs/figures", "labs/reference")
KEPT_BACK = (Path("course") / "INSTRUCTOR.md",)  # the answers stay with the instructors
def grading_table() -> str:
    """The ``[tool.labkit.grading]`` table a released course's ``pyproject.toml`` gets: the labs worth points
    (:attr:`labkit.course.labs.Lab.points`), in the course's order, each with its points."""
    graded = [lab for lab in labs.LABS.values() if lab.points]
    width = max(len(lab.name) for lab in graded)
    return "\n".join([
        "",
        "[tool.labkit.grading]",
        "# Which labs `labkit grade` checks, where the learner's scripts are, and the points of each",
        "# lab (one number: split evenly over its steps; a list: one number per step).",
        f"labs = [{', '.join(json.dumps(lab.name) for lab in graded)}]",
        'path = "labs"',
        "",
        "[tool.labkit.grading.points]",
        *(f"{lab.name.ljust(width)} = {lab.points}" for lab in graded),
        "",
    ])


def pristine(lab: labs.Lab, roots: list[Path] | None = None, name: str | None = None) -> str | None:
    """The starter of ``lab`` as handed out (or of its file ``name``, for a lab whose steps ask for several): from
    its template, or from a released course's copy."""
    name = name or lab.starter
    for root in roots or [labs.ROOT]:
        target = next((t for t in sources.all_targets() if t.output == f"labs/{name}"), None)
        if target is not None and (root / target.template).is_file():
            return sources.expected(target, root)
        copy = root / STARTERS / name
        if copy.is_file():
            return copy.read_text()
    return None


def meaningful_lines(text: str) -> list[str]:
    """A shell script's or a hostfile's lines without blank lines and comments (``#!`` and ``#SBATCH`` lines,
    which mean something, kept), spaces trimmed."""
    lines = [line.strip() for line in text.splitlines()]
    return [line for line in lines if line and (not line.startswith("#") or line.startswith(("#!", "#SBATCH")))]


def same_code(a: str, b: str, name: str = "script.py") -> bool:
    """True when two versions of the file ``name`` are the same (comments and layout aside): the same Python
    program, or for another file (a batch script, a hostfile) the same lines that are not comments."""
    if not name.endswith(".py"):
        return meaningful_lines(a) == meaningful_lines(b)
    try:
        return ast.dump(ast.parse(a)) == ast.dump(ast.parse(b))
    except SyntaxError:
        return False


def not_started(script: Path, lab: labs.Lab, roots: list[Path] | None = None) -> bool:
    """True when ``script`` is still the starter as handed out (only comments or layout changed), and so are the
    lab's other files next to it (one that is not there was not started either)."""
    if not script.is_file():
        return False
    for name in lab.files:  # the script may be any of the lab's files, or the starter under a name of the learner's
        path = script.parent / name if script.name in lab.files or name != lab.starter else script
        original = pristine(lab, roots, name)
        if original is None or (path.is_file() and not same_code(path.read_text(), original, name)):
            return False
    return True


# ----------------------------------------------------------------------------- release


def _clear(notebook: Path) -> str:
    nb = json.loads(notebook.read_text())
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"], cell["execution_count"] = [], None
    return json.dumps(nb, indent=1, ensure_ascii=False) + "\n"


def release_files(root: Path = labs.ROOT, mode: str | None = None) -> dict[str, bytes]:
    """Every file of the learner's course, by relative path; ``mode`` self-paced or graded (default: the
    course's setting, else self-paced)."""
    mode = solutions.mode_of(root, mode)
    files: dict[str, bytes] = {}
    for name in COPIED:
        src = root / name
        paths = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file()) if src.is_dir() else []
        for p in paths:
            if "__pycache__" in p.parts or p.suffix == ".pyc" or p.relative_to(root) in KEPT_BACK:
                continue
            files[str(p.relative_to(root))] = p.read_bytes()
    pyproject = (root / "pyproject.toml").read_text()
    if "[tool.labkit.grading]" not in pyproject:
        pyproject = pyproject.rstrip("\n") + "\n" + grading_table()
    files["pyproject.toml"] = solutions.with_mode(pyproject, mode).encode()
    for nb in sorted((root / "labs").glob("*.ipynb")):
        files[f"labs/{nb.name}"] = _clear(nb).encode()
    for lab in labs.LABS.values():
        for name in lab.files:
            text = pristine(lab, [root], name)
            if text is None:
                raise FileNotFoundError(f"no starter {name} for the {lab.name} lab")
            files[f"labs/{name}"] = files[str(STARTERS / name)] = text.encode()
    for template, target in CI_FILES.items():
        if (root / template).is_file():
            files[target] = (root / template).read_bytes()
    if mode == solutions.SELF_PACED:
        files.update(solutions.release_files(root))
    return files


def release(out: str | Path, check: bool = False, root: Path = labs.ROOT, mode: str | None = None) -> list[str]:
    """Write the learner's course to ``out`` (or with ``check`` only compare); return the paths that differ.

    ``mode`` (default: the course's setting, else the mode ``out`` was released with, else self-paced) graded:
    no solution anywhere in ``out``, a ``.labkit/solutions/`` left there by an earlier self-paced release removed
    (``--check`` names it)."""
    out = Path(out)
    if out.resolve() == root.resolve():
        raise ValueError("the release must go to another folder than the course source")
    mode = solutions.mode_of(root, mode, out)
    differ = []
    released = out / solutions.RELEASED
    if mode == solutions.GRADED and (released.exists() or released.is_symlink()):
        differ.append(f"{solutions.RELEASED}/ (a graded release holds no solutions)")
        if not check:
            released.unlink() if released.is_symlink() or not released.is_dir() else shutil.rmtree(released)
    for rel, data in release_files(root, mode).items():
        path = out / rel
        if path.is_file() and path.read_bytes() == data:
            continue
        differ.append(rel)
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    if check and (out / "solutions").exists():
        differ.append("solutions/ (a learner's release holds no solutions)")
    return differ


def first_start(out: str | Path, root: Path = labs.ROOT, mode: str | None = None) -> list[str]:
    """Write the learner's course into ``out`` where a file of it is missing; never touch a file that is there.

    For a folder that outlives a container or a pod (the learner's work): the first start fills it, later
    starts leave the learner's scripts and notebooks as they are. Returns the paths written."""
    out = Path(out)
    if out.resolve() == root.resolve():
        raise ValueError("the course goes to another folder than the course source")
    written = []
    for rel, data in release_files(root, solutions.mode_of(root, mode)).items():
        path = out / rel
        if path.exists() or path.is_symlink():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "xb") as f:  # never over a file that appeared meanwhile
            f.write(data)
        written.append(rel)
    return written


# ----------------------------------------------------------------------------- reset


def backup_name(path: Path) -> Path:
    """``stem_YYYYmmdd-HHMMSS.py`` next to ``path``, with ``-1``, ``-2`` ... if that is taken."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    candidate = path.with_name(f"{path.stem}_{stamp}{path.suffix}")
    k = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.stem}_{stamp}-{k}{path.suffix}")
        k += 1
    return candidate


def reset(script: str | Path) -> Path | None:
    """Restore the starter ``script``; return the backup of the learner's version (None if nothing changed)."""
    script = Path(script)
    lab = labs.by_script(script)
    if lab is None:
        known = ", ".join(dict.fromkeys(name for lab in labs.LABS.values() for name in lab.files))
        raise ValueError(f"{script.name} is not a lab starter: one of {known}")
    name = script.name if script.name in lab.files else lab.starter
    original = pristine(lab, [script.resolve().parent.parent, labs.ROOT], name)
    if original is None:
        raise FileNotFoundError(f"no pristine copy of {lab.starter} was found")
    if script.is_file() and script.read_text() == original:
        return None
    saved = None
    if script.is_file():
        saved = backup_name(script)
        shutil.copy2(script, saved)
    script.write_text(original)
    return saved


