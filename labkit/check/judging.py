"""The one judging loop every lab's check goes through.

A lab's check module (``labkit.check.lab_*``, listed in :data:`labkit.check.judges.JUDGES`) provides

* ``collect(script, upto, timeout, work) -> dict``: run the script under a probe and
  return the *evidence*, a JSON-able dict of what the processes did;
* ``evidence(data)`` (optional): the evidence as typed records, parsed once before the judges (a lab without it
  gives its judges the JSON dict);
* ``STEPS``: one judge per step, a plain function of the evidence that returns what
  passed or raises :class:`~labkit.check.verdict.Failed` with what to change;
* ``upto(step) -> int`` (optional): how many steps one run covers when step ``step``
  is asked for (the multi-worker lab only kills a worker when step 4 is asked for);
* ``syntax_error(script) -> str | None`` (optional): why the script cannot be read, before any run
  (default: Python's parser; a lab whose file is not Python reads it its own way).

Evidence is cached per script content (with the lab's other files next to it, for a lab whose steps
ask for several), so checking step 2, then 3, ... of an unchanged script judges the same run again
instead of running it again.
"""

from __future__ import annotations

import ast
import hashlib
import json
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from labkit.check import judges
from labkit.check.ending import left_behind
from labkit.check.report import Report, StepResult
from labkit.check.verdict import Failed
from labkit.core import env, files, slots
from labkit.course import labs
from labkit.records import typed

# Bumped whenever the evidence a probe run produces changes shape; recorded fixtures
# carry it, and the tests compare a fresh run's evidence with them.
FORMAT = 2

def judge(module: Any, evidence: dict[str, Any], upto: int, titles: Sequence[str]) -> list[StepResult]:
    """Judge steps 1..``upto`` of ``module`` (a lab's judges) in order; after the first failure the rest are not
    judged. A module with ``evidence(data)`` gets its judges the typed records it parses, once, here."""
    results: list[StepResult] = []
    run_error = evidence.get("run_error")
    parse = getattr(module, "evidence", None)
    try:
        seen = parse(evidence) if parse else evidence
    except typed.RecordError as e:
        bad = f"{titles[0]}: the run's record could not be read ({e}); was a file in the check's folder changed?"
        return [StepResult(1, False, bad)] + [StepResult(k, False, "not checked: fix step 1 first.")
                                              for k in range(2, upto + 1)]
    for k, fn in enumerate(module.STEPS[:upto], 1):
        failed = next((r.step for r in results if not r.passed), None)
        if failed is not None:
            results.append(StepResult(k, False, f"not checked: fix step {failed} first."))
            continue
        try:
            results.append(StepResult(k, True, f"{titles[k - 1]}: {fn(seen)}"))
            continue
        except Failed as e:
            msg = f"{titles[k - 1]}: {e}"
        except (KeyError, IndexError, TypeError) as e:
            msg = f"{titles[k - 1]}: the run did not record what this step needs ({type(e).__name__}: {e})."
        if run_error:
            msg += f"\nThe run failed:\n{run_error}"
        results.append(StepResult(k, False, msg))
    return results


def syntax_error(script: Path) -> str | None:
    """Why ``script`` does not parse, or None."""
    try:
        ast.parse(script.read_bytes(), filename=str(script))
    except SyntaxError as e:
        return (f"{script.name} does not parse (SyntaxError at line {e.lineno}: {e.msg}). "
                "Fix the syntax, then check again.")
    except ValueError as e:  # null bytes
        return f"{script.name} is not Python source: {e}"
    return None


def digest(script: Path, others: Sequence[Path] = ()) -> str:
    """The script's content, and that of the lab's other files next to it (a missing one counts as missing)."""
    h = hashlib.sha256(script.read_bytes())
    for path in others:
        h.update(b"\0" + path.name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"(missing)"))
    return h.hexdigest()


def lab_module(lab: str) -> Any:
    """The judge module of ``lab`` (:data:`labkit.check.judges.JUDGES`)."""
    return judges.of(lab)


def run_covers(module: Any, step: int) -> int:
    """How many steps the run made for ``step`` lets the judges decide."""
    n = len(module.STEPS)
    return module.upto(step) if hasattr(module, "upto") else n


# (lab, script digest, steps covered) -> evidence of one run
_CACHE: dict[tuple[str, str, int], dict[str, Any]] = {}


