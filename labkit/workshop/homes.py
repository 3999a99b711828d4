"""A learner's home at the first start of their server, made by the learner, never by root.

The hub (root) calls :func:`give` before a learner's server starts. It starts a child that *is* the
learner (:mod:`labkit.workshop.asuser`: the learner's user, group and groups, no way back to root),
running this module from the workshop's released course (root's, read-only), and waits for it at most
``timeout`` seconds. The child (:func:`main`, :func:`prepare`):

* copies the release into ``~/course`` when the home has no ``~/course``: into a new hidden folder first,
  renamed to ``course`` at the end, so a half copy is never taken for a course; a restart of the server
  keeps the learner's work;
* links ``~/course/.venv`` to the shared environment (root's, read-only to learners) and
  ``~/.keras/datasets/fashion-mnist`` to the workshop's read-only copy of Fashion-MNIST, where
  ``tf.keras.datasets.fashion_mnist.load_data()`` finds it offline;
* appends the shared environment to ``PATH`` in ``~/.profile`` once (JupyterLab's terminals run ``bash -l``).

It opens files with ``O_NOFOLLOW | O_NONBLOCK`` and reads or appends only regular files: a symbolic link
or a FIFO where ``~/.profile`` should be is left alone and named in the report. Whatever the learner put
in their home, the child has only the learner's rights; root writes, links and changes owners of nothing
in it.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from labkit.workshop import asuser

COURSE = "course"  # HOME/course: the learner's copy
KERAS_DATA = Path(".keras") / "datasets" / "fashion-mnist"
PROFILE_MARK = "# labkit workshop: the class's shared environment first"
SKIPPED = ("__pycache__",)
READ_LIMIT = 1 << 20  # bytes of ~/.profile read when looking for the mark
NOFOLLOW = os.O_NOFOLLOW | os.O_NONBLOCK


@dataclass(frozen=True)
class Plan:
    """What the child gives the home, and who it must be to do it."""

    release: str  # the released course, root's and read-only
    venv: str  # the shared environment
    data: str | None  # the read-only data set, or None
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str


@dataclass
class Report:
    course_written: bool = False
    notes: list[str] = field(default_factory=list)  # what was left alone, and why
    seconds: float = 0.0  # the child's, from start to end (set by :func:`give`)


def _copy_file(src: Path, dest: Path) -> None:
    mode = 0o755 if src.stat().st_mode & 0o100 else 0o644
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, mode)
    try:
        with open(src, "rb") as f:
            while chunk := f.read(1 << 16):
                os.write(fd, chunk)
    finally:
        os.close(fd)


def copy_tree(src: Path, dest: Path) -> None:
    """Copy the folders and regular files of ``src`` into the new folder ``dest`` (nothing else)."""
    for entry in os.scandir(src):
        if entry.name in SKIPPED:
            continue
        if entry.is_dir(follow_symlinks=False):
            os.mkdir(dest / entry.name, 0o755)
            copy_tree(Path(entry.path), dest / entry.name)
        elif entry.is_file(follow_symlinks=False):
            _copy_file(Path(entry.path), dest / entry.name)


def give_course(home: Path, plan: Plan, report: Report) -> None:
    course = home / COURSE
    if os.path.lexists(course):
        if not course.is_dir() or course.is_symlink():
            report.notes.append(f"{course} is not a folder: left alone")
        return
    work = Path(tempfile.mkdtemp(prefix=".course-", dir=home))
    copy_tree(Path(plan.release), work)
    os.symlink(plan.venv, work / ".venv", target_is_directory=True)
    os.chmod(work, 0o755)
    try:
        os.rename(work, course)
        report.course_written = True
    except OSError as e:
        report.notes.append(f"{course} appeared while the course was copied ({e.strerror}): left alone; "
                            f"the copy is in {work}")


def link_data(home: Path, plan: Plan, report: Report) -> None:
    link = home / KERAS_DATA
    if plan.data is None or os.path.lexists(link):
        return
    try:
        os.makedirs(link.parent, exist_ok=True)
        os.symlink(plan.data, link, target_is_directory=True)
    except OSError as e:
        report.notes.append(f"{link}: not linked to the data set ({e.strerror})")


def profile_line(venv: str) -> str:
    return f'\n{PROFILE_MARK}\nexport PATH="{Path(venv) / "bin"}:$PATH"\n'


def add_to_profile(profile: Path, venv: str) -> str | None:
    """Append the ``PATH`` line to ``profile`` once; a note when it was left alone, else None."""
    try:
        fd = os.open(profile, os.O_RDWR | os.O_CREAT | os.O_APPEND | NOFOLLOW, 0o644)
    except OSError as e:
        return f"{profile}: left alone ({e.strerror})"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return f"{profile}: not a regular file, left alone"
        text = b""
        while len(text) < READ_LIMIT and (chunk := os.read(fd, 1 << 16)):
            text += chunk
        if PROFILE_MARK.encode() not in text:
            os.write(fd, profile_line(venv).encode())
        return None
    finally:
        os.close(fd)


def prepare(plan: Plan) -> Report:
    """Give the home its course, data link and profile line (run as the learner)."""
    home, report = Path(plan.home), Report()
    give_course(home, plan, report)
    link_data(home, plan, report)
    if report.course_written:
        note = add_to_profile(home / ".profile", plan.venv)
        if note:
            report.notes.append(note)
    return report


def main(args: list[str]) -> int:
    """The child: check it is the learner and nothing more, prepare the home, print the report as JSON."""
    raw = json.loads(args[0])
    plan = Plan(**{**raw, "groups": tuple(raw["groups"])})
    asuser.verify_dropped(plan.uid, plan.gid, plan.groups)
    os.umask(0o022)
    print(json.dumps(asdict(prepare(plan))))
    return 0


def child_args(plan: Plan) -> list[str]:
    """``python -I`` arguments running :func:`main` from the release's labkit (root's), not the learner's."""
    boot = (f"{asuser.NOT_DUMPABLE}; import sys; sys.path.insert(0, {plan.release!r}); "
            "from labkit.workshop import homes; sys.exit(homes.main(sys.argv[1:]))")
    return ["-c", boot, json.dumps(asdict(plan))]


def give(learner: asuser.Learner, release: Path, data: Path | None, timeout: float,
         groups_files: tuple[str, ...] = (), become: tuple[str, ...] = ()) -> Report:
    """Run :func:`prepare` as ``learner`` in a child (in the learner's control groups when ``groups_files`` name
    them; not traceable: it makes itself non-dumpable first), killed after ``timeout`` s; its report."""
    plan = Plan(str(release), str(Path(sys.prefix)), str(data) if data else None, learner.uid, learner.gid,
                learner.groups, str(learner.home))
    try:
        done = asuser.run(learner, child_args(plan), timeout, groups_files, become)
    except OSError as e:
        return Report(notes=[f"preparing {learner.home} as {learner.name} could not start: {e}"])
    if done.timed_out:
        note = f"preparing {learner.home} as {learner.name} took more than {timeout:g} s: stopped"
        return Report(notes=[note], seconds=done.seconds)
    try:
        return Report(**{**json.loads(done.out.strip().splitlines()[-1]), "seconds": done.seconds})
    except (ValueError, IndexError, TypeError):
        return Report(notes=[f"preparing {learner.home} as {learner.name} failed (exit {done.code}): "
                             f"{done.err.strip()[-500:]}"], seconds=done.seconds)
