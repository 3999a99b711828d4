"""Class records: one JSON line per judged step, in a class folder only the instructors read.

During a workshop every learner's server has ``$LABKIT_CLASS_DIR`` (:data:`labkit.core.contract.CLASS_DIR`)
set to the class folder. Each ``labkit check`` and each assessment then appends one record per step
to the learner's own file in it, ``CLASS_DIR/LEARNER.jsonl``:

    {"learner": "learner01", "lab": "horovod", "step": 2, "passed": false, "message": "...", "time": 1764077000.1}

The folder belongs to root and the instructors' group (``rwxr-x--x``): learners cannot list it; each
learner's file is theirs and the instructors' group's (``rw-r-----``), so a learner appends to their own
file and reads no one else's. Outside a workshop (the variable unset) nothing is written. Writing a
record never fails a check: a problem is returned, not raised.

Reading trusts nothing in a file (the class view runs as the instructor, the files are the learners'):
each file is opened without following a symbolic link and read only when it is a regular file, at most
:data:`MAX_BYTES` of it; a record's learner is the file's owner (or, for a copied folder, the file's
name), never the record's own field. Each line is bounded before it is decoded
(:mod:`labkit.records.boundedjson`: at most 8 KiB of UTF-8, arrays and objects at most 16 deep, no integer of
more than 20 digits, no NaN or Infinity), then checked (:meth:`Record.parse`: every field's
type and range); whatever goes wrong with a line is named in :attr:`Reading.problems` (the first
:data:`PROBLEMS_PER_FILE` of a file, then how many in all) and the line skipped, so the view is built from
what is left and never fails. A learner's text is shown in a terminal only through ``boundedjson.for_terminal``.

The instructor's reveals (``labkit workshop reveal LAB STEP``) are class records too: one line each in
``CLASS_DIR/reveals.log`` (:data:`REVEALS`; not ``*.jsonl``, so never taken for a learner's file), written by
root and read only when the file is root's (or the reader's own), never through a link:

    {"lab": "horovod", "step": 5, "by": "alice", "time": 1764077000.1}
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import re
import stat
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from labkit.core import contract
from labkit.records.boundedjson import Refused, decode_line

FIELDS = ("learner", "lab", "step", "passed", "message", "time")
MESSAGE_LIMIT = 600  # characters of a check's message kept in a record
T = TypeVar("T")
MAX_BYTES = 2 * 2**20  # of each learner's file read by the class view (about 3000 records); the rest is named
PROBLEMS_PER_FILE = 20  # bad lines of one file named; the rest are counted
MAX_STEP = 999
MAX_TIME = 4102444800.0  # 2100-01-01 UTC: a later time is no record's
LAB_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # the whole name (fullmatch: no trailing newline)
SURROGATE = re.compile("[\ud800-\udfff]")  # a lone half of a UTF-16 pair (JSON's "\\ud800"): no UTF-8 text
ASSESSMENT = "assessment"  # the lab name of the final assessment's records (one step)
SUFFIX = ".jsonl"
REVEALS = "reveals.log"  # in the class folder: the steps the instructor revealed to the class


def _time(when: object) -> bool:
    """Whether ``when`` is a time a record holds: seconds since the epoch, an int or float, up to :data:`MAX_TIME`."""
    return isinstance(when, (int, float)) and not isinstance(when, bool) and 0 <= when <= MAX_TIME  # NaN: False


def _unrefused(row: dict[str, Any]) -> None:
    """ValueError naming a field (of those parse does not check) that holds a :class:`Refused` number."""
    for key, value in row.items():
        if isinstance(value, Refused):
            raise ValueError(f"field {key[:40]!r} holds {value.what}, not a number")


@dataclass(frozen=True)
class Record:
    """One judged step of one learner."""

    learner: str
    lab: str
    step: int
    passed: bool
    message: str
    time: float | None  # seconds since the epoch; None for grade results, which carry no time

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def parse(cls, row: object, learner: str) -> Record:
        """The record of one decoded line, for ``learner`` (whom the file belongs to); ValueError says what is wrong."""
        if not isinstance(row, dict):
            raise ValueError("not a JSON object")
        missing = [k for k in FIELDS if k not in row and k != "learner"]
        if missing:
            raise ValueError("missing " + ", ".join(missing))
        if "learner" in row and row["learner"] != learner:
            raise ValueError(f"names another learner ({str(row['learner'])[:40]!r}) in {learner}'s file")
        lab, step, passed, message, when = (row[k] for k in FIELDS[1:])
        if not isinstance(lab, str) or not LAB_NAME.fullmatch(lab):
            raise ValueError("lab is not a lab's name")
        if type(step) is not int or not 1 <= step <= MAX_STEP:
            raise ValueError(f"step is not a whole number from 1 to {MAX_STEP}")
        if type(passed) is not bool:
            raise ValueError("passed is not true or false")
        if not isinstance(message, str):
            raise ValueError("message is not text")
        if SURROGATE.search(message):
            raise ValueError("message is not UTF-8 text (a lone surrogate)")
        if when is not None and not _time(when):
            raise ValueError("time is not a time (seconds since 1970, before 2100)")
        _unrefused(row)
        return cls(learner, lab, step, passed, _short(message), None if when is None else float(when))


@dataclass(frozen=True)
class Reveal:
    """One step's solution revealed to the class: what, by whom, when."""

    lab: str
    step: int
    by: str
    time: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def parse(cls, row: object) -> Reveal:
        """The reveal of one decoded line; ValueError says what is wrong with it."""
        if not isinstance(row, dict):
            raise ValueError("not a JSON object")
        lab, step, by, when = (row.get(k) for k in ("lab", "step", "by", "time"))
        if not isinstance(lab, str) or not LAB_NAME.fullmatch(lab):
            raise ValueError("lab is not a lab's name")
        if type(step) is not int or not 1 <= step <= MAX_STEP:
            raise ValueError(f"step is not a whole number from 1 to {MAX_STEP}")
        if not isinstance(by, str) or not by or len(by) > 64 or SURROGATE.search(by):
            raise ValueError("by is not a name")
        if not _time(when):
            raise ValueError("time is not a time (seconds since 1970, before 2100)")
        _unrefused(row)
        return cls(lab, step, by, float(when))