def _cached(lab: str, key: str) -> dict[str, Any] | None:
    """The evidence of the widest earlier run of this script, if any."""
    runs = [ev for (lab_, key_, _), ev in _CACHE.items() if (lab_, key_) == (lab, key)]
    return max(runs, key=lambda ev: ev.get("covers", 0), default=None)


def _enough(module: Any, evidence: dict[str, Any], covers: int, titles: Sequence[str]) -> bool:
    """Whether an earlier run answers: it covers the steps asked, or already fails one it covers (unless it was cut
    short, ``"partial"`` in its evidence: what a wider run also shows, the weights the notebook draws, is not in
    it)."""
    have = evidence.get("covers", 0)
    if have >= covers:
        return True
    return not evidence.get("partial") and any(not r.passed for r in judge(module, evidence, have, titles))


def check(lab: labs.Lab, script: Path, step: int, timeout: float, keep: str | Path | None = None,
          fresh: bool = False, evidence_out: str | Path | None = None) -> Report:
    """Judge steps 1..``step`` of ``script`` for ``lab`` (its declaration, looked up once by the caller) from one
    probed run (or its cached evidence).

    ``keep`` keeps the run's working folder; ``evidence_out`` writes the evidence as JSON
    (how the tests' fixtures are recorded); ``fresh`` ignores earlier runs.
    """
    start = time.perf_counter()
    script = Path(script).resolve()
    if not script.is_file():
        raise FileNotFoundError(f"no such script: {script}")
    module = lab_module(lab.name)
    report = Report(lab.name, str(script))
    bad = getattr(module, "syntax_error", syntax_error)(script)
    if bad:
        report.steps = [StepResult(1, False, f"{lab.step_title(1)}: {bad}")] + [
            StepResult(k, False, "not checked: fix step 1 first.") for k in range(2, step + 1)]
        report.seconds = time.perf_counter() - start
        return report
    covers = run_covers(module, step)
    key = digest(script, [script.parent / name for name in lab.files if name != script.name])
    evidence = None if fresh else _cached(lab.name, key)
    if evidence is None or not _enough(module, evidence, covers, lab.steps):
        with slots.queued(f"{lab.name} check of {script.name}") as waited:  # the budget starts with the slot
            evidence = collect(module, script, covers, timeout, keep)
        if waited >= 1:
            report.notes.append(f"waited {waited:.0f} s for a check slot before it started")
        if not evidence.get("interrupted") and not evidence.get("timed_out"):  # a busy machine may pass later
            _CACHE[(lab.name, key, covers)] = evidence
    covers = evidence["covers"]
    if evidence_out:
        save(evidence, Path(evidence_out))
    report.steps = judge(module, evidence, min(step, covers), lab.steps)
    report.evidence = evidence
    report.notes += left_behind(evidence)
    failed = report.first_failing_step
    report.steps += [StepResult(k, False, f"not checked: fix step {failed} first.")
                     for k in range(covers + 1, step + 1)] if failed else []
    report.seconds = time.perf_counter() - start
    return report


def collect(module: Any, script: Path, covers: int, timeout: float, keep: str | Path | None) -> dict[str, Any]:
    """Run the lab's probe in a scratch folder (kept when asked) and return its evidence."""
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="labkit-check-"))
    work.mkdir(parents=True, exist_ok=True)
    # The ranks' temporary files (AutoGraph's generated modules, MPI's session folder) go to a folder of the
    # check's own, short enough for a socket's path, so that a rank the check stops leaves nothing in /tmp.
    scratch = tempfile.mkdtemp(prefix="labkit-tmp-")
    try:
        with env.setting("TMPDIR", scratch):
            evidence = module.collect(script, covers, timeout, work)
    finally:
        _discard(scratch)
        if not keep:
            _discard(work)
    evidence["format"] = FORMAT
    evidence["covers"] = covers
    return evidence


def _discard(folder: str | Path) -> None:
    """Remove a check's scratch folder, whatever the script left in it (any depth, links not followed)."""
    try:
        files.remove_tree(folder)
    except OSError:
        pass  # a file the script made unremovable stays behind; the verdict does not depend on it


def save(evidence: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(evidence, indent=1, sort_keys=True, default=str) + "\n")


def load(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def shape(value: Any, depth: int = 3) -> Any:
    """The structure of evidence, ``depth`` levels of keys deep, to compare formats (values are left out)."""
    if isinstance(value, dict):
        return {k: shape(v, depth - 1) for k, v in sorted(value.items())} if depth else "dict"
    return "list" if isinstance(value, list) else "value"


def tail(text: str, chars: int = 1500) -> str:
    return text[-chars:].strip()
