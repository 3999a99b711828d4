"""``labkit grade``: check every lab of a learner's checkout, one test case per step, with points.

    labkit grade labs/ --junit grade.xml --summary "$GITHUB_STEP_SUMMARY"

Each lab is checked in a process of its own (``labkit check LAB SCRIPT --json``), on a
copy of the learner's scripts in a scratch folder: grading never writes to the
checkout, and a script that crashes, loops, floods its output, kills its parent or
leaves children behind fails its step within the lab's timeout with nothing left
running. A lab whose script is still the starter as handed out scores 0 ("not
started") without a run. Points come from ``[tool.labkit.grading]`` in the course's
``pyproject.toml`` (default: one point per step). A failing case names the file it is about and, when the
check's message shows it (a traceback into the learner's script, a syntax error), the line. Outputs
(:mod:`labkit.grading.reports`): JUnit XML, a Markdown summary, GitHub annotations, the whole result as JSON.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from labkit.core import proc
from labkit.course import labs
from labkit.course import release as course
from labkit.grading import assessment
from labkit.launching.jobspec import JobSpec


@dataclass
class Case:
    """One step of one lab: a test case."""

    lab: str
    step: int
    title: str
    passed: bool
    message: str
    points: float
    max_points: float
    seconds: float = 0.0
    file: str = ""  # the learner's file the case is about (for annotations), "" when none
    line: int | None = None  # the line in ``file`` where it failed, when the check's message shows it

    @property
    def name(self) -> str:
        return f"{self.lab} step {self.step}: {self.title}"

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Case:
        """A case as :meth:`Result.to_dict` wrote it; ValueError when a field is missing or of the wrong type."""
        kinds = {"lab": str, "step": int, "title": str, "passed": bool, "message": str, "points": (int, float),
                 "max_points": (int, float), "seconds": (int, float), "file": str, "line": (int, type(None))}
        optional = {"seconds", "file", "line"}
        fields = {}
        for key, kind in kinds.items():
            if key not in data and key in optional:
                continue
            value = data.get(key)
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
                raise ValueError(f"a case's {key!r} is {value!r}")
            fields[key] = value
        return cls(**fields)


@dataclass
class Result:
    """Every case of a grading run."""

    path: str
    cases: list[Case] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def score(self) -> float:
        return round(sum(c.points for c in self.cases), 3)

    @property
    def max_score(self) -> float:
        return round(sum(c.max_points for c in self.cases), 3)

    @property
    def passed(self) -> bool:
        return bool(self.cases) and all(c.passed for c in self.cases)

    def labs(self) -> list[str]:
        return list(dict.fromkeys(c.lab for c in self.cases))

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "score": self.score, "max_score": self.max_score, "passed": self.passed,
                "seconds": round(self.seconds, 1), "cases": [asdict(c) for c in self.cases]}

    @classmethod
    def from_dict(cls, data: Any) -> Result:
        """The result :meth:`to_dict` (``labkit grade --json`` or ``--save``) wrote; ValueError when it is not one."""
        if not (isinstance(data, dict) and isinstance(data.get("path"), str) and isinstance(data.get("cases"), list)):
            raise ValueError("not a labkit grade result (a JSON object with path and cases)")
        seconds = data.get("seconds", 0.0)
        return cls(data["path"], [Case.from_dict(c if isinstance(c, dict) else {}) for c in data["cases"]],
                   float(seconds) if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else 0.0)


# ----------------------------------------------------------------------------- configuration


def load_config(start: Path) -> dict[str, Any]:
    """``[tool.labkit.grading]`` of the nearest ``pyproject.toml`` at or above ``start`` ({} if none)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    for folder in [start.resolve(), *start.resolve().parents]:
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            data = tomllib.loads(pyproject.read_text())
            return data.get("tool", {}).get("labkit", {}).get("grading", {})
    return {}


def step_points(lab: labs.Lab, config: dict[str, Any]) -> list[float]:
    """Points of each step: the configured total split evenly, a configured list, or 1 each."""
    given = config.get("points", {}).get(lab.name)
    if given is None:
        return [1.0] * lab.n_steps
    if isinstance(given, (int, float)) and not isinstance(given, bool) and given >= 0:
        return [round(given / lab.n_steps, 4)] * lab.n_steps
    if isinstance(given, list) and len(given) == lab.n_steps and all(
            isinstance(p, (int, float)) and not isinstance(p, bool) and p >= 0 for p in given):
        return [float(p) for p in given]
    raise ValueError(f"[tool.labkit.grading.points] {lab.name} = {given!r}: give a number >= 0 "
                     f"or a list of {lab.n_steps} numbers")


