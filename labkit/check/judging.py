"""The one judging loop every lab's check goes through.

A lab's check module (``labkit.check.lab_*``, listed in :data:`labkit.check.judges.JUDGES`) provides

* ``EVIDENCE``: the class of its *evidence*, a typed record of what the processes did (a subclass of
  :class:`labkit.records.evidence.Evidence`);
* ``collect(script, upto, timeout, work) -> EVIDENCE``: run the script under a probe and return its evidence (each
  file a process wrote read once, every field checked);
* ``STEPS``: one judge per step, a plain function of the evidence that returns what
  passed or raises :class:`~labkit.check.verdict.Failed` with what to change;
* ``upto(step) -> int`` (optional): how many steps one run covers when step ``step``
  is asked for (the multi-worker lab only kills a worker when step 4 is asked for);
* ``syntax_error(script) -> str | None`` (optional): why the script cannot be read, before any run
  (default: Python's parser; a lab whose file is not Python reads it its own way).

Evidence is cached per script content (with the lab's other files next to it, for a lab whose steps
ask for several), so checking step 2, then 3, ... of an unchanged script judges the same run again
instead of running it again. :func:`save` writes it as JSON (``evidence_out=``, the tests' recorded runs) and
:func:`load` reads it back as its lab's ``EVIDENCE``, once, every field checked: a bad file is named
(:class:`~labkit.records.evidence.EvidenceError`), never a ``KeyError`` in a judge.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
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
from labkit.records import evidence as saved
from labkit.records import typed
from labkit.records.evidence import Evidence, EvidenceError

# The evidence's schema version (labkit.records.evidence.SCHEMA): recorded fixtures carry it, a file of another
# version is refused, and the tests compare a fresh run's evidence with them.
FORMAT = saved.SCHEMA


def judge(module: Any, evidence: Evidence, upto: int, titles: Sequence[str]) -> list[StepResult]:
    """Judge steps 1..``upto`` of ``module`` (a lab's judges) in order on its typed ``evidence``; after the first
    failure the rest are not judged. A record a process wrote that could not be read fails step 1, named."""
    results: list[StepResult] = []
    run_error = evidence.run_failure()
    unreadable = evidence.record_error()
    if unreadable:
        bad = (f"{titles[0]}: the run's record could not be read ({unreadable}); was a file in the check's folder "
               "changed?")
        return [StepResult(1, False, bad)] + [StepResult(k, False, "not checked: fix step 1 first.")
                                              for k in range(2, upto + 1)]
    for k, fn in enumerate(module.STEPS[:upto], 1):
        failed = next((r.step for r in results if not r.passed), None)
        if failed is not None:
            results.append(StepResult(k, False, f"not checked: fix step {failed} first."))
            continue
        try:
            results.append(StepResult(k, True, f"{titles[k - 1]}: {fn(evidence)}"))
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
_CACHE: dict[tuple[str, str, int], Evidence] = {}


def _cached(lab: str, key: str) -> Evidence | None:
    """The evidence of the widest earlier run of this script, if any."""
    runs = [ev for (lab_, key_, _), ev in _CACHE.items() if (lab_, key_) == (lab, key)]
    return max(runs, key=lambda ev: ev.covers, default=None)


def _enough(module: Any, evidence: Evidence, covers: int, titles: Sequence[str]) -> bool:
    """Whether an earlier run answers: it covers the steps asked, or already fails one it covers (unless it was cut
    short, ``partial`` in its evidence: what a wider run also shows, the weights the notebook draws, is not in
    it)."""
    have = evidence.covers
    if have >= covers:
        return True
    return not evidence.partial and any(not r.passed for r in judge(module, evidence, have, titles))


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
        if not evidence.cut_short():  # a busy machine may pass later
            _CACHE[(lab.name, key, covers)] = evidence
    covers = evidence.covers
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


def collect(module: Any, script: Path, covers: int, timeout: float, keep: str | Path | None) -> Evidence:
    """Run the lab's probe in a scratch folder (kept when asked) and return its evidence, with the steps it
    covers."""
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
    if not isinstance(evidence, Evidence):
        raise TypeError(f"{getattr(module, '__name__', module)}.collect returned a {type(evidence).__name__}, not its "
                        "evidence: a dataclass derived from labkit.records.evidence.Evidence (its EVIDENCE)")
    return dataclasses.replace(evidence, schema=FORMAT, covers=covers)


def _discard(folder: str | Path) -> None:
    """Remove a check's scratch folder, whatever the script left in it (any depth, links not followed)."""
    try:
        files.remove_tree(folder)
    except OSError:
        pass  # a file the script made unremovable stays behind; the verdict does not depend on it


def save(evidence: Evidence, path: Path) -> None:
    """Write ``evidence`` as JSON to ``path`` (:func:`labkit.records.evidence.write`), for :func:`load`."""
    saved.write(evidence, Path(path))


def load(path: str | Path, lab: str | None = None) -> Evidence:
    """The evidence saved in ``path``, typed as its lab's ``EVIDENCE``: the lab named in the file (or ``lab``, which
    the file must then be of). :class:`~labkit.records.evidence.EvidenceError` names the file when it cannot be read,
    names no lab this course has, or does not hold that lab's evidence (its version, a field of the wrong type)."""
    path = Path(path)
    data = saved.read_json(path)
    named = data.get("lab")
    if lab is not None and named is not None and named != lab:
        raise EvidenceError(f"{path}: evidence of the {named!r} lab, not of the {lab} lab")
    name = lab if lab is not None else named
    if not isinstance(name, str):
        raise EvidenceError(f"{path}: names no lab (its 'lab' field), so its evidence cannot be read")
    try:
        module = lab_module(name)
    except ValueError as e:
        raise EvidenceError(f"{path}: {e}") from None
    return saved.parse(module.EVIDENCE, data, path)


def shape(value: Any, depth: int = 3) -> Any:
    """The structure of evidence (typed, or as JSON), ``depth`` levels of keys deep, to compare formats (values are
    left out)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = typed.dump(value)
    if isinstance(value, dict):
        return {str(k): shape(v, depth - 1) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))} \
            if depth else "dict"
    return "list" if isinstance(value, list | tuple) else "value"


def tail(text: str, chars: int = 1500) -> str:
    return text[-chars:].strip()