@dataclass
class Reading:
    """The records read from class files, oldest first, and what was skipped (file and line, and why)."""

    records: list[Record] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    reveals: list[Reveal] = field(default_factory=list)  # the steps revealed to the class, oldest first

    def add(self, other: Reading) -> None:
        self.records += other.records
        self.problems += other.problems
        self.reveals += other.reveals


def class_dir(environ: dict[str, str] | None = None) -> Path | None:
    """The class folder named by ``$LABKIT_CLASS_DIR``, or None outside a workshop."""
    value = (os.environ if environ is None else environ).get(contract.CLASS_DIR)
    return Path(value) if value else None


def learner_name(uid: int | None = None) -> str:
    """The Unix name of ``uid`` (default: this process's user)."""
    uid = os.getuid() if uid is None else uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _short(message: str) -> str:
    return message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 3] + "..."


def make_record(learner: str, lab: str, step: int, passed: bool, message: str, when: float | None) -> Record:
    return Record(learner, lab, int(step), bool(passed), _short(message), None if when is None else round(when, 3))


def records_of_report(report: dict[str, Any], learner: str, when: float) -> list[Record]:
    """One record per step of a check report (``Report.to_dict()`` or ``labkit check --json``)."""
    return [make_record(learner, str(report.get("lab")), s["step"], s["passed"], str(s.get("message", "")), when)
            for s in report.get("steps", []) if isinstance(s, dict) and isinstance(s.get("step"), int)]


def write(records: Iterable[Record], folder: Path | None = None) -> Path | None:
    """Append ``records`` to their learner's file in ``folder`` (default: the class folder); its path or None."""
    folder = class_dir() if folder is None else folder
    rows = list(records)
    if folder is None or not rows:
        return None
    path = folder / f"{rows[0].learner}{SUFFIX}"
    data = "".join(json.dumps(r.to_dict(), ensure_ascii=False) + "\n" for r in rows).encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o640)
    try:
        size = os.fstat(fd).st_size
        if size + len(data) > MAX_BYTES:  # the view would not read it: say so instead of growing the file
            raise ValueError(f"{path} holds {size / 2**20:.1f} MiB, all the class view reads; ask your instructor")
        os.write(fd, data)  # one write of whole lines: records of two checks never interleave
    finally:
        os.close(fd)
    return path


def record_check(report: Any) -> str | None:
    """Write the records of a check's :class:`~labkit.check.report.Report` when in a workshop.

    Returns None when done (or not in a workshop), else why it could not be written.
    """
    if class_dir() is None:
        return None
    try:
        write(records_of_report(report.to_dict(), learner_name(), time.time()))
    except (OSError, KeyError, TypeError, ValueError) as e:
        return f"the class record was not written: {e}"
    return None


def record_assessment(verdict: Any) -> str | None:
    """Write the final assessment's :class:`~labkit.grading.assessment.Verdict` as one record (step 1)."""
    if class_dir() is None:
        return None
    try:
        write([make_record(learner_name(), ASSESSMENT, 1, verdict.passed, str(verdict.message), time.time())])
    except (OSError, TypeError, ValueError) as e:
        return f"the class record was not written: {e}"
    return None


def prepare(folder: Path, learner: str, uid: int, gid: int) -> Path:
    """The learner's record file, created empty: owned by the learner and the instructors' group ``gid``."""
    path = folder / f"{learner}{SUFFIX}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o640)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, 0o640)
    finally:
        os.close(fd)
    return path