# ----------------------------------------------------------------------------- grading


# Where a check's message shows a line of the learner's file: labkit's own "(at NAME:LINE)", a syntax error, or a
# Python traceback's frames (the last one in the learner's files counts).
_AT = re.compile(r"\(at ([^\s():]+):(\d+)\)")
_SYNTAX = re.compile(r"(\S+) does not parse \(SyntaxError at line (\d+)")
_FRAME = re.compile(r'File "([^"\n]+)", line (\d+)')


def locate(message: str, names: tuple[str, ...]) -> tuple[str, int | None]:
    """The file of ``names`` (a lab's files) that ``message`` points into, and the line, as far as it shows them:
    ``("", None)`` when it names none of them."""
    for pattern in (_AT, _SYNTAX):
        for m in pattern.finditer(message):
            if Path(m.group(1)).name in names:
                return Path(m.group(1)).name, int(m.group(2))
    frames = [(Path(m.group(1)).name, int(m.group(2))) for m in _FRAME.finditer(message)
              if Path(m.group(1)).name in names]
    return frames[-1] if frames else ("", None)


def _where(case: Case, lab: labs.Lab, folder: Path) -> Case:
    """``case`` with the file (and line) it is about, when it failed: as its message shows, else the step's file."""
    if not case.passed:
        name, line = locate(case.message, lab.files)
        case.file = (folder / (name or lab.step_file(case.step))).as_posix()
        case.line = line
    return case


def _all_fail(lab: labs.Lab, points: list[float], message: str, seconds: float = 0.0) -> list[Case]:
    return [Case(lab.name, k, lab.step_title(k), False, message, 0.0, points[k - 1], seconds / lab.n_steps)
            for k in range(1, lab.n_steps + 1)]


def _report_of(out: str, code: int | None, lab: labs.Lab) -> dict[str, Any] | None:
    """The check's JSON report: its last line, from a check that ended on its own, for this lab."""
    lines = [line for line in out.splitlines() if line.strip()]
    if code not in (0, 1) or not lines:
        return None
    try:
        report = json.loads(lines[-1])
    except ValueError:
        return None
    steps = report.get("steps") if isinstance(report, dict) else None
    if report.get("lab") != lab.name or not isinstance(steps, list):
        return None
    good = all(isinstance(s, dict) and isinstance(s.get("step"), int) and 1 <= s["step"] <= lab.n_steps
               and isinstance(s.get("passed"), bool) and isinstance(s.get("message"), str) for s in steps)
    return report if good else None


def _run_check(lab: labs.Lab, script: Path, timeout: float, scratch: Path) -> tuple[dict[str, Any] | None, str]:
    """``labkit check`` in a process of its own; its JSON report, or None and why.

    The report is read from the check's own output, kept outside the folder the learner's script runs
    from, and only from a check that ended on its own: a script cannot write or fake it.
    """
    argv = [sys.executable, "-m", "labkit.cli", "check", lab.name, str(script), "--json", "--timeout", str(timeout)]
    with tempfile.TemporaryDirectory(prefix="labkit-grade-log-") as logs:
        log = Path(logs) / f"check-{lab.name}.log"
        with proc.Job() as job:
            # The check's temporary folders go in this one, removed here even when a script kills the check.
            p = job.spawn(argv, env={"TMPDIR": logs}, cwd=scratch, log=log, name=f"check {lab.name}")
            code = p.wait(timeout + 60)  # the check stops its own runs at ``timeout``; this is the backstop
        out = log.read_text(errors="replace") if log.exists() else ""
    report = _report_of(out, code, lab)
    if report is not None:
        return report, ""
    if code is None:
        return None, f"the check did not finish within {timeout + 60:.0f} s and was stopped"
    if code == 2 and '"error"' in out:  # the check refused the script (e.g. it does not exist)
        return None, "the check could not run: " + out.strip().splitlines()[-1][:2000]
    tail = "\n".join(out.strip().splitlines()[-8:])
    return None, f"the check was stopped (exit code {code}): the script may have killed its parent\n{tail}"