def _open(path: Path) -> tuple[int, os.stat_result]:
    """A descriptor on ``path`` when it is a regular file (no link followed, a FIFO never waited for)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise ValueError("a symbolic link, not read") from e
        raise ValueError(f"cannot be opened: {e.strerror}") from e
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise ValueError("not a regular file, not read")
    return fd, info


def _read(path: Path, limit: int, problems: list[str],
          refuse: Callable[[os.stat_result], str | None] = lambda info: None) -> tuple[bytes, os.stat_result] | None:
    """The first ``limit`` bytes of the regular file ``path`` (cut after its last whole line) and its status, unless
    ``refuse(status)`` gives a reason; None when it cannot be read. Every problem goes to ``problems``."""
    try:
        fd, info = _open(path)
    except ValueError as e:
        problems.append(f"{path}: {e}")
        return None
    try:
        if (why := refuse(info)) is not None:
            problems.append(f"{path}: {why}")
            return None
        data = os.read(fd, limit + 1)
        while len(data) <= limit and (more := os.read(fd, limit + 1 - len(data))):
            data += more
    except OSError as e:
        problems.append(f"{path}: cannot be read: {e.strerror}")
        return None
    finally:
        os.close(fd)
    if len(data) > limit:
        data = data[: data.rfind(b"\n", 0, limit) + 1]
        problems.append(f"{path}: larger than {limit // 2**20} MiB: only its first {len(data)} bytes read")
    return data, info


def read_file(path: Path, learner: str | None = None, limit: int = MAX_BYTES) -> Reading:
    """The valid records of one learner's file: ``learner``'s, or (None) its owner's, whatever the lines say."""
    out = Reading()
    got = _read(path, limit, out.problems)
    if got is None:
        return out
    data, info = got
    who = learner_name(info.st_uid) if learner is None else learner
    out.records += _parsed(data, path, lambda row: Record.parse(row, who), out.problems)
    return out


def _parsed(data: bytes, path: Path, parse: Callable[[Any], T], problems: list[str]) -> list[T]:
    """What ``parse`` makes of each JSON line of ``data`` (lines end at ``\\n`` only); a line that cannot be read
    or that ``parse`` refuses is skipped and named in ``problems`` (the first :data:`PROBLEMS_PER_FILE`, then how
    many in all): whatever is in a line, nothing is raised."""
    out = []
    bad = 0
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            out.append(parse(decode_line(line)))
        except Exception as e:  # noqa: BLE001  # a learner's line never ends the view: said, not raised
            bad += 1
            if bad <= PROBLEMS_PER_FILE:
                why = str(e) if isinstance(e, ValueError) else f"cannot be read ({type(e).__name__})"
                problems.append(f"{path} line {number}: {why}; skipped")
    if bad > PROBLEMS_PER_FILE:
        problems.append(f"{path}: {bad} lines skipped in all (the first {PROBLEMS_PER_FILE} named)")
    return out


def write_reveal(reveal: Reveal, folder: Path) -> Path:
    """Append ``reveal`` to the class folder's :data:`REVEALS` (created ``rw-r-----``, the folder's group: the
    instructors'), never through a link."""
    path = folder / REVEALS
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o640)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise ValueError(f"{path} is not a file of this user's: not written")
        group = os.stat(folder).st_gid
        if info.st_gid != group:
            os.fchown(fd, -1, group)
        os.fchmod(fd, 0o640)
        os.write(fd, (json.dumps(reveal.to_dict(), ensure_ascii=False) + "\n").encode())
    finally:
        os.close(fd)
    return path


def read_reveals(folder: Path, check_owner: bool = True) -> Reading:
    """The reveals in ``folder``'s :data:`REVEALS` (none when it has no such file), and what was skipped.

    ``check_owner`` (a workshop's class folder): the file is read only when it is root's or this process's user's
    (learners cannot write in the folder; a copy of a class folder is read whoever owns it)."""
    out = Reading()
    path = Path(folder) / REVEALS
    if not path.exists() and not path.is_symlink():
        return out
    got = _read(path, MAX_BYTES, out.problems,
                lambda info: "not root's; skipped" if check_owner and info.st_uid not in (0, os.geteuid()) else None)
    if got is None:
        return out
    data, _ = got
    out.reveals += _parsed(data, path, Reveal.parse, out.problems)
    return out


def read(folder: Path, by_owner: bool = True, learners: Iterable[str] | None = None) -> Reading:
    """Every valid record in ``folder``'s ``*.jsonl`` files, oldest first, the reveals (:func:`read_reveals`),
    and what was skipped.

    ``by_owner`` (a workshop's class folder): a file's records are its owner's, and a file its learner does
    not own (``learner02.jsonl`` owned by someone else) is skipped; else (a copy of a class folder) they are
    the learner the file is named after. ``learners`` given: files of anyone else are skipped too.
    """
    out = Reading()
    known = None if learners is None else set(learners)
    for path in sorted(Path(folder).glob(f"*{SUFFIX}")):
        name = path.name[: -len(SUFFIX)]
        if known is not None and name not in known:
            out.problems.append(f"{path}: not a learner of this workshop; skipped")
            continue
        got = read_file(path, None if by_owner else name)
        if by_owner and any(r.learner != name for r in got.records):
            out.problems.append(f"{path}: not owned by {name}; skipped")
            got.records = []
        out.add(got)
    out.add(read_reveals(folder, check_owner=by_owner))
    out.records.sort(key=lambda r: r.time or 0.0)
    return out