def grade_lab(lab: labs.Lab, folder: Path, scratch: Path, config: dict[str, Any],
              timeout: float | None = None) -> list[Case]:
    """Grade one lab: not started, missing, or checked step by step; each failing case names its file."""
    return [_where(c, lab, folder) for c in _grade_lab(lab, folder, scratch, config, timeout)]


def _grade_lab(lab: labs.Lab, folder: Path, scratch: Path, config: dict[str, Any],
               timeout: float | None = None) -> list[Case]:
    points = step_points(lab, config)
    script = folder / lab.starter
    if not script.is_file():
        return _all_fail(lab, points, f"missing: {script} was not found")
    roots = [folder.resolve().parent, labs.ROOT]
    if course.not_started(script, lab, roots):
        return _all_fail(lab, points, f"not started: {lab.starter} is still the starter; work through its TODO steps")
    start = time.perf_counter()
    report, why = _run_check(lab, scratch / lab.starter, timeout or lab.timeout, scratch)
    took = time.perf_counter() - start
    if report is None or not report.get("steps"):
        cases = _all_fail(lab, points, "not checked: step 1 failed", took)
        cases[0].message = why or f"the check failed: {report.get('error') if report else '?'}"
        return cases
    cases = []
    for s in report["steps"]:
        k = int(s["step"])
        message = s["message"] if len(s["message"]) <= 8000 else s["message"][:4000] + "\n...\n" + s["message"][-4000:]
        cases.append(Case(lab.name, k, lab.step_title(k), bool(s["passed"]), message,
                          points[k - 1] if s["passed"] else 0.0, points[k - 1], took / lab.n_steps))
    return cases


def grade_assessment(table: dict[str, Any], folder: Path, scratch: Path) -> Case:
    """The final assessment, if the course asks for it: one run of the learner's own script (never a solution),
    judged from its record against this machine's budget (:mod:`labkit.grading.assessment`)."""
    spec, run = assessment.from_config(table)
    title = f"{spec['target']:.0%} validation accuracy on {spec['np']} workers within this machine's budget"
    start = time.perf_counter()
    if not (folder / run["script"]).is_file():
        return Case("assessment", 1, title, False, f"missing: {folder / run['script']} was not found", 0.0,
                    run["points"], file=(folder / run["script"]).as_posix())
    goal = assessment.machine_goal(**spec)
    work = scratch / "assessment"
    work.mkdir(exist_ok=True)
    verdict = assessment.assess(scratch / run["script"], goal, run["args"], run["launcher"],
                                job=JobSpec(quiet=True, cwd=work))
    case = Case("assessment", 1, title, verdict.passed, f"{verdict.message} (goal: {goal})",
                run["points"] if verdict.passed else 0.0, run["points"], time.perf_counter() - start)
    if not case.passed:
        _, line = locate(case.message, (run["script"],))
        case.file, case.line = (folder / run["script"]).as_posix(), line
    return case


def grade(path: str | Path = "labs", lab_names: list[str] | None = None, timeout: float | None = None,
          config: dict[str, Any] | None = None, progress: Any = None) -> Result:
    """Grade the labs of the checkout folder ``path``; nothing in it is written."""
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} is not a folder: give the folder holding the lab scripts (e.g. labs/)")
    config = load_config(folder) if config is None else config
    if config.get("assessment"):
        assessment.from_config(config["assessment"])  # a wrong table fails now, before any lab is graded
    names = lab_names or config.get("labs") or list(labs.LABS)
    chosen = [labs.get(n) for n in names]
    result = Result(str(folder))
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="labkit-grade-") as tmp:
        scratch = Path(tmp)
        theirs = {*folder.glob("*.py"), *(folder / name for lab in chosen for name in lab.files)}
        for p in sorted(theirs):  # the learner's scripts, modules of theirs they import, a lab's other files
            if p.is_file() and not p.is_symlink():
                shutil.copy2(p, scratch / p.name)
        for lab in chosen:
            if progress:
                progress(f"grading {lab.name} ({lab.starter}) ...")
            cases = grade_lab(lab, folder, scratch, config, timeout)
            result.cases += cases
            if progress:
                got, top = sum(c.points for c in cases), sum(c.max_points for c in cases)
                progress(f"  {lab.name}: {got:g}/{top:g} points")
        if config.get("assessment"):
            if progress:
                progress("the final assessment ...")
            result.cases.append(grade_assessment(config["assessment"], folder, scratch))
    result.seconds = time.perf_counter() - start
    return result


# ----------------------------------------------------------------------------- CLI
